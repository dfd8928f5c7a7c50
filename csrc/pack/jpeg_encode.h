// Write stage (native): RGB pixels -> baseline JPEG bytes through libjpeg-turbo's compressor.
//
// Used by `fastload pack --resize`: decode, resize and re-encode run in one GIL-free call per batch
// of files (batch_decode.h, resize_encode_batch) instead of three Python-level steps per image.
// One JpegEncoder per thread, created once and reused (the jpeg_compress_struct and its output
// buffer survive between images). libjpeg errors never exit(): the shared error manager
// (jpeg_io.h) longjmps back and they come out as `false` plus a message; the output buffer is
// libjpeg-style memory (jpeg_io.h's GrowingDestination), so no C++ allocation, and no exception,
// happens inside libjpeg's frames.
// Plain C++: glue/pack.cpp holds the Python glue.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/jpeg_io.h"

namespace fastload {

class JpegEncoder {
 public:
  JpegEncoder();
  ~JpegEncoder();
  JpegEncoder(const JpegEncoder&) = delete;
  JpegEncoder& operator=(const JpegEncoder&) = delete;

  // Encodes `height` rows of packed RGB (`width * 3` bytes each) at `quality` (1..100) with libjpeg's
  // defaults otherwise (YCbCr 4:2:0, baseline, standard Huffman tables, JFIF header): the settings
  // Pillow's Image.save(format="JPEG", quality=q) and OpenCV's imencode use. `out` is replaced
  // (after libjpeg has finished: a failed allocation there throws std::bad_alloc to the caller).
  bool encode(const uint8_t* rgb, int width, int height, int quality, std::vector<uint8_t>* out, std::string* err);

 private:
  jpeg_compress_struct cinfo_;
  JpegErrorManager err_;
  GrowingDestination dest_;
};

}  // namespace fastload
