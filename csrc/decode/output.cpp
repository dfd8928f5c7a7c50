// Output stage (native): rows of output pixels into the batch slot, in the final dtype and layout.
//
// Why AVX2 kernels: a float32 NCHW 224x224 image is 600 KB of output per image against ~150 KB of
// uint8, and the conversion (widen, convert, multiply-add, narrow to half) is ~10 operations per
// element; the scalar loop took about a third of a 1-thread RandomResizedCrop(224) decode. Eight
// pixels per step (24 bytes in, 3 x 8 floats out) with the per-channel constants laid out in three
// vectors of period 3 (NHWC), or one shuffle per channel plane (NCHW), bring it to a few percent.
#include "common/fp_exact.h"  // first: the mixed rows multiply and add separately (mix_batch's bits)
#include "decode/output.h"
#include "common/half_float.h"

#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#define FASTLOAD_OUTPUT_X86 1
#include <immintrin.h>
#endif

namespace fastload {

uint16_t float_to_half(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7FFFFFu;
  const int exp = static_cast<int>((x >> 23) & 0xFFu);
  if (exp == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (mant != 0 ? 0x200u | (mant >> 13) : 0u));
  const int e = exp - 127 + 15;
  if (e >= 0x1F) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow: infinity
  if (e <= 0) {                                                 // half subnormal, or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

bool make_output_format(const OutputParams& p, int height, int width, OutputFormat* out, std::string* why) {
  OutputFormat f;
  f.dtype = p.dtype;
  f.layout = p.layout;
  f.normalize = p.normalize;
  f.height = height;
  f.width = width;
  if (p.dtype != DType::kUint8 && p.dtype != DType::kFloat32 && p.dtype != DType::kFloat16) {
    *why = "unknown output dtype";
    return false;
  }
  if (p.layout != Layout::kNhwc && p.layout != Layout::kNchw) {
    *why = "unknown output layout";
    return false;
  }
  if (p.normalize) {
    if (p.dtype == DType::kUint8) {
      *why = "a normalized output must be float32 or float16";
      return false;
    }
    if (!std::isfinite(p.scale)) {
      *why = "Normalize scale must be finite";
      return false;
    }
    for (int c = 0; c < 3; ++c) {
      if (!std::isfinite(p.mean[c]) || !std::isfinite(p.std_dev[c]) || p.std_dev[c] == 0.0) {
        *why = "Normalize mean and std must be finite and std non-zero";
        return false;
      }
      f.mul[c] = static_cast<float>(p.scale / p.std_dev[c]);
      f.add[c] = static_cast<float>(-p.mean[c] / p.std_dev[c]);
    }
  }
  *out = f;
  return true;
}

namespace {

// ---- scalar kernels (the reference bits every SIMD kernel must reproduce) ----

void row_scalar(const OutputFormat& f, const uint8_t* rgb, int y, void* slot) {
  const int w = f.width;
  const size_t plane = static_cast<size_t>(f.height) * w;
  const size_t row = static_cast<size_t>(y) * w;
  if (f.dtype == DType::kUint8) {
    uint8_t* d = static_cast<uint8_t*>(slot);
    if (f.layout == Layout::kNhwc) {
      std::memcpy(d + 3 * row, rgb, 3 * static_cast<size_t>(w));
    } else {
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) d[c * plane + row + x] = rgb[3 * x + c];
    }
    return;
  }
  for (int x = 0; x < w; ++x) {
    for (int c = 0; c < 3; ++c) {
      const float v = std::fmaf(static_cast<float>(rgb[3 * x + c]), f.mul[c], f.add[c]);
      const size_t at = f.layout == Layout::kNhwc ? 3 * (row + x) + c : c * plane + row + x;
      if (f.dtype == DType::kFloat32)
        static_cast<float*>(slot)[at] = v;
      else
        static_cast<uint16_t*>(slot)[at] = float_to_half(v);
    }
  }
}

#ifdef FASTLOAD_OUTPUT_X86

// Packed RGB -> three uint8 planes, 16 pixels (48 bytes, three loads) per step: each plane gathers
// its bytes from the three loads with one shuffle each (-1 lanes give zero) and ORs them together.
struct PlaneMasks {
  __m128i m[3][3];  // [channel][load]
};

PlaneMasks make_plane_masks() {
  PlaneMasks pm;
  for (int c = 0; c < 3; ++c) {
    for (int l = 0; l < 3; ++l) {
      alignas(16) int8_t m[16];
      for (int x = 0; x < 16; ++x) {
        const int byte = 3 * x + c - 16 * l;
        m[x] = (byte >= 0 && byte < 16) ? static_cast<int8_t>(byte) : static_cast<int8_t>(-1);
      }
      std::memcpy(&pm.m[c][l], m, 16);
    }
  }
  return pm;
}

__attribute__((target("ssse3"))) void planes_u8_ssse3(const uint8_t* line, int w, uint8_t* r, uint8_t* g, uint8_t* b) {
  static const PlaneMasks pm = make_plane_masks();
  uint8_t* planes[3] = {r, g, b};
  int x = 0;
  for (; x + 16 <= w; x += 16) {
    const __m128i* p = reinterpret_cast<const __m128i*>(line + 3 * x);
    const __m128i v0 = _mm_loadu_si128(p), v1 = _mm_loadu_si128(p + 1), v2 = _mm_loadu_si128(p + 2);
    for (int c = 0; c < 3; ++c) {
      const __m128i v = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(v0, pm.m[c][0]), _mm_shuffle_epi8(v1, pm.m[c][1])),
                                     _mm_shuffle_epi8(v2, pm.m[c][2]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(planes[c] + x), v);
    }
  }
  for (; x < w; ++x) r[x] = line[3 * x], g[x] = line[3 * x + 1], b[x] = line[3 * x + 2];
}

// Eight pixels' channel c from 24 packed bytes: bytes 3k + c of (lo: bytes 0..15, hi: 16..23).
struct ChannelMasks {
  __m128i lo[3], hi[3];
};

ChannelMasks make_channel_masks() {
  ChannelMasks cm;
  for (int c = 0; c < 3; ++c) {
    alignas(16) int8_t lo[16], hi[16];
    for (int k = 0; k < 16; ++k) {
      const int byte = 3 * k + c;
      lo[k] = (k < 8 && byte < 16) ? static_cast<int8_t>(byte) : static_cast<int8_t>(-1);
      hi[k] = (k < 8 && byte >= 16) ? static_cast<int8_t>(byte - 16) : static_cast<int8_t>(-1);
    }
    std::memcpy(&cm.lo[c], lo, 16);
    std::memcpy(&cm.hi[c], hi, 16);
  }
  return cm;
}

template <bool kHalf>
__attribute__((target("avx2,fma,f16c"))) inline void store8(void* dst, size_t at, __m256 v) {
  if (kHalf) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(dst) + at),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    _mm256_storeu_ps(static_cast<float*>(dst) + at, v);
  }
}

