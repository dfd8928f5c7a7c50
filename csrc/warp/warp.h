// Pixels stage (native): the one-pass warp resampler for geometries with rotation, shear or scale.
//
// A WarpPlan says, for one sample, where each output pixel's centre lands in the decoded image and
// how it is sampled there: a first affine map to the "frame" (the intermediate image a two-pass
// pipeline would have made: torchvision's resized crop before RandomAffine, MXNet's image after its
// resize and warp, before pad; points outside it get the fill colour; optionally snapped to the
// centre of their frame pixel), a second affine map to the source position, then a separable kernel
// (bilinear / bicubic (Pillow's or OpenCV's) / Lanczos-4 / area / nearest, optionally widened by the
// downscale factor as Pillow's antialiased resize) with a border rule for taps outside the image.
// fastload/transforms/warp.py is the reference this file reproduces bit for bit: positions to
// 1/256 pixel; plain bilinear as 8-bit integer weights; the other kernels tabulated per phase (the
// weights computed once per plan and axis, not per pixel), 14-bit weights, integer accumulation.
//
// The engine decodes only the source rectangle a plan reads (warp_source_rect), at a DCT scale when
// the plan allows it, into a per-thread RegionBuffer, then warp_region writes the output-sized HWC
// image. Plain C++: no pybind11, no exceptions thrown through libjpeg (RegionBuffer::begin / rows
// never allocate: reserve() does, before the decode starts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode/jpeg_decode.h"
#include "fastload_abi.h"  // Affine2, WarpKernel, WarpBorder, WarpPlan

namespace fastload {

// Affine2 (x' = a x + b y + c, y' = d x + e y + f), WarpKernel, WarpBorder and WarpPlan come from
// fastload/engine_abi.py (generated into fastload_abi.h; fastload/transforms/warp.py uses the same).

// outer after inner.
Affine2 compose(const Affine2& outer, const Affine2& inner);

// Added to NEAREST positions (warp.py's NEAREST_EPSILON).
constexpr double kNearestEpsilon = 1e-6;

// DCT scale denominator (1, 2, 4 or 8) for a plan: the rule of the crop path (jpeg_decode.h's
// dct_scale_denom of the plan's smaller shrink), when plan.dct_scaling and `enabled`.
int warp_denom(const WarpPlan& plan, bool enabled);

// Source rectangle [x0, x1) x [y0, y1) of the image decoded at 1/denom (scaled_w x scaled_h) that
// the plan's taps can read; never empty (at least one pixel, so the decode still validates the image).
struct SourceRect {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};
SourceRect warp_source_rect(const WarpPlan& plan, int denom, int scaled_w, int scaled_h);

// Decoded rows of an image at 1/denom: columns [x0, x0 + width), rows [y0, y0 + height).
struct SourceRegion {
  const uint8_t* data = nullptr;
  size_t stride = 0;  // bytes between rows
  int x0 = 0, y0 = 0, width = 0, height = 0;
  int image_w = 0, image_h = 0;  // the scaled image's size (border rules apply at its edges)
  int denom = 1;
};

// Per-thread scratch of warp_region (tap weights), reused across images.
struct WarpScratch {
  std::vector<int32_t> tx, ty;  // renormalised weights of one position (DROP at the image edge)
  std::vector<double> td;
  std::vector<double> cu, cv;  // per-column terms of separable plans
  std::vector<long long> cqx, cqy;
  std::vector<uint8_t> cok;
  std::vector<int> gx;      // per-column first tap (or position) of grid plans
  std::vector<int32_t> gw;  // per-column tap weights of grid plans
  // Plain bilinear, one output row: each pixel's position (1/256 pixel) and, for pixels whose four
  // taps lie inside the region, the byte offset of the top-left tap (-1 otherwise; -2: fill).
  std::vector<int32_t> bq, bqy, boff;
};

// Evaluates the plan into dst: out_h rows of out_w RGB pixels, dst_stride bytes apart.
void warp_region(const WarpPlan& plan, const SourceRegion& src, uint8_t* dst, size_t dst_stride, WarpScratch* scratch);

// A snapped plan whose frame is an image already made (the resized crop: frame_w x frame_h RGB
// pixels, frame_stride bytes apart; the frame rectangle starts at 0): each output pixel copies the
// frame pixel its frame point falls in, or gets fill.
void warp_gather(const WarpPlan& plan, const uint8_t* frame_img, size_t frame_stride, int frame_w, int frame_h,
                 uint8_t* dst, size_t dst_stride);

// Collects the decoded rows of a region (a RowSink for JpegDecoder::decode_region).
class RegionBuffer final : public RowSink {
 public:
  // Makes room for `rows` rows starting at row y0 of an image `max_width` pixels wide; call before
  // decode_region (begin / rows never allocate, so nothing can throw inside the decoder).
  void reserve(int y0, int rows, int max_width);
  void begin(int x_origin, int width) override;
  void rows(int y, const uint8_t* const* rgb, int count) override;
  int rows_received() const { return received_; }
  // The collected rows as a region of an image_w x image_h image decoded at 1/denom.
  SourceRegion region(int image_w, int image_h, int denom) const;

 private:
  std::vector<uint8_t> data_;
  size_t stride_ = 0;
  int y0_ = 0, rows_ = 0, x_origin_ = 0, width_ = 0, received_ = 0;
};

}  // namespace fastload
