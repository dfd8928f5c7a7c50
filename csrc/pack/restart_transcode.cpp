// Restart-indexed JPEGs, pack-time half: lossless restart-marker transcode and its verification.
// See restart_transcode.h.
#include "pack/restart_transcode.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/jpeg_io.h"

namespace fastload {
namespace {

// Every function that calls setjmp here keeps its state in a calloc'd block of trivially
// destructible members, so the longjmp of a libjpeg error skips no destructor; the public entry
// points convert to C++ containers after libjpeg has returned.

bool is_app_marker_with_id(const jpeg_saved_marker_ptr m, int code, const char* id, size_t id_len) {
  return m->marker == code && m->data_length >= id_len && std::memcmp(m->data, id, id_len) == 0;
}

// ---- transcode ------------------------------------------------------------------------------

struct TranscodeState {
  const uint8_t* data;
  size_t size;
  int max_mcus;
  JpegErrorManager em;
  jpeg_decompress_struct src;
  jpeg_compress_struct dst;
  GrowingDestination out;  // the transcoded bytes (libjpeg-side memory, freed by the caller)
  RestartGeometry geo;
  bool progressive;
  bool arithmetic;
  int source_warnings;
};

// All libjpeg work of one transcode; returns false (message in st->em.message) on a libjpeg error.
bool transcode_impl(TranscodeState* st) {
  if (setjmp(st->em.jump)) return false;
  jpeg_create_decompress(&st->src);
  use_memory_source(&st->src, st->data, st->size);
  jpeg_save_markers(&st->src, JPEG_COM, 0xFFFF);
  for (int m = 0; m < 16; ++m) jpeg_save_markers(&st->src, JPEG_APP0 + m, 0xFFFF);
  jpeg_read_header(&st->src, TRUE);
  if (static_cast<long long>(st->src.image_width) * st->src.image_height > kMaxTranscodePixels) {
    // jpeg_read_coefficients keeps every coefficient in memory: refuse decompression bombs first.
    std::snprintf(st->em.message, sizeof st->em.message, "image is %ux%u, above the %lld-pixel transcode limit",
                  st->src.image_width, st->src.image_height, kMaxTranscodePixels);
    return false;
  }
  st->progressive = st->src.progressive_mode != 0;
  st->arithmetic = st->src.arith_code != 0;
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&st->src);
  st->source_warnings = st->em.warnings;

  jpeg_create_compress(&st->dst);
  jpeg_copy_critical_parameters(&st->src, &st->dst);
  // A JFIF header only where the source had one: a 3-component image without JFIF/Adobe markers
  // has its colour space guessed from the component ids, and an added JFIF marker would force YCbCr.
  st->dst.write_JFIF_header = st->src.saw_JFIF_marker;
  st->dst.optimize_coding = TRUE;  // also makes most files smaller than their encoder's tables did

  int h_samp[MAX_COMPONENTS], v_samp[MAX_COMPONENTS];
  for (int c = 0; c < st->dst.num_components; ++c) {
    h_samp[c] = st->dst.comp_info[c].h_samp_factor;
    v_samp[c] = st->dst.comp_info[c].v_samp_factor;
  }
  fill_geometry(static_cast<int>(st->dst.image_width), static_cast<int>(st->dst.image_height), st->dst.num_components,
                h_samp, v_samp, 0, &st->geo);
  // Largest divisor of the MCU row width not above max_mcus: every MCU row is then a whole number
  // of intervals, so interval columns line up from row to row.
  int interval = 1;
  for (int n = st->max_mcus < st->geo.mcus_per_row ? st->max_mcus : st->geo.mcus_per_row; n >= 1; --n) {
    if (st->geo.mcus_per_row % n == 0) {
      interval = n;
      break;
    }
  }
  st->dst.restart_interval = static_cast<unsigned int>(interval);
  st->geo.restart_interval = interval;
  st->geo.intervals_per_row = st->geo.mcus_per_row / interval;

