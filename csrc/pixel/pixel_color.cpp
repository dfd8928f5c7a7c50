// Pixels stage (native): the pixel op primitives on packed RGB, built on the kernels of
// pixel_kernels.h; lookup-table ops build their 256-entry tables here with the reference library's
// arithmetic (see pixel_color.h).
#include "common/fp_exact.h"  // first: no fused multiply-add
#include "pixel/pixel_color.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pixel/pixel_kernels.h"

namespace fastload {
namespace pixel {
namespace {

inline uint8_t clip8i(long long v) { return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v)); }

// Pillow's ImagingBlend of a constant in1 with every value of in2 (float alpha).
void blend_table(int in1, float alpha, uint8_t lut[256]) {
  const bool inside = alpha >= 0.0f && alpha <= 1.0f;
  for (int v = 0; v < 256; ++v) {
    const float t = static_cast<float>(in1) + alpha * static_cast<float>(v - in1);
    if (inside)
      lut[v] = static_cast<uint8_t>(t);
    else
      lut[v] = t <= 0.0f ? 0 : (t >= 255.0f ? 255 : static_cast<uint8_t>(t));
  }
}

inline uint8_t cv_sat(float v) { return clip8i(static_cast<long long>(std::nearbyint(v))); }

void histograms(const uint8_t* rgb, size_t pixels, uint32_t hist[3][256]) {
  // Four sets of counters (pixel i % 4) so runs of equal values, common in smooth images, do not
  // serialize on one counter's store-to-load chain (2 sets: 50 us per 224 image, 4 sets: see below).
  static thread_local uint32_t h[4][3][256];
  std::memset(h, 0, sizeof(h));
  size_t i = 0;
  for (; i + 4 <= pixels; i += 4, rgb += 12) {
    for (int k = 0; k < 4; ++k) ++h[k][0][rgb[3 * k]], ++h[k][1][rgb[3 * k + 1]], ++h[k][2][rgb[3 * k + 2]];
  }
  for (; i < pixels; ++i, rgb += 3) ++h[0][0][rgb[0]], ++h[0][1][rgb[1]], ++h[0][2][rgb[2]];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) hist[c][v] = h[0][c][v] + h[1][c][v] + h[2][c][v] + h[3][c][v];
}

}  // namespace

void brightness(uint8_t* rgb, size_t pixels, double factor) {
  uint8_t lut[256];
  blend_table(0, static_cast<float>(factor), lut);
  kernels().lut1(rgb, pixels * 3, lut);
}

void contrast(uint8_t* rgb, size_t pixels, double factor) {
  if (pixels == 0) return;
  // ImageStat's mean of the L image, rounded as ImageEnhance.Contrast does: int(mean + 0.5).
  const double mean = static_cast<double>(kernels().luma_sum(rgb, pixels)) / static_cast<double>(pixels);
  const int m = static_cast<int>(mean + 0.5);
  uint8_t lut[256];
  blend_table(m, static_cast<float>(factor), lut);
  kernels().lut1(rgb, pixels * 3, lut);
}

void saturation(uint8_t* rgb, size_t pixels, double factor) {
  kernels().saturation(rgb, pixels, static_cast<float>(factor));
}

void sharpness(uint8_t* rgb, int h, int w, double factor, std::vector<uint8_t>* scratch) {
  if (h < 3 || w < 3) return;  // ImagingFilter returns a copy: blending it with itself changes nothing
  const size_t n = static_cast<size_t>(h) * static_cast<size_t>(w) * 3;
  scratch->resize(n);
  std::memcpy(scratch->data(), rgb, n);
  kernels().sharpen(scratch->data(), rgb, h, w, static_cast<float>(factor));
}

void hue(uint8_t* rgb, size_t pixels, double factor) {
  // torchvision: np.int32(hue_factor * 255).astype(np.uint8): truncation, then modulo 256.
  const uint8_t shift = static_cast<uint8_t>(static_cast<int32_t>(factor * 255.0));
  kernels().hue(rgb, pixels, shift);
}

void grayscale(uint8_t* rgb, size_t pixels) { kernels().grayscale(rgb, pixels); }

void posterize(uint8_t* rgb, size_t pixels, int bits) {
  bits = std::max(1, std::min(8, bits));
  const int mask = ~((1 << (8 - bits)) - 1) & 0xFF;
  uint8_t lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = static_cast<uint8_t>(v & mask);
  kernels().lut1(rgb, pixels * 3, lut);
}

