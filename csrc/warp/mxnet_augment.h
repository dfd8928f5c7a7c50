// Augmentation stage (native): MXNet's default augmenter geometry (src/io/image_aug_default.cc,
// MXNet 1.9) as a one-pass WarpPlan.
//
// Twin of fastload/transforms/mxnet_augment.py (mxnet_plan): MXNet's window and size arithmetic
// (ints, float32 where MXNet computes in float), draws from the counter-based generator with
// MXNet's distributions (counter layout in the Python module's docstring), the same composed maps
// and kernel choice. The Python tests check every reported parameter and plan against the reference.
#pragma once

#include <cstdint>
#include <string>

#include "warp/warp.h"

namespace fastload {

// MXNetAugmentSpec (fastload/engine_abi.py) holds MXNet's parameter names (DefaultImageAugmentParam
// + the iterator's mirror flags; out_h, out_w: data_shape[1], data_shape[2]).

// What the augmenter did (MXNET_PARAM_NAMES order in the Python module).
struct MXNetParams {
  int resized_w = 0, resized_h = 0;
  int angle = 0;
  float shear = 0.0f, scale = 1.0f, ratio = 1.0f;
  int warped_w = 0, warped_h = 0;
  int crop_x = 0, crop_y = 0, crop_w = 0, crop_h = 0;
  int scaled_w = 0, scaled_h = 0;
  bool mirror = false;
  int inter_resize = -1, inter_warp = -1, inter_crop = -1;
};
constexpr int kMXNetParamCount = 18;

// Fills `out` with the params in the Python module's MXNET_PARAM_NAMES order.
void mxnet_params_values(const MXNetParams& p, double out[kMXNetParamCount]);

// The plan for one width x height image; false (with the reason) where MXNet aborts (an image
// smaller than max_crop_size, a warp to an empty image).
bool mxnet_plan(const MXNetAugmentSpec& spec, int width, int height, uint64_t key, WarpPlan* plan, MXNetParams* params,
                std::string* error);

}  // namespace fastload
