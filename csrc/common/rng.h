// Counter-based randomness shared by every native augmentation: SplitMix64 keyed by (seed, epoch, index).
//
// Twin of fastload/transforms/rng.py: a sample's stream is uniform(sample_key(seed, epoch, index),
// counter), a pure function, so a sample gets the same draws whatever the thread, the batch it lands
// in or the point an epoch was resumed from; the distributions built on it are the module's, with the
// same arithmetic in the same order. The Python tests compare every draw of the engine with the
// module's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

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

// A uniform integer in [0, n) from one draw.
inline int randint(uint64_t key, uint64_t counter, int n) {
  return std::min(static_cast<int>(uniform(key, counter) * static_cast<double>(n)), n - 1);
}

// A standard normal from the draws counter and counter + 1 (Box-Muller, cosine branch).
inline double normal(uint64_t key, uint64_t counter) {
  const double u1 = uniform(key, counter);
  const double u2 = uniform(key, counter + 1);
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * M_PI * u2);
}

// A uniform permutation of 0..N-1 from the draws counter .. counter + N - 2 (Fisher-Yates).
template <int N>
void permutation(uint64_t key, uint64_t counter, int (&perm)[N]) {
  for (int i = 0; i < N; ++i) perm[i] = i;
  int step = 0;
  for (int i = N - 1; i > 0; --i, ++step) std::swap(perm[i], perm[randint(key, counter + step, i + 1)]);
}

// std::uniform_real_distribution<float>(0, 1): the draw rounded to float, kept below 1.
inline float uniform_float32(uint64_t key, uint64_t counter) {
  const float u = static_cast<float>(uniform(key, counter));
  return u >= 1.0f ? std::nextafter(1.0f, 0.0f) : u;
}

// std::uniform_int_distribution<int>(lo, hi): every integer of [lo, hi] equally likely.
inline int uniform_int(uint64_t key, uint64_t counter, int lo, int hi) {
  const long long span = static_cast<long long>(hi) - lo + 1;
  const long long v = lo + static_cast<long long>(uniform(key, counter) * static_cast<double>(span));
  return static_cast<int>(std::min<long long>(hi, v));
}

}  // namespace fastload
