// Pixels stage (native): one call decodes a whole batch into caller memory.
//
// Per image: parse the header (bomb guard first), draw the crop box and flips from the counter-based
// generator (crop_sampler.h), pick a power-of-two DCT scale when the crop is at least twice the output,
// decode only the needed region (restart-interval slice first when the record has restart markers,
// else jpeg_crop_scanline + jpeg_skip_scanlines + early stop), resample each decoded row as it comes
// out and write the slot through the output stage (output.h): the final dtype and layout,
// normalized, fused into the resampler's vertical pass. Images are spread over the persistent pool
// through an atomic counter; every thread keeps its own decoder and buffers for the life of the
// thread.
//
// Pixel ops (pixel/pixel_ops.h): when a pipeline has any, the resampler writes a per-thread HWC
// uint8 scratch image instead, apply_pixel_ops runs on it, and the output stage writes the scratch
// into the slot; apply_erasing then runs on the written slot. Without pixel ops the direct write
// stays.
// Plain C++: glue/decode.cpp holds the Python glue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "decode/crop_sampler.h"
#include "decode/jpeg_decode.h"
#include "decode/output.h"
#include "decode/resize.h"
#include "pixel/pixel_ops.h"
#include "warp/mxnet_augment.h"
#include "warp/random_affine.h"

namespace fastload {

// One batch's transform: the geometry, the pixel ops and the output stage.
//
// Warp geometries (warp/warp.h): geometry.kind == kMxnetAugment samples the source through
// mxnet_plan(mxnet); has_affine adds torchvision's RandomAffine after a RandomResizedCrop /
// CenterCrop / Resize (affine_plan). Either way the decoded region is sampled once into the
// thread's HWC scratch, then the pixel ops and the output stage run as on the scratch path.
struct PipelineSpec {
  GeometryParams geometry;
  MXNetAugmentSpec mxnet;
  bool has_affine = false;
  AffineSpec affine;
  OutputParams output;
  PixelOpsSpec pixel_ops;
  ErasingSpec erasing;
  // The batch's MixUp / CutMix, fused into the output stage (nullptr: none); see decode_batch.
  const MixParams* mix = nullptr;
  bool has_pixel_ops() const { return !pixel_ops.ops.empty(); }
};

struct ImageRef {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// Where results go; arrays hold one entry per image (boxes: 4 per image) and are caller-owned.
struct BatchResults {
  int32_t* status = nullptr;
  double* boxes = nullptr;
  uint8_t* flips = nullptr;
  uint8_t* vflips = nullptr;
  std::vector<std::string> errors;  // "" where the image decoded
  long long warnings = 0;
  long long sliced = 0;           // decoded through a restart-interval slice
  long long slice_fallbacks = 0;  // restart-indexed, but slicing failed and the plain path decoded it
  // Sampled parameters of the pixel ops (n * ops * kTraceValuesPerOp doubles) and of the output
  // stage (n * kErasingTraceValues), when the caller asks for them (pixel_ops.h); else nullptr.
  double* pixel_traces = nullptr;
  double* erase_traces = nullptr;
  // The warp geometry's draws (n * kWarpTraceValues doubles: RandomAffine's 6 values of
  // fastload.transforms.affine.AFFINE_PARAM_NAMES, or MXNet's 18 of MXNET_PARAM_NAMES), or nullptr.
  double* warp_traces = nullptr;
  // True when decode_batch applied spec.mix (every image decoded); false leaves the slots unmixed.
  bool mixed = false;
};

constexpr int kWarpTraceValues = kMXNetParamCount;

// Decodes images[i] into out + i * (slot bytes of `format`) for every i. `format` is the prepared
// form of spec.output for the geometry's output size. Never throws for a bad image.
//
// With spec.mix the batch is mixed in the same call, with mix_batch's result bit for bit, but
// without its extra pass over the output: every image is first decoded (pixel ops included) into
// a uint8 HWC image of the calling thread's batch scratch. Without erasing, slot i is written from
// images i and i - 1 as soon as both are decoded (mix_output_rows: normalized and mixed row by
// row); with erasing, each thread walks a contiguous run of samples, writing sample i's output
// into a per-thread buffer that stays in cache and the slot from it and sample i - 1's buffer. If
// any image did not decode, the slots are written unmixed and results->mixed stays false (the
// caller mixes after replacing them).
void decode_batch(const std::vector<ImageRef>& images, void* out, const PipelineSpec& spec, const OutputFormat& format,
                  uint64_t seed, uint64_t epoch, const int64_t* indices, int threads, const DecodeSettings& options,
                  BatchResults* results);

// Testing hook: true sends every image through the per-thread HWC scratch and the output stage's
// whole-image write (the pixel-op path) even without pixel ops; the bytes must not change.
void force_hwc_scratch(bool on);

// One re-encoded image of resize_encode_batch.
struct EncodedImage {
  Status status = Status::kOk;
  std::string message;        // why it failed ("" when it did not)
  int width = 0, height = 0;  // size after the resize
  std::vector<uint8_t> jpeg;  // the re-encoded bytes
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
