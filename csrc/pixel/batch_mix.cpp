// Pixels stage (native): mix_batch, torchvision v2's MixUp / CutMix over a whole batch in place (see
// pixel_ops.h). Sample i takes sample i - 1 (sample 0 the last one). The batch is cut into one
// contiguous chunk per thread; each chunk walks its samples backwards so that sample i - 1 is still
// unmixed when sample i reads it, and the sample before each chunk is copied first (it belongs to
// another chunk, which may overwrite it).
#include "common/fp_exact.h"  // first: no fused multiply-add
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/half_float.h"
#include "pixel/pixel_ops.h"
#include "common/thread_pool.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12 flags the _mm512_undefined_* placeholders inside its own intrinsics headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define FL_F16C __attribute__((target("avx2,f16c")))
#define FL_HAVE_F16C_PATH 1
#endif

namespace fastload {
namespace {

size_t elem_size(DType t) { return t == DType::kUint8 ? 1 : t == DType::kFloat32 ? 4 : 2; }

// dst = prev * wb + own * wa (torch: rolled.mul_(1 - lam).add_(image.mul(lam))), n elements; dst
// may be own.
void mix_float_scalar(float* dst, const float* own, const float* prev, size_t n, float wa, float wb) {
  for (size_t i = 0; i < n; ++i) dst[i] = prev[i] * wb + own[i] * wa;
}

#ifdef FL_HAVE_F16C_PATH
// The same products and sum, 8 lanes at a time (no fused multiply-add: the scalar loop's bits).
// Plain stores: streaming ones measured 1.14x the plain decode instead of 1.05x here (NCHW rows
// are three interleaved store streams per image row).
__attribute__((target("avx2"))) void mix_float_avx2(float* dst, const float* own, const float* prev, size_t n, float wa,
                                                    float wb) {
  const __m256 va = _mm256_set1_ps(wa), vb = _mm256_set1_ps(wb);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(prev + i), vb);
    const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(own + i), va);
    _mm256_storeu_ps(dst + i, _mm256_add_ps(p, d));
  }
  mix_float_scalar(dst + i, own + i, prev + i, n - i, wa, wb);
}
#endif

void mix_float(float* dst, const float* own, const float* prev, size_t n, float wa, float wb) {
#ifdef FL_HAVE_F16C_PATH
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    mix_float_avx2(dst, own, prev, n, wa, wb);
    return;
  }
#endif
  mix_float_scalar(dst, own, prev, n, wa, wb);
}

// Round half to even through the current (default) rounding mode: cvtss2si, no libm call (a call
// per byte made the uint8 MixUp cost ~20x the rest of its pass).
inline int round_even(float v) {
#if defined(__x86_64__)
  return _mm_cvtss_si32(_mm_set_ss(v));
#else
  return static_cast<int>(std::nearbyint(v));
#endif
}

void mix_u8_scalar(uint8_t* dst, const uint8_t* own, const uint8_t* prev, size_t n, float wa, float wb) {
  for (size_t i = 0; i < n; ++i) {
    const int v = round_even(static_cast<float>(prev[i]) * wb + static_cast<float>(own[i]) * wa);
    dst[i] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
  }
}

#ifdef FL_HAVE_F16C_PATH
__attribute__((target("avx2"))) void mix_u8_avx2(uint8_t* dst, const uint8_t* own, const uint8_t* prev, size_t n,
                                                 float wa, float wb) {
  const __m256 va = _mm256_set1_ps(wa), vb = _mm256_set1_ps(wb);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 p =
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(prev + i))));
    const __m256 d =
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(own + i))));
    const __m256i v = _mm256_cvtps_epi32(_mm256_add_ps(_mm256_mul_ps(p, vb), _mm256_mul_ps(d, va)));
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(w, w));
  }
  mix_u8_scalar(dst + i, own + i, prev + i, n - i, wa, wb);
}
#endif

#ifdef FL_HAVE_F16C_PATH
__attribute__((target("avx512f,avx512bw,avx512vl"))) void mix_u8_avx512(uint8_t* dst, const uint8_t* own,
                                                                        const uint8_t* prev, size_t n, float wa,
                                                                        float wb) {
  const __m512 va = _mm512_set1_ps(wa), vb = _mm512_set1_ps(wb);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 p =
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(prev + i))));
    const __m512 d =
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(own + i))));
    const __m512i v = _mm512_cvtps_epi32(_mm512_add_ps(_mm512_mul_ps(p, vb), _mm512_mul_ps(d, va)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm512_cvtusepi32_epi8(_mm512_max_epi32(v, _mm512_setzero_si512())));
  }
  mix_u8_scalar(dst + i, own + i, prev + i, n - i, wa, wb);
}
#endif

