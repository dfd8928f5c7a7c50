// Pixels stage (native): libjpeg-turbo decoding through the libjpeg API, with region decode.
#include "decode/jpeg_decode.h"

#include <algorithm>
#include <cstring>

extern "C" {
#include <jerror.h>
}

namespace fastload {

JpegDecoder::JpegDecoder() {
  std::memset(&cinfo_, 0, sizeof(cinfo_));
  init_error_manager(&err_);
  cinfo_.err = &err_.pub;
  // jpeg_create_decompress only fails on a library/struct version mismatch, which the build rules out.
  jpeg_create_decompress(&cinfo_);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&cinfo_); }

void JpegDecoder::reset_state() {
  message_.clear();
  reset_error_state(&err_);
  header_ok_ = false;
  cmyk_ = false;
  adobe_ = false;
  entropy_override_ = nullptr;
}

Status JpegDecoder::failed() {
  jpeg_abort_decompress(&cinfo_);
  message_ = err_.message;
  if (err_.saw_eof) return Status::kTruncated;
  switch (err_.error_code) {
    case JERR_INPUT_EMPTY:
    case JERR_INPUT_EOF: return Status::kTruncated;
    case JERR_BAD_PRECISION:
    case JERR_CCIR601_NOTIMPL:
    case JERR_CONVERSION_NOTIMPL:
    case JERR_NOTIMPL:
    case JERR_NOT_COMPILED:
    case JERR_ARITH_NOTIMPL:
    case JERR_IMAGE_TOO_BIG:
    case JERR_WIDTH_OVERFLOW: return Status::kUnsupported;
    default: return Status::kCorrupt;
  }
}

int exif_orientation(const uint8_t* p, size_t n) {
  if (n < 14 || std::memcmp(p, "Exif\0\0", 6) != 0) return 1;
  p += 6;
  n -= 6;
  bool le;
  if (p[0] == 'I' && p[1] == 'I')
    le = true;
  else if (p[0] == 'M' && p[1] == 'M')
    le = false;
  else
    return 1;
  auto u16 = [&](size_t off) -> unsigned {
    return le ? unsigned(p[off]) | unsigned(p[off + 1]) << 8 : unsigned(p[off]) << 8 | unsigned(p[off + 1]);
  };
  auto u32 = [&](size_t off) -> uint32_t {
    return le ? uint32_t(u16(off)) | uint32_t(u16(off + 2)) << 16 : uint32_t(u16(off)) << 16 | uint32_t(u16(off + 2));
  };
  const uint32_t ifd = u32(4);
  if (ifd > n || n - ifd < 2) return 1;
  const unsigned count = u16(ifd);
  for (unsigned i = 0; i < count; ++i) {
    const size_t e = ifd + 2 + size_t(i) * 12;
    if (e + 12 > n) return 1;
    if (u16(e) == 0x0112) {
      const unsigned v = u16(e + 8);
      return (v >= 1 && v <= 8) ? int(v) : 1;
    }
  }
  return 1;
}

Status JpegDecoder::open(const uint8_t* data, size_t size, const DecodeSettings& settings, JpegInfo* info) {
  if (header_ok_ || cinfo_.global_state != 0) jpeg_abort_decompress(&cinfo_);
  reset_state();
  settings_ = settings;
  if (size == 0) {
    message_ = "empty record (0 bytes)";
    return Status::kEmpty;
  }
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) {
    message_ = "not a JPEG (no SOI marker)";
    return Status::kNeedsPillow;
  }
  if (setjmp(err_.jump)) return failed();
  use_memory_source(&cinfo_, data, size);
  jpeg_save_markers(&cinfo_, JPEG_APP0 + 1, settings.apply_exif ? 0xFFFF : 0);
  if (jpeg_read_header(&cinfo_, TRUE) != JPEG_HEADER_OK) {
    jpeg_abort_decompress(&cinfo_);
    message_ = "no image in the JPEG datastream";
    return Status::kCorrupt;
  }
  const long long pixels = static_cast<long long>(cinfo_.image_width) * cinfo_.image_height;
  if (pixels > settings.max_pixels) {
    jpeg_abort_decompress(&cinfo_);
    message_ = "image is " + std::to_string(cinfo_.image_width) + "x" + std::to_string(cinfo_.image_height) + " = " +
               std::to_string(pixels) + " pixels, above max_pixels=" + std::to_string(settings.max_pixels);
    return Status::kTooLarge;
  }
  if (pixels == 0) {
    jpeg_abort_decompress(&cinfo_);
    message_ = "image has zero width or height";
    return Status::kCorrupt;
  }
  switch (cinfo_.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB: break;
    case JCS_CMYK:
    case JCS_YCCK:
      cmyk_ = true;
      adobe_ = cinfo_.saw_Adobe_marker;
      break;
    default:
      jpeg_abort_decompress(&cinfo_);
      message_ = "unsupported JPEG colour space " + std::to_string(int(cinfo_.jpeg_color_space));
      return Status::kUnsupported;
  }
  info->width = static_cast<int>(cinfo_.image_width);
  info->height = static_cast<int>(cinfo_.image_height);
  info->components = cinfo_.num_components;
  info->orientation = 1;
  if (settings.apply_exif) {
    for (jpeg_saved_marker_ptr m = cinfo_.marker_list; m; m = m->next) {
      if (m->marker == JPEG_APP0 + 1) {
        const int o = exif_orientation(m->data, m->data_length);
        if (o != 1) {
          info->orientation = o;
          break;
        }
      }
    }
  }
  header_ok_ = true;
  return Status::kOk;
}