void solarize(uint8_t* rgb, size_t pixels, double threshold) {
  uint8_t lut[256];
  for (int v = 0; v < 256; ++v)
    lut[v] = static_cast<double>(v) < threshold ? static_cast<uint8_t>(v) : static_cast<uint8_t>(255 - v);
  kernels().lut1(rgb, pixels * 3, lut);
}

void autocontrast(uint8_t* rgb, size_t pixels) {
  if (pixels == 0) return;
  uint8_t lo[3], hi[3];
  kernels().minmax(rgb, pixels, lo, hi);
  uint8_t lut[768];
  for (int c = 0; c < 3; ++c) {
    uint8_t* t = lut + 256 * c;
    if (hi[c] <= lo[c]) {
      for (int v = 0; v < 256; ++v) t[v] = static_cast<uint8_t>(v);
      continue;
    }
    const double scale = 255.0 / static_cast<double>(hi[c] - lo[c]);
    const double offset = -static_cast<double>(lo[c]) * scale;
    for (int v = 0; v < 256; ++v) t[v] = clip8i(static_cast<long long>(static_cast<double>(v) * scale + offset));
  }
  kernels().lut3(rgb, pixels, lut);
}

void equalize(uint8_t* rgb, size_t pixels) {
  if (pixels == 0) return;
  uint32_t hist[3][256];
  histograms(rgb, pixels, hist);
  uint8_t lut[768];
  for (int c = 0; c < 3; ++c) {
    uint8_t* t = lut + 256 * c;
    // ImageOps.equalize: step = (count - count of the highest level present) // 255.
    int last = 255;
    while (last >= 0 && hist[c][last] == 0) --last;
    int levels = 0;
    uint64_t total = 0;
    for (int v = 0; v < 256; ++v) levels += hist[c][v] != 0, total += hist[c][v];
    const uint64_t step = levels <= 1 ? 0 : (total - hist[c][last]) / 255;
    if (step == 0) {
      for (int v = 0; v < 256; ++v) t[v] = static_cast<uint8_t>(v);
      continue;
    }
    uint64_t n = step / 2;
    for (int v = 0; v < 256; ++v) {
      t[v] = clip8i(static_cast<long long>(n / step));
      n += hist[c][v];
    }
  }
  kernels().lut3(rgb, pixels, lut);
}

void invert(uint8_t* rgb, size_t pixels) {
  uint8_t lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = static_cast<uint8_t>(255 - v);
  kernels().lut1(rgb, pixels * 3, lut);
}

void add_rounded(uint8_t* rgb, size_t pixels, const double shift[3]) {
  uint8_t lut[768];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v)
      lut[256 * c + v] = clip8i(static_cast<long long>(std::nearbyint(static_cast<double>(v) + shift[c])));
  kernels().lut3(rgb, pixels, lut);
}

void mx_brightness(uint8_t* rgb, size_t pixels, float alpha) {
  uint8_t lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = cv_sat(static_cast<float>(v) * alpha + 0.0f);
  kernels().lut1(rgb, pixels * 3, lut);
}

void mx_contrast(uint8_t* rgb, size_t pixels, float alpha) {
  if (pixels == 0) return;
  const float gray_mean =
      static_cast<float>(static_cast<double>(kernels().mx_gray_sum(rgb, pixels)) / static_cast<double>(pixels));
  const float beta = (1.0f - alpha) * gray_mean;
  uint8_t lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = cv_sat(static_cast<float>(v) * alpha + beta);
  kernels().lut1(rgb, pixels * 3, lut);
}

void mx_saturation(uint8_t* rgb, size_t pixels, float alpha) {
  kernels().mx_saturation(rgb, pixels, alpha, 1.0f - alpha);
}

void mx_hls(uint8_t* rgb, size_t pixels, int dh, int dl, int ds) { kernels().mx_hls(rgb, pixels, dh, dl, ds); }

void mx_pca(uint8_t* rgb, size_t pixels, const float pca[3]) {
  uint8_t lut[768];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) lut[256 * c + v] = clip8i(static_cast<long long>(static_cast<float>(v) + pca[c]));
  kernels().lut3(rgb, pixels, lut);
}

}  // namespace pixel
}  // namespace fastload
