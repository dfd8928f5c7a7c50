// Pixels stage (native): apply_pixel_ops, the sampler and dispatcher of the pixel ops (see
// pixel_ops.h). Each op draws its parameters from its own 64 counters of the sample's stream, in the
// layout fastload/transforms/pixel.py documents (the Python references draw the very same values),
// then runs its primitives (pixel_color.h) on the output-sized image in place.
#include "common/fp_exact.h"  // first: no fused multiply-add
#include "pixel/pixel_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "common/rng.h"
#include "pixel/pixel_color.h"
#include "pixel/pixel_kernels.h"
#include "pixel/timm_ops.h"
#include "common/thread_pool.h"

namespace fastload {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Scratch {
  std::vector<uint8_t> a;
};

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

void apply_prim(uint8_t* rgb, int h, int w, PixelPrim prim, double magnitude, const double* warp_row, bool bilinear,
                const uint8_t fill[3]) {
  const size_t px = static_cast<size_t>(h) * static_cast<size_t>(w);
  switch (prim) {
    case PixelPrim::kIdentity: break;
    case PixelPrim::kShearX:
    case PixelPrim::kShearY:
    case PixelPrim::kTranslateX:
    case PixelPrim::kTranslateY:
    case PixelPrim::kRotate:
      if (warp_row) pixel::warp(rgb, h, w, warp_row, bilinear, fill, &scratch().a);
      break;
    case PixelPrim::kBrightness: pixel::brightness(rgb, px, 1.0 + magnitude); break;
    case PixelPrim::kColor: pixel::saturation(rgb, px, 1.0 + magnitude); break;
    case PixelPrim::kContrast: pixel::contrast(rgb, px, 1.0 + magnitude); break;
    case PixelPrim::kSharpness: pixel::sharpness(rgb, h, w, 1.0 + magnitude, &scratch().a); break;
    case PixelPrim::kPosterize: pixel::posterize(rgb, px, static_cast<int>(magnitude)); break;
    case PixelPrim::kSolarize: pixel::solarize(rgb, px, magnitude); break;
    case PixelPrim::kAutocontrast: pixel::autocontrast(rgb, px); break;
    case PixelPrim::kEqualize: pixel::equalize(rgb, px); break;
    case PixelPrim::kInvert: pixel::invert(rgb, px); break;
    case PixelPrim::kHue: pixel::hue(rgb, px, magnitude); break;
    case PixelPrim::kGrayscale: pixel::grayscale(rgb, px); break;
  }
}

void color_jitter(uint8_t* rgb, size_t px, const PixelOp& op, uint64_t key, uint64_t base, double* t) {
  int order[4];
  permutation(key, base, order);
  const double b =
      op.has_brightness ? op.brightness[0] + (op.brightness[1] - op.brightness[0]) * uniform(key, base + 3) : kNaN;
  const double c = op.has_contrast ? op.contrast[0] + (op.contrast[1] - op.contrast[0]) * uniform(key, base + 4) : kNaN;
  const double s =
      op.has_saturation ? op.saturation[0] + (op.saturation[1] - op.saturation[0]) * uniform(key, base + 5) : kNaN;
  const double hu = op.has_hue ? op.hue[0] + (op.hue[1] - op.hue[0]) * uniform(key, base + 6) : kNaN;
  for (int fn : order) {
    if (fn == 0 && op.has_brightness) pixel::brightness(rgb, px, b);
    if (fn == 1 && op.has_contrast) pixel::contrast(rgb, px, c);
    if (fn == 2 && op.has_saturation) pixel::saturation(rgb, px, s);
    if (fn == 3 && op.has_hue) pixel::hue(rgb, px, hu);
  }
  if (t) {
    for (int i = 0; i < 4; ++i) t[i] = order[i];
    t[4] = b, t[5] = c, t[6] = s, t[7] = hu;
  }
}

void lighting(uint8_t* rgb, size_t px, const PixelOp& op, uint64_t key, uint64_t base, double* t) {
  double alpha[3];
  for (int j = 0; j < 3; ++j) alpha[j] = op.alphastd * normal(key, base + 2 * j);
  double shift[3];
  for (int c = 0; c < 3; ++c) {
    double s = 0.0;
    for (int j = 0; j < 3; ++j) s += op.eigvec[3 * c + j] * alpha[j] * op.eigval[j];
    shift[c] = 255.0 * s;
  }
  pixel::add_rounded(rgb, px, shift);
  if (t) t[0] = alpha[0], t[1] = alpha[1], t[2] = alpha[2];
}

// MXNet's eigval * eigvec table (rows R, G, B), float products as in image_aug_default.cc.
const float kMxPca[3][3] = {{55.46f * -0.5675f, 4.794f * 0.7192f, 1.148f * 0.4009f},
                            {55.46f * -0.5808f, 4.794f * -0.0045f, 1.148f * -0.8140f},
                            {55.46f * -0.5836f, 4.794f * -0.6948f, 1.148f * 0.4203f}};

void mxnet_color(uint8_t* rgb, size_t px, const PixelOp& op, uint64_t key, uint64_t base, double* t) {
  if (op.mx_brightness > 0 || op.mx_contrast > 0 || op.mx_saturation > 0) {
    const double v[3] = {op.mx_brightness, op.mx_contrast, op.mx_saturation};
    float alpha[3];
    for (int i = 0; i < 3; ++i) alpha[i] = static_cast<float>(1.0 + (2.0 * uniform(key, base + i) - 1.0) * v[i]);
    int order[3];
    permutation(key, base + 3, order);
    for (int step : order) {
      if (step == 0) pixel::mx_brightness(rgb, px, alpha[0]);
      if (step == 1) pixel::mx_contrast(rgb, px, alpha[1]);
      if (step == 2) pixel::mx_saturation(rgb, px, alpha[2]);
    }
    if (t) {
      for (int i = 0; i < 3; ++i) t[i] = widen(alpha[i]), t[3 + i] = order[i];
    }
  }
  if (op.random_h != 0 || op.random_s != 0 || op.random_l != 0) {
    const int v[3] = {op.random_h, op.random_s, op.random_l};
    int shift[3];
    for (int i = 0; i < 3; ++i) {
      float r = static_cast<float>(uniform(key, base + 5 + 2 * i));
      r += 4.0f * static_cast<float>(uniform(key, base + 6 + 2 * i));
      r = r / 5.0f;
      shift[i] = static_cast<int>(r * static_cast<float>(v[i]) * 2.0f - static_cast<float>(v[i]));
    }
    pixel::mx_hls(rgb, px, shift[0], shift[2], shift[1]);
    if (t) t[6] = shift[0], t[7] = shift[1], t[8] = shift[2];
  }
  if (op.mx_pca_noise > 0) {
    float a[3];
    for (int j = 0; j < 3; ++j) a[j] = static_cast<float>(op.mx_pca_noise * normal(key, base + 11 + 2 * j));
    float pca[3];
    for (int c = 0; c < 3; ++c) pca[c] = kMxPca[c][0] * a[0] + kMxPca[c][1] * a[1] + kMxPca[c][2] * a[2];
    pixel::mx_pca(rgb, px, pca);
    if (t) t[9] = widen(pca[0]), t[10] = widen(pca[1]), t[11] = widen(pca[2]);
  }
}

const double* warp_of(const PolicyOp& cand, int bin, bool negative) {
  if (cand.warps.empty() || bin < 0) return nullptr;
  return cand.warps.data() + (2 * static_cast<size_t>(bin) + (negative ? 1 : 0)) * kWarpValues;
}

void auto_augment(uint8_t* rgb, int h, int w, const PixelOp& op, uint64_t key, uint64_t base, double* t) {
  if (op.subpolicies.empty()) return;
  const int id = randint(key, base, static_cast<int>(op.subpolicies.size()));
  const std::vector<PolicyStep>& sub = op.subpolicies[static_cast<size_t>(id)];
  if (t) t[0] = id;
  for (size_t i = 0; i < sub.size() && i < 2; ++i) {
    const PolicyStep& st = sub[i];
    const bool hit = uniform(key, base + 1 + i) <= st.prob;
    const bool negative = st.is_signed && uniform(key, base + 3 + i) < 0.5;
    const double m = negative ? -st.magnitude : st.magnitude;
    if (hit)
      apply_prim(rgb, h, w, st.prim, m, st.warps.data() + (negative ? kWarpValues : 0), op.bilinear, op.fill.data());
    if (t) t[1 + i] = hit, t[3 + 2 * i] = static_cast<int>(st.prim), t[4 + 2 * i] = m;
  }
}

void list_policy_step(uint8_t* rgb, int h, int w, const PixelOp& op, const PolicyOp& cand, int bin, bool sign_draw,
                      double* t) {
  double m = cand.magnitudes.empty() ? 0.0 : cand.magnitudes[static_cast<size_t>(bin)];
  const bool negative = cand.is_signed && sign_draw;
  if (negative) m = -m;
  apply_prim(rgb, h, w, cand.prim, m, warp_of(cand, cand.magnitudes.empty() ? -1 : bin, negative), op.bilinear,
             op.fill.data());
  if (t) t[0] = static_cast<int>(cand.prim), t[1] = m;
}

void rand_augment(uint8_t* rgb, int h, int w, const PixelOp& op, uint64_t key, uint64_t base, double* t) {
  const int n = static_cast<int>(op.candidates.size());
  if (n == 0) return;
  for (int i = 0; i < op.num_ops; ++i) {
    const PolicyOp& cand = op.candidates[static_cast<size_t>(randint(key, base + 2 * i, n))];
    const bool sign = uniform(key, base + 2 * i + 1) >= 0.5;
    list_policy_step(rgb, h, w, op, cand, op.magnitude, sign, t ? t + 2 * i : nullptr);
  }
}

void trivial_augment(uint8_t* rgb, int h, int w, const PixelOp& op, uint64_t key, uint64_t base, double* t) {
  const int n = static_cast<int>(op.candidates.size());
  if (n == 0) return;
  const PolicyOp& cand = op.candidates[static_cast<size_t>(randint(key, base, n))];
  const int bin = cand.magnitudes.empty() ? -1 : randint(key, base + 1, static_cast<int>(cand.magnitudes.size()));
  const bool sign = uniform(key, base + 2) >= 0.5;
  list_policy_step(rgb, h, w, op, cand, bin, sign, t);
}

}  // namespace

