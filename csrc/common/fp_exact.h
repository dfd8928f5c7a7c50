// Included first by the pixel-op sources. Their float arithmetic reproduces Pillow's, OpenCV's and
// numpy's operation for operation, so no multiply and add may be fused into one FMA: GCC fuses by
// default in C++ wherever a target attribute enables FMA (measured: AVX-512 saturation and MXNet
// colour kernels then differed from Pillow on a few pixels per image), clang within an expression.
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace fastload {

// A float widened to double for a trace. GCC 12.2's SLP vectorizer at -O3 stores the double a float
// was rounded from, instead of the float, when both are live (seen in the MXNet factor trace:
// 0.72137397693758887 recorded for the float 0.72137397527694702); pinning the float in a register
// first keeps the rounding.
inline double widen(float f) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm volatile("" : "+x"(f));
#else
  volatile float pinned = f;
  f = pinned;
#endif
  return static_cast<double>(f);
}

}  // namespace fastload
