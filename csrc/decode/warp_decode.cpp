// Pixels stage (native): region decode + warp of one image (see warp_decode.h).
#include "decode/warp_decode.h"

#include <cmath>

namespace fastload {

bool warp_uses_crop_frame(const WarpPlan& p) {
  return p.snap && p.kernel == WarpKernel::kLinear && p.antialias && !p.quantize && p.has_frame && p.frame[0] == 0.0 &&
         p.frame[1] == 0.0 && p.frame[2] >= 1.0 && p.frame[3] >= 1.0 && p.frame[2] <= 16384.0 &&
         p.frame[3] <= 16384.0 && p.frame[2] == std::floor(p.frame[2]) && p.frame[3] == std::floor(p.frame[3]) &&
         p.to_source.b == 0.0 && p.to_source.d == 0.0 && p.to_source.a != 0.0 && p.to_source.e > 0.0;
}

Status warp_decode(JpegDecoder& decoder, const JpegInfo& info, const WarpPlan& plan, bool dct_scaling,
                   WarpWorkspace* ws, uint8_t* dst, size_t dst_stride, int* denom_out) {
  const int denom = warp_denom(plan, dct_scaling);
  const int sw = scaled_size(info.width, denom), sh = scaled_size(info.height, denom);
  const SourceRect r = warp_source_rect(plan, denom, sw, sh);
  ws->region.reserve(r.y0, r.y1 - r.y0, sw);
  const Status st = decoder.decode_region(denom, r.x0, r.y0, r.x1, r.y1, &ws->region);
  if (st != Status::kOk) return st;
  if (ws->region.rows_received() != r.y1 - r.y0) return Status::kCorrupt;
  warp_region(plan, ws->region.region(sw, sh, denom), dst, dst_stride, &ws->scratch);
  *denom_out = denom;
  return Status::kOk;
}

Status warp_decode_single(const uint8_t* data, size_t size, const DecodeSettings& settings, const WarpPlan& plan,
                          uint8_t* dst, size_t dst_stride, int* denom_out, std::string* message) {
  thread_local JpegDecoder decoder;
  thread_local WarpWorkspace ws;
  JpegInfo info;
  Status st = decoder.open(data, size, settings, &info);
  if (st == Status::kOk) st = warp_decode(decoder, info, plan, settings.dct_scaling, &ws, dst, dst_stride, denom_out);
  if (st != Status::kOk) {
    *message = decoder.message();
    if (message->empty()) *message = "the decoder produced fewer rows than the warp needs";
  }
  return st;
}

}  // namespace fastload
