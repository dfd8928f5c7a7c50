// Pixels stage (native): AVX-512 (F/BW/DQ/VL/VBMI) kernels of the pixel ops; same bytes as the scalar
// twins in pixel_kernels_scalar.cpp (see pixel_kernels.h).
//
// Packed RGB is handled 16 pixels (48 bytes) at a time: one masked load, one vpermb to planar
// R|G|B bytes, widened to 16 int32 / float lanes per channel, and the reverse on the way out. Table
// lookups use vpermi2b on the 256-byte table held in four registers (64 bytes per 4 instructions).
// Floating-point steps are separate multiplies and adds in the scalar code's order (no FMA), and the
// steps Pillow computes in double are computed in double here too, so the results are identical.
// Measured on 224x224 images (1 thread, this machine): hue 0.39 ms scalar -> 0.04 ms, saturation
// 0.12 -> 0.012 ms, a table lookup pass 0.05 -> 0.003 ms.
#include "common/fp_exact.h"  // first: no fused multiply-add
#include "pixel/pixel_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12 flags the _mm512_undefined_* placeholders inside its own intrinsics headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cfloat>
#include <cstring>

#define FL_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi")))

namespace fastload {
namespace pixel {
namespace {

constexpr __mmask64 kMask48 = (__mmask64{1} << 48) - 1;

struct Tables {
  alignas(64) uint8_t deint[64];
  alignas(64) uint8_t inter[64];
  alignas(64) uint8_t phase[3][64];  // lane j of a 64-byte vector starting at byte offset o: (o + j) % 3
  Tables() {
    for (int j = 0; j < 64; ++j) {
      deint[j] = j < 16 ? 3 * j : j < 32 ? 3 * (j - 16) + 1 : j < 48 ? 3 * (j - 32) + 2 : 0;
      inter[j] = j < 48 ? static_cast<uint8_t>((j % 3) * 16 + j / 3) : 0;
      for (int o = 0; o < 3; ++o) phase[o][j] = static_cast<uint8_t>((o + j) % 3);
    }
  }
};
const Tables kT;

inline __mmask64 tail_mask(size_t pixels) { return pixels >= 16 ? kMask48 : ((__mmask64{1} << (3 * pixels)) - 1); }

// 16 packed pixels at a time. Masked loads and stores cost about ten times the plain ones on this
// CPU (AMD EPYC, Zen 5: a 150 KB read-modify-write pass 15 us masked vs 1.2 us plain), so blocks
// use a plain 64-byte load and 32 + 16-byte stores while 64 bytes remain readable, and the masked
// forms only for the last blocks (RUN_BLOCKS).
template <bool kTail>
FL_AVX512 inline void load16(const uint8_t* p, __mmask64 m, __m512i* r, __m512i* g, __m512i* b) {
  const __m512i raw = kTail ? _mm512_maskz_loadu_epi8(m, p) : _mm512_loadu_si512(p);
  const __m512i planar = _mm512_permutexvar_epi8(_mm512_load_si512(kT.deint), raw);
  *r = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(planar));
  *g = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(planar, 1));
  *b = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(planar, 2));
}

// Three vectors of 16 int32 in [0, 255] -> 16 packed pixels.
template <bool kTail>
FL_AVX512 inline void store16(uint8_t* p, __mmask64 m, __m512i r, __m512i g, __m512i b) {
  __m512i planar = _mm512_castsi128_si512(_mm512_cvtepi32_epi8(r));
  planar = _mm512_inserti32x4(planar, _mm512_cvtepi32_epi8(g), 1);
  planar = _mm512_inserti32x4(planar, _mm512_cvtepi32_epi8(b), 2);
  const __m512i out = _mm512_permutexvar_epi8(_mm512_load_si512(kT.inter), planar);
  if (kTail) {
    _mm512_mask_storeu_epi8(p, m, out);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_castsi512_si256(out));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 32), _mm512_extracti32x4_epi32(out, 2));
  }
}

// Runs block<kTail>(pixel pointer, mask, args...) over the image, 16 pixels per call.
#define RUN_BLOCKS(block, rgb, pixels, ...)                                                             \
  do {                                                                                                  \
    size_t i_ = 0;                                                                                      \
    for (; i_ + 22 <= (pixels); i_ += 16) block<false>((rgb) + 3 * i_, 0, __VA_ARGS__);                 \
    for (; i_ < (pixels); i_ += 16) block<true>((rgb) + 3 * i_, tail_mask((pixels) - i_), __VA_ARGS__); \
  } while (0)

struct Lut256 {
  __m512i t0, t1, t2, t3;
};

FL_AVX512 inline Lut256 load_lut(const uint8_t* lut) {
  return {_mm512_loadu_si512(lut), _mm512_loadu_si512(lut + 64), _mm512_loadu_si512(lut + 128),
          _mm512_loadu_si512(lut + 192)};
}

FL_AVX512 inline __m512i lookup(const Lut256& t, __m512i x) {
  const __m512i lo = _mm512_permutex2var_epi8(t.t0, x, t.t1);
  const __m512i hi = _mm512_permutex2var_epi8(t.t2, x, t.t3);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
}

FL_AVX512 void lut1_avx512(uint8_t* p, size_t n, const uint8_t* lut) {
  const Lut256 t = load_lut(lut);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(p + i, lookup(t, _mm512_loadu_si512(p + i)));
  if (i < n) {
    const __mmask64 m = (__mmask64{1} << (n - i)) - 1;
    _mm512_mask_storeu_epi8(p + i, m, lookup(t, _mm512_maskz_loadu_epi8(m, p + i)));
  }
}

