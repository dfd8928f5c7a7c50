// Pixels stage (native): portable scalar kernels of the pixel ops, operation for operation the
// arithmetic of Pillow (torchvision ops) and OpenCV 3.4 (MXNet ops). See pixel_kernels.h.
#include "common/fp_exact.h"  // first: no fused multiply-add
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "pixel/pixel_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// The portable kernels are also compiled for AVX2 (GCC/clang function multiversioning, picked at
// load time), where the compiler vectorizes them 8 wide: on CPUs without the hand-written AVX-512
// set (AMD Zen 2/3, older Intel) saturation runs in 37 instead of 82 us per 224x224 image. Same
// operations, no FMA: the same bytes.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FL_CLONES
#endif

namespace fastload {
namespace pixel {
namespace {

inline uint8_t clip8i(int v) { return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v)); }

// Pillow's ImagingBlend for one byte: in1 + alpha * (in2 - in1) in float, truncated (clipped when
// alpha is outside [0, 1]).
inline uint8_t pil_blend(int in1, int in2, float alpha) {
  const float v = static_cast<float>(in1) + alpha * static_cast<float>(in2 - in1);
  if (alpha >= 0.0f && alpha <= 1.0f) return static_cast<uint8_t>(v);
  if (v <= 0.0f) return 0;
  if (v >= 255.0f) return 255;
  return static_cast<uint8_t>(v);
}

inline int pil_luma(int r, int g, int b) { return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16; }

// OpenCV 3.4's cvtColor(CV_RGB2GRAY) applied to MXNet's BGR buffer: the first byte (blue) gets
// the red weight.
inline int mx_gray_of(int r, int g, int b) { return (b * 4899 + g * 9617 + r * 1868 + (1 << 13)) >> 14; }

// OpenCV's saturate_cast<uchar>(float): round half to even (cvRound: cvtss2si under the default
// rounding mode, as here; std::nearbyint would be a libm call per value on baseline x86-64), then clip.
inline uint8_t cv_sat(float v) {
#if defined(__x86_64__)
  return clip8i(_mm_cvtss_si32(_mm_set_ss(v)));
#else
  return clip8i(static_cast<int>(std::nearbyint(v)));
#endif
}

void lut1_scalar(uint8_t* p, size_t n, const uint8_t* lut) {
  for (size_t i = 0; i < n; ++i) p[i] = lut[p[i]];
}

void lut3_scalar(uint8_t* rgb, size_t pixels, const uint8_t* lut) {
  for (size_t i = 0; i < pixels; ++i, rgb += 3) {
    rgb[0] = lut[rgb[0]];
    rgb[1] = lut[256 + rgb[1]];
    rgb[2] = lut[512 + rgb[2]];
  }
}

FL_CLONES uint64_t luma_sum_scalar(const uint8_t* rgb, size_t pixels) {
  uint64_t s = 0;
  for (size_t i = 0; i < pixels; ++i, rgb += 3) s += static_cast<uint64_t>(pil_luma(rgb[0], rgb[1], rgb[2]));
  return s;
}

FL_CLONES void grayscale_scalar(uint8_t* rgb, size_t pixels) {
  for (size_t i = 0; i < pixels; ++i, rgb += 3) {
    const uint8_t l = static_cast<uint8_t>(pil_luma(rgb[0], rgb[1], rgb[2]));
    rgb[0] = rgb[1] = rgb[2] = l;
  }
}

// pil_blend with the interpolation / extrapolation choice taken once per image (vectorizable).
FL_CLONES void saturation_scalar(uint8_t* rgb, size_t pixels, float alpha) {
  if (alpha >= 0.0f && alpha <= 1.0f) {
    for (size_t i = 0; i < pixels; ++i) {
      uint8_t* p = rgb + 3 * i;
      const int l = pil_luma(p[0], p[1], p[2]);
      const float lf = static_cast<float>(l);
      for (int c = 0; c < 3; ++c)
        p[c] = static_cast<uint8_t>(static_cast<int>(lf + alpha * static_cast<float>(p[c] - l)));
    }
    return;
  }
  for (size_t i = 0; i < pixels; ++i) {
    uint8_t* p = rgb + 3 * i;
    const int l = pil_luma(p[0], p[1], p[2]);
    const float lf = static_cast<float>(l);
    for (int c = 0; c < 3; ++c) {
      float v = lf + alpha * static_cast<float>(p[c] - l);
      v = v <= 0.0f ? 0.0f : (v >= 255.0f ? 255.0f : v);
      p[c] = static_cast<uint8_t>(static_cast<int>(v));
    }
  }
}

// adjust_hue: Pillow's rgb2hsv and hsv2rgb (Convert.c) to the byte, with the shortcuts the AVX-512 kernel takes (each
// checked over every RGB value / every (h, s, v) by the tests): one division for the mid channel's
// quotient, h * (1 / 6.0) for h / 6.0, s * 255 and p, q, t in float, sector positions from tables.
struct HueTables {
  float f[256], fs[256];
  int sector[256];
  HueTables() {
    for (int v = 0; v < 256; ++v) {
      const int i = (6 * v) / 255;
      sector[v] = i % 6;
      f[v] = static_cast<float>(6 * v - 255 * i) / 255.0f;
      fs[v] = static_cast<float>(v) / 255.0f;
    }
  }
};
const HueTables kHue;

inline int round_half_up(float x) {
  const float t = static_cast<float>(static_cast<int>(x));
  return static_cast<int>(t) + (x - t >= 0.5f ? 1 : 0);
}

FL_CLONES void hue_scalar(uint8_t* rgb, size_t pixels, uint8_t shift) {
  for (size_t i = 0; i < pixels; ++i, rgb += 3) {
    const int r = rgb[0], g = rgb[1], b = rgb[2];
    const int maxc = std::max(r, std::max(g, b)), minc = std::min(r, std::min(g, b));
    const int cr = maxc - minc;
    int uh = 0, us = 0;
    if (cr != 0) {
      const int mid = r + g + b - maxc - minc;
      const float x = static_cast<float>(maxc - mid) / static_cast<float>(cr);
      float h;
      if (r == maxc)
        h = b == minc ? 1.0f - x : x - 1.0f;
      else if (g == maxc)
        h = r == minc ? 3.0f - x : 1.0f + x;
      else
        h = g == minc ? 5.0f - x : 3.0f + x;
      double y = static_cast<double>(h) * (1.0 / 6.0) + 1.0;
      if (y >= 1.0) y -= 1.0;
      uh = static_cast<int>(static_cast<double>(static_cast<float>(y)) * 255.0);
      us = static_cast<int>(static_cast<float>(cr) / static_cast<float>(maxc) * 255.0f);
    }
    if (us == 0) {
      rgb[0] = rgb[1] = rgb[2] = static_cast<uint8_t>(maxc);
      continue;
    }
    const int hh = (uh + shift) & 255;
    const float v = static_cast<float>(maxc), fs = kHue.fs[us], f = kHue.f[hh];
    const uint8_t p = clip8i(round_half_up(v * (1.0f - fs)));
    const uint8_t q = clip8i(round_half_up(v * (1.0f - fs * f)));
    const uint8_t t = clip8i(round_half_up(v * (1.0f - fs * (1.0f - f))));
    const uint8_t vv = static_cast<uint8_t>(maxc);
    switch (kHue.sector[hh]) {
      case 0: rgb[0] = vv, rgb[1] = t, rgb[2] = p; break;
      case 1: rgb[0] = q, rgb[1] = vv, rgb[2] = p; break;
      case 2: rgb[0] = p, rgb[1] = vv, rgb[2] = t; break;
      case 3: rgb[0] = p, rgb[1] = q, rgb[2] = vv; break;
      case 4: rgb[0] = t, rgb[1] = p, rgb[2] = vv; break;
      default: rgb[0] = vv, rgb[1] = p, rgb[2] = q; break;
    }
  }
}

// Pillow's ImagingFilter3x3 with the SMOOTH kernel (1 1 1 / 1 5 1 / 1 1 1, each divided by 13 in
// float), offset 0.5, clamped and truncated; then blended with the source.
FL_CLONES void sharpen_scalar(const uint8_t* src, uint8_t* dst, int h, int w, float alpha) {
  const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
  const bool inside = alpha >= 0.0f && alpha <= 1.0f;
  const size_t stride = static_cast<size_t>(w) * 3;
  for (int y = 1; y < h - 1; ++y) {
    const uint8_t* up = src + (y - 1) * stride;
    const uint8_t* mid = src + y * stride;
    const uint8_t* down = src + (y + 1) * stride;
    uint8_t* out = dst + y * stride;
    for (size_t j = 3; j < stride - 3; ++j) {
      float ss = 0.5f;
      ss += static_cast<float>(down[j - 3]) * k1 + static_cast<float>(down[j]) * k1 +
            static_cast<float>(down[j + 3]) * k1;
      ss += static_cast<float>(mid[j - 3]) * k1 + static_cast<float>(mid[j]) * k5 + static_cast<float>(mid[j + 3]) * k1;
      ss += static_cast<float>(up[j - 3]) * k1 + static_cast<float>(up[j]) * k1 + static_cast<float>(up[j + 3]) * k1;
      ss = ss < 0.0f ? 0.0f : ss;
      ss = ss > 255.0f ? 255.0f : ss;
      const int smooth = static_cast<int>(ss);
      float v = static_cast<float>(smooth) + alpha * static_cast<float>(mid[j] - smooth);
      if (!inside) v = v <= 0.0f ? 0.0f : (v >= 255.0f ? 255.0f : v);
      out[j] = static_cast<uint8_t>(static_cast<int>(v));
    }
  }
}

void minmax_scalar(const uint8_t* rgb, size_t pixels, uint8_t lo[3], uint8_t hi[3]) {
  uint8_t l[3] = {255, 255, 255}, m[3] = {0, 0, 0};
  for (size_t i = 0; i < pixels; ++i, rgb += 3) {
    for (int c = 0; c < 3; ++c) {
      l[c] = std::min(l[c], rgb[c]);
      m[c] = std::max(m[c], rgb[c]);
    }
  }
  for (int c = 0; c < 3; ++c) lo[c] = l[c], hi[c] = m[c];
}

FL_CLONES uint64_t mx_gray_sum_scalar(const uint8_t* rgb, size_t pixels) {
  uint64_t s = 0;
  for (size_t i = 0; i < pixels; ++i, rgb += 3) s += static_cast<uint64_t>(mx_gray_of(rgb[0], rgb[1], rgb[2]));
  return s;
}

FL_CLONES void mx_saturation_scalar(uint8_t* rgb, size_t pixels, float alpha, float beta) {
  for (size_t i = 0; i < pixels; ++i, rgb += 3) {
    const float g = static_cast<float>(mx_gray_of(rgb[0], rgb[1], rgb[2])) * beta;
    for (int c = 0; c < 3; ++c) rgb[c] = cv_sat(static_cast<float>(rgb[c]) * alpha + g);
  }
}

// OpenCV's RGB2HLS_f / HLS2RGB_f (scalar code) with the 8-bit wrappers' 1/255 scaling and
// saturate_cast, for the true colours (MXNet's BGR buffer read with blueIdx 0).
inline void cv_rgb2hls(int R, int G, int B, int* H, int* L, int* S) {
  const float k = 1.0f / 255.0f;
  const float r = static_cast<float>(R) * k, g = static_cast<float>(G) * k, b = static_cast<float>(B) * k;
  float h = 0.0f, s = 0.0f;
  float vmax = r, vmin = r;
  if (vmax < g) vmax = g;
  if (vmax < b) vmax = b;
  if (vmin > g) vmin = g;
  if (vmin > b) vmin = b;
  float diff = vmax - vmin;
  const float l = (vmax + vmin) * 0.5f;
  if (diff > FLT_EPSILON) {
    s = l < 0.5f ? diff / (vmax + vmin) : diff / (2.0f - vmax - vmin);
    diff = 60.0f / diff;
    if (vmax == r)
      h = (g - b) * diff;
    else if (vmax == g)
      h = (b - r) * diff + 120.0f;
    else
      h = (r - g) * diff + 240.0f;
    if (h < 0.0f) h += 360.0f;
  }
  *H = cv_sat(h * 0.5f);
  *L = cv_sat(l * 255.0f);
  *S = cv_sat(s * 255.0f);
}

inline void cv_hls2rgb(int H, int L, int S, uint8_t* out) {
  const float k = 1.0f / 255.0f;
  float h = static_cast<float>(H);
  const float l = static_cast<float>(L) * k, s = static_cast<float>(S) * k;
  float b, g, r;
  if (s == 0.0f) {
    b = g = r = l;
  } else {
    static const int sector_data[6][3] = {{1, 3, 0}, {1, 0, 2}, {3, 0, 1}, {0, 2, 1}, {0, 1, 3}, {2, 1, 0}};
    const float p2 = l <= 0.5f ? l * (1.0f + s) : l + s - l * s;
    const float p1 = 2.0f * l - p2;
    h *= 6.0f / 180.0f;
    while (h < 0.0f) h += 6.0f;
    while (h >= 6.0f) h -= 6.0f;
    const int sector = static_cast<int>(std::floor(h));
    h -= static_cast<float>(sector);
    float tab[4];
    tab[0] = p2;
    tab[1] = p1;
    tab[2] = p1 + (p2 - p1) * (1.0f - h);
    tab[3] = p1 + (p2 - p1) * h;
    b = tab[sector_data[sector][0]];
    g = tab[sector_data[sector][1]];
    r = tab[sector_data[sector][2]];
  }
  out[0] = cv_sat(r * 255.0f);
  out[1] = cv_sat(g * 255.0f);
  out[2] = cv_sat(b * 255.0f);
}

FL_CLONES void mx_hls_scalar(uint8_t* rgb, size_t pixels, int dh, int dl, int ds) {
  for (size_t i = 0; i < pixels; ++i, rgb += 3) {
    int h, l, s;
    cv_rgb2hls(rgb[0], rgb[1], rgb[2], &h, &l, &s);
    h = std::max(0, std::min(180, h + dh));
    l = std::max(0, std::min(255, l + dl));
    s = std::max(0, std::min(255, s + ds));
    cv_hls2rgb(h, l, s, rgb);
  }
}

// Pillow's COORD / FLOOR.
inline int floor_int(double v) { return v < 0.0 ? static_cast<int>(std::floor(v)) : static_cast<int>(v); }

inline void put3(uint8_t* dst, const uint8_t* src) { dst[0] = src[0], dst[1] = src[1], dst[2] = src[2]; }

void affine_nearest_fixed_scalar(const uint8_t* in, uint8_t* out, int h, int w, const double a[6], const uint8_t*) {
  // out already holds the fill (pixel_warp.cpp).
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
        if (yi >= 0 && yi < h) put3(o + 3 * x, in + yi * stride + 3 * xi);
      }
      xx += a0;
      yy += a3;
    }
    a2 += a1;
    a5 += a4;
  }
}

