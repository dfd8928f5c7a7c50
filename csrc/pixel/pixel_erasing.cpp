// Pixels stage (native): apply_erasing, the ops on one sample of the final output (see pixel_ops.h):
// MXNet's normalization jitter (float outputs), then torchvision's RandomErasing. Draws as
// fastload/transforms/erasing.py documents.
#include "common/fp_exact.h"  // first: no fused multiply-add
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/rng.h"
#include "common/half_float.h"
#include "pixel/pixel_ops.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FL_F16C __attribute__((target("avx2,f16c")))
#define FL_HAVE_F16C_PATH 1
#endif

namespace fastload {
namespace {

constexpr int kAttempts = 10;
constexpr uint64_t kNoise = 64;

// out = out * c + l * s[ch], float32 arithmetic (half outputs: through float, rounded back).
template <typename T>
void affine_scalar(T* p, size_t plane, bool channels_first, float c, const float add[3]);

template <>
void affine_scalar<float>(float* p, size_t plane, bool channels_first, float c, const float add[3]) {
  if (channels_first) {
    for (int ch = 0; ch < 3; ++ch)
      for (size_t i = 0; i < plane; ++i) p[ch * plane + i] = p[ch * plane + i] * c + add[ch];
  } else {
    for (size_t i = 0; i < plane; ++i)
      for (int ch = 0; ch < 3; ++ch) p[3 * i + ch] = p[3 * i + ch] * c + add[ch];
  }
}

template <>
void affine_scalar<uint16_t>(uint16_t* p, size_t plane, bool channels_first, float c, const float add[3]) {
  for (size_t i = 0; i < 3 * plane; ++i) {
    const int ch = channels_first ? static_cast<int>(i / plane) : static_cast<int>(i % 3);
    p[i] = half::from_float(half::to_float(p[i]) * c + add[ch]);
  }
}

#ifdef FL_HAVE_F16C_PATH
FL_F16C void affine_half_f16c(uint16_t* p, size_t plane, bool channels_first, float c, const float add[3]) {
  const __m256 vc = _mm256_set1_ps(c);
  if (channels_first) {
    for (int ch = 0; ch < 3; ++ch) {
      uint16_t* q = p + ch * plane;
      const __m256 va = _mm256_set1_ps(add[ch]);
      size_t i = 0;
      for (; i + 8 <= plane; i += 8) {
        const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                         _mm256_cvtps_ph(_mm256_add_ps(_mm256_mul_ps(v, vc), va), _MM_FROUND_TO_NEAREST_INT));
      }
      for (; i < plane; ++i) q[i] = half::from_float(half::to_float(q[i]) * c + add[ch]);
    }
    return;
  }
  // NHWC: 24 values (8 pixels) per step, the channel pattern repeats every 3 vectors.
  const __m256 a0 = _mm256_setr_ps(add[0], add[1], add[2], add[0], add[1], add[2], add[0], add[1]);
  const __m256 a1 = _mm256_setr_ps(add[2], add[0], add[1], add[2], add[0], add[1], add[2], add[0]);
  const __m256 a2 = _mm256_setr_ps(add[1], add[2], add[0], add[1], add[2], add[0], add[1], add[2]);
  const __m256 adds[3] = {a0, a1, a2};
  const size_t n = 3 * plane;
  size_t i = 0;
  for (; i + 24 <= n; i += 24) {
    for (int k = 0; k < 3; ++k) {
      const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 8 * k)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i + 8 * k),
                       _mm256_cvtps_ph(_mm256_add_ps(_mm256_mul_ps(v, vc), adds[k]), _MM_FROUND_TO_NEAREST_INT));
    }
  }
  for (; i < n; ++i) p[i] = half::from_float(half::to_float(p[i]) * c + add[i % 3]);
}

bool have_f16c() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return ok;
}
#endif

void mx_jitter(void* image, DType type, bool channels_first, size_t plane, const ErasingSpec& spec, uint64_t key,
               double* t) {
  const uint64_t b = spec.mx_counter_base;
  const float c = static_cast<float>(1.0 + (2.0 * uniform(key, b + 17) - 1.0) * spec.max_random_contrast);
  const float l = static_cast<float>((2.0 * uniform(key, b + 18) - 1.0) * spec.max_random_illumination);
  if (t) t[5] = widen(c), t[6] = widen(l);
  const float add[3] = {l * spec.illumination_scale[0], l * spec.illumination_scale[1], l * spec.illumination_scale[2]};
  if (type == DType::kFloat32) {
    affine_scalar(static_cast<float*>(image), plane, channels_first, c, add);
  } else {
#ifdef FL_HAVE_F16C_PATH
    if (have_f16c()) {
      affine_half_f16c(static_cast<uint16_t*>(image), plane, channels_first, c, add);
      return;
    }
#endif
    affine_scalar(static_cast<uint16_t*>(image), plane, channels_first, c, add);
  }
}

