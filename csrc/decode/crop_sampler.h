// Augmentation stage (native side): the crop/flip sampler of the geometry ops.
//
// This is a line-for-line twin of fastload/transforms/geometry.py (_rrc_box, sample_params), drawing
// from the counter-based RNG (common/rng.h, twin of fastload/transforms/rng.py): same double
// arithmetic in the same order, round-half-even rounding (Python's round(), torchvision's choice;
// std::nearbyint under the default rounding mode), draw counters 4 * attempt + {0: area, 1: log-aspect, 2: y, 3: x},
// flip draw 40, vertical flip 41, the filter of a per-image choice 42. The Python tests check every box
// and flip the engine returns against transforms.sample_params.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/rng.h"
#include "fastload_abi.h"  // GeometryKind, GeometryParams (generated from fastload/engine_abi.py)

namespace fastload {

// A source box in float full-size pixel coordinates plus the flip decisions.
struct SampleBox {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  bool flip = false;
  bool vflip = false;
};

constexpr int kDrawsPerAttempt = 4;
constexpr int kMaxAttempts = 10;
constexpr int kFlipDraw = kDrawsPerAttempt * kMaxAttempts;  // 40
constexpr int kVFlipDraw = kFlipDraw + 1;                   // 41
constexpr int kInterpolationDraw = kVFlipDraw + 1;          // 42: which filter of a per-image choice
constexpr int kCropTopDraw = 0, kCropLeftDraw = 1;          // RandomCrop (torchvision draws i, then j)

// torchvision RandomResizedCrop sampling; returns an integer box (x, y, w, h).
inline void rrc_box(long long width, long long height, const GeometryParams& op, uint64_t key, long long* bx,
                    long long* by, long long* bw, long long* bh) {
  const double area = static_cast<double>(width * height);
  const double log_lo = std::log(op.ratio_lo), log_hi = std::log(op.ratio_hi);
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    const uint64_t c = static_cast<uint64_t>(attempt) * kDrawsPerAttempt;
    const double target_area = area * (op.scale_lo + (op.scale_hi - op.scale_lo) * uniform(key, c));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * uniform(key, c + 1));
    const long long w = round_half_even(std::sqrt(target_area * aspect));
    const long long h = round_half_even(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const long long y =
          std::min(static_cast<long long>(uniform(key, c + 2) * static_cast<double>(height - h + 1)), height - h);
      const long long x =
          std::min(static_cast<long long>(uniform(key, c + 3) * static_cast<double>(width - w + 1)), width - w);
      *bx = x, *by = y, *bw = w, *bh = h;
      return;
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  long long w, h;
  if (in_ratio < op.ratio_lo) {
    w = width;
    h = round_half_even(static_cast<double>(w) / op.ratio_lo);
  } else if (in_ratio > op.ratio_hi) {
    h = height;
    w = round_half_even(static_cast<double>(h) * op.ratio_hi);
  } else {
    w = width, h = height;
  }
  w = std::max(1LL, std::min(w, width));
  h = std::max(1LL, std::min(h, height));
  *bx = (width - w) / 2, *by = (height - h) / 2, *bw = w, *bh = h;
}

// The source box and flip for one sample of a width x height image (transforms.sample_params).
inline SampleBox sample_box(long long width, long long height, const GeometryParams& op, uint64_t key) {
  SampleBox b;
  const double W = static_cast<double>(width), H = static_cast<double>(height);
  const int out_h = op.out_h, out_w = op.out_w;
  if (op.kind == GeometryKind::kRandomResizedCrop) {
    long long x, y, w, h;
    rrc_box(width, height, op, key, &x, &y, &w, &h);
    b.x0 = static_cast<double>(x), b.y0 = static_cast<double>(y);
    b.x1 = static_cast<double>(x + w), b.y1 = static_cast<double>(y + h);
  } else if (op.kind == GeometryKind::kResizeCenterCrop) {
    if (op.resize == 0) {
      const double s = std::min(W / out_w, H / out_h);
      const double w = out_w * s, h = out_h * s;
      b.x0 = (W - w) / 2.0, b.y0 = (H - h) / 2.0, b.x1 = (W + w) / 2.0, b.y1 = (H + h) / 2.0;
    } else {
      long long new_w, new_h;
      // Python: int(resize * height / width): an exact integer product, then a correctly rounded
      // double division, then truncation.
      if (width <= height) {
        new_w = op.resize;
        new_h = static_cast<long long>(static_cast<double>(static_cast<long long>(op.resize) * height) / W);
      } else {
        new_w = static_cast<long long>(static_cast<double>(static_cast<long long>(op.resize) * width) / H);
        new_h = op.resize;
      }
      const double s = W / static_cast<double>(new_w);
      const double sy = H / static_cast<double>(new_h);
      const long long left = round_half_even(static_cast<double>(new_w - out_w) / 2.0);
      const long long top = round_half_even(static_cast<double>(new_h - out_h) / 2.0);
      b.x0 = static_cast<double>(left) * s, b.y0 = static_cast<double>(top) * sy;
      b.x1 = static_cast<double>(left + out_w) * s, b.y1 = static_cast<double>(top + out_h) * sy;
    }
  } else {
    b.x0 = 0.0, b.y0 = 0.0, b.x1 = W, b.y1 = H;
  }
  b.flip = uniform(key, kFlipDraw) < op.flip;
  b.vflip = uniform(key, kVFlipDraw) < op.vflip;
  return b;
}

// The op with the filter of one sample filled in (transforms.sample_interpolation): its own, or for a
// per-image choice (timm's interpolation='random') the first filter when draw 42 < 0.5, else the second.
inline GeometryParams with_sample_interpolation(const GeometryParams& op, uint64_t key) {
  GeometryParams out = op;
  if (op.random_interpolation) {
    out.interpolation = uniform(key, kInterpolationDraw) < 0.5 ? op.interpolation : op.interpolation2;
    out.random_interpolation = false;
  }
  return out;
}

// RandomCrop (torchvision): pad by the op's padding, then (pad_if_needed) by the shortfall on both
// sides, then an unscaled window drawn uniformly. geometry.py's random_crop_window is its twin.
struct CropWindow {
  bool fits = false;    // false: the padded image is smaller than the crop
  long long pad_x = 0;  // pad_if_needed's padding, on each side
  long long pad_y = 0;
  long long top = 0;  // the window in the twice-padded image
  long long left = 0;
  SampleBox box;  // the window in original-image coordinates, and the flips
};

inline CropWindow random_crop_window(long long width, long long height, const GeometryParams& op, uint64_t key) {
  CropWindow c;
  const long long w1 = width + op.pad_left + op.pad_right, h1 = height + op.pad_top + op.pad_bottom;
  c.pad_x = op.pad_if_needed && w1 < op.out_w ? op.out_w - w1 : 0;
  c.pad_y = op.pad_if_needed && h1 < op.out_h ? op.out_h - h1 : 0;
  const long long w2 = w1 + 2 * c.pad_x, h2 = h1 + 2 * c.pad_y;
  if (w2 < op.out_w || h2 < op.out_h) return c;
  c.fits = true;
  c.top = std::min(static_cast<long long>(uniform(key, kCropTopDraw) * static_cast<double>(h2 - op.out_h + 1)),
                   h2 - op.out_h);
  c.left = std::min(static_cast<long long>(uniform(key, kCropLeftDraw) * static_cast<double>(w2 - op.out_w + 1)),
                    w2 - op.out_w);
  const long long x0 = c.left - c.pad_x - op.pad_left, y0 = c.top - c.pad_y - op.pad_top;
  c.box.x0 = static_cast<double>(x0), c.box.y0 = static_cast<double>(y0);
  c.box.x1 = static_cast<double>(x0 + op.out_w), c.box.y1 = static_cast<double>(y0 + op.out_h);
  c.box.flip = uniform(key, kFlipDraw) < op.flip;
  c.box.vflip = uniform(key, kVFlipDraw) < op.vflip;
  return c;
}

}  // namespace fastload
