// Pixels stage (native): the policies' geometric ops (ShearX/Y, TranslateX/Y, Rotate) as Pillow runs
// them on the output-sized image: Image.transform(AFFINE) with NEAREST (16.16 fixed point when the
// corners fit, the pure-translation fast path, else double stepping) or BILINEAR (per pixel in
// double, edge-clamped neighbours, truncated), the uncovered area left at the fill colour; and
// Image.transpose for the multiples of 90 degrees that Image.rotate maps to transposes.
#include "fp_exact.h"  // first: no fused multiply-add
#include <algorithm>
#include <cmath>
#include <cstring>

#include "pixel_color.h"

namespace fastload {
namespace pixel {
namespace {

inline int coord(double v) { return v < 0.0 ? -1 : static_cast<int>(v); }           // Pillow's COORD
inline int floor_int(double v) { return v < 0.0 ? static_cast<int>(std::floor(v)) : static_cast<int>(v); }  // FLOOR

void fill_image(uint8_t* rgb, size_t pixels, const uint8_t fill[3]) {
  if (fill[0] == fill[1] && fill[1] == fill[2]) {
    std::memset(rgb, fill[0], pixels * 3);
    return;
  }
  for (size_t i = 0; i < pixels; ++i) std::memcpy(rgb + 3 * i, fill, 3);
}

inline void put(uint8_t* dst, const uint8_t* src) { dst[0] = src[0], dst[1] = src[1], dst[2] = src[2]; }

void nearest_scale(const uint8_t* in, uint8_t* out, int h, int w, const double* a) {
  // ImagingScaleAffine: a[1] == a[3] == 0.
  std::vector<int> xin(static_cast<size_t>(w));
  double xo = a[2] + a[0] * 0.5;
  double yo = a[5] + a[4] * 0.5;
  int xmin = w, xmax = 0;
  for (int x = 0; x < w; ++x) {
    const int xi = coord(xo);
    if (xi >= 0 && xi < w) {
      xmax = x + 1;
      if (x < xmin) xmin = x;
      xin[x] = xi;
    }
    xo += a[0];
  }
  const size_t stride = static_cast<size_t>(w) * 3;
  for (int y = 0; y < h; ++y) {
    const int yi = coord(yo);
    if (yi >= 0 && yi < h) {
      const uint8_t* row = in + yi * stride;
      uint8_t* o = out + y * stride;
      for (int x = xmin; x < xmax; ++x) put(o + 3 * x, row + 3 * xin[x]);
    }
    yo += a[4];
  }
}

bool fits_fixed(const double* a, int x, int y) {
  return std::fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && std::fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

void nearest_fixed(const uint8_t* in, uint8_t* out, int h, int w, const double* a) {
  // affine_fixed: 16.16 fixed point, FIX(v) = FLOOR(v * 65536 + 0.5).
  auto fix = [](double v) { return floor_int(v * 65536.0 + 0.5); };
  const int a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
  int a2 = fix(a[2] + a[0] * 0.5 + a[1] * 0.5);
  int a5 = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
  const size_t stride = static_cast<size_t>(w) * 3;
  for (int y = 0; y < h; ++y) {
    int xx = a2, yy = a5;
    uint8_t* o = out + y * stride;
    for (int x = 0; x < w; ++x) {
      const int xi = xx >> 16;
      if (xi >= 0 && xi < w) {
        const int yi = yy >> 16;
        if (yi >= 0 && yi < h) put(o + 3 * x, in + yi * stride + 3 * xi);
      }
      xx += a0;
      yy += a3;
    }
    a2 += a1;
    a5 += a4;
  }
}

void nearest_double(const uint8_t* in, uint8_t* out, int h, int w, const double* a) {
  double xo = a[2] + a[1] * 0.5 + a[0] * 0.5;
  double yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
  const size_t stride = static_cast<size_t>(w) * 3;
  for (int y = 0; y < h; ++y) {
    double xx = xo, yy = yo;
    uint8_t* o = out + y * stride;
    for (int x = 0; x < w; ++x) {
      const int xi = coord(xx);
      if (xi >= 0 && xi < w) {
        const int yi = coord(yy);
        if (yi >= 0 && yi < h) put(o + 3 * x, in + yi * stride + 3 * xi);
      }
      xx += a[0];
      yy += a[3];
    }
    xo += a[1];
    yo += a[4];
  }
}

void bilinear(const uint8_t* in, uint8_t* out, int h, int w, const double* a) {
  // ImagingGenericTransform(affine_transform, bilinear_filter32RGB).
  const size_t stride = static_cast<size_t>(w) * 3;
  for (int y = 0; y < h; ++y) {
    uint8_t* o = out + y * stride;
    const double yc = y + 0.5;
    for (int x = 0; x < w; ++x) {
      const double xc = x + 0.5;
      double xin = a[0] * xc + a[1] * yc + a[2];
      double yin = a[3] * xc + a[4] * yc + a[5];
      if (xin < 0.0 || xin >= w || yin < 0.0 || yin >= h) continue;
      xin -= 0.5;
      yin -= 0.5;
      const int xi = floor_int(xin), yi = floor_int(yin);
      const double dx = xin - xi, dy = yin - yi;
      const int x0 = std::max(0, std::min(w - 1, xi)), x1 = std::max(0, std::min(w - 1, xi + 1));
      const uint8_t* r0 = in + std::max(0, std::min(h - 1, yi)) * stride;
      const bool has_r1 = yi + 1 >= 0 && yi + 1 < h;
      const uint8_t* r1 = in + (yi + 1) * stride;
      for (int b = 0; b < 3; ++b) {
        double v1 = r0[3 * x0 + b] + (r0[3 * x1 + b] - r0[3 * x0 + b]) * dx;
        double v2 = v1;
        if (has_r1) v2 = r1[3 * x0 + b] + (r1[3 * x1 + b] - r1[3 * x0 + b]) * dx;
        v1 = v1 + (v2 - v1) * dy;
        o[3 * x + b] = static_cast<uint8_t>(v1);
      }
    }
  }
}

}  // namespace

void warp(uint8_t* rgb, int h, int w, const double plan[7], bool bilinear_mode, const uint8_t fill[3],
          std::vector<uint8_t>* scratch) {
  const int mode = static_cast<int>(plan[0]);
  if (mode == 1 || h <= 0 || w <= 0) return;  // identity
  const size_t pixels = static_cast<size_t>(h) * static_cast<size_t>(w);
  scratch->resize(pixels * 3);
  uint8_t* src = scratch->data();
  std::memcpy(src, rgb, pixels * 3);
  const size_t stride = static_cast<size_t>(w) * 3;
  if (mode == 2 || mode == 3 || mode == 4) {
    // Transposes (square images for the quarter turns): ROTATE_90 is counter-clockwise.
    for (int y = 0; y < h; ++y) {
      uint8_t* o = rgb + y * stride;
      for (int x = 0; x < w; ++x) {
        const uint8_t* p;
        if (mode == 2)
          p = src + x * stride + 3 * (w - 1 - y);
        else if (mode == 3)
          p = src + (h - 1 - y) * stride + 3 * (w - 1 - x);
        else
          p = src + (h - 1 - x) * stride + 3 * y;
        put(o + 3 * x, p);
      }
    }
    return;
  }
  const double* a = plan + 1;
  fill_image(rgb, pixels, fill);
  if (bilinear_mode) {
    bilinear(src, rgb, h, w, a);
  } else if (a[1] == 0.0 && a[3] == 0.0) {
    nearest_scale(src, rgb, h, w, a);
  } else if (fits_fixed(a, 0, 0) && fits_fixed(a, w, h) && fits_fixed(a, 0, h) && fits_fixed(a, w, 0)) {
    nearest_fixed(src, rgb, h, w, a);
  } else {
    nearest_double(src, rgb, h, w, a);
  }
}

}  // namespace pixel
}  // namespace fastload
