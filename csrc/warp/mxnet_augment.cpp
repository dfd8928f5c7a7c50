// Augmentation stage (native): MXNet's default augmenter geometry (see mxnet_augment.h).
#include "warp/mxnet_augment.h"

#include <algorithm>
#include <cmath>

#include "common/rng.h"

namespace fastload {

namespace {

// Counter layout (fastload/transforms/mxnet_augment.py).
constexpr uint64_t kInter = 0;  // + step: 0 resize, 1 warp, 2 crop
constexpr uint64_t kShear = 3, kAngle = 4, kScale = 5, kRatio = 6, kCropSize = 7, kCropY = 8, kCropX = 9;
constexpr uint64_t kRrc = 10, kRrcDraws = 5;
constexpr int kRrcAttempts = 10;
constexpr uint64_t kMirror = 60;

// DefaultImageAugmenter::GetInterMethod.
int inter_method(const MXNetAugmentSpec& s, int old_w, int old_h, int new_w, int new_h, uint64_t key, int step) {
  if (s.inter_method == 9) {
    if (new_w > old_w && new_h > old_h) return 2;
    if (new_w < old_w && new_h < old_h) return 3;
    return 1;
  }
  if (s.inter_method == 10) return uniform_int(key, kInter + static_cast<uint64_t>(step), 0, 4);
  return s.inter_method;
}

Affine2 affine(double a, double b, double c, double d, double e, double f) {
  Affine2 m;
  m.a = a, m.b = b, m.c = c, m.d = d, m.e = e, m.f = f;
  return m;
}

// cv::resize, dst -> src in Pillow's coordinates: src = dst * scale, scale = 1 / (dst / src).
Affine2 resize_map(int src_w, int src_h, int dst_w, int dst_h) {
  return affine(1.0 / (static_cast<double>(dst_w) / src_w), 0.0, 0.0, 0.0, 1.0 / (static_cast<double>(dst_h) / src_h),
                0.0);
}

WarpKernel kernel_of(int method) {
  switch (method) {
    case 0: return WarpKernel::kNearest;
    case 2: return WarpKernel::kCubicCv;
    case 3: return WarpKernel::kArea;
    case 4: return WarpKernel::kLanczos4;
    default: return WarpKernel::kLinear;
  }
}

void aspect_range(const MXNetAugmentSpec& s, float* lo, float* hi) {
  if (s.has_min_aspect_ratio) {
    *lo = s.min_aspect_ratio, *hi = s.max_aspect_ratio;
  } else {
    *lo = 1.0f - s.max_aspect_ratio, *hi = 1.0f + s.max_aspect_ratio;
  }
}

bool has_warp(const MXNetAugmentSpec& s) {
  float lo, hi;
  aspect_range(s, &lo, &hi);
  return s.max_rotate_angle > 0 || s.max_shear_ratio > 0.0f || s.rotate > 0 || s.max_random_scale != 1.0f ||
         s.min_random_scale != 1.0 || (!s.random_resized_crop && (lo != 1.0f || hi != 1.0f)) ||
         s.max_img_size != 1e10f || s.min_img_size != 0.0f;
}

}  // namespace

void mxnet_params_values(const MXNetParams& p, double out[kMXNetParamCount]) {
  const double v[kMXNetParamCount] = {
      double(p.resized_w),    double(p.resized_h),  double(p.angle),     double(p.shear),    double(p.scale),
      double(p.ratio),        double(p.warped_w),   double(p.warped_h),  double(p.crop_x),   double(p.crop_y),
      double(p.crop_w),       double(p.crop_h),     double(p.scaled_w),  double(p.scaled_h), p.mirror ? 1.0 : 0.0,
      double(p.inter_resize), double(p.inter_warp), double(p.inter_crop)};
  std::copy(v, v + kMXNetParamCount, out);
}

namespace {

// Where a window starts in the room left around it (spare_x, spare_y >= 0): drawn with rand_crop
// (y first, as MXNet), else centred with MXNet's floor division.
void window_origin(const MXNetAugmentSpec& s, uint64_t key, int spare_x, int spare_y, int* x, int* y) {
  if (s.rand_crop) {
    *y = uniform_int(key, kCropY, 0, spare_y);
    *x = uniform_int(key, kCropX, 0, spare_x);
  } else {
    *y = spare_y / 2, *x = spare_x / 2;
  }
}

}  // namespace

bool mxnet_plan(const MXNetAugmentSpec& s, int width, int height, uint64_t key, WarpPlan* plan, MXNetParams* out,
                std::string* error) {
  const int dh = s.out_h, dw = s.out_w;
  int cols = width, rows = height;
  MXNetParams prm;
  Affine2 to_warped;  // warped-image point -> source point

  if (s.resize != -1) {
    int new_h, new_w;
    if (rows > cols) {
      new_h = static_cast<int>(static_cast<long long>(s.resize) * rows / cols), new_w = s.resize;
    } else {
      new_h = s.resize, new_w = static_cast<int>(static_cast<long long>(s.resize) * cols / rows);
    }
    prm.inter_resize = inter_method(s, cols, rows, new_w, new_h, key, 0);
    to_warped = resize_map(cols, rows, new_w, new_h);
    cols = new_w, rows = new_h;
  }
  prm.resized_w = cols, prm.resized_h = rows;

  if (has_warp(s)) {
    const float max_shear = s.max_shear_ratio;
    const float sh = uniform_float32(key, kShear) * max_shear * 2.0f - max_shear;
    int angle = uniform_int(key, kAngle, -s.max_rotate_angle, s.max_rotate_angle);
    if (s.rotate > 0) angle = s.rotate;
    const float a = static_cast<float>(std::cos(angle / 180.0 * 3.14159265358979323846));
    const float b = static_cast<float>(std::sin(angle / 180.0 * 3.14159265358979323846));
    float sc = 1.0f, rt = 1.0f;
    if (!s.random_resized_crop) {
      sc = uniform_float32(key, kScale) * (s.max_random_scale - s.min_random_scale) + s.min_random_scale;
      float lo, hi;
      aspect_range(s, &lo, &hi);
      rt = uniform_float32(key, kRatio) * (hi - lo) + lo;
    }
    const float hs = 2.0f * sc / (1.0f + rt);
    const float ws = rt * hs;
    const float new_width = std::max(s.min_img_size, std::min(s.max_img_size, sc * static_cast<float>(cols)));
    const float new_height = std::max(s.min_img_size, std::min(s.max_img_size, sc * static_cast<float>(rows)));
    const float m00 = hs * a - sh * b * ws;
    const float m10 = -b * ws;
    const float m01 = hs * b + sh * a * ws;
    const float m11 = a * ws;
    const float ori_w = m00 * static_cast<float>(cols) + m01 * static_cast<float>(rows);
    const float ori_h = m10 * static_cast<float>(cols) + m11 * static_cast<float>(rows);
    const float m02 = (new_width - ori_w) / 2.0f;
    const float m12 = (new_height - ori_h) / 2.0f;
    if (!(new_width >= 1.0f && new_height >= 1.0f && new_width < 65536.0f && new_height < 65536.0f)) {
      *error = "the affine warp makes the " + std::to_string(cols) + "x" + std::to_string(rows) + " image " +
               std::to_string(new_width) + "x" + std::to_string(new_height) + " (sizes must be in 1..65535)";
      return false;
    }
    const int warped_w = static_cast<int>(new_width), warped_h = static_cast<int>(new_height);
    prm.inter_warp = inter_method(s, cols, rows, warped_w, warped_h, key, 1);
    // cv::invertAffineTransform in double, then OpenCV's centred coordinates -> Pillow's.
    const double d00 = m00, d01 = m01, d02 = m02, d10 = m10, d11 = m11, d12 = m12;
    double det = d00 * d11 - d01 * d10;
    det = det != 0.0 ? 1.0 / det : 0.0;
    const double i00 = d11 * det, i11 = d00 * det, i01 = -d01 * det, i10 = -d10 * det;
    const double ib0 = -i00 * d02 - i01 * d12, ib1 = -i10 * d02 - i11 * d12;
    const Affine2 inv = affine(i00, i01, ib0 - 0.5 * (i00 + i01) + 0.5, i10, i11, ib1 - 0.5 * (i10 + i11) + 0.5);
    to_warped = compose(to_warped, inv);
    prm.angle = angle, prm.shear = sh, prm.scale = sc, prm.ratio = rt;
    cols = warped_w, rows = warped_h;
  }
  prm.warped_w = cols, prm.warped_h = rows;

  const int pad = s.pad;
  cols += 2 * pad, rows += 2 * pad;
  prm.scaled_w = cols, prm.scaled_h = rows;
  Affine2 to_padded;  // output point -> padded-image point
  int crop[4] = {0, 0, 0, 0};
  bool resampled = false;
  if (s.random_resized_crop) {
    const float lo_a = s.min_random_area, hi_a = s.max_random_area;
    float lo_r, hi_r;
    aspect_range(s, &lo_r, &hi_r);
    if (hi_a != 1.0f || lo_a != 1.0f || hi_r != 1.0f || lo_r != 1.0f) {
      const float area = static_cast<float>(static_cast<long long>(rows) * cols);
      for (int attempt = 0; attempt < kRrcAttempts; ++attempt) {
        const uint64_t c = kRrc + kRrcDraws * static_cast<uint64_t>(attempt);
        const float rand_area = uniform_float32(key, c) * (hi_a - lo_a) + lo_a;
        const float r = uniform_float32(key, c + 1) * (hi_r - lo_r) + lo_r;
        const float target = area * rand_area;
        int y_area = static_cast<int>(std::round(std::sqrt(target / r)));
        int x_area = static_cast<int>(std::round(std::sqrt(target * r)));
        if (uniform_float32(key, c + 2) > 0.5f) std::swap(x_area, y_area);
        if (1 <= y_area && y_area <= rows && 1 <= x_area && x_area <= cols) {
          const int y = uniform_int(key, c + 3, 0, rows - y_area);
          const int x = uniform_int(key, c + 4, 0, cols - x_area);
          crop[0] = x, crop[1] = y, crop[2] = x_area, crop[3] = y_area;
          prm.inter_crop = inter_method(s, x_area, y_area, dw, dh, key, 2);
          resampled = true;
          break;
        }
      }
    }
  } else if (s.max_crop_size != -1 || s.min_crop_size != -1) {
    if (cols < s.max_crop_size || rows < s.max_crop_size) {
      *error = "the image is " + std::to_string(cols) + "x" + std::to_string(rows) +
               " after resize, warp and pad, smaller than max_crop_size=" + std::to_string(s.max_crop_size);
      return false;
    }
    const int size = uniform_int(key, kCropSize, s.min_crop_size, s.max_crop_size);
    int x, y;
    window_origin(s, key, cols - size, rows - size, &x, &y);
    crop[0] = x, crop[1] = y, crop[2] = size, crop[3] = size;
    prm.inter_crop = inter_method(s, size, size, dw, dh, key, 2);
    resampled = true;
  }
  if (crop[2] > 0) {
    to_padded = affine(1.0 / (static_cast<double>(dw) / crop[2]), 0.0, static_cast<double>(crop[0]), 0.0,
                       1.0 / (static_cast<double>(dh) / crop[3]), static_cast<double>(crop[1]));
  } else {
    prm.inter_crop = inter_method(s, cols, rows, dw, dh, key, 2);
    if (rows < dh) {
      const int new_cols =
          static_cast<int>(static_cast<float>(dh) / static_cast<float>(rows) * static_cast<float>(cols));
      to_padded = compose(to_padded, resize_map(cols, rows, new_cols, dh));
      cols = new_cols, rows = dh;
      resampled = true;
    }
    if (cols < dw) {
      const int new_rows =
          static_cast<int>(static_cast<float>(dw) / static_cast<float>(cols) * static_cast<float>(rows));
      to_padded = compose(to_padded, resize_map(cols, rows, dw, new_rows));
      cols = dw, rows = new_rows;
      resampled = true;
    }
    if (cols < dw || rows < dh) {
      *error = "the image is " + std::to_string(cols) + "x" + std::to_string(rows) + " after scaling, smaller than " +
               std::to_string(dw) + "x" + std::to_string(dh);
      return false;
    }
    prm.scaled_w = cols, prm.scaled_h = rows;
    int x, y;
    window_origin(s, key, cols - dw, rows - dh, &x, &y);
    crop[0] = x, crop[1] = y, crop[2] = dw, crop[3] = dh;
    to_padded = compose(to_padded, affine(1.0, 0.0, static_cast<double>(x), 0.0, 1.0, static_cast<double>(y)));
  }
  prm.crop_x = crop[0], prm.crop_y = crop[1], prm.crop_w = crop[2], prm.crop_h = crop[3];

  prm.mirror = (s.rand_mirror && uniform(key, kMirror) < 0.5) || s.mirror;
  Affine2 to_frame =
      compose(affine(1.0, 0.0, -static_cast<double>(pad), 0.0, 1.0, -static_cast<double>(pad)), to_padded);
  if (prm.mirror) to_frame = compose(to_frame, affine(-1.0, 0.0, static_cast<double>(dw), 0.0, 1.0, 0.0));

  int method;
  if (resampled) {
    method = prm.inter_crop;
  } else if (prm.inter_warp != -1) {
    method = prm.inter_warp;
  } else if (prm.inter_resize != -1) {
    method = prm.inter_resize;
  } else {
    method = 1;  // a plain window copy: the sampling points are pixel centres
  }
  const bool warp_last = prm.inter_warp != -1 && !resampled;
  if (warp_last && method == 3) method = 1;  // cv::warpAffine has no area mode: OpenCV uses bilinear
  const Affine2 composite = compose(to_warped, to_frame);
  const double sx = std::fabs(composite.a) + std::fabs(composite.b),
               sy = std::fabs(composite.d) + std::fabs(composite.e);

  WarpPlan p;
  p.out_h = dh, p.out_w = dw;
  p.to_frame = to_frame;
  p.has_frame = true;
  p.frame[0] = 0.0, p.frame[1] = 0.0, p.frame[2] = static_cast<double>(prm.warped_w);
  p.frame[3] = static_cast<double>(prm.warped_h);
  p.snap = false;
  p.to_source = to_warped;
  p.scale_x = sx, p.scale_y = sy;
  p.kernel = kernel_of(method);
  p.antialias = false;
  p.shift_x = warp_last ? 0.0 : -sx / 2.0;
  p.shift_y = warp_last ? 0.0 : -sy / 2.0;
  p.border = (prm.inter_warp != -1 || pad > 0) ? WarpBorder::kConstant : WarpBorder::kReplicate;
  p.fill[0] = p.fill[1] = p.fill[2] = static_cast<uint8_t>(s.fill_value);
  // No DCT-domain downscaling: libjpeg's scaled IDCT is no area average, and MXNet decodes at full
  // size (measured with inter_method=9 shrinking ~3x: mean 3.0, max 50 grey levels from MXNet's
  // pixels with it, 0 without).
  p.dct_scaling = false;
  p.quantize = warp_last && s.resize == -1;
  *plan = p;
  *out = prm;
  return true;
}

}  // namespace fastload