__attribute__((target("avx2,fma,f16c"))) inline __m256 widen8(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

// Channel c of 8 packed RGB pixels (24 bytes from s, readable to s + 24), widened to floats.
__attribute__((target("avx2,fma,f16c"))) inline __m256 channel8(const uint8_t* s, const ChannelMasks& cm, int c) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 16));
  return widen8(_mm_or_si128(_mm_shuffle_epi8(lo, cm.lo[c]), _mm_shuffle_epi8(hi, cm.hi[c])));
}

// A MixUp of the row with the previous sample's (write_output_row_mixed): its pixels and weights.
struct RowMix {
  const uint8_t* prev = nullptr;
  float wa = 1, wb = 0;
};

// The mix of one element pair, as mix_batch computes it on the written outputs: float32
// prev * wb + own * wa; float16 each output rounded to half, each product rounded to half, then
// their sum (rounded by the store).
template <bool kHalf>
__attribute__((target("avx2,fma,f16c"))) inline __m256 mix8(__m256 own, __m256 prev, __m256 wa, __m256 wb) {
  if (!kHalf) return _mm256_add_ps(_mm256_mul_ps(prev, wb), _mm256_mul_ps(own, wa));
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256 o = _mm256_cvtph_ps(_mm256_cvtps_ph(own, kRound));
  const __m256 p = _mm256_cvtph_ps(_mm256_cvtps_ph(prev, kRound));
  const __m256 x = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(p, wb), kRound));
  const __m256 y = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(o, wa), kRound));
  return _mm256_add_ps(x, y);
}

