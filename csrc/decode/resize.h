// Pixels stage (native): separable resampling of a decoded region into a batch slot.
//
// Same geometry as Pillow's Image.resize(size, filter, box=box) (bilinear or bicubic with the
// filter's support growing with the downscale factor, or nearest), or torch's interpolate without
// antialiasing (build_axis): float box coordinates, horizontal pass first (only over the rows the
// vertical pass needs), uint8 intermediate. Coefficients are 14-bit fixed point in int16 so the
// inner loops are pmaddwd or vpdpwssd (AVX-512, AVX2 or SSSE3 kernels picked at run time, with a
// portable scalar twin giving the same integers). The horizontal pass consumes decoder rows as they
// come out of libjpeg (the RowSink interface), writes columns mirrored when the flip is drawn, and
// the vertical pass hands each output row to the output stage (output.h), which writes it in the
// final dtype and layout, normalized, straight into the caller's buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "decode/jpeg_decode.h"
#include "decode/output.h"

namespace fastload {

constexpr int kCoefBits = 14;

// Filter taps of one axis, for a box [in0, in1) of an axis of in_size pixels mapped to out_size.
struct AxisTable {
  int out_size = 0;
  int taps = 0;       // per output, zero padded: 2 or a multiple of 4 (horizontal kernel step)
  int src_first = 0;  // source range read by the taps: [src_first, src_last)
  int src_last = 0;
  std::vector<int> start;     // first source index per output pixel
  std::vector<int16_t> coef;  // out_size * taps
};

// Builds the table of one axis: the box [in0, in1) of an axis of in_size pixels to out_size
// outputs, taps clipped to the source range [clip0, clip1) (clip1 < 0: in_size), as the crop a
// torchvision op resizes (RandomResizedCrop resizes its crop; Resize + CenterCrop the whole image).
//   antialias (bilinear, bicubic): Pillow's precompute_coeffs, the triangle or a = -0.5 cubic filter
//     with its support scaled by the downscale factor (torchvision's PIL backend and antialias=True);
//   plain: torch's interpolate(align_corners=False, antialias=False): 2 taps, or 4 with A = -0.75;
//   nearest: PIL's NEAREST (antialias) or torch's "nearest" (plain), one tap.
void build_axis(double in0, double in1, int in_size, int out_size, AxisTable* t,
                Interpolation interp = Interpolation::kBilinear, bool antialias = true, int clip0 = 0, int clip1 = -1);

// The horizontal pass as a gather plan over the output row in 16-byte groups (see resize.cpp):
// for each group, the source pixel its one vector load starts at and, per pair of taps, the byte
// permutation that lays out that pair of samples for each output byte and the coefficient pair.
struct GroupPlan {
  int groups = 0;              // ceil(3 * out_w / 16)
  int pairs = 0;               // taps / 2
  std::vector<int> base;       // per group: first source pixel of its load (image coordinates)
  std::vector<uint8_t> index;  // groups * pairs * 64 permutation bytes (odd bytes unused)
  std::vector<int32_t> coef;   // groups * pairs * 16 coefficient pairs (low half: even tap)
};

// Receives decoded rows (RowSink), runs the horizontal pass on the rows the vertical pass needs,
// then finish() runs the vertical pass into the output slot.
class Resampler final : public RowSink {
 public:
  // Tables must outlive the decode; rows outside [yt->src_first, yt->src_last) are ignored.
  void setup(const AxisTable* xt, const AxisTable* yt, bool flip);
  void begin(int x_origin, int width) override;
  void rows(int y, const uint8_t* const* rgb, int count) override;
  // Vertical pass into one image of the batch, `slot`, in out's dtype and layout (output.h),
  // rows mirrored top to bottom when vflip.
  void finish(const OutputFormat& out, void* slot, bool vflip);
  // Rows received so far (all needed rows must have arrived before finish()).
  int rows_received() const { return rows_received_; }

 private:
  const AxisTable* xt_ = nullptr;
  const AxisTable* yt_ = nullptr;
  bool flip_ = false;
  int x_origin_ = 0;
  int rows_received_ = 0;
  size_t tmp_stride_ = 0;
  std::vector<int> rel_start_;
  bool grouped_ = false;  // plan_ is valid and the grouped kernel runs the horizontal pass
  GroupPlan plan_;
  std::vector<uint8_t> tmp_;   // intermediate packed RGB rows, out_w wide (+ kernel slack)
  std::vector<uint8_t> line_;  // one output row, packed RGB (NCHW and slot-end rows)
};

// Name of the resampling kernels in use ("avx512", "avx2", "ssse3" or "scalar").
const char* resize_kernel_name();

// Testing hook: use the "scalar", "ssse3", "avx2" or the "best" available kernels; false when the
// CPU lacks the requested set. All sets give identical bytes.
bool resize_force_kernels(const std::string& name);

}  // namespace fastload
