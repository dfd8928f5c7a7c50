// Write stage (native): RGB pixels -> baseline JPEG bytes; see jpeg_encode.h.
#include "pack/jpeg_encode.h"

#include <cstring>

namespace fastload {

JpegEncoder::JpegEncoder() {
  std::memset(&cinfo_, 0, sizeof cinfo_);
  init_error_manager(&err_);
  cinfo_.err = &err_.pub;
  jpeg_create_compress(&cinfo_);
  init_destination(&dest_);
  cinfo_.dest = &dest_.pub;
}

JpegEncoder::~JpegEncoder() {
  jpeg_destroy_compress(&cinfo_);
  release_destination(&dest_);
}

bool JpegEncoder::encode(const uint8_t* rgb, int width, int height, int quality, std::vector<uint8_t>* out,
                         std::string* err) {
  if (width <= 0 || height <= 0 || width > JPEG_MAX_DIMENSION || height > JPEG_MAX_DIMENSION) {
    *err = "cannot encode a " + std::to_string(width) + "x" + std::to_string(height) + " image";
    return false;
  }
  if (quality < 1 || quality > 100) {
    *err = "quality " + std::to_string(quality) + " is not in 1..100";
    return false;
  }
  out->clear();
  reset_error_state(&err_);
  // From here to jpeg_finish_compress only trivially destructible objects: a libjpeg error
  // longjmps back to this setjmp.
  if (setjmp(err_.jump)) {
    jpeg_abort_compress(&cinfo_);
    *err = std::string("libjpeg: ") + err_.message;
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
  out->assign(dest_.data, dest_.data + dest_.size);  // libjpeg is done: C++ allocation is safe here
  return true;
}

}  // namespace fastload
