// Write stage (native): RGB pixels -> baseline JPEG bytes; see jpeg_encode.h.
#include "jpeg_encode.h"

#include <cstdio>

namespace fastload {

namespace {

void encoder_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegEncoder::ErrorManager*>(cinfo->err);
  std::longjmp(err->jump, 1);
}

// The compressor emits no warnings worth counting; silence the default stderr printer.
void encoder_emit_message(j_common_ptr, int) {}

// Start with room for a typical re-encoded image; empty_output_buffer doubles it when needed.
constexpr size_t kInitialBytes = 64 << 10;

void vector_init(j_compress_ptr cinfo) {
  std::vector<uint8_t>* out = reinterpret_cast<VectorDestination*>(cinfo->dest)->out;
  if (out->size() < kInitialBytes) out->resize(kInitialBytes);
  cinfo->dest->next_output_byte = out->data();
  cinfo->dest->free_in_buffer = out->size();
}

boolean vector_empty(j_compress_ptr cinfo) {
  std::vector<uint8_t>* out = reinterpret_cast<VectorDestination*>(cinfo->dest)->out;
  // libjpeg calls this only when the whole buffer is full (free_in_buffer == 0).
  const size_t used = out->size();
  out->resize(used * 2);
  cinfo->dest->next_output_byte = out->data() + used;
  cinfo->dest->free_in_buffer = out->size() - used;
  return TRUE;
}

void vector_term(j_compress_ptr cinfo) {
  std::vector<uint8_t>* out = reinterpret_cast<VectorDestination*>(cinfo->dest)->out;
  out->resize(out->size() - cinfo->dest->free_in_buffer);
}

}  // namespace

JpegEncoder::JpegEncoder() {
  cinfo_.err = jpeg_std_error(&err_.pub);
  err_.pub.error_exit = encoder_error_exit;
  err_.pub.emit_message = encoder_emit_message;
  jpeg_create_compress(&cinfo_);
  dest_.pub.init_destination = vector_init;
  dest_.pub.empty_output_buffer = vector_empty;
  dest_.pub.term_destination = vector_term;
  dest_.out = nullptr;
  cinfo_.dest = &dest_.pub;
}

JpegEncoder::~JpegEncoder() { jpeg_destroy_compress(&cinfo_); }

bool JpegEncoder::encode(const uint8_t* rgb, int width, int height, int quality, std::vector<uint8_t>* out,
                         std::string* err) {
  // Nothing with a destructor may be created between setjmp and the last libjpeg call: longjmp
  // would skip it.
  if (width <= 0 || height <= 0 || width > JPEG_MAX_DIMENSION || height > JPEG_MAX_DIMENSION) {
    *err = "cannot encode a " + std::to_string(width) + "x" + std::to_string(height) + " image";
    return false;
  }
  if (quality < 1 || quality > 100) {
    *err = "quality " + std::to_string(quality) + " is not in 1..100";
    return false;
  }
  out->clear();
  dest_.out = out;
  if (setjmp(err_.jump)) {
    char msg[JMSG_LENGTH_MAX];
    (*cinfo_.err->format_message)(reinterpret_cast<j_common_ptr>(&cinfo_), msg);
    jpeg_abort_compress(&cinfo_);
    *err = std::string("libjpeg: ") + msg;
    out->clear();
    return false;
  }
  cinfo_.image_width = static_cast<JDIMENSION>(width);
  cinfo_.image_height = static_cast<JDIMENSION>(height);
  cinfo_.input_components = 3;
  cinfo_.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo_);
  jpeg_set_quality(&cinfo_, quality, TRUE);
  jpeg_start_compress(&cinfo_, TRUE);
  const size_t stride = static_cast<size_t>(width) * 3;
  while (cinfo_.next_scanline < cinfo_.image_height) {
    JSAMPROW rows[16];
    int count = 0;
    for (; count < 16 && cinfo_.next_scanline + count < cinfo_.image_height; ++count)
      rows[count] = const_cast<JSAMPROW>(rgb + (cinfo_.next_scanline + count) * stride);
    jpeg_write_scanlines(&cinfo_, rows, static_cast<JDIMENSION>(count));
  }
  jpeg_finish_compress(&cinfo_);
  return true;
}

}  // namespace fastload
