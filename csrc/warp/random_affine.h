// Augmentation stage (native): torchvision's RandomAffine after the crop, as a one-pass WarpPlan.
//
// Twin of fastload/transforms/affine.py (sample_affine, inverse_affine_matrix, affine_plan): the
// same draws (counters 48..53: angle, translate x, y, scale, shear x, y), the same double arithmetic
// in the same order, so the engine and the reference agree on every plan to the last bit.
#pragma once

#include <cstdint>

#include "warp/warp.h"

namespace fastload {

// AffineSpec (fastload/engine_abi.py): the RandomAffine's ranges as normalised by the Python
// dataclass; kernel kNearest snaps to the resized crop's pixels.

// One sample's drawn parameters (torchvision's RandomAffine.get_params).
struct AffineParams {
  double angle = 0;
  long long tx = 0, ty = 0;
  double scale = 1;
  double shear_x = 0, shear_y = 0;
};

constexpr uint64_t kAffineCounter = 48;

AffineParams sample_affine(const AffineSpec& spec, int width, int height, uint64_t key);

// torchvision's _get_inverse_affine_matrix: output pixel centre -> input position.
Affine2 inverse_affine_matrix(const AffineParams& p, double cx, double cy);

// The plan of crop box (full-size source pixels) -> resize to out_w x out_h -> flip -> affine.
// crop_kernel / crop_antialias: the geometry op's filter (evaluated at the snapped positions of
// kernel == kNearest).
WarpPlan affine_plan(const AffineSpec& spec, const double box[4], bool flip, int out_h, int out_w, uint64_t key,
                     WarpKernel crop_kernel, bool crop_antialias, AffineParams* params);

}  // namespace fastload
