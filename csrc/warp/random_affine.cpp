// Augmentation stage (native): RandomAffine sampling and plan (see random_affine.h).
#include "warp/random_affine.h"

#include <cmath>

#include "common/rng.h"

namespace fastload {

namespace {

inline double between(double lo, double hi, double u) { return lo + (hi - lo) * u; }

// Python's math.radians: x * (pi / 180).
inline double radians(double x) { return x * (3.14159265358979323846 / 180.0); }

}  // namespace

AffineParams sample_affine(const AffineSpec& s, int width, int height, uint64_t key) {
  const uint64_t c = kAffineCounter;
  AffineParams p;
  p.angle = between(s.degrees_lo, s.degrees_hi, uniform(key, c));
  if (s.has_translate) {
    const double max_dx = s.translate_x * width, max_dy = s.translate_y * height;
    p.tx = round_half_even(between(-max_dx, max_dx, uniform(key, c + 1)));
    p.ty = round_half_even(between(-max_dy, max_dy, uniform(key, c + 2)));
  }
  if (s.has_scale) p.scale = between(s.scale_lo, s.scale_hi, uniform(key, c + 3));
  if (s.shear_count > 0) {
    p.shear_x = between(s.shear[0], s.shear[1], uniform(key, c + 4));
    if (s.shear_count == 4) p.shear_y = between(s.shear[2], s.shear[3], uniform(key, c + 5));
  }
  return p;
}

Affine2 inverse_affine_matrix(const AffineParams& p, double cx, double cy) {
  const double rot = radians(p.angle), sx = radians(p.shear_x), sy = radians(p.shear_y);
  const double tx = static_cast<double>(p.tx), ty = static_cast<double>(p.ty);
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  double m[6] = {d / p.scale, -b / p.scale, 0.0, -c / p.scale, a / p.scale, 0.0};
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  Affine2 r;
  r.a = m[0], r.b = m[1], r.c = m[2], r.d = m[3], r.e = m[4], r.f = m[5];
  return r;
}

WarpPlan affine_plan(const AffineSpec& s, const double box[4], bool flip, int out_h, int out_w, uint64_t key,
                     WarpKernel crop_kernel, bool crop_antialias, AffineParams* params) {
  *params = sample_affine(s, out_w, out_h, key);
  const double cx = s.has_center ? s.center_x : out_w * 0.5, cy = s.has_center ? s.center_y : out_h * 0.5;
  WarpPlan p;
  p.out_h = out_h, p.out_w = out_w;
  p.to_frame = inverse_affine_matrix(*params, cx, cy);
  p.has_frame = true;
  p.frame[0] = 0.0, p.frame[1] = 0.0, p.frame[2] = static_cast<double>(out_w), p.frame[3] = static_cast<double>(out_h);
  const double sx = (box[2] - box[0]) / out_w, sy = (box[3] - box[1]) / out_h;
  if (flip) {
    p.to_source.a = -sx, p.to_source.b = 0.0, p.to_source.c = box[0] + out_w * sx;
  } else {
    p.to_source.a = sx, p.to_source.b = 0.0, p.to_source.c = box[0];
  }
  p.to_source.d = 0.0, p.to_source.e = sy, p.to_source.f = box[1];
  p.scale_x = sx, p.scale_y = sy;
  p.snap = s.kernel == WarpKernel::kNearest;
  p.kernel = p.snap ? crop_kernel : s.kernel;
  p.antialias = crop_antialias;
  p.border = WarpBorder::kDrop;
  p.fill[0] = s.fill[0], p.fill[1] = s.fill[1], p.fill[2] = s.fill[2];
  p.dct_scaling = crop_antialias && p.kernel != WarpKernel::kNearest;
  return p;
}

}  // namespace fastload
