// Pixels stage (native): decode the source region a WarpPlan reads, then warp it to the output.
//
// The per-image step of a warp geometry: pick the DCT scale the plan allows, decode only the rows
// and columns its taps reach (jpeg_crop_scanline / skip / early stop through the thread's reused
// decoder) into a per-thread RegionBuffer, and evaluate the plan into an HWC uint8 image.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "decode/jpeg_decode.h"
#include "warp/warp.h"

namespace fastload {

// Per-thread buffers of warp_decode, reused across images.
struct WarpWorkspace {
  RegionBuffer region;
  WarpScratch scratch;
  std::vector<uint8_t> frame;  // the snapped path's resized crop (batch_decode.cpp)
};

// Whether a plan is a RandomAffine with nearest interpolation after a crop whose filter is the
// resampler's (antialiased bilinear): its frame is then exactly the resized crop the plain crop path
// makes, and each output pixel copies one of that crop's pixels (warp_gather): torchvision's
// two-pass result. The decode path (batch_decode.cpp) makes the frame with the plain crop path
// itself (its crop-bounded filters, DCT scaling and restart slices) and gathers; warp_decode
// evaluates such plans like any other (the numpy reference's arithmetic).
bool warp_uses_crop_frame(const WarpPlan& plan);

// Decodes the image `decoder` has just opened (header `info`) through `plan` into dst (out_h rows
// of out_w RGB pixels, dst_stride bytes apart). dct_scaling: the caller's DecodeOptions switch.
// *denom_out: the DCT scale used. On failure dst is untouched and decoder.message() says why.
Status warp_decode(JpegDecoder& decoder, const JpegInfo& info, const WarpPlan& plan, bool dct_scaling,
                   WarpWorkspace* ws, uint8_t* dst, size_t dst_stride, int* denom_out);

// One image on the calling thread's own decoder and workspace (tests and tools): open, then
// warp_decode. *message says why on failure.
Status warp_decode_single(const uint8_t* data, size_t size, const DecodeSettings& settings, const WarpPlan& plan,
                          uint8_t* dst, size_t dst_stride, int* denom_out, std::string* message);

}  // namespace fastload