void mix_u8(uint8_t* dst, const uint8_t* own, const uint8_t* prev, size_t n, float wa, float wb) {
#ifdef FL_HAVE_F16C_PATH
  static const bool avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  if (avx512) {
    mix_u8_avx512(dst, own, prev, n, wa, wb);
    return;
  }
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    mix_u8_avx2(dst, own, prev, n, wa, wb);
    return;
  }
#endif
  mix_u8_scalar(dst, own, prev, n, wa, wb);
}

// Half: each product rounded to half, then their sum (torch's half arithmetic).
void mix_half_scalar(uint16_t* dst, const uint16_t* own, const uint16_t* prev, size_t n, float wa, float wb) {
  for (size_t i = 0; i < n; ++i) {
    const float x = half::to_float(half::from_float(half::to_float(prev[i]) * wb));
    const float y = half::to_float(half::from_float(half::to_float(own[i]) * wa));
    dst[i] = half::from_float(x + y);
  }
}

#ifdef FL_HAVE_F16C_PATH
FL_F16C void mix_half_f16c(uint16_t* dst, const uint16_t* own, const uint16_t* prev, size_t n, float wa, float wb) {
  const __m256 va = _mm256_set1_ps(wa), vb = _mm256_set1_ps(wb);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 p = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(prev + i)));
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(own + i)));
    const __m256 x = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(p, vb), kRound));
    const __m256 y = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(d, va), kRound));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_add_ps(x, y), kRound));
  }
  mix_half_scalar(dst + i, own + i, prev + i, n - i, wa, wb);
}
#endif

void mix_half(uint16_t* dst, const uint16_t* own, const uint16_t* prev, size_t n, float wa, float wb) {
#ifdef FL_HAVE_F16C_PATH
  static const bool f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (f16c) {
    mix_half_f16c(dst, own, prev, n, wa, wb);
    return;
  }
#endif
  mix_half_scalar(dst, own, prev, n, wa, wb);
}

// MixUp of `count` elements of `type`: dst = prev * wb + own * wa with the type's rounding.
void mix_values(void* dst, const void* own, const void* prev, DType type, size_t count, float wa, float wb) {
  if (type == DType::kFloat32) {
    mix_float(static_cast<float*>(dst), static_cast<const float*>(own), static_cast<const float*>(prev), count, wa, wb);
  } else if (type == DType::kUint8) {
    mix_u8(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(own), static_cast<const uint8_t*>(prev), count, wa,
           wb);
  } else {
    mix_half(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(own), static_cast<const uint16_t*>(prev), count,
             wa, wb);
  }
}

// Copies the CutMix box of src into dst (both one sample).
void copy_box(uint8_t* dst, const uint8_t* src, size_t es, bool channels_first, int h, int w, const MixParams& p) {
  const size_t bw = static_cast<size_t>(p.x1 - p.x0);
  if (bw == 0 || p.y1 <= p.y0) return;
  if (channels_first) {
    for (int ch = 0; ch < 3; ++ch)
      for (int y = p.y0; y < p.y1; ++y) {
        const size_t off = ((static_cast<size_t>(ch) * h + y) * w + p.x0) * es;
        std::memcpy(dst + off, src + off, bw * es);
      }
  } else {
    for (int y = p.y0; y < p.y1; ++y) {
      const size_t off = ((static_cast<size_t>(y) * w + p.x0) * 3) * es;
      std::memcpy(dst + off, src + off, bw * 3 * es);
    }
  }
}

}  // namespace

void mix_sample(void* out, const void* own, const void* prev, DType type, bool channels_first, int h, int w,
                const MixParams& params) {
  const size_t count = static_cast<size_t>(h) * static_cast<size_t>(w) * 3;
  const size_t es = elem_size(type);
  uint8_t* dst = static_cast<uint8_t*>(out);
  const uint8_t* src = static_cast<const uint8_t*>(own);
  if (params.cutmix) {
    if (dst != src) std::memcpy(dst, src, count * es);
    copy_box(dst, static_cast<const uint8_t*>(prev), es, channels_first, h, w, params);
    return;
  }
  mix_values(dst, src, prev, type, count, static_cast<float>(params.lam), static_cast<float>(1.0 - params.lam));
}

