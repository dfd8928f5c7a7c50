// Pixels stage (native): timm's augmentation policies (timm.data.auto_augment's RandAugment, AutoAugment and
// AugMix) on the output-sized image; the twin of fastload/transforms/timm_policy.py, which documents the op
// semantics and the counter layout. The policy arrives as PixelOp.timm (TimmPolicy, generated from
// fastload/engine_abi.py); the geometric ops fill the uncovered area with PixelOp.fill.
#pragma once

#include <cstdint>
#include <string>

#include "fastload_abi.h"  // PixelOp, PixelOpKind, TimmPolicy, TimmOpName (generated from fastload/engine_abi.py)

namespace fastload {

// Whether op.timm describes a valid policy of op.kind (one of the TIMM_* kinds); false with `error`
// set otherwise. The glue checks every spec with it before a call; apply_timm_policy assumes it.
bool check_timm_policy(const PixelOp& op, std::string* error);

// Runs the policy of op (a TIMM_* kind) on one image (rgb: h rows of 3 * w bytes, in place), drawing from
// its own stream policy_key(key, base); `trace` (64 doubles or nullptr) receives what timm_policy.py's
// trace() holds. Never throws.
void apply_timm_policy(uint8_t* rgb, int h, int w, const PixelOp& op, uint64_t key, uint64_t base, double* trace);

}  // namespace fastload