FL_AVX512 void lut3_avx512(uint8_t* rgb, size_t pixels, const uint8_t* lut) {
  const Lut256 tr = load_lut(lut), tg = load_lut(lut + 256), tb = load_lut(lut + 512);
  const size_t n = pixels * 3;
  __mmask64 is_g[3], is_b[3];
  for (int o = 0; o < 3; ++o) {
    const __m512i ph = _mm512_load_si512(kT.phase[o]);
    is_g[o] = _mm512_cmpeq_epi8_mask(ph, _mm512_set1_epi8(1));
    is_b[o] = _mm512_cmpeq_epi8_mask(ph, _mm512_set1_epi8(2));
  }
  size_t i = 0;
  int o = 0;  // i % 3; 64 % 3 == 1
  for (; i < n; i += 64, o = (o + 1) % 3) {
    const bool full = n - i >= 64;
    const __mmask64 m = full ? ~__mmask64{0} : ((__mmask64{1} << (n - i)) - 1);
    const __m512i x = full ? _mm512_loadu_si512(rgb + i) : _mm512_maskz_loadu_epi8(m, rgb + i);
    __m512i v = lookup(tr, x);
    v = _mm512_mask_blend_epi8(is_g[o], v, lookup(tg, x));
    v = _mm512_mask_blend_epi8(is_b[o], v, lookup(tb, x));
    if (full)
      _mm512_storeu_si512(rgb + i, v);
    else
      _mm512_mask_storeu_epi8(rgb + i, m, v);
  }
}

FL_AVX512 inline __m512i pil_luma16(__m512i r, __m512i g, __m512i b) {
  __m512i s = _mm512_mullo_epi32(r, _mm512_set1_epi32(19595));
  s = _mm512_add_epi32(s, _mm512_mullo_epi32(g, _mm512_set1_epi32(38470)));
  s = _mm512_add_epi32(s, _mm512_mullo_epi32(b, _mm512_set1_epi32(7471)));
  return _mm512_srli_epi32(_mm512_add_epi32(s, _mm512_set1_epi32(0x8000)), 16);
}

FL_AVX512 inline __m512i mx_gray16(__m512i r, __m512i g, __m512i b) {
  __m512i s = _mm512_mullo_epi32(b, _mm512_set1_epi32(4899));
  s = _mm512_add_epi32(s, _mm512_mullo_epi32(g, _mm512_set1_epi32(9617)));
  s = _mm512_add_epi32(s, _mm512_mullo_epi32(r, _mm512_set1_epi32(1868)));
  return _mm512_srli_epi32(_mm512_add_epi32(s, _mm512_set1_epi32(1 << 13)), 14);
}

FL_AVX512 inline uint64_t reduce_u32(__m512i acc) {
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(acc)))) +
         static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(acc, 1))));
}

// Sum of a per-pixel gray value; lanes hold at most 255 per block, flushed before they could reach 2^32.
template <bool kMx>
FL_AVX512 uint64_t gray_sum(const uint8_t* rgb, size_t pixels) {
  __m512i acc = _mm512_setzero_si512();
  uint64_t total = 0;
  size_t i = 0, blocks = 0;
  for (; i + 22 <= pixels; i += 16) {
    __m512i r, g, b;
    load16<false>(rgb + 3 * i, 0, &r, &g, &b);
    acc = _mm512_add_epi32(acc, kMx ? mx_gray16(r, g, b) : pil_luma16(r, g, b));
    if (++blocks == (1u << 20)) total += reduce_u32(acc), acc = _mm512_setzero_si512(), blocks = 0;
  }
  for (; i < pixels; i += 16) {
    __m512i r, g, b;
    const size_t left = pixels - i;
    load16<true>(rgb + 3 * i, tail_mask(left), &r, &g, &b);
    const __m512i l = kMx ? mx_gray16(r, g, b) : pil_luma16(r, g, b);
    acc = _mm512_add_epi32(acc,
                           _mm512_maskz_mov_epi32(static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1), l));
  }
  return total + reduce_u32(acc);
}

FL_AVX512 uint64_t luma_sum_avx512(const uint8_t* rgb, size_t pixels) { return gray_sum<false>(rgb, pixels); }
FL_AVX512 uint64_t mx_gray_sum_avx512(const uint8_t* rgb, size_t pixels) { return gray_sum<true>(rgb, pixels); }

template <bool kTail>
FL_AVX512 inline void gray_block(uint8_t* p, __mmask64 m, int) {
  __m512i r, g, b;
  load16<kTail>(p, m, &r, &g, &b);
  const __m512i l = pil_luma16(r, g, b);
  store16<kTail>(p, m, l, l, l);
}

FL_AVX512 void grayscale_avx512(uint8_t* rgb, size_t pixels) { RUN_BLOCKS(gray_block, rgb, pixels, 0); }

// Pillow's blend of (in1, in2) with a float alpha: truncation, plus clipping when extrapolating.
FL_AVX512 inline __m512i pil_blend16(__m512i in1, __m512i in2, __m512 alpha, bool clip) {
  __m512 v =
      _mm512_add_ps(_mm512_cvtepi32_ps(in1), _mm512_mul_ps(alpha, _mm512_cvtepi32_ps(_mm512_sub_epi32(in2, in1))));
  if (clip) v = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
  return _mm512_cvttps_epi32(v);
}