float mix1(float own, float prev, bool half, float wa, float wb) {
  if (!half) return prev * wb + own * wa;
  const auto round = [](float v) { return half::to_float(float_to_half(v)); };
  return round(round(prev) * wb) + round(round(own) * wa);
}

// kMix: each element is the mix of this row's value and mix.prev's (same layout, same arithmetic).
template <bool kHalf, bool kMix = false>
__attribute__((target("avx2,fma,f16c"))) void float_row_avx2(const OutputFormat& f, const uint8_t* rgb, int y,
                                                             void* slot, const RowMix& mix = RowMix()) {
  const __m256 wa = _mm256_set1_ps(mix.wa), wb = _mm256_set1_ps(mix.wb);
  const uint8_t* q = mix.prev;
  const int w = f.width;
  const size_t plane = static_cast<size_t>(f.height) * w;
  const size_t row = static_cast<size_t>(y) * w;
  const float* m = f.mul;
  const float* a = f.add;
  int x = 0;
  if (f.layout == Layout::kNhwc) {
    // 24 consecutive elements start at channel 0; their channels run 0,1,2,0,1,2,...: three
    // vectors of constants with period 3 cover them.
    const __m256 m0 = _mm256_setr_ps(m[0], m[1], m[2], m[0], m[1], m[2], m[0], m[1]);
    const __m256 m1 = _mm256_setr_ps(m[2], m[0], m[1], m[2], m[0], m[1], m[2], m[0]);
    const __m256 m2 = _mm256_setr_ps(m[1], m[2], m[0], m[1], m[2], m[0], m[1], m[2]);
    const __m256 a0 = _mm256_setr_ps(a[0], a[1], a[2], a[0], a[1], a[2], a[0], a[1]);
    const __m256 a1 = _mm256_setr_ps(a[2], a[0], a[1], a[2], a[0], a[1], a[2], a[0]);
    const __m256 a2 = _mm256_setr_ps(a[1], a[2], a[0], a[1], a[2], a[0], a[1], a[2]);
    const size_t base = 3 * row;
    const __m256 ms[3] = {m0, m1, m2}, as[3] = {a0, a1, a2};
    for (; x + 8 <= w; x += 8) {
      const size_t at = base + 3 * static_cast<size_t>(x);
      for (int k = 0; k < 3; ++k) {
        const size_t off = 3 * static_cast<size_t>(x) + 8 * k;
        __m256 v = _mm256_fmadd_ps(widen8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rgb + off))), ms[k], as[k]);
        if (kMix) {
          const __m256 p =
              _mm256_fmadd_ps(widen8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + off))), ms[k], as[k]);
          v = mix8<kHalf>(v, p, wa, wb);
        }
        store8<kHalf>(slot, at + 8 * k, v);
      }
    }
  } else {
    static const ChannelMasks cm = make_channel_masks();
    const __m256 mc[3] = {_mm256_set1_ps(m[0]), _mm256_set1_ps(m[1]), _mm256_set1_ps(m[2])};
    const __m256 ac[3] = {_mm256_set1_ps(a[0]), _mm256_set1_ps(a[1]), _mm256_set1_ps(a[2])};
    for (; x + 8 <= w; x += 8) {
      for (int c = 0; c < 3; ++c) {
        __m256 v = _mm256_fmadd_ps(channel8(rgb + 3 * x, cm, c), mc[c], ac[c]);
        if (kMix) v = mix8<kHalf>(v, _mm256_fmadd_ps(channel8(q + 3 * x, cm, c), mc[c], ac[c]), wa, wb);
        store8<kHalf>(slot, c * plane + row + x, v);
      }
    }
  }
  // The last w % 8 pixels: the scalar kernel's arithmetic (fmaf, the same rounding to half).
  for (; x < w; ++x) {
    for (int c = 0; c < 3; ++c) {
      float v = std::fmaf(static_cast<float>(rgb[3 * x + c]), m[c], a[c]);
      if (kMix) v = mix1(v, std::fmaf(static_cast<float>(q[3 * x + c]), m[c], a[c]), kHalf, mix.wa, mix.wb);
      const size_t at = f.layout == Layout::kNhwc ? 3 * (row + x) + c : c * plane + row + x;
      if (kHalf)
        static_cast<uint16_t*>(slot)[at] = float_to_half(v);
      else
        static_cast<float*>(slot)[at] = v;
    }
  }
}

