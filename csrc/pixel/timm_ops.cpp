// Pixels stage (native): timm's RandAugment / AutoAugment / AugMix (see timm_ops.h), each op as
// timm.data.auto_augment's AugmentOp does it to a PIL image: the draws of fastload/transforms/timm_policy.py
// (same counters of the policy's own stream, same double arithmetic), then the primitive with Pillow's
// arithmetic (pixel_color.h: ImageEnhance blends, ImageOps lookup tables, Image.transform / Image.rotate
// warps with nearest, bilinear or bicubic sampling).
#include "common/fp_exact.h"  // first: no fused multiply-add
#include "pixel/timm_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "common/rng.h"
#include "pixel/pixel_color.h"

namespace fastload {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kLevelDenom = 10.0;
constexpr int kNearest = 0, kBilinear = 2, kBicubic = 3;  // PIL's resample codes
// Counter layout of a policy's stream (timm_policy.py).
constexpr uint64_t kOpApply = 0, kOpMagnitude = 1, kOpSign = 3, kOpResample = 4;
constexpr uint64_t kRaLayer = 16, kRaOp = 8, kAaStep = 8;
constexpr uint64_t kGammaStride = 64;
constexpr int kGammaAttempts = 16;
constexpr uint64_t kChainBase = uint64_t{1} << 16, kChainStride = uint64_t{1} << 10, kChainOp = 16;
constexpr int kTraceValues = 64;

inline uint64_t policy_key(uint64_t key, uint64_t base) { return splitmix64(key ^ splitmix64(base)); }

bool is_geometric(TimmOpName n) {
  switch (n) {
    case TimmOpName::kRotate:
    case TimmOpName::kShearX:
    case TimmOpName::kShearY:
    case TimmOpName::kTranslateX:
    case TimmOpName::kTranslateY:
    case TimmOpName::kTranslateXRel:
    case TimmOpName::kTranslateYRel: return true;
    default: return false;
  }
}

bool is_negated(TimmOpName n) {
  return is_geometric(n) || n == TimmOpName::kColorIncreasing || n == TimmOpName::kContrastIncreasing ||
         n == TimmOpName::kBrightnessIncreasing || n == TimmOpName::kSharpnessIncreasing;
}

// Python's round(v, 15) (correctly rounded to 15 decimals, then read back), as Pillow's rotate does.
double round15(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15f", v);
  return std::strtod(buf, nullptr);
}

// Python's float `a % 360.0` (the result takes the divisor's sign).
double py_mod360(double a) {
  double m = std::fmod(a, 360.0);
  if (m != 0.0) {
    if (m < 0.0) m += 360.0;
  } else {
    m = 0.0;
  }
  return m;
}

// Pillow's Image.rotate(angle, expand=False) as a warp plan (primitives.py's _rotate_plan).
void rotate_plan(double angle, int h, int w, double plan[7]) {
  angle = py_mod360(angle);
  plan[0] = static_cast<double>(static_cast<int>(WarpMode::kAffine));
  if (angle == 0.0) {
    plan[0] = static_cast<double>(static_cast<int>(WarpMode::kIdentity));
    return;
  }
  if (angle == 180.0) {
    plan[0] = static_cast<double>(static_cast<int>(WarpMode::kRotate180));
    return;
  }
  if ((angle == 90.0 || angle == 270.0) && w == h) {
    plan[0] = static_cast<double>(static_cast<int>(angle == 90.0 ? WarpMode::kRotate90 : WarpMode::kRotate270));
    return;
  }
  const double cx = w / 2.0, cy = h / 2.0;
  const double rad = -(angle * (M_PI / 180.0));
  double m[6] = {round15(std::cos(rad)),  round15(std::sin(rad)), 0.0,
                 round15(-std::sin(rad)), round15(std::cos(rad)), 0.0};
  const double x = -cx, y = -cy;
  const double m2 = m[0] * x + m[1] * y + m[2], m5 = m[3] * x + m[4] * y + m[5];
  m[2] = m2 + cx;
  m[5] = m5 + cy;
  std::copy(m, m + 6, plan + 1);
}

struct Scratch {
  std::vector<uint8_t> warp, work, original, chain;
  std::vector<float> mixed;
};

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

// One applied op with its argument (timm_policy.apply_timm_op).
void apply_op(uint8_t* rgb, int h, int w, TimmOpName name, double arg, int resample, const uint8_t fill[3]) {
  const size_t px = static_cast<size_t>(h) * static_cast<size_t>(w);
  if (is_geometric(name)) {
    double plan[7] = {static_cast<double>(static_cast<int>(WarpMode::kAffine)), 1, 0, 0, 0, 1, 0};
    double* a = plan + 1;
    switch (name) {
      case TimmOpName::kRotate: rotate_plan(arg, h, w, plan); break;
      case TimmOpName::kShearX: a[1] = arg; break;
      case TimmOpName::kShearY: a[3] = arg; break;
      case TimmOpName::kTranslateX: a[2] = arg; break;
      case TimmOpName::kTranslateY: a[5] = arg; break;
      case TimmOpName::kTranslateXRel: a[2] = arg * w; break;
      case TimmOpName::kTranslateYRel: a[5] = arg * h; break;
      default: break;
    }
    const pixel::WarpFilter filter = resample == kBicubic    ? pixel::WarpFilter::kBicubic
                                     : resample == kBilinear ? pixel::WarpFilter::kBilinear
                                                             : pixel::WarpFilter::kNearest;
    pixel::warp_filtered(rgb, h, w, plan, filter, fill, &scratch().warp);
    return;
  }
  switch (name) {
    case TimmOpName::kAutoContrast: pixel::autocontrast(rgb, px); break;
    case TimmOpName::kEqualize: pixel::equalize(rgb, px); break;
    case TimmOpName::kInvert: pixel::invert(rgb, px); break;
    case TimmOpName::kPosterize:
    case TimmOpName::kPosterizeIncreasing:
    case TimmOpName::kPosterizeOriginal: {
      const int bits = static_cast<int>(arg);
      if (bits >= 8) break;
      if (bits <= 0) {  // Pillow < 13: ~(2 ** 8 - 1) masks every bit away
        std::memset(rgb, 0, px * 3);
        break;
      }
      pixel::posterize(rgb, px, bits);
      break;
    }
    case TimmOpName::kSolarize:
    case TimmOpName::kSolarizeIncreasing: pixel::solarize(rgb, px, arg); break;
    case TimmOpName::kSolarizeAdd: {
      const int add = static_cast<int>(arg);
      uint8_t lut[256];
      for (int v = 0; v < 256; ++v) lut[v] = static_cast<uint8_t>(v < 128 ? std::min(255, v + add) : v);
      for (size_t i = 0; i < px * 3; ++i) rgb[i] = lut[rgb[i]];
      break;
    }
    case TimmOpName::kColor:
    case TimmOpName::kColorIncreasing: pixel::saturation(rgb, px, arg); break;
    case TimmOpName::kContrast:
    case TimmOpName::kContrastIncreasing: pixel::contrast(rgb, px, arg); break;
    case TimmOpName::kBrightness:
    case TimmOpName::kBrightnessIncreasing: pixel::brightness(rgb, px, arg); break;
    case TimmOpName::kSharpness:
    case TimmOpName::kSharpnessIncreasing: pixel::sharpness(rgb, h, w, arg, &scratch().work); break;
    default: break;
  }
}

// timm's LEVEL_TO_ARG[name](level) with the sign drawn (timm_policy.timm_op_arg).
double op_arg(TimmOpName name, double level, bool negative, const TimmPolicy& p) {
  const double d = kLevelDenom;
  double v = 0.0;
  switch (name) {
    case TimmOpName::kAutoContrast:
    case TimmOpName::kEqualize:
    case TimmOpName::kInvert: return kNaN;
    case TimmOpName::kRotate: v = (level / d) * 30.0; break;
    case TimmOpName::kPosterize: return static_cast<double>(static_cast<int>((level / d) * 4));
    case TimmOpName::kPosterizeIncreasing: return static_cast<double>(4 - static_cast<int>((level / d) * 4));
    case TimmOpName::kPosterizeOriginal: return static_cast<double>(static_cast<int>((level / d) * 4) + 4);
    case TimmOpName::kSolarize: return static_cast<double>(std::min(256, static_cast<int>((level / d) * 256)));
    case TimmOpName::kSolarizeIncreasing:
      return static_cast<double>(256 - std::min(256, static_cast<int>((level / d) * 256)));
    case TimmOpName::kSolarizeAdd: return static_cast<double>(std::min(128, static_cast<int>((level / d) * 110)));
    case TimmOpName::kColor:
    case TimmOpName::kContrast:
    case TimmOpName::kBrightness:
    case TimmOpName::kSharpness: return (level / d) * 1.8 + 0.1;
    case TimmOpName::kColorIncreasing:
    case TimmOpName::kContrastIncreasing:
    case TimmOpName::kBrightnessIncreasing:
    case TimmOpName::kSharpnessIncreasing: {
      const double lv = (level / d) * 0.9;
      return std::max(0.1, 1.0 + (negative ? -lv : lv));
    }
    case TimmOpName::kShearX:
    case TimmOpName::kShearY: v = (level / d) * 0.3; break;
    case TimmOpName::kTranslateX:
    case TimmOpName::kTranslateY: v = (level / d) * p.translate_const; break;
    case TimmOpName::kTranslateXRel:
    case TimmOpName::kTranslateYRel: v = (level / d) * p.translate_pct; break;
  }
  return negative ? -v : v;
}

struct Drawn {
  bool applied = false;
  double level = kNaN;  // the clipped magnitude
  bool negative = false;
  double arg = kNaN;
  int resample = -1;  // -1: not a geometric op