template <bool kTail>
FL_AVX512 inline void saturation_block(uint8_t* p, __mmask64 m, __m512 a, bool clip) {
  __m512i r, g, b;
  load16<kTail>(p, m, &r, &g, &b);
  const __m512i l = pil_luma16(r, g, b);
  store16<kTail>(p, m, pil_blend16(l, r, a, clip), pil_blend16(l, g, a, clip), pil_blend16(l, b, a, clip));
}

FL_AVX512 void saturation_avx512(uint8_t* rgb, size_t pixels, float alpha) {
  RUN_BLOCKS(saturation_block, rgb, pixels, _mm512_set1_ps(alpha), !(alpha >= 0.0f && alpha <= 1.0f));
}

// C's round() (half away from zero) of non-negative floats.
FL_AVX512 inline __m512 round_half_up_ps(__m512 x) {
  const __m512 t = _mm512_roundscale_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(x, t), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  return _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0f));
}

// uh for 8 lanes: trunc(float(fmod(h / 6.0 + 1.0, 1.0)) * 255.0), Pillow's double steps; h * (1 / 6.0)
// instead of h / 6.0 gives the same bytes for every RGB value (checked exhaustively).
FL_AVX512 inline __m256i hue_byte8(__m256 h) {
  __m512d y = _mm512_add_pd(_mm512_mul_pd(_mm512_cvtps_pd(h), _mm512_set1_pd(1.0 / 6.0)), _mm512_set1_pd(1.0));
  y = _mm512_mask_sub_pd(y, _mm512_cmp_pd_mask(y, _mm512_set1_pd(1.0), _CMP_GE_OQ), y, _mm512_set1_pd(1.0));
  const __m512d hf = _mm512_cvtps_pd(_mm512_cvtpd_ps(y));
  return _mm512_cvttpd_epi32(_mm512_mul_pd(hf, _mm512_set1_pd(255.0)));
}