// Element (ch, y, x) of the image, either layout.
inline size_t offset(bool channels_first, int h, int w, int ch, int y, int x) {
  return channels_first ? (static_cast<size_t>(ch) * h + y) * w + x : (static_cast<size_t>(y) * w + x) * 3 + ch;
}

template <typename T, typename Conv>
void fill_box(T* p, bool channels_first, int h, int w, int top, int left, int eh, int ew, const ErasingSpec& spec,
              uint64_t key, bool uint8_out, Conv conv) {
  const uint64_t base = kOutputOpsCounterBase + kNoise;
  if (!spec.random_value) {
    // A constant per channel: converted once, written row by row. timm's mode='rand' draws it: channel
    // ch takes noise element ch.
    double value[3] = {spec.value[0], spec.value[1], spec.value[2]};
    if (spec.random_color)
      for (int ch = 0; ch < 3; ++ch)
        value[ch] = uint8_out ? randint(key, base + 2 * ch, 256) : normal(key, base + 2 * ch);
    const T v[3] = {conv(value[0]), conv(value[1]), conv(value[2])};
    for (int yy = 0; yy < eh; ++yy) {
      if (channels_first) {
        for (int ch = 0; ch < 3; ++ch) std::fill_n(p + offset(true, h, w, ch, top + yy, left), ew, v[ch]);
      } else {
        T* row = p + offset(false, h, w, 0, top + yy, left);
        for (int xx = 0; xx < ew; ++xx) row[3 * xx] = v[0], row[3 * xx + 1] = v[1], row[3 * xx + 2] = v[2];
      }
    }
    return;
  }
  for (int ch = 0; ch < 3; ++ch) {
    for (int yy = 0; yy < eh; ++yy) {
      for (int xx = 0; xx < ew; ++xx) {
        const uint64_t k = (static_cast<uint64_t>(ch) * eh + yy) * ew + xx;
        const double v = uint8_out ? randint(key, base + 2 * k, 256) : normal(key, base + 2 * k);
        p[offset(channels_first, h, w, ch, top + yy, left + xx)] = conv(v);
      }
    }
  }
}

}  // namespace

void apply_erasing(void* image, DType type, bool channels_first, int h, int w, const ErasingSpec& spec, uint64_t key,
                   ErasingTrace* trace) {
  double* t = trace ? trace->values : nullptr;
  if (t) std::fill(t, t + kErasingTraceValues, std::numeric_limits<double>::quiet_NaN());
  if (t) t[0] = 0;
  const size_t plane = static_cast<size_t>(h) * static_cast<size_t>(w);
  if (spec.mx_jitter && type != DType::kUint8) mx_jitter(image, type, channels_first, plane, spec, key, t);
  if (!spec.erase) return;
  const uint64_t e = kOutputOpsCounterBase;
  if (!(uniform(key, e) < spec.p)) return;
  const double area = static_cast<double>(h) * static_cast<double>(w);
  for (int a = 0; a < kAttempts; ++a) {
    const uint64_t c = e + 1 + 4 * a;
    const double erase_area = area * (spec.scale[0] + (spec.scale[1] - spec.scale[0]) * uniform(key, c));
    const double aspect = std::exp(spec.log_ratio[0] + (spec.log_ratio[1] - spec.log_ratio[0]) * uniform(key, c + 1));
    const long long eh = static_cast<long long>(std::nearbyint(std::sqrt(erase_area * aspect)));
    const long long ew = static_cast<long long>(std::nearbyint(std::sqrt(erase_area / aspect)));
    if (!(eh < h && ew < w)) continue;
    const int top = randint(key, c + 2, h - static_cast<int>(eh) + 1);
    const int left = randint(key, c + 3, w - static_cast<int>(ew) + 1);
    const int ih = static_cast<int>(eh), iw = static_cast<int>(ew);
    switch (type) {
      case DType::kUint8:
        fill_box(static_cast<uint8_t*>(image), channels_first, h, w, top, left, ih, iw, spec, key, true,
                 [](double v) { return static_cast<uint8_t>(std::min(255.0, std::max(0.0, std::nearbyint(v)))); });
        break;
      case DType::kFloat32:
        fill_box(static_cast<float*>(image), channels_first, h, w, top, left, ih, iw, spec, key, false,
                 [](double v) { return static_cast<float>(v); });
        break;
      case DType::kFloat16:
        fill_box(static_cast<uint16_t*>(image), channels_first, h, w, top, left, ih, iw, spec, key, false,
                 [](double v) { return half::from_double(v); });
        break;
    }
    if (t) t[0] = 1, t[1] = top, t[2] = left, t[3] = ih, t[4] = iw;
    return;
  }
}

}  // namespace fastload