void affine_bilinear_scalar(const uint8_t* in, uint8_t* out, int h, int w, const double a[6], const uint8_t*) {
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

const Kernels kScalar = {
    "scalar",
    lut1_scalar,
    lut3_scalar,
    luma_sum_scalar,
    grayscale_scalar,
    saturation_scalar,
    hue_scalar,
    sharpen_scalar,
    minmax_scalar,
    mx_gray_sum_scalar,
    mx_saturation_scalar,
    mx_hls_scalar,
    affine_nearest_fixed_scalar,
    affine_bilinear_scalar,
};

std::atomic<const Kernels*> g_forced{nullptr};

}  // namespace

const Kernels& scalar_kernels() { return kScalar; }

const Kernels& kernels() {
  const Kernels* forced = g_forced.load(std::memory_order_relaxed);
  if (forced) return *forced;
  static const Kernels* best = avx512_kernels() ? avx512_kernels() : &kScalar;
  return *best;
}

bool force_kernels(const char* name) {
  const std::string n = name ? name : "";
  if (n == "scalar") {
    g_forced.store(&kScalar);
    return true;
  }
  if (n == "avx512") {
    if (!avx512_kernels()) return false;
    g_forced.store(avx512_kernels());
    return true;
  }
  if (n == "best") {
    g_forced.store(nullptr);
    return true;
  }
  return false;
}

}  // namespace pixel
}  // namespace fastload