  // The trace of one op (timm_policy._TimmPolicy._draw_values): applied, level, negative, resample.
  void trace(double* t) const {
    t[0] = applied, t[1] = level, t[2] = negative, t[3] = resample < 0 ? kNaN : static_cast<double>(resample);
  }
};

// One AugmentOp's draws at offset o of the stream (timm_policy._TimmPolicy._op).
Drawn draw_op(const TimmOp& op, const TimmPolicy& p, uint64_t key, uint64_t o, bool check_prob) {
  Drawn r;
  if (check_prob && op.prob < 1.0 && uniform(key, o + kOpApply) > op.prob) return r;
  r.applied = true;
  double level = op.magnitude;
  if (p.magnitude_std > 0) {
    if (std::isinf(p.magnitude_std))
      level = op.magnitude * uniform(key, o + kOpMagnitude);
    else
      level = op.magnitude + p.magnitude_std * normal(key, o + kOpMagnitude);
  }
  level = std::max(0.0, std::min(level, p.upper_bound));
  const bool negative = is_negated(op.name) && uniform(key, o + kOpSign) > 0.5;
  r.level = level;
  r.negative = negative;
  r.arg = op_arg(op.name, level, negative, p);
  if (is_geometric(op.name))
    r.resample = p.resample >= 0 ? p.resample : (randint(key, o + kOpResample, 2) == 0 ? kBilinear : kBicubic);
  return r;
}

void rand_augment(uint8_t* rgb, int h, int w, const TimmPolicy& p, const uint8_t fill[3], uint64_t key, double* t) {
  const int n = static_cast<int>(p.ops.size());
  std::vector<bool> taken(p.weights.empty() ? 0 : p.ops.size(), false);
  for (int i = 0; i < p.num_layers; ++i) {
    const uint64_t layer = kRaLayer * static_cast<uint64_t>(i);
    int k;
    if (p.weights.empty()) {
      k = randint(key, layer, n);
    } else {
      // numpy's choice(replace=False, p): proportional to the weights of the ops not yet picked.
      double total = 0.0;
      for (double v : p.weights) total += v;
      std::vector<double> cdf(p.ops.size());
      double acc = 0.0;
      for (size_t j = 0; j < p.ops.size(); ++j) {
        acc += taken[j] ? 0.0 : p.weights[j] / total;
        cdf[j] = acc;
      }
      const double u = uniform(key, layer) * acc;
      k = static_cast<int>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      if (k >= n) k = n - 1;
      while (taken[static_cast<size_t>(k)] || p.weights[static_cast<size_t>(k)] == 0.0) k = (k - 1 + n) % n;
      taken[static_cast<size_t>(k)] = true;
    }
    const TimmOp& op = p.ops[static_cast<size_t>(k)];
    const Drawn d = draw_op(op, p, key, layer + kRaOp, true);
    if (d.applied) apply_op(rgb, h, w, op.name, d.arg, d.resample, fill);
    if (t && 5 * i + 4 < kTraceValues) {  // layer i: the op's index, then its draws
      t[5 * i] = k;
      d.trace(t + 5 * i + 1);
    }
  }
}

void auto_augment(uint8_t* rgb, int h, int w, const TimmPolicy& p, const uint8_t fill[3], uint64_t key, double* t) {
  const int subs = static_cast<int>(p.groups.size()) - 1;
  if (subs < 1) return;
  const int id = randint(key, 0, subs);
  if (t) t[0] = id;
  const int first = p.groups[static_cast<size_t>(id)], last = p.groups[static_cast<size_t>(id) + 1];
  for (int j = 0; first + j < last; ++j) {
    const TimmOp& op = p.ops[static_cast<size_t>(first + j)];
    const Drawn d = draw_op(op, p, key, kAaStep + kAaStep * static_cast<uint64_t>(j), true);
    if (d.applied) apply_op(rgb, h, w, op.name, d.arg, d.resample, fill);
    if (t && 4 + 4 * j < kTraceValues) d.trace(t + 1 + 4 * j);
  }
}

// A Gamma(alpha, 1) variate from counters base .. base + 63 (timm_policy._gamma).
double gamma_variate(uint64_t key, uint64_t base, double alpha) {
  if (alpha == 1.0) return -std::log(1.0 - uniform(key, base));
  const double a = alpha < 1.0 ? alpha + 1.0 : alpha;
  const double d = a - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  double value = d;
  for (int attempt = 0; attempt < kGammaAttempts; ++attempt) {
    const uint64_t o = base + 3 * static_cast<uint64_t>(attempt);
    const double x = normal(key, o);
    double v = 1.0 + c * x;
    if (v <= 0.0) continue;
    v = v * v * v;
    const double u = uniform(key, o + 2);
    if (std::log(1.0 - u) < 0.5 * x * x + d - d * v + d * std::log(v)) {
      value = d * v;
      break;
    }
  }
  if (alpha < 1.0) value *= std::pow(1.0 - uniform(key, base + 3 * kGammaAttempts), 1.0 / alpha);
  return value;
}

void augmix(uint8_t* rgb, int h, int w, const TimmPolicy& p, const uint8_t fill[3], uint64_t key, double* t) {
  const size_t bytes = static_cast<size_t>(h) * static_cast<size_t>(w) * 3;
  std::vector<double> gammas(static_cast<size_t>(p.width));
  double total = 0.0;
  for (int g = 0; g < p.width; ++g)
    total += gammas[static_cast<size_t>(g)] = gamma_variate(key, kGammaStride * g, p.alpha);
  const double x = gamma_variate(key, kGammaStride * static_cast<uint64_t>(p.width), p.alpha);
  const double y = gamma_variate(key, kGammaStride * static_cast<uint64_t>(p.width + 1), p.alpha);
  const float m = x + y > 0 ? static_cast<float>(x / (x + y)) : 0.5f;
  Scratch& s = scratch();
  s.original.assign(rgb, rgb + bytes);
  s.mixed.assign(bytes, 0.0f);
  if (t) t[0] = widen(m);
  int ti = 1 + p.width;
  for (int c = 0; c < p.width; ++c) {
    const float mw =
        total > 0 ? static_cast<float>(gammas[static_cast<size_t>(c)] / total) : 1.0f / static_cast<float>(p.width);
    if (t) t[1 + c] = widen(mw);
    const uint64_t cb = kChainBase + kChainStride * static_cast<uint64_t>(c);
    const int depth = p.depth > 0 ? p.depth : 1 + randint(key, cb, 3);
    if (t && ti < kTraceValues) t[ti] = depth;
    ++ti;
    // The chain's image, from the original (timm's ops make new images).
    std::vector<uint8_t>& chain = s.chain;
    chain.assign(s.original.begin(), s.original.end());
    for (int j = 0; j < depth; ++j) {
      const uint64_t o = cb + kChainOp + kChainOp * static_cast<uint64_t>(j);
      const int k = randint(key, o, static_cast<int>(p.ops.size()));
      const TimmOp& op = p.ops[static_cast<size_t>(k)];
      const Drawn d = draw_op(op, p, key, o + 8, false);
      apply_op(chain.data(), h, w, op.name, d.arg, d.resample, fill);
      if (t && ti + 3 < kTraceValues) {  // the op's index, level, negative, resample
        double v[4];
        d.trace(v);
        t[ti] = k, t[ti + 1] = v[1], t[ti + 2] = v[2], t[ti + 3] = v[3];
      }
      ti += 4;
    }
    // mixed += mw * float32(chain), in float32 as numpy.
    float* acc = s.mixed.data();
    for (size_t i = 0; i < bytes; ++i) acc[i] = acc[i] + mw * static_cast<float>(chain[i]);
  }
  // clip to [0, 255], truncate to uint8 (astype), then Image.blend(original, mixed, m).
  const uint8_t* orig = s.original.data();
  for (size_t i = 0; i < bytes; ++i) {
    const float v = std::min(255.0f, std::max(0.0f, s.mixed[i]));
    const int mixed = static_cast<int>(static_cast<uint8_t>(v));
    const int a = orig[i];
    rgb[i] = static_cast<uint8_t>(static_cast<float>(a) + m * static_cast<float>(mixed - a));
  }
}

}  // namespace

