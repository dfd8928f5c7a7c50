// Write stage (native): RGB pixels -> baseline JPEG bytes through libjpeg-turbo's compressor.
//
// Used by `fastload pack --resize`: decode, resize and re-encode run in one GIL-free call per batch
// of files (batch_decode.h, resize_encode_batch) instead of three Python-level steps per image.
// One JpegEncoder per thread, created once and reused (the jpeg_compress_struct survives between
// images). libjpeg errors never exit(): they longjmp back and come out as `false` plus a message.
// Plain C++: bindings.cpp holds the Python glue.
#pragma once

#include <csetjmp>
#include <cstdint>
#include <string>
#include <vector>

extern "C" {
#include <jpeglib.h>
}

namespace fastload {

// libjpeg destination manager appending into a std::vector (grown by doubling); `pub` first, so a
// j_compress_ptr's dest casts back to it.
struct VectorDestination {
  jpeg_destination_mgr pub;
  std::vector<uint8_t>* out = nullptr;
};

class JpegEncoder {
 public:
  JpegEncoder();
  ~JpegEncoder();
  JpegEncoder(const JpegEncoder&) = delete;
  JpegEncoder& operator=(const JpegEncoder&) = delete;

  // Encodes `height` rows of packed RGB (`width * 3` bytes each) at `quality` (1..100) with libjpeg's
  // defaults otherwise (YCbCr 4:2:0, baseline, standard Huffman tables, JFIF header): the settings
  // Pillow's Image.save(format="JPEG", quality=q) and OpenCV's imencode use. `out` is replaced.
  bool encode(const uint8_t* rgb, int width, int height, int quality, std::vector<uint8_t>* out,
              std::string* err);

  struct ErrorManager {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
  };

 private:
  jpeg_compress_struct cinfo_;
  ErrorManager err_;
  VectorDestination dest_;
};

}  // namespace fastload