void JpegDecoder::configure_output(int denom) {
  cinfo_.scale_num = 1;
  cinfo_.scale_denom = static_cast<unsigned>(denom);
  cinfo_.dct_method = settings_.fast_idct ? JDCT_IFAST : JDCT_ISLOW;
  cinfo_.do_fancy_upsampling = settings_.fancy_upsampling ? TRUE : FALSE;
  cinfo_.out_color_space = cmyk_ ? JCS_CMYK : JCS_RGB;
  // libjpeg-turbo 2.1's jpeg_skip_scanlines tests cinfo->cconvert / cquantize and swaps their
  // function pointers. With the merged upsampler (plain upsampling of 4:2:0 / 4:2:2) no colour
  // deconverter is created, so on a reused decompressor those fields still point into the previous
  // image's freed pool: a use-after-free valgrind shows. Clearing them lets start_decompress
  // install fresh modules or leave them null.
  cinfo_.cconvert = nullptr;
  cinfo_.cquantize = nullptr;
}

// Pillow's CMYK -> RGB (libImaging/Convert.c cmyk2rgb), after Pillow's JPEG reader inverts every
// CMYK JPEG ("CMYK;I", the Adobe convention): R = (255 - K) - (255 - K) * C / 255, rounded as
// Pillow's MULDIV255.
void JpegDecoder::cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int width) const {
  for (int x = 0; x < width; ++x) {
    const int k = 255 - cmyk[4 * x + 3];
    const int nk = 255 - k;
    for (int c = 0; c < 3; ++c) {
      const int v = 255 - cmyk[4 * x + c];
      const int t = v * nk + 128;
      const int r = nk - (((t >> 8) + t) >> 8);
      rgb[3 * x + c] = static_cast<uint8_t>(r < 0 ? 0 : (r > 255 ? 255 : r));
    }
  }
}

Status JpegDecoder::finish(bool complete) {
  jpeg_abort_decompress(&cinfo_);
  if (err_.saw_eof) {
    message_ = std::string("truncated JPEG data: ") + err_.message;
    return Status::kTruncated;
  }
  if (!complete) {
    message_ = "decoder returned fewer rows than the image has";
    return Status::kCorrupt;
  }
  return Status::kOk;
}

