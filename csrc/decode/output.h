// Output stage (native): an output-sized image's pixels written into its batch slot, in the final
// dtype (uint8, float32, float16) and layout (NHWC, NCHW), normalized on the way:
//   out = (pixel * scale - mean[c]) / std[c]   (fastload.transforms.Normalize)
// computed as one fused multiply-add per element, pixel * mul[c] + add[c] with mul = scale / std and
// add = -mean / std rounded to float once per batch (within 2 float32 ulps of the formula; float16
// rounds to nearest even, as numpy's and torch's conversions do).
//
// The resampler calls write_output_row on each output row as its vertical pass produces it (the row
// is still in L1), so a normalized batch costs no second pass over memory; write_output_image does
// the same from a whole HWC image (the per-thread scratch of the pixel-op and warp paths). AVX2 +
// F16C + FMA kernels where the CPU has them, a scalar twin otherwise: both give the same bits (the
// scalar one uses fmaf and the same float -> half rounding), which the tests check.
// Plain C++: no Python here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "fastload_abi.h"  // DType, Layout, OutputParams

namespace fastload {

// One batch's output format, prepared once per call from OutputParams.
struct OutputFormat {
  DType dtype = DType::kUint8;
  Layout layout = Layout::kNhwc;
  bool normalize = false;  // false: the pixel itself (uint8 as is, floats as 0..255 values)
  float mul[3] = {1, 1, 1};
  float add[3] = {0, 0, 0};
  int height = 0, width = 0;

  size_t element_size() const { return dtype == DType::kUint8 ? 1 : (dtype == DType::kFloat32 ? 4 : 2); }
  size_t slot_bytes() const { return static_cast<size_t>(height) * width * 3 * element_size(); }
  // Writes packed RGB rows straight through: uint8 NHWC without normalization.
  bool is_raw_nhwc() const { return dtype == DType::kUint8 && layout == Layout::kNhwc && !normalize; }
};

// Validates `p` (finite scale, mean and std, std non-zero; uint8 output only without normalization)
// and prepares the batch's format. Returns false with the reason in *why.
bool make_output_format(const OutputParams& p, int height, int width, OutputFormat* out, std::string* why);

// Writes output row y from `rgb` (width packed RGB pixels; readable for 32 bytes past the row) into
// `slot`, one image of the batch in `f`'s dtype and layout.
void write_output_row(const OutputFormat& f, const uint8_t* rgb, int y, void* slot);

// MixUp fused into the output stage: writes output row y of `slot` as mix_batch would mix the rows
// written from `own` and `prev` (prev * wb + own * wa on the float32 outputs; float16: each output,
// then each product, rounded to half), both packed RGB rows readable 32 bytes past their end.
// Returns false (nothing written) where no fused kernel applies: uint8 outputs, no AVX2, or the
// scalar kernels forced; the caller then writes both rows and mixes them.
bool write_output_row_mixed(const OutputFormat& f, const uint8_t* own, const uint8_t* prev, int y, void* slot, float wa,
                            float wb);

// Writes a whole HWC uint8 image (`stride` bytes per row, rows readable 32 bytes past their end)
// into `slot`.
void write_output_image(const OutputFormat& f, const uint8_t* hwc, size_t stride, void* slot);

// float -> IEEE half, round to nearest even (F16C's vcvtps2ph with _MM_FROUND_TO_NEAREST_INT).
uint16_t float_to_half(float v);

// Name of the output kernels in use ("avx2" or "scalar").
const char* output_kernel_name();

// Testing hook: "scalar" or "best"; false when unknown or unavailable.
bool output_force_kernels(const std::string& name);

}  // namespace fastload
