// Pixels stage (native): the policies' geometric ops (ShearX/Y, TranslateX/Y, Rotate) as Pillow runs
// them on the output-sized image: Image.transform(AFFINE) with NEAREST (16.16 fixed point when the
// corners fit, the pure-translation fast path, else double stepping), BILINEAR (per pixel in
// double, edge-clamped neighbours, truncated) or BICUBIC (Pillow's a = -1 cubic, clipped and
// truncated), the uncovered area left at the fill colour; and
// Image.transpose for the multiples of 90 degrees that Image.rotate maps to transposes.
#include "common/fp_exact.h"  // first: no fused multiply-add
#include <algorithm>
#include <cmath>
#include <cstring>

#include "pixel/pixel_color.h"
#include "pixel/pixel_ops.h"
#include "pixel/pixel_kernels.h"

namespace fastload {
namespace pixel {
namespace {

inline int coord(double v) { return v < 0.0 ? -1 : static_cast<int>(v); }  // Pillow's COORD
inline int coord_floor(double v) { return v < 0.0 ? static_cast<int>(std::floor(v)) : static_cast<int>(v); }  // FLOOR

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
  // Translations (the policies' TranslateX/Y) step by exactly one source pixel: whole spans.
  bool contiguous = xmax > xmin;
  for (int x = xmin + 1; x < xmax && contiguous; ++x) contiguous = xin[x] == xin[x - 1] + 1;
  for (int y = 0; y < h; ++y) {
    const int yi = coord(yo);
    if (yi >= 0 && yi < h) {
      const uint8_t* row = in + yi * stride;
      uint8_t* o = out + y * stride;
      if (contiguous)
        std::memcpy(o + 3 * xmin, row + 3 * xin[xmin], 3 * static_cast<size_t>(xmax - xmin));
      else
        for (int x = xmin; x < xmax; ++x) put(o + 3 * x, row + 3 * xin[x]);
    }
    yo += a[4];
  }
}

bool fits_fixed(const double* a, int x, int y) {
  return std::fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && std::fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
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

// Pillow's BICUBIC macro (a = -1 cubic through four samples at offset d), operation for operation.
inline double cubic(double v1, double v2, double v3, double v4, double d) {
  const double p1 = v2;
  const double p2 = -v1 + v3;
  const double p3 = 2 * (v1 - v2) + v3 - v4;
  const double p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

// ImagingGenericTransform(affine_transform, bicubic_filter32RGB): per output pixel centre, the
// source point; outside the image it keeps the fill; inside, four clamped columns of up to four rows
// (the first row clamped, rows past the edge repeat the one before), clipped and truncated.
void affine_bicubic(const uint8_t* in, uint8_t* out, int h, int w, const double a[6]) {
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
      int xi = coord_floor(xin), yi = coord_floor(yin);
      const double dx = xin - xi, dy = yin - yi;
      --xi, --yi;
      int cols[4];
      for (int k = 0; k < 4; ++k) cols[k] = 3 * std::max(0, std::min(w - 1, xi + k));
      const uint8_t* rows[4] = {in + std::max(0, std::min(h - 1, yi)) * stride, nullptr, nullptr, nullptr};
      for (int k = 1; k < 4; ++k) rows[k] = yi + k >= 0 && yi + k < h ? in + (yi + k) * stride : nullptr;
      for (int b = 0; b < 3; ++b) {
        // rows[0] is clamped into the image, so every row past the edge repeats one before it.
        double v[4];
        v[0] = cubic(rows[0][cols[0] + b], rows[0][cols[1] + b], rows[0][cols[2] + b], rows[0][cols[3] + b], dx);
        for (int k = 1; k < 4; ++k) {
          const uint8_t* r = rows[k];
          v[k] = r ? cubic(r[cols[0] + b], r[cols[1] + b], r[cols[2] + b], r[cols[3] + b], dx) : v[k - 1];
        }
        const double value = cubic(v[0], v[1], v[2], v[3], dy);
        o[3 * x + b] = value <= 0.0 ? 0 : value >= 255.0 ? 255 : static_cast<uint8_t>(value);
      }
    }
  }
}

}  // namespace

void warp_filtered(uint8_t* rgb, int h, int w, const double plan[7], WarpFilter filter, const uint8_t fill[3],
                   std::vector<uint8_t>* scratch) {
  const WarpMode mode = static_cast<WarpMode>(static_cast<int>(plan[0]));
  if (mode == WarpMode::kIdentity || h <= 0 || w <= 0) return;
  const size_t pixels = static_cast<size_t>(h) * static_cast<size_t>(w);
  scratch->resize(pixels * 3 + 8);  // kernels read up to 8 bytes from the last pixel on
  uint8_t* src = scratch->data();
  std::memcpy(src, rgb, pixels * 3);
  const size_t stride = static_cast<size_t>(w) * 3;
  if (mode == WarpMode::kRotate90 || mode == WarpMode::kRotate180 || mode == WarpMode::kRotate270) {
    // Transposes (square images for the quarter turns): ROTATE_90 is counter-clockwise.
    for (int y = 0; y < h; ++y) {
      uint8_t* o = rgb + y * stride;
      for (int x = 0; x < w; ++x) {
        const uint8_t* p;
        if (mode == WarpMode::kRotate90)
          p = src + x * stride + 3 * (w - 1 - y);
        else if (mode == WarpMode::kRotate180)
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
  // An integer translation samples Pillow's bilinear / bicubic filter at pixel centres (dx = dy = 0): it gives
  // the nearest-neighbour result exactly, which the span copy below produces far faster.
  const bool integer_shift =
      a[0] == 1.0 && a[1] == 0.0 && a[3] == 0.0 && a[4] == 1.0 && a[2] == std::floor(a[2]) && a[5] == std::floor(a[5]);
  if (filter == WarpFilter::kBicubic && !integer_shift) {
    affine_bicubic(src, rgb, h, w, a);
  } else if (filter == WarpFilter::kBilinear && !integer_shift) {
    kernels().affine_bilinear(src, rgb, h, w, a, fill);
  } else if (a[1] == 0.0 && a[3] == 0.0) {
    nearest_scale(src, rgb, h, w, a);
  } else if (fits_fixed(a, 0, 0) && fits_fixed(a, w, h) && fits_fixed(a, 0, h) && fits_fixed(a, w, 0)) {
    kernels().affine_nearest_fixed(src, rgb, h, w, a, fill);
  } else {
    nearest_double(src, rgb, h, w, a);
  }
}

}  // namespace pixel
}  // namespace fastload