// adjust_hue on 16 pixels: Pillow's rgb2hsv, hue byte + shift, hsv2rgb. Besides the one double
// step above, every value is a single float operation on exactly the operands Pillow rounds to
// float, which the exhaustive tests confirm: the mid channel's quotient (the others are 0 and 1),
// s * 255 truncated, and hsv2rgb's p, q, t in float (equal to Pillow's double products over every
// (h, s, v)).
template <bool kTail>
FL_AVX512 inline void hue_block(uint8_t* p, __mmask64 m, __m512i vshift) {
  __m512i r, g, b;
  load16<kTail>(p, m, &r, &g, &b);
  const __m512i zero = _mm512_setzero_si512(), v255 = _mm512_set1_epi32(255);
  const __m512i maxc = _mm512_max_epi32(r, _mm512_max_epi32(g, b));
  const __m512i minc = _mm512_min_epi32(r, _mm512_min_epi32(g, b));
  const __m512i cr_i = _mm512_sub_epi32(maxc, minc);
  const __mmask16 grey = _mm512_cmpeq_epi32_mask(cr_i, zero);
  const __m512i mid = _mm512_sub_epi32(_mm512_sub_epi32(_mm512_add_epi32(r, _mm512_add_epi32(g, b)), maxc), minc);
  const __m512 crf = _mm512_cvtepi32_ps(_mm512_max_epi32(cr_i, _mm512_set1_epi32(1)));
  const __m512 x = _mm512_div_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(maxc, mid)), crf);
  const __m512 s = _mm512_div_ps(crf, _mm512_cvtepi32_ps(_mm512_max_epi32(maxc, _mm512_set1_epi32(1))));
  const __mmask16 r_max = _mm512_cmpeq_epi32_mask(r, maxc);
  const __mmask16 g_max = _mm512_knot(r_max) & _mm512_cmpeq_epi32_mask(g, maxc);
  const __mmask16 b_max = _mm512_knot(r_max | g_max);
  const __mmask16 r_min = _mm512_cmpeq_epi32_mask(r, minc);
  const __mmask16 g_min = _mm512_cmpeq_epi32_mask(g, minc);
  const __mmask16 b_min = _mm512_cmpeq_epi32_mask(b, minc);
  // h = K +- x: r max: b min -> 1 - x, else x - 1; g max: r min -> 3 - x, else 1 + x;
  // b max: g min -> 5 - x, else 3 + x.
  const __mmask16 neg = (r_max & b_min) | (g_max & r_min) | (b_max & g_min);
  __m512 k = _mm512_set1_ps(-1.0f);
  k = _mm512_mask_mov_ps(k, (r_max & b_min) | g_max, _mm512_set1_ps(1.0f));
  k = _mm512_mask_mov_ps(k, (g_max & r_min) | b_max, _mm512_set1_ps(3.0f));
  k = _mm512_mask_mov_ps(k, b_max & g_min, _mm512_set1_ps(5.0f));
  const __m512 h = _mm512_add_ps(k, _mm512_mask_sub_ps(x, neg, _mm512_setzero_ps(), x));
  __m512i uh = _mm512_inserti64x4(_mm512_castsi256_si512(hue_byte8(_mm512_castps512_ps256(h))),
                                  hue_byte8(_mm512_extractf32x8_ps(h, 1)), 1);
  __m512i us = _mm512_cvttps_epi32(_mm512_mul_ps(s, _mm512_set1_ps(255.0f)));
  uh = _mm512_maskz_mov_epi32(_mm512_knot(grey), uh);
  us = _mm512_maskz_mov_epi32(_mm512_knot(grey), us);
  // hsv2rgb of (uh + shift, us, max).
  const __m512i h2 = _mm512_and_si512(_mm512_add_epi32(uh, vshift), v255);
  const __m512i six_h = _mm512_mullo_epi32(h2, _mm512_set1_epi32(6));
  // i = floor(6 h / 255) exactly (the double quotient is never within rounding of another integer).
  const __m512i i = _mm512_srli_epi32(_mm512_mullo_epi32(six_h, _mm512_set1_epi32(16449)), 22);
  const __m512 f =
      _mm512_div_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(six_h, _mm512_mullo_epi32(i, v255))), _mm512_set1_ps(255.0f));
  const __m512 fs = _mm512_div_ps(_mm512_cvtepi32_ps(us), _mm512_set1_ps(255.0f));
  const __m512 vf = _mm512_cvtepi32_ps(maxc);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i pp = _mm512_cvttps_epi32(round_half_up_ps(_mm512_mul_ps(vf, _mm512_sub_ps(one, fs))));
  const __m512i qq = _mm512_cvttps_epi32(round_half_up_ps(_mm512_mul_ps(vf, _mm512_sub_ps(one, _mm512_mul_ps(fs, f)))));
  const __m512i tt = _mm512_cvttps_epi32(
      round_half_up_ps(_mm512_mul_ps(vf, _mm512_sub_ps(one, _mm512_mul_ps(fs, _mm512_sub_ps(one, f))))));
  // Sector i % 6 picks (R, G, B) among (v, p, q, t): 0 (v, t, p), 1 (q, v, p), 2 (p, v, t), 3 (p, q, v),
  // 4 (t, p, v), 5 (v, p, q). The four bytes are packed in one word per lane (v | p << 8 | q << 16 |
  // t << 24) and each channel shifts its byte out by a per-sector amount from a 16-entry table: no
  // per-sector compare masks (the mask registers were this kernel's bottleneck).
  const __m512i v = maxc;
  const __m512i word = _mm512_or_si512(_mm512_or_si512(v, _mm512_slli_epi32(pp, 8)),
                                       _mm512_or_si512(_mm512_slli_epi32(qq, 16), _mm512_slli_epi32(tt, 24)));
  const __m512i sr = _mm512_setr_epi32(0, 16, 8, 8, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i sg = _mm512_setr_epi32(24, 0, 0, 16, 8, 8, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i sb = _mm512_setr_epi32(8, 8, 24, 0, 0, 16, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  // i == 6 (h = 255) is sector 0: entry 6 of each table repeats entry 0.
  const __m512i b255 = _mm512_set1_epi32(255);
  __m512i ro = _mm512_and_si512(_mm512_srlv_epi32(word, _mm512_permutexvar_epi32(i, sr)), b255);
  __m512i go = _mm512_and_si512(_mm512_srlv_epi32(word, _mm512_permutexvar_epi32(i, sg)), b255);
  __m512i bo = _mm512_and_si512(_mm512_srlv_epi32(word, _mm512_permutexvar_epi32(i, sb)), b255);
  const __mmask16 flat = _mm512_cmpeq_epi32_mask(us, zero);
  store16<kTail>(p, m, _mm512_mask_mov_epi32(ro, flat, v), _mm512_mask_mov_epi32(go, flat, v),
                 _mm512_mask_mov_epi32(bo, flat, v));
}

FL_AVX512 void hue_avx512(uint8_t* rgb, size_t pixels, uint8_t shift) {
  RUN_BLOCKS(hue_block, rgb, pixels, _mm512_set1_epi32(shift));
}

FL_AVX512 inline __m512 ld16(const uint8_t* p, bool tail, __mmask16 m) {
  const __m128i x = tail ? _mm_maskz_loadu_epi8(m, p) : _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(x));
}

// Sharpness on the interior, byte by byte: the neighbours of a byte are 3 bytes left/right and one
// row up/down, so the 3x3 filter runs on interleaved RGB without unpacking.
FL_AVX512 void sharpen_avx512(const uint8_t* src, uint8_t* dst, int h, int w, float alpha) {
  const __m512 k1 = _mm512_set1_ps(1.0f / 13.0f), k5 = _mm512_set1_ps(5.0f / 13.0f);
  const __m512 a = _mm512_set1_ps(alpha);
  const bool clip = !(alpha >= 0.0f && alpha <= 1.0f);
  const size_t stride = static_cast<size_t>(w) * 3;
  const size_t end = stride - 3;
  for (int y = 1; y < h - 1; ++y) {
    const uint8_t* up = src + (y - 1) * stride;
    const uint8_t* mid = src + y * stride;
    const uint8_t* down = src + (y + 1) * stride;
    uint8_t* out = dst + y * stride;
    for (size_t j = 3; j < end; j += 16) {
      // Plain loads while the furthest one (j + 3 .. j + 18) stays inside the row.
      const bool tail = j + 19 > stride;
      const __mmask16 m =
          end - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (end - j)) - 1);
      __m512 ss = _mm512_set1_ps(0.5f);
      ss = _mm512_add_ps(ss, _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(ld16(down + j - 3, tail, m), k1),
                                                         _mm512_mul_ps(ld16(down + j, tail, m), k1)),
                                           _mm512_mul_ps(ld16(down + j + 3, tail, m), k1)));
      const __m512 centre = ld16(mid + j, tail, m);
      ss = _mm512_add_ps(
          ss, _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(ld16(mid + j - 3, tail, m), k1), _mm512_mul_ps(centre, k5)),
                            _mm512_mul_ps(ld16(mid + j + 3, tail, m), k1)));
      ss = _mm512_add_ps(ss, _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(ld16(up + j - 3, tail, m), k1),
                                                         _mm512_mul_ps(ld16(up + j, tail, m), k1)),
                                           _mm512_mul_ps(ld16(up + j + 3, tail, m), k1)));
      ss = _mm512_min_ps(_mm512_max_ps(ss, _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
      const __m512i res = pil_blend16(_mm512_cvttps_epi32(ss), _mm512_cvttps_epi32(centre), a, clip);
      const __m128i bytes = _mm512_cvtepi32_epi8(res);
      if (end - j >= 16)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), bytes);
      else
        _mm_mask_storeu_epi8(out + j, m, bytes);
    }
  }
}

