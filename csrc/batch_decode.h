// Pixels stage (native): one call decodes a whole batch into caller memory.
//
// Per image: parse the header (bomb guard first), draw the crop box and flip from the counter-based
// generator (augment.h), pick a power-of-two DCT scale when the crop is at least twice the output,
// decode only the needed region (restart-interval slice first when the record has restart markers,
// else jpeg_crop_scanline + jpeg_skip_scanlines + early stop), resample each decoded row as it comes
// out and write the slot in NHWC or NCHW. Images are spread over the persistent pool through an
// atomic counter; every thread keeps its own decoder and buffers for the life of the thread.
// Plain C++: bindings.cpp holds the Python glue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "augment.h"
#include "jpeg_decode.h"
#include "resize.h"

namespace fastload {

struct ImageRef {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// Where results go; arrays hold one entry per image (boxes: 4 per image) and are caller-owned.
struct BatchResults {
  int32_t* status = nullptr;
  double* boxes = nullptr;
  uint8_t* flips = nullptr;
  std::vector<std::string> errors;  // "" where the image decoded
  long long warnings = 0;
  long long sliced = 0;           // decoded through a restart-interval slice
  long long slice_fallbacks = 0;  // restart-indexed, but slicing failed and the plain path decoded it
};

// Decodes images[i] into out + i * out_h * out_w * 3 for every i. Never throws for a bad image.
void decode_batch(const std::vector<ImageRef>& images, uint8_t* out, Layout layout, const GeometryParams& op,
                  uint64_t seed, uint64_t epoch, const int64_t* indices, int threads, const DecodeSettings& options,
                  BatchResults* results);

// One re-encoded image of resize_encode_batch.
struct EncodedImage {
  Status status = Status::kOk;
  std::string message;          // why it failed ("" when it did not)
  int width = 0, height = 0;    // size after the resize
  std::vector<uint8_t> jpeg;    // the re-encoded bytes
};

// `fastload pack --resize`: decodes each JPEG, resizes it so its shorter side is `shorter` (the
// longer side scaled with floor division, as MXNet's im2rec does; Pillow-like antialiased bilinear,
// DCT-domain downscaling first when the image is at least twice the target) and re-encodes it at
// `quality`. Images that are not JPEG, or fail, get a non-OK status for the caller's slower path.
void resize_encode_batch(const std::vector<ImageRef>& images, int shorter, int quality, int threads,
                         const DecodeSettings& options, std::vector<EncodedImage>* results);

// Single full-size decode on the calling thread's decoder: open (header checks) then decode into
// a width * height * 3 buffer the caller allocates in between.
Status open_single(const uint8_t* data, size_t size, const DecodeSettings& settings, JpegInfo* info, std::string* msg);
Status decode_single(uint8_t* dst, std::string* msg);

// Thread count knobs for the persistent pool.
void set_pool_threads(int threads);
int pool_threads();

}  // namespace fastload