void apply_pixel_ops(uint8_t* rgb, int h, int w, const PixelOpsSpec& ops, uint64_t key, PixelOpsTrace* trace) {
  const size_t px = static_cast<size_t>(h) * static_cast<size_t>(w);
  double* values = trace ? trace->values : nullptr;
  if (values) std::fill(values, values + ops.ops.size() * kTraceValuesPerOp, kNaN);
  for (size_t k = 0; k < ops.ops.size(); ++k) {
    const PixelOp& op = ops.ops[k];
    const uint64_t base = kPixelOpCounterBase + kPixelOpCounterStride * k;
    double* t = values ? values + k * kTraceValuesPerOp : nullptr;
    switch (op.kind) {
      case PixelOpKind::kColorJitter: color_jitter(rgb, px, op, key, base, t); break;
      case PixelOpKind::kRandomGrayscale: {
        const bool hit = uniform(key, base) < op.p;
        if (hit) pixel::grayscale(rgb, px);
        if (t) t[0] = hit;
        break;
      }
      case PixelOpKind::kLighting: lighting(rgb, px, op, key, base, t); break;
      case PixelOpKind::kMxnetColor: mxnet_color(rgb, px, op, key, base, t); break;
      case PixelOpKind::kAutoAugment: auto_augment(rgb, h, w, op, key, base, t); break;
      case PixelOpKind::kRandAugment: rand_augment(rgb, h, w, op, key, base, t); break;
      case PixelOpKind::kTrivialAugmentWide: trivial_augment(rgb, h, w, op, key, base, t); break;
      case PixelOpKind::kTimmRandAugment:
      case PixelOpKind::kTimmAutoAugment:
      case PixelOpKind::kTimmAugmix: apply_timm_policy(rgb, h, w, op, key, base, t); break;
    }
  }
}