FL_AVX512 void minmax_avx512(const uint8_t* rgb, size_t pixels, uint8_t lo[3], uint8_t hi[3]) {
  // Three accumulators over 192-byte steps: lane j of accumulator k always sees channel (64k + j) % 3.
  const size_t n = pixels * 3;
  __m512i mn[3], mx[3];
  for (int k = 0; k < 3; ++k) mn[k] = _mm512_set1_epi8(static_cast<char>(0xFF)), mx[k] = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 192 <= n; i += 192) {
    for (int k = 0; k < 3; ++k) {
      const __m512i x = _mm512_loadu_si512(rgb + i + 64 * k);
      mn[k] = _mm512_min_epu8(mn[k], x);
      mx[k] = _mm512_max_epu8(mx[k], x);
    }
  }
  alignas(64) uint8_t a[64], b[64];
  uint8_t l[3] = {255, 255, 255}, u[3] = {0, 0, 0};
  for (int k = 0; k < 3; ++k) {
    _mm512_store_si512(a, mn[k]);
    _mm512_store_si512(b, mx[k]);
    for (int j = 0; j < 64; ++j) {
      const int c = (64 * k + j) % 3;
      if (a[j] < l[c]) l[c] = a[j];
      if (b[j] > u[c]) u[c] = b[j];
    }
  }
  for (; i < n; ++i) {
    const int c = static_cast<int>(i % 3);
    if (rgb[i] < l[c]) l[c] = rgb[i];
    if (rgb[i] > u[c]) u[c] = rgb[i];
  }
  for (int c = 0; c < 3; ++c) lo[c] = l[c], hi[c] = u[c];
}

// OpenCV's saturate_cast<uchar>(float) on 16 lanes: cvtps rounds half to even (default MXCSR).
FL_AVX512 inline __m512i cv_sat16(__m512 v) {
  return _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(v), _mm512_setzero_si512()), _mm512_set1_epi32(255));
}

template <bool kTail>
FL_AVX512 inline void mx_saturation_block(uint8_t* p, __mmask64 m, __m512 a, __m512 bt) {
  __m512i r, g, b;
  load16<kTail>(p, m, &r, &g, &b);
  const __m512 gb = _mm512_mul_ps(_mm512_cvtepi32_ps(mx_gray16(r, g, b)), bt);
  store16<kTail>(p, m, cv_sat16(_mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(r), a), gb)),
                 cv_sat16(_mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(g), a), gb)),
                 cv_sat16(_mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(b), a), gb)));
}

FL_AVX512 void mx_saturation_avx512(uint8_t* rgb, size_t pixels, float alpha, float beta) {
  RUN_BLOCKS(mx_saturation_block, rgb, pixels, _mm512_set1_ps(alpha), _mm512_set1_ps(beta));
}