  st->dst.dest = &st->out.pub;
  jpeg_write_coefficients(&st->dst, coefficients);
  for (jpeg_saved_marker_ptr m = st->src.marker_list; m != nullptr; m = m->next) {
    // libjpeg has just written its own JFIF / Adobe markers from the copied parameters: skip the
    // source's copies of those so they are not duplicated (a source Adobe marker that libjpeg does
    // not regenerate, e.g. YCbCr with transform 1, is kept: it steers the decoder's colour space).
    if (st->dst.write_JFIF_header && is_app_marker_with_id(m, JPEG_APP0, "JFIF\0", 5)) continue;
    if (st->dst.write_Adobe_marker && is_app_marker_with_id(m, JPEG_APP0 + 14, "Adobe", 5)) continue;
    jpeg_write_marker(&st->dst, m->marker, m->data, m->data_length);
  }
  jpeg_finish_compress(&st->dst);
  jpeg_finish_decompress(&st->src);
  return true;
}

// ---- full decode comparison -----------------------------------------------------------------

struct VerifyState {
  const uint8_t* a;
  size_t a_size;
  const uint8_t* b;
  size_t b_size;
  JpegErrorManager em;
  jpeg_decompress_struct da;
  jpeg_decompress_struct db;
  unsigned char* rows;  // two scanlines, malloc'd
  int mismatch_row;     // -1 when identical
  char reason[160];
};

bool verify_impl(VerifyState* st) {
  if (setjmp(st->em.jump)) return false;
  jpeg_create_decompress(&st->da);
  jpeg_create_decompress(&st->db);
  use_memory_source(&st->da, st->a, st->a_size);
  use_memory_source(&st->db, st->b, st->b_size);
  jpeg_read_header(&st->da, TRUE);
  jpeg_read_header(&st->db, TRUE);
  jpeg_start_decompress(&st->da);
  jpeg_start_decompress(&st->db);
  if (st->da.output_width != st->db.output_width || st->da.output_height != st->db.output_height ||
      st->da.output_components != st->db.output_components || st->da.out_color_space != st->db.out_color_space) {
    std::snprintf(st->reason, sizeof st->reason, "decoded shape differs: %ux%ux%d vs %ux%ux%d", st->da.output_width,
                  st->da.output_height, st->da.output_components, st->db.output_width, st->db.output_height,
                  st->db.output_components);
    st->mismatch_row = 0;
    return true;
  }
  const size_t stride = static_cast<size_t>(st->da.output_width) * st->da.output_components;
  st->rows = static_cast<unsigned char*>(std::malloc(2 * stride));
  if (st->rows == nullptr) {
    std::snprintf(st->em.message, sizeof st->em.message, "out of memory");
    return false;
  }
  JSAMPROW ra = st->rows, rb = st->rows + stride;
  while (st->da.output_scanline < st->da.output_height) {
    const int y = static_cast<int>(st->da.output_scanline);
    jpeg_read_scanlines(&st->da, &ra, 1);
    jpeg_read_scanlines(&st->db, &rb, 1);
    if (std::memcmp(ra, rb, stride) != 0) {
      st->mismatch_row = y;
      std::snprintf(st->reason, sizeof st->reason, "pixels differ in row %d", y);
      return true;
    }
  }
  jpeg_finish_decompress(&st->da);
  jpeg_finish_decompress(&st->db);
  return true;
}

}  // namespace

bool add_restart_markers(const uint8_t* data, size_t size, int max_mcus, std::vector<uint8_t>* out,
                         RestartGeometry* geo, std::string* err, TranscodeNotes* notes) {
  if (max_mcus < 1 || max_mcus > 65535) {
    if (err) *err = "max_mcus must be in [1, 65535]";
    return false;
  }
  if (data == nullptr || size == 0) {
    if (err) *err = "empty input";
    return false;
  }
  // Heap-allocated so the libjpeg structs are zeroed (jpeg_destroy on a never-created struct is a
  // no-op) and nothing the longjmp crosses has a destructor.
  TranscodeState* st = static_cast<TranscodeState*>(std::calloc(1, sizeof(TranscodeState)));
  if (st == nullptr) {
    if (err) *err = "out of memory";
    return false;
  }
  st->data = data;
  st->size = size;
  st->max_mcus = max_mcus;
  init_error_manager(&st->em);
  init_destination(&st->out);
  st->src.err = &st->em.pub;
  st->dst.err = &st->em.pub;
  const bool ok = transcode_impl(st);
  jpeg_destroy_compress(&st->dst);
  jpeg_destroy_decompress(&st->src);
  if (ok) {
    out->assign(st->out.data, st->out.data + st->out.size);
    if (geo) *geo = st->geo;
    if (notes) {
      notes->source_progressive = st->progressive;
      notes->source_arithmetic = st->arithmetic;
      notes->source_warnings = st->source_warnings;
      notes->source_bytes = static_cast<long long>(size);
      notes->output_bytes = static_cast<long long>(st->out.size);
    }
  } else if (err) {
    *err = st->em.message;
  }
  release_destination(&st->out);
  std::free(st);
  return ok;
}

bool verify_identical(const uint8_t* a, size_t a_size, const uint8_t* b, size_t b_size, std::string* why) {
  VerifyState* st = static_cast<VerifyState*>(std::calloc(1, sizeof(VerifyState)));
  if (st == nullptr) {
    if (why) *why = "out of memory";
    return false;
  }
  st->a = a;
  st->a_size = a_size;
  st->b = b;
  st->b_size = b_size;
  st->mismatch_row = -1;
  init_error_manager(&st->em);
  st->da.err = &st->em.pub;
  st->db.err = &st->em.pub;
  const bool ran = verify_impl(st);
  jpeg_destroy_decompress(&st->da);
  jpeg_destroy_decompress(&st->db);
  bool identical = ran && st->mismatch_row < 0;
  if (why != nullptr && !identical) *why = ran ? st->reason : (std::string("decode failed: ") + st->em.message);
  std::free(st->rows);
  std::free(st);
  return identical;
}

}  // namespace fastload