void apply_pixel_prim(uint8_t* rgb, int h, int w, PixelPrim prim, double magnitude, const double* warp, bool bilinear,
                      const uint8_t fill[3]) {
  apply_prim(rgb, h, w, prim, magnitude, warp, bilinear, fill);
}

void apply_pixel_ops_batch(uint8_t* images, int n, int h, int w, const PixelOpsSpec& ops, uint64_t seed, uint64_t epoch,
                           const int64_t* indices, int threads, double* traces) {
  const size_t bytes = static_cast<size_t>(h) * static_cast<size_t>(w) * 3;
  ThreadPool::instance().run(n, threads, [&](int i) {
    PixelOpsTrace trace{traces ? traces + static_cast<size_t>(i) * ops.ops.size() * kTraceValuesPerOp : nullptr};
    apply_pixel_ops(images + static_cast<size_t>(i) * bytes, h, w, ops,
                    sample_key(seed, epoch, static_cast<uint64_t>(indices[i])), traces ? &trace : nullptr);
  });
}

void apply_erasing_batch(void* images, DType type, bool channels_first, int n, int h, int w, const ErasingSpec& spec,
                         uint64_t seed, uint64_t epoch, const int64_t* indices, int threads, double* traces) {
  const size_t elem = type == DType::kUint8 ? 1 : type == DType::kFloat32 ? 4 : 2;
  const size_t bytes = static_cast<size_t>(h) * static_cast<size_t>(w) * 3 * elem;
  uint8_t* base = static_cast<uint8_t*>(images);
  ThreadPool::instance().run(n, threads, [&](int i) {
    ErasingTrace trace{traces ? traces + static_cast<size_t>(i) * kErasingTraceValues : nullptr};
    apply_erasing(base + static_cast<size_t>(i) * bytes, type, channels_first, h, w, spec,
                  sample_key(seed, epoch, static_cast<uint64_t>(indices[i])), traces ? &trace : nullptr);
  });
}

const char* pixel_ops_kernel_name() { return pixel::kernels().name; }

bool pixel_ops_force_kernels(const char* name) { return pixel::force_kernels(name); }

}  // namespace fastload