// OpenCV's RGB2HLS_f / HLS2RGB_f scalar code (8-bit wrappers) on 16 pixels, with the jitter.
template <bool kTail>
FL_AVX512 inline void mx_hls_block(uint8_t* p, __mmask64 m, __m512i dh, __m512i dl, __m512i ds) {
  const __m512 k255 = _mm512_set1_ps(1.0f / 255.0f);
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  const __m512i izero = _mm512_setzero_si512(), i255 = _mm512_set1_epi32(255);
  __m512i ri, gi, bi;
  load16<kTail>(p, m, &ri, &gi, &bi);
  const __m512 r = _mm512_mul_ps(_mm512_cvtepi32_ps(ri), k255);
  const __m512 g = _mm512_mul_ps(_mm512_cvtepi32_ps(gi), k255);
  const __m512 b = _mm512_mul_ps(_mm512_cvtepi32_ps(bi), k255);
  const __m512 vmax = _mm512_max_ps(_mm512_max_ps(r, g), b);
  const __m512 vmin = _mm512_min_ps(_mm512_min_ps(r, g), b);
  const __m512 diff = _mm512_sub_ps(vmax, vmin);
  const __m512 sum = _mm512_add_ps(vmax, vmin);
  const __m512 l = _mm512_mul_ps(sum, _mm512_set1_ps(0.5f));
  const __mmask16 colour = _mm512_cmp_ps_mask(diff, _mm512_set1_ps(FLT_EPSILON), _CMP_GT_OQ);
  const __mmask16 low = _mm512_cmp_ps_mask(l, _mm512_set1_ps(0.5f), _CMP_LT_OQ);
  const __m512 den = _mm512_mask_mov_ps(_mm512_sub_ps(_mm512_sub_ps(_mm512_set1_ps(2.0f), vmax), vmin), low, sum);
  const __m512 safe_diff = _mm512_mask_mov_ps(one, colour, diff);
  __m512 s = _mm512_div_ps(safe_diff, _mm512_mask_mov_ps(one, colour, den));
  const __m512 d = _mm512_div_ps(_mm512_set1_ps(60.0f), safe_diff);
  const __mmask16 r_max = _mm512_cmp_ps_mask(vmax, r, _CMP_EQ_OQ);
  const __mmask16 g_max = _mm512_knot(r_max) & _mm512_cmp_ps_mask(vmax, g, _CMP_EQ_OQ);
  __m512 h = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(r, g), d), _mm512_set1_ps(240.0f));
  h = _mm512_mask_mov_ps(h, g_max, _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(b, r), d), _mm512_set1_ps(120.0f)));
  h = _mm512_mask_mov_ps(h, r_max, _mm512_mul_ps(_mm512_sub_ps(g, b), d));
  h = _mm512_mask_add_ps(h, _mm512_cmp_ps_mask(h, zero, _CMP_LT_OQ), h, _mm512_set1_ps(360.0f));
  h = _mm512_maskz_mov_ps(colour, h);
  s = _mm512_maskz_mov_ps(colour, s);
  __m512i H = cv_sat16(_mm512_mul_ps(h, _mm512_set1_ps(0.5f)));
  __m512i L = cv_sat16(_mm512_mul_ps(l, _mm512_set1_ps(255.0f)));
  __m512i S = cv_sat16(_mm512_mul_ps(s, _mm512_set1_ps(255.0f)));
  H = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(H, dh), izero), _mm512_set1_epi32(180));
  L = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(L, dl), izero), i255);
  S = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(S, ds), izero), i255);
  const __m512 l2 = _mm512_mul_ps(_mm512_cvtepi32_ps(L), k255);
  const __m512 s2 = _mm512_mul_ps(_mm512_cvtepi32_ps(S), k255);
  const __mmask16 le_half = _mm512_cmp_ps_mask(l2, _mm512_set1_ps(0.5f), _CMP_LE_OQ);
  const __m512 p2 = _mm512_mask_mov_ps(_mm512_sub_ps(_mm512_add_ps(l2, s2), _mm512_mul_ps(l2, s2)), le_half,
                                       _mm512_mul_ps(l2, _mm512_add_ps(one, s2)));
  const __m512 p1 = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), l2), p2);
  __m512 hh = _mm512_mul_ps(_mm512_cvtepi32_ps(H), _mm512_set1_ps(6.0f / 180.0f));
  hh = _mm512_mask_sub_ps(hh, _mm512_cmp_ps_mask(hh, _mm512_set1_ps(6.0f), _CMP_GE_OQ), hh, _mm512_set1_ps(6.0f));
  const __m512i sector = _mm512_cvttps_epi32(hh);
  const __m512 fr = _mm512_sub_ps(hh, _mm512_cvtepi32_ps(sector));
  const __m512 span = _mm512_sub_ps(p2, p1);
  const __m512 tab2 = _mm512_add_ps(p1, _mm512_mul_ps(span, _mm512_sub_ps(one, fr)));
  const __m512 tab3 = _mm512_add_ps(p1, _mm512_mul_ps(span, fr));
  // sector_data (b, g, r) -> tab: 0 (1,3,0) 1 (1,0,2) 2 (3,0,1) 3 (0,2,1) 4 (0,1,3) 5 (2,1,0).
  const __mmask16 q1 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(1));
  const __mmask16 q2 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(2));
  const __mmask16 q3 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(3));
  const __mmask16 q4 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(4));
  const __mmask16 q5 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(5));
  __m512 bo = _mm512_mask_mov_ps(p1, q2, tab3);
  bo = _mm512_mask_mov_ps(bo, q3 | q4, p2);
  bo = _mm512_mask_mov_ps(bo, q5, tab2);
  __m512 go = _mm512_mask_mov_ps(tab3, q1 | q2, p2);
  go = _mm512_mask_mov_ps(go, q3, tab2);
  go = _mm512_mask_mov_ps(go, q4 | q5, p1);
  __m512 ro = _mm512_mask_mov_ps(p2, q1, tab2);
  ro = _mm512_mask_mov_ps(ro, q2 | q3, p1);
  ro = _mm512_mask_mov_ps(ro, q4, tab3);
  const __mmask16 grey = _mm512_cmp_ps_mask(s2, zero, _CMP_EQ_OQ);
  ro = _mm512_mask_mov_ps(ro, grey, l2);
  go = _mm512_mask_mov_ps(go, grey, l2);
  bo = _mm512_mask_mov_ps(bo, grey, l2);
  const __m512 c255 = _mm512_set1_ps(255.0f);
  store16<kTail>(p, m, cv_sat16(_mm512_mul_ps(ro, c255)), cv_sat16(_mm512_mul_ps(go, c255)),
                 cv_sat16(_mm512_mul_ps(bo, c255)));
}

FL_AVX512 void mx_hls_avx512(uint8_t* rgb, size_t pixels, int dh, int dl, int ds) {
  RUN_BLOCKS(mx_hls_block, rgb, pixels, _mm512_set1_epi32(dh), _mm512_set1_epi32(dl), _mm512_set1_epi32(ds));
}

// 16 gathered RGBx words -> 48 packed bytes (drops every 4th byte).
struct PackTable {
  alignas(64) uint8_t idx[64];
  PackTable() {
    for (int j = 0; j < 64; ++j) idx[j] = j < 48 ? static_cast<uint8_t>((j / 3) * 4 + j % 3) : 0;
  }
};
const PackTable kPack;

