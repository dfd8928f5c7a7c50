// Counter-based randomness shared by every native augmentation: SplitMix64 keyed by (seed, epoch, index).
//
// Twin of fastload/transforms/rng.py: a sample's stream is uniform(sample_key(seed, epoch, index),
// counter), a pure function, so a sample gets the same draws whatever the thread, the batch it lands
// in or the point an epoch was resumed from. The Python tests compare every draw of the engine with
// the module's.
#pragma once

#include <cmath>
#include <cstdint>

namespace fastload {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

inline uint64_t sample_key(uint64_t seed, uint64_t epoch, uint64_t index) {
  uint64_t k = splitmix64(seed);
  k = splitmix64(k ^ epoch);
  return splitmix64(k ^ index);
}

inline double uniform(uint64_t key, uint64_t counter) {
  return static_cast<double>(splitmix64(key + counter) >> 11) * (1.0 / 9007199254740992.0);
}

// Python's round(): ties to even. The process never changes the FPU rounding mode, so nearbyint
// rounds to nearest-even.
inline long long round_half_even(double x) { return static_cast<long long>(std::nearbyint(x)); }

}  // namespace fastload
