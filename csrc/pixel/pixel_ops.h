// Pixels stage (native): the ops that run on the output-sized image after the geometry, the ops
// that run on the final (normalized) output, and the batch-level MixUp / CutMix.
//
// Three entry points, all plain C++ (glue/pixel.cpp and glue/decode.cpp bind them):
//   apply_pixel_ops  one output-sized RGB image (HWC uint8), between the resampler and the output
//                    write: ColorJitter, RandomGrayscale, Lighting, MXNet's colour augmenter, the
//                    AutoAugment / RandAugment / TrivialAugmentWide policies and timm's
//                    (pixel/timm_ops.h), in the Pipeline's order;
//   apply_erasing    one image of the final output (uint8 / float32 / float16, NCHW / NHWC), after the
//                    output write: MXNet's random contrast / illumination (float outputs) and then
//                    RandomErasing;
//   mix_batch        a whole decoded batch and its labels: MixUp or CutMix (torchvision v2).
//
// Randomness: every draw is uniform(sample_key(seed, epoch, index), counter) (common/rng.h). Counters
// [0, 64) belong to the geometry; pixel op k of the Pipeline's ops uses [64 * (k + 2), 64 * (k + 3));
// the output-stage ops use counters from 1 << 20; batch ops use the key of the batch's first sample
// with counters from 1 << 30. fastload/transforms/pixel.py documents the per-op layout; both sides
// draw the same counters, so a sample's parameters do not depend on threads or batch boundaries.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fastload_abi.h"  // the specs, PixelPrim, PixelOpKind, WarpMode, DType (from fastload/engine_abi.py)
#include "decode/output.h"