FL_AVX512 inline void store_words(uint8_t* p, int count, __m512i words) {
  const __m512i packed = _mm512_permutexvar_epi8(_mm512_load_si512(kPack.idx), words);
  if (count == 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_castsi512_si256(packed));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 32), _mm512_extracti32x4_epi32(packed, 2));
  } else {
    _mm512_mask_storeu_epi8(p, (__mmask64{1} << (3 * count)) - 1, packed);
  }
}

FL_AVX512 inline void store_words8(uint8_t* p, int count, __m256i words) {
  const __m512i packed = _mm512_permutexvar_epi8(_mm512_load_si512(kPack.idx), _mm512_castsi256_si512(words));
  if (count == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_castsi512_si128(packed));
    std::memcpy(p + 16, reinterpret_cast<const uint8_t*>(&packed) + 16, 8);
  } else {
    _mm512_mask_storeu_epi8(p, (__mmask64{1} << (3 * count)) - 1, packed);
  }
}

// Pillow's affine_fixed: the 16.16 coordinates of lane x are the row start plus x steps (the same
// integers as its running sums), each in-range source pixel gathered as one 32-bit word (src is
// readable one byte past its end), out-of-range lanes take the fill.
FL_AVX512 void affine_nearest_fixed_avx512(const uint8_t* src, uint8_t* dst, int h, int w, const double a[6],
                                           const uint8_t fill[3]) {
  const __m512i fill_words = _mm512_set1_epi32(fill[0] | (fill[1] << 8) | (fill[2] << 16));
  auto fix = [](double v) {
    return v < 0.0 ? static_cast<int>(__builtin_floor(v * 65536.0 + 0.5)) : static_cast<int>(v * 65536.0 + 0.5);
  };
  const int a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
  int a2 = fix(a[2] + a[0] * 0.5 + a[1] * 0.5);
  int a5 = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
  const size_t stride = static_cast<size_t>(w) * 3;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step_x = _mm512_mullo_epi32(lane, _mm512_set1_epi32(a0));
  const __m512i step_y = _mm512_mullo_epi32(lane, _mm512_set1_epi32(a3));
  const __m512i wv = _mm512_set1_epi32(w), hv = _mm512_set1_epi32(h),
                stride_v = _mm512_set1_epi32(static_cast<int>(stride));
  for (int y = 0; y < h; ++y) {
    uint8_t* o = dst + y * stride;
    for (int x = 0; x < w; x += 16) {
      const int count = w - x >= 16 ? 16 : w - x;
      const __mmask16 live = static_cast<__mmask16>(count == 16 ? 0xFFFF : (1u << count) - 1);
      // Running sums in int32, wrapping as Pillow's do.
      const __m512i xx =
          _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<unsigned>(a2) +
                                                              static_cast<unsigned>(x) * static_cast<unsigned>(a0))),
                           step_x);
      const __m512i yy =
          _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<unsigned>(a5) +
                                                              static_cast<unsigned>(x) * static_cast<unsigned>(a3))),
                           step_y);
      const __m512i xi = _mm512_srai_epi32(xx, 16), yi = _mm512_srai_epi32(yy, 16);
      const __mmask16 ok = live & _mm512_cmpge_epi32_mask(xi, _mm512_setzero_si512()) &
                           _mm512_cmplt_epi32_mask(xi, wv) & _mm512_cmpge_epi32_mask(yi, _mm512_setzero_si512()) &
                           _mm512_cmplt_epi32_mask(yi, hv);
      const __m512i off =
          _mm512_add_epi32(_mm512_mullo_epi32(yi, stride_v), _mm512_mullo_epi32(xi, _mm512_set1_epi32(3)));
      const __m512i words = _mm512_mask_i32gather_epi32(fill_words, ok, off, src, 1);
      store_words(o + 3 * x, count, words);
    }
    a2 += a1;
    a5 += a4;
  }
}

