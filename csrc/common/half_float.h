// IEEE half-precision conversions (round to nearest even, as numpy's and torch's astype(float16)),
// portable; the batch loops use F16C where the CPU has it, which gives the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace fastload {
namespace half {

inline float to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: value = man * 2^-24
      const float v = static_cast<float>(man) * 5.9604644775390625e-08f;
      std::memcpy(&bits, &v, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Correctly rounded (ties to even) from a double: no double rounding through float.
inline uint16_t from_double(double v) {
  if (std::isnan(v)) return 0x7E00;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  double a = std::fabs(v);
  if (a >= 65520.0) return sign | 0x7C00;  // rounds to infinity
  if (a < 6.103515625e-05) {
    // Subnormal range: multiples of 2^-24; nearbyint rounds half to even.
    const double q = std::nearbyint(a * 16777216.0);
    return sign | static_cast<uint16_t>(q);  // q == 1024 gives the smallest normal, correctly
  }
  int e;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // 11 significant bits: scale to [1024, 2048), round half to even.
  double q = std::nearbyint(m * 2048.0);
  if (q == 2048.0) {
    q = 1024.0;
    ++e;
  }
  const int exp = e - 1 + 15;  // value = q * 2^(e - 11)
  if (exp >= 31) return sign | 0x7C00;
  return sign | static_cast<uint16_t>((exp << 10) | (static_cast<int>(q) - 1024));
}

inline uint16_t from_float(float v) { return from_double(static_cast<double>(v)); }

}  // namespace half
}  // namespace fastload
