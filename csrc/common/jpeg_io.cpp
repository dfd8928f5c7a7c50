// Pixels and write stages (native): the one libjpeg error / source / destination module.
#include "common/jpeg_io.h"

#include <cstdlib>
#include <cstring>

extern "C" {
#include <jerror.h>
}

namespace fastload {

namespace {

extern "C" void fl_error_exit(j_common_ptr cinfo) noexcept {
  auto* em = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, em->message);
  em->error_code = cinfo->err->msg_code;
  std::longjmp(em->jump, 1);
}

extern "C" void fl_emit_message(j_common_ptr cinfo, int level) noexcept {
  if (level >= 0) return;  // trace messages
  auto* em = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  em->warnings++;
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
    em->saw_eof = true;
    (*cinfo->err->format_message)(cinfo, em->message);
  }
}

extern "C" void fl_output_message(j_common_ptr) noexcept {}

// Room for a typical re-encoded image; grow() doubles it when needed.
constexpr size_t kInitialBytes = 64 << 10;

extern "C" void fl_dest_init(j_compress_ptr cinfo) noexcept {
  auto* d = reinterpret_cast<GrowingDestination*>(cinfo->dest);
  if (d->capacity < kInitialBytes) {
    void* p = std::realloc(d->data, kInitialBytes);
    if (p == nullptr) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
    d->data = static_cast<uint8_t*>(p);
    d->capacity = kInitialBytes;
  }
  d->size = 0;
  d->pub.next_output_byte = d->data;
  d->pub.free_in_buffer = d->capacity;
}

// libjpeg calls this only when the whole buffer is full (free_in_buffer == 0).
extern "C" boolean fl_dest_empty(j_compress_ptr cinfo) noexcept {
  auto* d = reinterpret_cast<GrowingDestination*>(cinfo->dest);
  const size_t used = d->capacity;
  void* p = std::realloc(d->data, used * 2);
  if (p == nullptr) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 11);
  d->data = static_cast<uint8_t*>(p);
  d->capacity = used * 2;
  d->pub.next_output_byte = d->data + used;
  d->pub.free_in_buffer = d->capacity - used;
  return TRUE;
}

extern "C" void fl_dest_term(j_compress_ptr cinfo) noexcept {
  auto* d = reinterpret_cast<GrowingDestination*>(cinfo->dest);
  d->size = d->capacity - d->pub.free_in_buffer;
}

}  // namespace

void init_error_manager(JpegErrorManager* em) noexcept {
  jpeg_std_error(&em->pub);
  em->pub.error_exit = fl_error_exit;
  em->pub.emit_message = fl_emit_message;
  em->pub.output_message = fl_output_message;
  reset_error_state(em);
}

void reset_error_state(JpegErrorManager* em) noexcept {
  em->warnings = 0;
  em->error_code = 0;
  em->saw_eof = false;
  em->message[0] = '\0';
  em->pub.num_warnings = 0;
}

void use_memory_source(jpeg_decompress_struct* cinfo, const uint8_t* data, size_t size) noexcept {
  jpeg_mem_src(cinfo, const_cast<unsigned char*>(data), static_cast<unsigned long>(size));
}

void init_destination(GrowingDestination* d) noexcept {
  std::memset(d, 0, sizeof *d);
  d->pub.init_destination = fl_dest_init;
  d->pub.empty_output_buffer = fl_dest_empty;
  d->pub.term_destination = fl_dest_term;
}

void release_destination(GrowingDestination* d) noexcept {
  std::free(d->data);
  d->data = nullptr;
  d->capacity = d->size = 0;
}

}  // namespace fastload