// Pillow's bilinear_filter32RGB at affine_transform's coordinates, 8 output pixels per step in
// double: the same operations in the same order as the scalar twin. One 64-bit gather per source
// row brings both horizontal neighbours (pixel x0 and the 3 bytes after it; src is readable 8 bytes
// past its end); where Pillow clamps x1 onto x0, the right neighbour is taken equal to the left one.
FL_AVX512 void affine_bilinear_avx512(const uint8_t* src, uint8_t* dst, int h, int w, const double a[6],
                                      const uint8_t fill[3]) {
  const __m256i fill_words = _mm256_set1_epi32(fill[0] | (fill[1] << 8) | (fill[2] << 16));
  const size_t stride = static_cast<size_t>(w) * 3;
  const __m512d a0 = _mm512_set1_pd(a[0]), a1 = _mm512_set1_pd(a[1]), a2 = _mm512_set1_pd(a[2]);
  const __m512d a3 = _mm512_set1_pd(a[3]), a4 = _mm512_set1_pd(a[4]), a5 = _mm512_set1_pd(a[5]);
  const __m512d wd = _mm512_set1_pd(w), hd = _mm512_set1_pd(h), half = _mm512_set1_pd(0.5), zero = _mm512_setzero_pd();
  const __m512d lane = _mm512_setr_pd(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i wmax = _mm256_set1_epi32(w - 1), hmax = _mm256_set1_epi32(h - 1), izero = _mm256_setzero_si256();
  const __m256i stride_v = _mm256_set1_epi32(static_cast<int>(stride)), three = _mm256_set1_epi32(3);
  const __m512i mask8 = _mm512_set1_epi64(255);
  for (int y = 0; y < h; ++y) {
    uint8_t* o = dst + y * stride;
    const __m512d yc = _mm512_set1_pd(y + 0.5);
    for (int x = 0; x < w; x += 8) {
      const int count = w - x >= 8 ? 8 : w - x;
      const __m512d xc = _mm512_add_pd(_mm512_add_pd(_mm512_set1_pd(x), lane), half);
      __m512d xin = _mm512_add_pd(_mm512_add_pd(_mm512_mul_pd(a0, xc), _mm512_mul_pd(a1, yc)), a2);
      __m512d yin = _mm512_add_pd(_mm512_add_pd(_mm512_mul_pd(a3, xc), _mm512_mul_pd(a4, yc)), a5);
      const __mmask8 ok = static_cast<__mmask8>((count == 8 ? 0xFF : (1u << count) - 1)) &
                          _mm512_cmp_pd_mask(xin, zero, _CMP_GE_OQ) & _mm512_cmp_pd_mask(xin, wd, _CMP_LT_OQ) &
                          _mm512_cmp_pd_mask(yin, zero, _CMP_GE_OQ) & _mm512_cmp_pd_mask(yin, hd, _CMP_LT_OQ);
      __m256i result = fill_words;
      if (ok) {
        xin = _mm512_sub_pd(xin, half);
        yin = _mm512_sub_pd(yin, half);
        const __m512d xf = _mm512_roundscale_pd(xin, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __m512d yf = _mm512_roundscale_pd(yin, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __m512d dx = _mm512_sub_pd(xin, xf), dy = _mm512_sub_pd(yin, yf);
        const __m256i xi = _mm512_cvtpd_epi32(xf), yi = _mm512_cvtpd_epi32(yf);
        const __m256i x0 = _mm256_max_epi32(izero, _mm256_min_epi32(wmax, xi));
        const __m256i x1 = _mm256_max_epi32(izero, _mm256_min_epi32(wmax, _mm256_add_epi32(xi, _mm256_set1_epi32(1))));
        const __mmask8 same_x = _mm256_cmpeq_epi32_mask(x0, x1);
        const __m256i y0 = _mm256_max_epi32(izero, _mm256_min_epi32(hmax, yi));
        const __m256i y1raw = _mm256_add_epi32(yi, _mm256_set1_epi32(1));
        const __mmask8 has_r1 = _mm256_cmpge_epi32_mask(y1raw, izero) & _mm256_cmple_epi32_mask(y1raw, hmax);
        const __m256i y1 = _mm256_max_epi32(izero, _mm256_min_epi32(hmax, y1raw));
        const __m256i c0 = _mm256_mullo_epi32(x0, three);
        const __m512i q0 = _mm512_mask_i32gather_epi64(_mm512_setzero_si512(), ok,
                                                       _mm256_add_epi32(_mm256_mullo_epi32(y0, stride_v), c0), src, 1);
        const __m512i q1 = _mm512_mask_i32gather_epi64(_mm512_setzero_si512(), ok,
                                                       _mm256_add_epi32(_mm256_mullo_epi32(y1, stride_v), c0), src, 1);
        for (int ch = 0; ch < 3; ++ch) {
          const __m512i sa = _mm512_set1_epi64(8 * ch), sb = _mm512_set1_epi64(24 + 8 * ch);
          const __m512i l0 = _mm512_and_si512(_mm512_srlv_epi64(q0, sa), mask8);
          const __m512i r0 = _mm512_mask_mov_epi64(_mm512_and_si512(_mm512_srlv_epi64(q0, sb), mask8), same_x, l0);
          const __m512i l1 = _mm512_and_si512(_mm512_srlv_epi64(q1, sa), mask8);
          const __m512i r1 = _mm512_mask_mov_epi64(_mm512_and_si512(_mm512_srlv_epi64(q1, sb), mask8), same_x, l1);
          // v1 = a + (b - a) * dx, the difference taken in int as Pillow's macro does.
          const __m512d v1 =
              _mm512_add_pd(_mm512_cvtepi64_pd(l0), _mm512_mul_pd(_mm512_cvtepi64_pd(_mm512_sub_epi64(r0, l0)), dx));
          __m512d v2 =
              _mm512_add_pd(_mm512_cvtepi64_pd(l1), _mm512_mul_pd(_mm512_cvtepi64_pd(_mm512_sub_epi64(r1, l1)), dx));
          v2 = _mm512_mask_mov_pd(v1, has_r1, v2);
          const __m512d v = _mm512_add_pd(v1, _mm512_mul_pd(_mm512_sub_pd(v2, v1), dy));
          result = _mm256_mask_or_epi32(result, ok, _mm256_and_si256(result, _mm256_set1_epi32(~(255 << (8 * ch)))),
                                        _mm256_slli_epi32(_mm512_cvttpd_epi32(v), 8 * ch));
        }
      }
      store_words8(o + 3 * x, count, result);
    }
  }
}

const Kernels kAvx512 = {
    "avx512",
    lut1_avx512,
    lut3_avx512,
    luma_sum_avx512,
    grayscale_avx512,
    saturation_avx512,
    hue_avx512,
    sharpen_avx512,
    minmax_avx512,
    mx_gray_sum_avx512,
    mx_saturation_avx512,
    mx_hls_avx512,
    affine_nearest_fixed_avx512,
    affine_bilinear_avx512,
};

}  // namespace

const Kernels* avx512_kernels() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512vbmi");
  return ok ? &kAvx512 : nullptr;
}

}  // namespace pixel
}  // namespace fastload

#else

namespace fastload {
namespace pixel {
const Kernels* avx512_kernels() { return nullptr; }
}  // namespace pixel
}  // namespace fastload

#endif