void mix_output_rows(const OutputFormat& fmt, const uint8_t* own, const uint8_t* prev, size_t stride, void* slot,
                     const MixParams& params, void* own_row, void* prev_row) {
  OutputFormat row = fmt;
  row.height = 1;  // a one-row image: NCHW rows come out as three planes of `width` values
  const size_t es = fmt.element_size();
  const int h = fmt.height, w = fmt.width;
  const bool nchw = fmt.layout == Layout::kNchw;
  const float wa = static_cast<float>(params.lam), wb = static_cast<float>(1.0 - params.lam);
  uint8_t* a = static_cast<uint8_t*>(own_row);
  uint8_t* b = static_cast<uint8_t*>(prev_row);
  const size_t rgb = 3 * static_cast<size_t>(w);
  for (int y = 0; y < h; ++y) {
    const uint8_t* o = own + static_cast<size_t>(y) * stride;
    const uint8_t* q = prev + static_cast<size_t>(y) * stride;
    if (params.cutmix) {
      // The output stage is per pixel: the box's pixels swapped in before it equal the box copied
      // from the previous sample's output after it.
      if (y >= params.y0 && y < params.y1 && params.x1 > params.x0) {
        std::memcpy(a, o, rgb);
        std::memcpy(a + 3 * static_cast<size_t>(params.x0), q + 3 * static_cast<size_t>(params.x0),
                    3 * static_cast<size_t>(params.x1 - params.x0));
        o = a;
      }
      write_output_row(fmt, o, y, slot);
      continue;
    }
    if (write_output_row_mixed(fmt, o, q, y, slot, wa, wb)) continue;
    if (fmt.is_raw_nhwc()) {  // the rows are the outputs already
      mix_u8(static_cast<uint8_t*>(slot) + static_cast<size_t>(y) * rgb, o, q, rgb, wa, wb);
      continue;
    }
    // Both rows through the output stage into the row buffers, then mixed into the slot.
    write_output_row(row, o, 0, a);
    write_output_row(row, q, 0, b);
    const int segments = nchw ? 3 : 1;
    const size_t seg = nchw ? static_cast<size_t>(w) : rgb;
    for (int c = 0; c < segments; ++c) {
      const size_t at = nchw ? (static_cast<size_t>(c) * h + y) * w : static_cast<size_t>(y) * seg;
      uint8_t* d = static_cast<uint8_t*>(slot) + at * es;
      mix_values(d, a + static_cast<size_t>(c) * seg * es, b + static_cast<size_t>(c) * seg * es, fmt.dtype, seg, wa,
                 wb);
    }
  }
}

void mix_batch(void* images, DType type, bool channels_first, int n, int h, int w, const MixParams& params,
               const float* labels, int num_classes, float* soft, int threads) {
  if (n <= 0) return;
  const float lw_own = static_cast<float>(params.lam_labels), lw_roll = static_cast<float>(1.0 - params.lam_labels);
  for (int i = 0; i < n; ++i) {
    const float* own = labels + static_cast<size_t>(i) * num_classes;
    const float* prev = labels + static_cast<size_t>(i == 0 ? n - 1 : i - 1) * num_classes;
    float* out = soft + static_cast<size_t>(i) * num_classes;
    for (int c = 0; c < num_classes; ++c) out[c] = prev[c] * lw_roll + own[c] * lw_own;
  }
  const size_t es = elem_size(type);
  const size_t count = static_cast<size_t>(h) * static_cast<size_t>(w) * 3;
  const size_t bytes = count * es;
  uint8_t* base = static_cast<uint8_t*>(images);
  const int chunks = std::max(1, std::min(threads, n));
  std::vector<int> start(static_cast<size_t>(chunks) + 1);
  for (int c = 0; c <= chunks; ++c)
    start[static_cast<size_t>(c)] = static_cast<int>(static_cast<long long>(n) * c / chunks);
  // The sample before each chunk, as it is before anything is mixed.
  std::vector<uint8_t> saved(static_cast<size_t>(chunks) * bytes);
  for (int c = 0; c < chunks; ++c) {
    const int before = start[static_cast<size_t>(c)] == 0 ? n - 1 : start[static_cast<size_t>(c)] - 1;
    std::memcpy(saved.data() + static_cast<size_t>(c) * bytes, base + static_cast<size_t>(before) * bytes, bytes);
  }
  auto mix_one = [&](uint8_t* dst, const uint8_t* prev) {
    mix_sample(dst, dst, prev, type, channels_first, h, w, params);
  };
  ThreadPool::instance().run(chunks, threads, [&](int c) {
    const int s = start[static_cast<size_t>(c)], e = start[static_cast<size_t>(c) + 1];
    for (int i = e - 1; i > s; --i)
      mix_one(base + static_cast<size_t>(i) * bytes, base + static_cast<size_t>(i - 1) * bytes);
    if (e > s) mix_one(base + static_cast<size_t>(s) * bytes, saved.data() + static_cast<size_t>(c) * bytes);
  });
}

}  // namespace fastload