namespace fastload {

constexpr uint64_t kPixelOpCounterStride = 64;
constexpr uint64_t kPixelOpCounterBase = 2 * kPixelOpCounterStride;  // op k starts at 64 * (k + 2)
constexpr uint64_t kOutputOpsCounterBase = uint64_t{1} << 20;
constexpr uint64_t kBatchOpsCounterBase = uint64_t{1} << 30;
constexpr int kMaxPixelOps = 64;

// PixelPrim (the single-image primitives), PixelOpKind (the pixel op specs), WarpMode and DType
// (uint8 / float32 / float16 outputs) come from fastload/engine_abi.py through the generated header.
constexpr int kNumPixelPrims = kPixelPrimCount;

// Geometric primitives carry Pillow's warp per signed magnitude: 7 numbers (mode, a0..a5) as
// fastload.transforms.primitives.WarpPlan.as_row(); mode 0 affine, 1 identity, 2/3/4 the
// transposes ROTATE_90 / ROTATE_180 / ROTATE_270 (WarpMode).
constexpr int kWarpValues = 7;

// The specs (fastload/engine_abi.py, generated into fastload_abi.h; fields documented there):
//   PixelOp       one op of the Pipeline's `ops`; the fields of its `kind` are read. ColorJitter's
//                 ranges apply where has_* (torchvision's None otherwise). Lighting: alpha ~
//                 N(0, alphastd) per component, shift_c = sum_j eigvec[c][j] * alpha_j * eigval_j in
//                 [0, 1] pixel units (times 255 on uint8 pixels). MXNetColorAugment's
//                 post-normalization part (max_random_contrast / max_random_illumination) runs in
//                 apply_erasing (ErasingSpec).
//   PolicyOp      one candidate of RandAugment / TrivialAugmentWide: the primitive, its magnitude
//                 bins (empty for magnitude-free ops; the same float32 linspace as torchvision, for
//                 the Pipeline's output size) and, for geometric ops, per bin the warp of +magnitude
//                 then of -magnitude (2 * kWarpValues numbers per bin).
//   PolicyStep    one step of an AutoAugment sub-policy: applied when its draw is <= prob, with a
//                 fixed magnitude (and, for geometric ops, the warps of +magnitude and -magnitude).
//   TimmPolicy    timm's RandAugment / AutoAugment / AugMix (PixelOp.timm; pixel/timm_ops.h runs it).
//   PixelOpsSpec  the ops in order (at most kMaxPixelOps).

// Sampled parameters of one image, kTraceValuesPerOp doubles per op (layout per op kind in
// fastload/transforms/pixel.py); NaN where a value was not drawn.
constexpr int kTraceValuesPerOp = 64;
struct PixelOpsTrace {
  double* values = nullptr;  // ops.size() * kTraceValuesPerOp doubles, or nullptr
};

// Runs ops in order on one image: rgb is h rows of 3 * w bytes (HWC uint8, RGB), modified in place.
// Thread-safe (scratch memory is per thread and reused). Never throws.
void apply_pixel_ops(uint8_t* rgb, int h, int w, const PixelOpsSpec& ops, uint64_t key, PixelOpsTrace* trace);

// One primitive with fixed parameters (what a policy step does): magnitude as torchvision's
// _apply_op takes it (Brightness/Color/Contrast/Sharpness use 1 + magnitude, Hue the hue factor);
// warp = kWarpValues numbers for geometric primitives. For tests and callers outside a Pipeline.
void apply_pixel_prim(uint8_t* rgb, int h, int w, PixelPrim prim, double magnitude, const double* warp, bool bilinear,
                      const uint8_t fill[3]);

// The ops on the final output of one image (ErasingSpec): MXNet's ImageRecordIter normalization
// jitter (float outputs only, as MXNet): out = out * c + l * illumination_scale[ch],
// c ~ U(1 - max_random_contrast, 1 + max_random_contrast), l ~ U(-max_random_illumination,
// max_random_illumination), drawn from the MXNetColorAugment op's counters (mx_counter_base); then
// RandomErasing (torchvision semantics; value is in output units: normalized for float outputs).
inline bool erasing_active(const ErasingSpec& spec) { return spec.mx_jitter || spec.erase; }

// What apply_erasing drew: applied (0/1), top, left, height, width, mx contrast, mx illumination.
constexpr int kErasingTraceValues = 8;
struct ErasingTrace {
  double* values = nullptr;  // kErasingTraceValues doubles, or nullptr
};

// image: one sample of the output ([h, w, 3] or [3, h, w] of `type`), modified in place. Never throws.
void apply_erasing(void* image, DType type, bool channels_first, int h, int w, const ErasingSpec& spec, uint64_t key,
                   ErasingTrace* trace);

// Batch-level mixing (torchvision.transforms.v2 MixUp / CutMix; MixParams): sample i is mixed with
// sample i - 1 (sample 0 with the last), as torch's roll(1, 0).
// images: n samples of [h, w, 3] or [3, h, w] `type` values, mixed in place with up to `threads`
// threads of the engine's pool. labels: n rows of num_classes float32 (one-hot or probabilities);
// soft: n rows of num_classes float32, written with the mixed labels.
void mix_batch(void* images, DType type, bool channels_first, int n, int h, int w, const MixParams& params,
               const float* labels, int num_classes, float* soft, int threads);

// One sample of the same mixing: out = own mixed with prev (the sample before it), with mix_batch's
// arithmetic bit for bit. out may be own; prev must not overlap out. The decode's fused MixUp /
// CutMix (batch_decode.cpp) writes each slot through it from two cache-hot sample images.
void mix_sample(void* out, const void* own, const void* prev, DType type, bool channels_first, int h, int w,
                const MixParams& params);

// The same sample written from the two samples' uint8 HWC images (`stride` bytes per row, readable
// 32 bytes past each row) when nothing follows the output stage's normalization, row by row into
// `slot`: MixUp through write_output_row_mixed (both rows normalized and mixed in registers), CutMix
// as the own row with the box's pixels swapped in, then the output stage. The caller's row buffers
// (kMixRowSlack + fmt.slot_bytes() / fmt.height bytes each, so they stay in L1) serve the kernels
// that cannot fuse (uint8 NCHW, no AVX2). The slot is written once, never read.
constexpr size_t kMixRowSlack = 64;
void mix_output_rows(const OutputFormat& fmt, const uint8_t* own, const uint8_t* prev, size_t stride, void* slot,
                     const MixParams& params, void* own_row, void* prev_row);

// Batch forms of apply_pixel_ops / apply_erasing over n contiguous samples, spread over up to
// `threads` threads of the engine's pool, keys sample_key(seed, epoch, indices[i]); traces (or
// nullptr) hold n * ops * kTraceValuesPerOp / n * kErasingTraceValues doubles. For callers that run
// the ops outside the decode (tests, benchmarks, already-decoded batches).
void apply_pixel_ops_batch(uint8_t* images, int n, int h, int w, const PixelOpsSpec& ops, uint64_t seed, uint64_t epoch,
                           const int64_t* indices, int threads, double* traces);
void apply_erasing_batch(void* images, DType type, bool channels_first, int n, int h, int w, const ErasingSpec& spec,
                         uint64_t seed, uint64_t epoch, const int64_t* indices, int threads, double* traces);

// Name of the SIMD kernels the pixel ops use ("avx512", "avx2" or "scalar").
const char* pixel_ops_kernel_name();
// Testing hook: use the "scalar", "avx2" or "best" kernels; false when the CPU lacks them.
bool pixel_ops_force_kernels(const char* name);

}  // namespace fastload