Status JpegDecoder::decode_region(int denom, int x0, int y0, int x1, int y1, RowSink* sink) {
  if (!header_ok_) {
    message_ = "decode_region called without a successful open";
    return Status::kInternal;
  }
  header_ok_ = false;
  if (setjmp(err_.jump)) return failed();
  configure_output(denom);
  jpeg_start_decompress(&cinfo_);
  if (entropy_override_ != nullptr) {
    EntropyOverride* e = entropy_override_;
    entropy_override_ = nullptr;
    if (!e->install(&cinfo_)) {
      jpeg_abort_decompress(&cinfo_);
      message_ = "the replacement entropy decoder cannot take this image";
      return Status::kUnsupported;
    }
  }
  const int ow = static_cast<int>(cinfo_.output_width), oh = static_cast<int>(cinfo_.output_height);
  x0 = std::max(0, x0), y0 = std::max(0, y0);
  x1 = std::min(ow, x1), y1 = std::min(oh, y1);
  if (x1 <= x0 || y1 <= y0) {
    jpeg_abort_decompress(&cinfo_);
    message_ = "empty decode region";
    return Status::kInternal;
  }
  // With fancy upsampling the last column of a cropped scanline is upsampled from a replicated
  // chroma sample (the crop ends there) and differs from a full decode; a few spare columns (one
  // chroma sample is at most 4 pixels wide) keep every column the resampler reads exact.
  if (x1 < ow) x1 = std::min(ow, x1 + 8);
  // The same holds for the first column of a cropped scanline (libjpeg treats it as the image
  // edge): one spare column on the left means that column is never one the resampler reads.
  if (x0 > 0) x0 -= 1;
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), width = static_cast<JDIMENSION>(x1 - x0);
  if (x0 > 0 || x1 < ow) jpeg_crop_scanline(&cinfo_, &xoff, &width);
  const int w = static_cast<int>(cinfo_.output_width);
  const size_t rgb_stride = static_cast<size_t>(w) * 3 + kRowSlackBytes;
  const size_t raw_stride = cmyk_ ? static_cast<size_t>(w) * 4 + kRowSlackBytes : rgb_stride;
  // Only resized upwards: the buffers live as long as the thread's decoder.
  if (row_buf_.size() < rgb_stride * kSinkRows) row_buf_.resize(rgb_stride * kSinkRows);
  if (cmyk_ && cmyk_buf_.size() < raw_stride * kSinkRows) cmyk_buf_.resize(raw_stride * kSinkRows);
  sink->begin(static_cast<int>(xoff), w);
  if (y0 > 0) jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(y0));
  JSAMPROW rows[kSinkRows];
  const uint8_t* rgb_rows[kSinkRows];
  uint8_t* raw = cmyk_ ? cmyk_buf_.data() : row_buf_.data();
  for (int r = 0; r < kSinkRows; ++r) {
    rows[r] = raw + raw_stride * r;
    rgb_rows[r] = row_buf_.data() + rgb_stride * r;
  }
  // Rows are gathered kSinkRows at a time so the resampler can run its multi-row kernels.
  while (static_cast<int>(cinfo_.output_scanline) < y1) {
    const int first = static_cast<int>(cinfo_.output_scanline);
    const int want = std::min(kSinkRows, y1 - first);
    int got = 0;
    while (got < want) {
      const int n = static_cast<int>(jpeg_read_scanlines(&cinfo_, rows + got, static_cast<JDIMENSION>(want - got)));
      if (n <= 0) break;
      got += n;
    }
    if (got <= 0) break;
    if (cmyk_) {
      for (int r = 0; r < got; ++r) cmyk_to_rgb(rows[r], row_buf_.data() + rgb_stride * r, w);
    }
    sink->rows(first, rgb_rows, got);
    if (got < want) break;
  }
  const bool complete = static_cast<int>(cinfo_.output_scanline) >= y1;
  return finish(complete);
}

Status JpegDecoder::decode_full(uint8_t* dst) {
  if (!header_ok_) {
    message_ = "decode_full called without a successful open";
    return Status::kInternal;
  }
  header_ok_ = false;
  if (setjmp(err_.jump)) return failed();
  configure_output(1);
  jpeg_start_decompress(&cinfo_);
  const int w = static_cast<int>(cinfo_.output_width), h = static_cast<int>(cinfo_.output_height);
  const size_t stride = static_cast<size_t>(w) * 3;
  if (cmyk_ && cmyk_buf_.size() < static_cast<size_t>(w) * 4) cmyk_buf_.resize(static_cast<size_t>(w) * 4);
  while (static_cast<int>(cinfo_.output_scanline) < h) {
    const int y = static_cast<int>(cinfo_.output_scanline);
    JSAMPROW row = cmyk_ ? cmyk_buf_.data() : dst + stride * y;
    if (jpeg_read_scanlines(&cinfo_, &row, 1) != 1) break;
    if (cmyk_) cmyk_to_rgb(cmyk_buf_.data(), dst + stride * y, w);
  }
  const bool complete = static_cast<int>(cinfo_.output_scanline) >= h;
  return finish(complete);
}

}  // namespace fastload