void row_avx2(const OutputFormat& f, const uint8_t* rgb, int y, void* slot) {
  if (f.dtype == DType::kFloat32) return float_row_avx2<false>(f, rgb, y, slot);
  if (f.dtype == DType::kFloat16) return float_row_avx2<true>(f, rgb, y, slot);
  if (f.layout == Layout::kNhwc) return row_scalar(f, rgb, y, slot);  // a memcpy
  uint8_t* d = static_cast<uint8_t*>(slot);
  const size_t plane = static_cast<size_t>(f.height) * f.width;
  uint8_t* r = d + static_cast<size_t>(y) * f.width;
  planes_u8_ssse3(rgb, f.width, r, r + plane, r + 2 * plane);
}

bool cpu_has_avx2_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#endif

using RowKernel = void (*)(const OutputFormat&, const uint8_t*, int, void*);

std::atomic<bool> g_force_scalar{false};

RowKernel best_row_kernel(const char** name) {
#ifdef FASTLOAD_OUTPUT_X86
  static const bool avx2 = cpu_has_avx2_f16c();
  if (avx2 && !g_force_scalar.load(std::memory_order_relaxed)) {
    *name = "avx2";
    return row_avx2;
  }
#endif
  *name = "scalar";
  return row_scalar;
}

}  // namespace

void write_output_row(const OutputFormat& f, const uint8_t* rgb, int y, void* slot) {
  const char* name;
  best_row_kernel (&name)(f, rgb, y, slot);
}

bool write_output_row_mixed(const OutputFormat& f, const uint8_t* own, const uint8_t* prev, int y, void* slot, float wa,
                            float wb) {
#ifdef FASTLOAD_OUTPUT_X86
  static const bool avx2 = cpu_has_avx2_f16c();
  if (!avx2 || g_force_scalar.load(std::memory_order_relaxed) || f.dtype == DType::kUint8) return false;
  const RowMix mix{prev, wa, wb};
  if (f.dtype == DType::kFloat32)
    float_row_avx2<false, true>(f, own, y, slot, mix);
  else
    float_row_avx2<true, true>(f, own, y, slot, mix);
  return true;
#else
  (void)f, (void)own, (void)prev, (void)y, (void)slot, (void)wa, (void)wb;
  return false;
#endif
}

void write_output_image(const OutputFormat& f, const uint8_t* hwc, size_t stride, void* slot) {
  const char* name;
  const RowKernel kernel = best_row_kernel(&name);
  for (int y = 0; y < f.height; ++y) kernel(f, hwc + static_cast<size_t>(y) * stride, y, slot);
}

const char* output_kernel_name() {
  const char* name;
  best_row_kernel(&name);
  return name;
}

bool output_force_kernels(const std::string& name) {
  if (name == "scalar") {
    g_force_scalar.store(true);
    return true;
  }
  if (name == "best") {
    g_force_scalar.store(false);
    return true;
  }
  return false;
}

}  // namespace fastload
