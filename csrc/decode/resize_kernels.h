// Pixels stage (native): the resampler's kernel sets, one per instruction set, all giving the same
// bytes (the scalar kernels are the reference integers).
#pragma once

#include "decode/resize.h"

#include <cstdint>

namespace fastload {

struct Kernels {
  void (*hpass)(const uint8_t*, const int*, const int16_t*, int, int, uint8_t*, bool);
  // Four rows at once, or null (then hpass runs row by row).
  void (*hpass4)(const uint8_t* const*, const int*, const int16_t*, int, int, uint8_t* const*, bool);
  // Processes bytes rounded up to its vector width: writes may run up to 31 bytes past `bytes`.
  void (*vpass)(const uint8_t* const*, const int16_t*, int, int, uint8_t*);
  // Horizontal pass over up to 4 rows from a GroupPlan (source columns counted from x_origin), or null. Used whenever
  // the axis admits a plan; the per-pixel kernels above cover the rest (downscales past about 2.5x).
  void (*hgroups)(const uint8_t* const*, int, int, const GroupPlan&, uint8_t* const*);
  const char* name;
};

// The kernel set in use: the best the CPU has, unless resize_force_kernels() chose another.
const Kernels& resize_kernels();

}  // namespace fastload
