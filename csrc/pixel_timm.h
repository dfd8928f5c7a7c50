// Pixels stage (native): timm's augmentation policies (timm.data.auto_augment's RandAugment, AutoAugment and
// AugMix) on the output-sized image; the twin of fastload/transforms/timm_policy.py, which documents the op
// semantics and the counter layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fastload_abi.h"  // PixelOpKind, TimmOpName (generated from fastload/engine_abi.py)

namespace fastload {

// One timm AugmentOp: its name (which level function and primitive), probability and magnitude.
struct TimmOp {
  TimmOpName name = TimmOpName::kAutoContrast;
  double prob = 1.0;
  double magnitude = 0.0;
};

// A policy with the hparams its ops share.
struct TimmPolicy {
  std::vector<TimmOp> ops;      // candidates (RandAugment, AugMix) or every sub-policy's steps (AutoAugment)
  std::vector<int> groups;      // AutoAugment: first step of each sub-policy, then ops.size()
  std::vector<double> weights;  // RandAugment: choice weights (picked without replacement); empty: uniform
  int num_layers = 2;           // RandAugment
  double magnitude_std = 0.0;   // > 0: N(magnitude, std); inf: U(0, magnitude)
  double upper_bound = 10.0;    // magnitudes are clipped to [0, upper_bound]
  double translate_const = 250.0, translate_pct = 0.45;
  int resample = -1;          // PIL code of the geometric ops' filter (0, 2, 3); -1: bilinear or bicubic per op
  double alpha = 1.0;         // AugMix
  int width = 3, depth = -1;  // AugMix: chains; ops per chain (-1: 1..3 drawn)
  uint8_t fill[3] = {128, 128, 128};
};

// The policy of a PixelOp spec from the plain numbers fastload/transforms/timm_policy.py's engine_fields()
// sends: ops as (name, prob, magnitude) triples, groups, weights, and params (num_layers, magnitude_std,
// upper_bound, translate_const, translate_pct, resample, alpha, width, depth). False with `error` set when
// they do not describe a valid policy.
bool timm_policy_from_numbers(PixelOpKind kind, const std::vector<double>& ops, const std::vector<double>& groups,
                              const std::vector<double>& weights, const std::vector<double>& params,
                              const uint8_t fill[3], TimmPolicy* out, std::string* error);

// Runs the policy on one image (rgb: h rows of 3 * w bytes, in place), drawing from its own stream
// policy_key(key, base); `trace` (64 doubles or nullptr) receives what timm_policy.py's trace() holds.
void apply_timm_policy(uint8_t* rgb, int h, int w, PixelOpKind kind, const TimmPolicy& policy, uint64_t key,
                       uint64_t base, double* trace);

}  // namespace fastload