bool check_timm_policy(const PixelOp& op, std::string* error) {
  const TimmPolicy& p = op.timm;
  const size_t n = p.ops.size();
  if (n == 0) return *error = "a timm policy needs its ops", false;
  for (const TimmOp& o : p.ops) {
    const int name = static_cast<int>(o.name);
    if (name < 0 || name >= kTimmOpNameCount) return *error = "unknown timm op", false;
    if (!std::isfinite(o.prob) || !std::isfinite(o.magnitude) || o.magnitude < 0)
      return *error = "a timm op needs a finite prob and a finite magnitude >= 0", false;
  }
  if (!(p.magnitude_std >= 0) || !std::isfinite(p.upper_bound) || !std::isfinite(p.translate_const) ||
      !std::isfinite(p.translate_pct))
    return *error = "timm policy hparams must be finite (magnitude_std >= 0, inf allowed)", false;
  if (p.resample != -1 && p.resample != kNearest && p.resample != kBilinear && p.resample != kBicubic)
    return *error = "timm policy resample must be -1, 0, 2 or 3", false;
  if (op.kind == PixelOpKind::kTimmRandAugment) {
    if (p.num_layers < 0 || p.num_layers > 12) return *error = "num_layers must be in [0, 12]", false;
    if (!p.weights.empty()) {
      if (p.weights.size() != n) return *error = "choice_weights must hold one weight per op", false;
      size_t positive = 0;
      for (double v : p.weights) {
        if (!(v >= 0) || !std::isfinite(v)) return *error = "choice_weights must be finite and >= 0", false;
        positive += v > 0;
      }
      if (positive < static_cast<size_t>(p.num_layers))
        return *error = "choice_weights: fewer weighted ops than num_layers", false;
    }
  } else if (op.kind == PixelOpKind::kTimmAutoAugment) {
    if (p.groups.size() < 2 || p.groups.front() != 0 || p.groups.back() != static_cast<long long>(n))
      return *error = "groups must run from 0 to the number of steps", false;
    for (size_t i = 1; i < p.groups.size(); ++i)
      if (p.groups[i] <= p.groups[i - 1] || p.groups[i] - p.groups[i - 1] > 15)
        return *error = "each sub-policy needs 1 to 15 steps", false;
  } else if (op.kind == PixelOpKind::kTimmAugmix) {
    if (!(p.alpha > 0) || !std::isfinite(p.alpha)) return *error = "alpha must be > 0", false;
    if (p.width < 1 || p.width > 16 || !(p.depth == -1 || (p.depth >= 1 && p.depth <= 16)))
      return *error = "width must be in [1, 16], depth -1 or in [1, 16]", false;
  } else {
    return *error = "not a timm policy kind", false;
  }
  return true;
}

void apply_timm_policy(uint8_t* rgb, int h, int w, const PixelOp& op, uint64_t key, uint64_t base, double* trace) {
  const uint64_t pk = policy_key(key, base);
  const uint8_t* fill = op.fill.data();
  switch (op.kind) {
    case PixelOpKind::kTimmRandAugment: rand_augment(rgb, h, w, op.timm, fill, pk, trace); break;
    case PixelOpKind::kTimmAutoAugment: auto_augment(rgb, h, w, op.timm, fill, pk, trace); break;
    case PixelOpKind::kTimmAugmix: augmix(rgb, h, w, op.timm, fill, pk, trace); break;
    default: break;
  }
}

}  // namespace fastload
