// Pixels stage (native): one call decodes a whole batch into caller memory.
#include "decode/batch_decode.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <new>

#include "pack/jpeg_encode.h"
#include "common/thread_pool.h"

#include "decode/entropy_decode.h"
#include "decode/restart_slice.h"
#include "decode/warp_decode.h"

namespace fastload {

namespace {

// Everything one decode thread reuses from image to image.
struct Worker {
  JpegDecoder decoder;
  Resampler resampler;
  AxisTable xt, yt;
  RestartSlice slice;
  IntervalEntropyDecoder entropy;
  std::string why;
  std::vector<uint8_t> hwc;                // output-sized HWC uint8 scratch (pixel ops, the scratch path)
  std::vector<uint8_t> region;             // RandomCrop: the decoded source rows and columns its window reads
  std::vector<int> xmap, ymap;             // RandomCrop: output column / row -> source column / row (-1: fill)
  std::vector<int> pad1, pad2;             // RandomCrop: the two paddings' index maps of one axis
  WarpWorkspace warp;                      // warp geometries: the decoded region and the warp's tap tables
  std::vector<uint8_t> mix_own, mix_prev;  // fused mixing: two samples' final outputs, in cache
  JpegEncoder encoder;                     // pack --resize only
  std::vector<uint8_t> pixels;             // pack --resize: the resized image before encoding
};

Worker& this_worker() {
  thread_local Worker worker;
  return worker;
}

// Rows of a slice arrive in slice coordinates; the resampler works in image coordinates.
class OffsetSink final : public RowSink {
 public:
  OffsetSink(RowSink* inner, int dx, int dy) : inner_(inner), dx_(dx), dy_(dy) {}
  void begin(int x_origin, int width) override { inner_->begin(x_origin + dx_, width); }
  void rows(int y, const uint8_t* const* rgb, int count) override { inner_->rows(y + dy_, rgb, count); }

 private:
  RowSink* inner_;
  int dx_, dy_;
};

// DCT scale for a crop f times larger than the output (jpeg_decode.h's dct_scale_denom).
int choose_denom(const SampleBox& b, const GeometryParams& op, bool enabled) {
  if (!enabled) return 1;
  return dct_scale_denom(std::min((b.x1 - b.x0) / op.out_w, (b.y1 - b.y0) / op.out_h));
}

struct ImageOutcome {
  Status status = Status::kOk;
  std::string message;
  int warnings = 0;
  bool sliced = false;
  bool slice_fallback = false;
};

// Decodes the region through a restart-interval slice; false when slicing does not apply (the
// caller then re-opens the original and decodes it the plain way).
bool decode_via_slice(Worker& w, const ImageRef& im, const JpegInfo& info, int denom, const DecodeSettings& options,
                      ImageOutcome* oc) {
  const int cx = w.xt.src_first * denom, cy = w.yt.src_first * denom;
  const int cx1 = std::min(info.width, w.xt.src_last * denom), cy1 = std::min(info.height, w.yt.src_last * denom);
  // denom: the slice's padding is decided in scaled pixels (4:2:2 at 1/2 still upsamples chroma).
  const bool own_entropy = options.slice_entropy == EntropyDecoder::kFastload && interval_entropy_available();
  if (!build_restart_slice(im.data, im.size, cx, cy, cx1 - cx, cy1 - cy, &w.slice, &w.why, denom, own_entropy)) {
    // Only records that carry restart markers count as fallbacks; plain JPEGs simply have none.
    oc->slice_fallback = w.slice.claimed.restart_interval > 0;
    return false;
  }
  if (w.slice.x0 % denom != 0 || w.slice.y0 % denom != 0) {
    oc->slice_fallback = true;
    return false;
  }
  DecodeSettings settings = options;
  settings.apply_exif = false;  // orientation was read from the original's headers
  JpegInfo slice_info;
  Status st = w.decoder.open(w.slice.jpeg.data(), w.slice.jpeg.size(), settings, &slice_info);
  const int ox = w.slice.x0 / denom, oy = w.slice.y0 / denom;
  if (st == Status::kOk) {
    if (own_entropy) {
      w.entropy.reset(&w.slice.entropy);
      w.decoder.override_entropy(&w.entropy);
    }
    OffsetSink sink(&w.resampler, ox, oy);
    st = w.decoder.decode_region(denom, w.xt.src_first - ox, w.yt.src_first - oy, w.xt.src_last - ox,
                                 w.yt.src_last - oy, &sink);
  }
  oc->warnings += w.decoder.warnings();
  if (st != Status::kOk || (own_entropy && w.entropy.failed()) ||
      w.resampler.rows_received() != w.yt.src_last - w.yt.src_first) {
    oc->slice_fallback = true;
    return false;
  }
  oc->sliced = true;
  return true;
}

// Parses the header on the calling thread's decoder; false (with the outcome filled in) when the
// image cannot take the engine's path.
bool open_image(Worker& w, const ImageRef& im, const DecodeSettings& options, JpegInfo* info, ImageOutcome* oc) {
  const Status st = w.decoder.open(im.data, im.size, options, info);
  if (st != Status::kOk) {
    oc->status = st;
    oc->message = w.decoder.message();
    oc->warnings = w.decoder.warnings();
    return false;
  }
  if (options.apply_exif && info->orientation != 1) {
    oc->status = Status::kNeedsPillow;
    oc->message = "EXIF orientation " + std::to_string(info->orientation) + " is applied by the Pillow path";
    return false;
  }
  return true;
}

std::atomic<bool> g_force_scratch{false};

// The per-thread output-sized HWC image (rows of 3 * width bytes, 32 spare bytes at the end).
uint8_t* scratch_image(Worker& w, int height, int width) {
  const size_t need = static_cast<size_t>(height) * width * 3 + 32;
  if (w.hwc.size() < need) w.hwc.resize(need);
  return w.hwc.data();
}

// The scratch path's tail: the pipeline's pixel ops on the thread's HWC scratch image, then the
// output stage writes it into the slot (dtype, layout, normalization).
void write_scratch(const PipelineSpec& spec, const OutputFormat& fmt, uint8_t* hwc, uint64_t key, double* op_trace,
                   void* slot) {
  if (spec.has_pixel_ops()) {
    PixelOpsTrace trace{op_trace};
    apply_pixel_ops(hwc, fmt.height, fmt.width, spec.pixel_ops, key, op_trace ? &trace : nullptr);
  }
  write_output_image(fmt, hwc, static_cast<size_t>(fmt.width) * 3, slot);
}

// Hands the resampled image to the output stage: straight into the slot (the vertical pass writes
// the final dtype and layout), or, with pixel ops, through the thread's HWC scratch.
void finish_image(Worker& w, const PipelineSpec& spec, const OutputFormat& fmt, void* slot, uint64_t key, bool vflip,
                  double* op_trace) {
  if (!spec.has_pixel_ops() && !g_force_scratch.load(std::memory_order_relaxed)) {
    w.resampler.finish(fmt, slot, vflip);
    return;
  }
  const int h = fmt.height, wd = fmt.width;
  OutputFormat hwc_fmt;
  hwc_fmt.height = h, hwc_fmt.width = wd;  // uint8 NHWC, not normalized
  uint8_t* hwc = scratch_image(w, h, wd);
  w.resampler.finish(hwc_fmt, hwc, vflip);
  write_scratch(spec, fmt, hwc, key, op_trace, slot);
}

// Collects a decoded region [x0, x1) x [y0, y1) (full-size pixels) into a packed RGB buffer.
class RegionSink final : public RowSink {
 public:
  RegionSink(int x0, int x1, int y0, int y1, uint8_t* buf) : x0_(x0), x1_(x1), y0_(y0), y1_(y1), buf_(buf) {}
  void begin(int x_origin, int /*width*/) override { x_origin_ = x_origin; }
  void rows(int y, const uint8_t* const* rgb, int count) override {
    const size_t stride = 3 * static_cast<size_t>(x1_ - x0_);
    for (int r = 0; r < count; ++r) {
      if (y + r < y0_ || y + r >= y1_) continue;
      std::memcpy(buf_ + static_cast<size_t>(y + r - y0_) * stride, rgb[r] + 3 * static_cast<size_t>(x0_ - x_origin_),
                  stride);
      ++received_;
    }
  }
  int received() const { return received_; }

 private:
  int x0_, x1_, y0_, y1_;
  uint8_t* buf_;
  int x_origin_ = 0;
  int received_ = 0;
};

// numpy.pad's index map of one axis (what torchvision's PIL backend pads with): map[k] is the
// source index of padded position k of n + before + after, or -1 for the constant fill. numpy
// reflects large pads in rounds, each reflecting what is filled so far (the other side's padding
// included), so an uneven pad wider than the image is not a plain periodic reflection: the rounds
// are replayed here as numpy runs them (numpy/lib/arraypad.py, _set_reflect_both).
void numpy_pad_map(long long n, long long before, long long after, PaddingMode mode, std::vector<int>* map) {
  const long long total = n + before + after;
  map->assign(static_cast<size_t>(total), -1);
  int* m = map->data();
  for (long long i = 0; i < n; ++i) m[before + i] = static_cast<int>(i);
  if (mode == PaddingMode::kConstant) return;
  if (mode == PaddingMode::kEdge || n == 1) {  // numpy extends a one-pixel axis by its edge too
    for (long long k = 0; k < before; ++k) m[k] = 0;
    for (long long k = before + n; k < total; ++k) m[k] = static_cast<int>(n - 1);
    return;
  }
  const long long edge_offset = mode == PaddingMode::kSymmetric ? 1 : 0;
  thread_local std::vector<int> chunk;
  long long left = before, right = after;
  while (left > 0 || right > 0) {
    long long filled = total - left - right;
    if (edge_offset == 0) filled -= 1;  // reflect leaves the edge pixel out of the mirrored run
    if (left > 0) {
      const long long len = std::min(filled, left);
      const long long start = left - edge_offset + len;  // mirrored from start, start - 1, ...
      chunk.assign(m + start - len + 1, m + start + 1);
      for (long long k = 0; k < len; ++k) m[left - len + k] = chunk[static_cast<size_t>(len - 1 - k)];
      left -= len;
    }
    if (right > 0) {
      const long long len = std::min(filled, right);
      const long long start = total - right + edge_offset - 2;  // mirrored from start, start - 1, ...
      chunk.assign(m + start - len + 1, m + start + 1);
      for (long long k = 0; k < len; ++k) m[total - right + k] = chunk[static_cast<size_t>(len - 1 - k)];
      right -= len;
    }
  }
}

// One axis of a RandomCrop window: the source pixel of each output pixel (mirrored when `flip`),
// -1 for the fill, and the source range [*first, *last) the window reads (empty: fill only).
// `origin` is the window's first pixel in the twice-padded axis; torchvision pads twice (the op's
// padding, then pad_if_needed's `pad2` on both sides), and so does this map.
void crop_axis(long long origin, int out, long long pad2, long long pad_before, long long pad_after, long long size,
               PaddingMode mode, bool flip, std::vector<int>* stage1, std::vector<int>* stage2, std::vector<int>* map,
               int* first, int* last) {
  numpy_pad_map(size, pad_before, pad_after, mode, stage1);
  numpy_pad_map(size + pad_before + pad_after, pad2, pad2, mode, stage2);
  map->resize(out);
  long long lo = size, hi = -1;
  for (int k = 0; k < out; ++k) {
    const long long p = origin + (flip ? out - 1 - k : k);
    int i = (*stage2)[static_cast<size_t>(p)];
    if (i >= 0) i = (*stage1)[static_cast<size_t>(i)];
    (*map)[k] = i;
    if (i >= 0) lo = std::min<long long>(lo, i), hi = std::max<long long>(hi, i);
  }
  *first = static_cast<int>(lo), *last = static_cast<int>(hi + 1);
}

// RandomCrop: decodes the source rows and columns the window reads (full size: the crop is
// unscaled), then assembles the window (padding, flips) in the thread's HWC scratch and hands it to
// the output stage.
ImageOutcome decode_random_crop(Worker& w, const JpegInfo& info, const PipelineSpec& spec, const OutputFormat& fmt,
                                void* slot, uint64_t key, SampleBox* box_out) {
  const GeometryParams& op = spec.geometry;
  ImageOutcome oc;
  const CropWindow c = random_crop_window(info.width, info.height, op, key);
  if (!c.fits) {
    oc.status = Status::kTooSmall;
    oc.message = "image is " + std::to_string(info.width) + "x" + std::to_string(info.height) +
                 ", smaller than the crop " + std::to_string(op.out_w) + "x" + std::to_string(op.out_h) +
                 " after padding (pad_if_needed=False)";
    return oc;
  }
  *box_out = c.box;
  int x0, x1, y0, y1;
  crop_axis(c.left, op.out_w, c.pad_x, op.pad_left, op.pad_right, info.width, op.padding_mode, c.box.flip, &w.pad1,
            &w.pad2, &w.xmap, &x0, &x1);
  crop_axis(c.top, op.out_h, c.pad_y, op.pad_top, op.pad_bottom, info.height, op.padding_mode, c.box.vflip, &w.pad1,
            &w.pad2, &w.ymap, &y0, &y1);
  const bool any_source = x1 > x0 && y1 > y0;
  const size_t region_stride = any_source ? 3 * static_cast<size_t>(x1 - x0) : 0;
  if (any_source) {
    w.region.resize(region_stride * static_cast<size_t>(y1 - y0));
    RegionSink sink(x0, x1, y0, y1, w.region.data());
    Status st = w.decoder.decode_region(1, x0, y0, x1, y1, &sink);
    oc.warnings += w.decoder.warnings();
    if (st == Status::kOk && sink.received() != y1 - y0) st = Status::kCorrupt;
    if (st != Status::kOk) {
      oc.status = st;
      oc.message = w.decoder.message();
      if (oc.message.empty()) oc.message = "decoder produced fewer rows than the crop needs";
      return oc;
    }
  }
  const int h = op.out_h, wd = op.out_w;
  uint8_t* hwc = scratch_image(w, h, wd);
  uint8_t fill[3];
  for (int ch = 0; ch < 3; ++ch)
    fill[ch] = static_cast<uint8_t>(std::max(0.0, std::min(255.0, std::nearbyint(op.fill[ch]))));
  for (int y = 0; y < h; ++y) {
    uint8_t* d = hwc + 3 * static_cast<size_t>(y) * wd;
    const int sy = w.ymap[y];
    const uint8_t* row = sy >= 0 ? w.region.data() + static_cast<size_t>(sy - y0) * region_stride : nullptr;
    for (int x = 0; x < wd; ++x, d += 3) {
      const int sx = w.xmap[x];
      const uint8_t* px = row != nullptr && sx >= 0 ? row + 3 * static_cast<size_t>(sx - x0) : fill;
      d[0] = px[0], d[1] = px[1], d[2] = px[2];
    }
  }
  write_scratch(spec, fmt, hwc, key, nullptr, slot);
  return oc;
}

// A warp geometry's per-image step: decode the region the plan reads and sample it once into the
// thread's HWC scratch, then the pixel ops and the output stage (as the scratch path does).
ImageOutcome decode_warped(Worker& w, const JpegInfo& info, const WarpPlan& plan, const PipelineSpec& spec,
                           const OutputFormat& fmt, void* slot, uint64_t key, const DecodeSettings& options,
                           double* op_trace) {
  ImageOutcome oc;
  const int h = fmt.height, wd = fmt.width;
  if (plan.out_h != h || plan.out_w != wd) {
    oc.status = Status::kInternal;
    oc.message = "warp plan size does not match the output";
    return oc;
  }
  uint8_t* hwc = scratch_image(w, h, wd);
  int denom = 1;
  const Status st =
      warp_decode(w.decoder, info, plan, options.dct_scaling, &w.warp, hwc, static_cast<size_t>(wd) * 3, &denom);
  oc.warnings += w.decoder.warnings();
  if (st != Status::kOk) {
    oc.status = st;
    oc.message = w.decoder.message();
    if (oc.message.empty()) oc.message = "decoder produced fewer rows than the warp needs";
    return oc;
  }
  write_scratch(spec, fmt, hwc, key, op_trace, slot);
  return oc;
}

// MXNet's augmenter geometry: the plan of image_aug_default.cc's chain for this image.
ImageOutcome decode_mxnet(Worker& w, const JpegInfo& info, const PipelineSpec& spec, const OutputFormat& fmt,
                          void* slot, uint64_t key, const DecodeSettings& options, SampleBox* box_out, double* op_trace,
                          double* warp_trace) {
  WarpPlan plan;
  MXNetParams params;
  std::string error;
  if (!mxnet_plan(spec.mxnet, info.width, info.height, key, &plan, &params, &error)) {
    ImageOutcome oc;
    oc.status = Status::kTooSmall;  // MXNet aborts on these images (smaller than max_crop_size, ...)
    oc.message = error;
    return oc;
  }
  box_out->flip = params.mirror;
  if (warp_trace != nullptr) mxnet_params_values(params, warp_trace);
  return decode_warped(w, info, plan, spec, fmt, slot, key, options, op_trace);
}

// Decodes an image open_image() has just opened on `w`, with the pipeline's geometry, into `slot`.
ImageOutcome decode_opened(Worker& w, const ImageRef& im, const JpegInfo& opened, const PipelineSpec& spec,
                           const OutputFormat& fmt, void* slot, uint64_t key, const DecodeSettings& options,
                           SampleBox* box_out, double* op_trace = nullptr, double* warp_trace = nullptr) {
  const GeometryParams op = with_sample_interpolation(spec.geometry, key);  // timm's per-image filter
  if (op.kind == GeometryKind::kRandomCrop) return decode_random_crop(w, opened, spec, fmt, slot, key, box_out);
  if (op.kind == GeometryKind::kMxnetAugment)
    return decode_mxnet(w, opened, spec, fmt, slot, key, options, box_out, op_trace, warp_trace);
  ImageOutcome oc;
  JpegInfo info = opened;
  Status st = Status::kOk;
  const SampleBox b = sample_box(info.width, info.height, op, key);
  *box_out = b;
  WarpPlan plan;
  bool gather = false;  // RandomAffine(nearest): the plain path below makes the frame, then a gather
  if (spec.has_affine) {
    // torchvision's RandomAffine on the resized (and flipped) crop, composed with it into one warp.
    const double box[4] = {b.x0, b.y0, b.x1, b.y1};
    const WarpKernel crop_kernel = op.interpolation == Interpolation::kBicubic   ? WarpKernel::kCubic
                                   : op.interpolation == Interpolation::kNearest ? WarpKernel::kNearest
                                                                                 : WarpKernel::kLinear;
    AffineParams prm;
    plan = affine_plan(spec.affine, box, b.flip, op.out_h, op.out_w, key, crop_kernel, op.antialias, &prm);
    if (warp_trace != nullptr) {
      const double values[6] = {
          prm.angle, static_cast<double>(prm.tx), static_cast<double>(prm.ty), prm.scale, prm.shear_x, prm.shear_y};
      std::copy(values, values + 6, warp_trace);
    }
    if (!warp_uses_crop_frame(plan)) return decode_warped(w, info, plan, spec, fmt, slot, key, options, op_trace);
    gather = true;
  }
  // DCT scaling averages pixels before the resize: right for the antialiased filters (whose support
  // spans them anyway), not for nearest or the 2- and 4-tap plain filters, which sample the source.
  const bool filtered = op.antialias && op.interpolation != Interpolation::kNearest;
  const int denom = choose_denom(b, op, options.dct_scaling && filtered);
  const int sw = scaled_size(info.width, denom), sh = scaled_size(info.height, denom);
  // RandomResizedCrop resizes its crop (torchvision crops, then resizes): the filters stop at the
  // crop's edges. CenterCrop resizes the whole image, then crops: they stop at the image's edges.
  int cx0 = 0, cy0 = 0, cx1 = sw, cy1 = sh;
  if (op.kind == GeometryKind::kRandomResizedCrop) {
    cx0 = static_cast<int>(std::floor(b.x0 / denom)), cx1 = static_cast<int>(std::ceil(b.x1 / denom));
    cy0 = static_cast<int>(std::floor(b.y0 / denom)), cy1 = static_cast<int>(std::ceil(b.y1 / denom));
  }
  build_axis(b.x0 / denom, b.x1 / denom, sw, op.out_w, &w.xt, op.interpolation, op.antialias, cx0, cx1);
  build_axis(b.y0 / denom, b.y1 / denom, sh, op.out_h, &w.yt, op.interpolation, op.antialias, cy0, cy1);
  w.resampler.setup(&w.xt, &w.yt, b.flip);
  bool done = false;
  const bool partial = w.xt.src_first > 0 || w.yt.src_first > 0 || w.xt.src_last < scaled_size(info.width, denom) ||
                       w.yt.src_last < scaled_size(info.height, denom);
  // A whole image goes through a slice of all its intervals too when fastload's interval decoder
  // is on: it Huffman-decodes faster than libjpeg does in restart mode (plain JPEGs cost one header
  // parse here, then take the plain path).
  if (options.use_restart_slices &&
      (partial || (options.slice_entropy == EntropyDecoder::kFastload && interval_entropy_available()))) {
    done = decode_via_slice(w, im, info, denom, options, &oc);
    if (!done && oc.slice_fallback) {
      // The decoder's state now belongs to the slice: start over on the original bytes.
      st = w.decoder.open(im.data, im.size, options, &info);
      w.resampler.setup(&w.xt, &w.yt, b.flip);
    }
  }
  if (!done && st == Status::kOk) {
    st = w.decoder.decode_region(denom, w.xt.src_first, w.yt.src_first, w.xt.src_last, w.yt.src_last, &w.resampler);
    oc.warnings += w.decoder.warnings();
    if (st == Status::kOk && w.resampler.rows_received() != w.yt.src_last - w.yt.src_first) {
      st = Status::kCorrupt;
    }
  }
  if (st != Status::kOk) {
    oc.status = st;
    oc.message = w.decoder.message();
    if (oc.message.empty()) oc.message = "decoder produced fewer rows than the crop needs";
    return oc;
  }
  if (gather) {
    // The frame is the plain path's resized crop, byte for byte (its crop-bounded filters, as
    // torchvision crops before it resizes); each output pixel copies the frame pixel its point
    // falls in. Then the pixel ops and the output stage, as on the scratch path.
    const int h = fmt.height, wd = fmt.width;
    w.warp.frame.resize(static_cast<size_t>(h) * wd * 3);
    OutputFormat raw;  // uint8 NHWC, not normalized
    raw.height = h, raw.width = wd;
    w.resampler.finish(raw, w.warp.frame.data(), false);
    uint8_t* hwc = scratch_image(w, h, wd);
    warp_gather(plan, w.warp.frame.data(), static_cast<size_t>(wd) * 3, wd, h, hwc, static_cast<size_t>(wd) * 3);
    write_scratch(spec, fmt, hwc, key, op_trace, slot);
    return oc;
  }
  finish_image(w, spec, fmt, slot, key, b.vflip, op_trace);
  return oc;
}

ImageOutcome decode_one(const ImageRef& im, const PipelineSpec& spec, const OutputFormat& fmt, void* slot, uint64_t key,
                        const DecodeSettings& options, SampleBox* box_out, double* op_trace, double* erase_trace,
                        double* warp_trace) {
  Worker& w = this_worker();
  JpegInfo info;
  ImageOutcome oc;
  if (!open_image(w, im, options, &info, &oc)) return oc;
  oc = decode_opened(w, im, info, spec, fmt, slot, key, options, box_out, op_trace, warp_trace);
  if (oc.status == Status::kOk && erasing_active(spec.erasing)) {
    ErasingTrace trace{erase_trace};
    apply_erasing(slot, fmt.dtype, fmt.layout == Layout::kNchw, fmt.height, fmt.width, spec.erasing, key,
                  erase_trace ? &trace : nullptr);
  }
  return oc;
}

// Sample j's final output (normalization, then erasing) from its uint8 HWC image, into `dst`.
void write_sample(const PipelineSpec& spec, const OutputFormat& fmt, const uint8_t* hwc, uint64_t key,
                  double* erase_trace, void* dst) {
  write_output_image(fmt, hwc, static_cast<size_t>(fmt.width) * 3, dst);
  if (erasing_active(spec.erasing)) {
    ErasingTrace trace{erase_trace};
    apply_erasing(dst, fmt.dtype, fmt.layout == Layout::kNchw, fmt.height, fmt.width, spec.erasing, key,
                  erase_trace ? &trace : nullptr);
  }
}

// decode_batch's second pass with a fused mix: the output stage of every decoded image.
// - All decoded, no erasing (`written` given: the decode pass already wrote the slots whose flag
//   is set): the rest with mix_output_rows.
// - All decoded, with erasing (which works on whole output images): each of up to `threads`
//   contiguous runs [s, e) writes sample s - 1's output into one per-thread buffer, then for
//   i = s .. e - 1 sample i's into the other and the slot as the mix of the two (swapping them):
//   an output is computed twice only at a run's start, and none is read back from memory.
// - Otherwise: unmixed outputs for the images that decoded (the caller mixes after replacing the
//   others).
void output_mixed(const PipelineSpec& spec, const OutputFormat& fmt, const uint8_t* scratch, size_t stride, void* out,
                  uint64_t seed, uint64_t epoch, const int64_t* indices, int n, int threads,
                  const std::atomic<bool>* written, BatchResults* results) {
  const size_t slot_bytes = fmt.slot_bytes();
  auto slot = [&](int i) { return static_cast<uint8_t*>(out) + slot_bytes * static_cast<size_t>(i); };
  auto image = [&](int i) { return scratch + stride * static_cast<size_t>(i); };
  auto key = [&](int i) { return sample_key(seed, epoch, static_cast<uint64_t>(indices[i])); };
  auto trace = [&](int i) {
    return results->erase_traces ? results->erase_traces + static_cast<size_t>(i) * kErasingTraceValues : nullptr;
  };
  auto unmixed = [&] {
    ThreadPool::instance().run(n, threads, [&](int i) {
      if (results->status[i] == static_cast<int32_t>(Status::kOk))
        write_sample(spec, fmt, image(i), key(i), trace(i), slot(i));
    });
  };
  bool all_ok = true;
  for (int i = 0; i < n; ++i) all_ok = all_ok && results->status[i] == static_cast<int32_t>(Status::kOk);
  if (!all_ok) {
    unmixed();
    return;
  }
  if (written != nullptr) {
    // Nothing follows the normalization: the decode pass wrote each slot from the two uint8 images
    // as soon as both were decoded (mix_output_rows); any left (none, barring a missed handshake)
    // are written here.
    const size_t row_bytes = slot_bytes / static_cast<size_t>(fmt.height) + kMixRowSlack;
    std::vector<uint8_t> own_row(row_bytes), prev_row(row_bytes);
    for (int i = 0; i < n; ++i) {
      if (!written[i].load())
        mix_output_rows(fmt, image(i), image(i == 0 ? n - 1 : i - 1), static_cast<size_t>(fmt.width) * 3, slot(i),
                        *spec.mix, own_row.data(), prev_row.data());
    }
    results->mixed = true;
    return;
  }
  std::atomic<bool> no_memory{false};
  const int runs = std::max(1, std::min(threads, n));
  const bool nchw = fmt.layout == Layout::kNchw;
  ThreadPool::instance().run(runs, threads, [&](int r) {
    const int s = static_cast<int>(static_cast<long long>(n) * r / runs);
    const int e = static_cast<int>(static_cast<long long>(n) * (r + 1) / runs);
    if (e <= s) return;
    Worker& w = this_worker();
    try {
      if (w.mix_own.size() < slot_bytes) w.mix_own.resize(slot_bytes), w.mix_prev.resize(slot_bytes);
    } catch (const std::bad_alloc&) {  // the pool's threads must not throw
      no_memory.store(true);
      return;
    }
    const int before = s == 0 ? n - 1 : s - 1;
    write_sample(spec, fmt, image(before), key(before), nullptr, w.mix_prev.data());
    for (int i = s; i < e; ++i) {
      write_sample(spec, fmt, image(i), key(i), trace(i), w.mix_own.data());
      mix_sample(slot(i), w.mix_own.data(), w.mix_prev.data(), fmt.dtype, nchw, fmt.height, fmt.width, *spec.mix);
      std::swap(w.mix_own, w.mix_prev);
    }
  });
  if (no_memory.load()) {
    unmixed();  // every slot again, unmixed, from the intact batch scratch; the caller mixes
    return;
  }
  results->mixed = true;
}
}  // namespace

void force_hwc_scratch(bool on) { g_force_scratch.store(on); }

namespace {

// Bytes of one image in the fused mix's batch scratch: the HWC uint8 image and the 32 spare bytes
// the pixel-op kernels may touch past its end (as the per-thread scratch), rounded to a cache line.
size_t mix_stride(const OutputFormat& f) {
  const size_t bytes = static_cast<size_t>(f.height) * f.width * 3 + 32;
  return (bytes + 63) / 64 * 64;
}

// The calling thread's batch scratch of the fused mix, grown on demand and kept for the thread's
// life (a loader calls from one producer thread: no page faults after its first batch).
uint8_t* mix_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < bytes) {
    scratch.clear();
    scratch.shrink_to_fit();
    scratch.resize(bytes);
  }
  return scratch.data();
}

}  // namespace

void decode_batch(const std::vector<ImageRef>& images, void* out, const PipelineSpec& spec, const OutputFormat& format,
                  uint64_t seed, uint64_t epoch, const int64_t* indices, int threads, const DecodeSettings& options,
                  BatchResults* results) {
  const int n = static_cast<int>(images.size());
  const size_t slot_bytes = format.slot_bytes();
  results->errors.assign(n, std::string());
  results->mixed = false;
  std::atomic<long long> warnings{0}, sliced{0}, fallbacks{0};
  const bool fuse_mix = spec.mix != nullptr && n > 0;
  // Fused mixing decodes every image (pixel ops included) into the batch scratch first, as uint8
  // HWC; the output stage (normalization, erasing, the mix) runs afterwards, below.
  PipelineSpec first_pass;
  OutputFormat raw;  // uint8 NHWC, not normalized
  uint8_t* scratch = nullptr;
  size_t stride = 0;
  if (fuse_mix) {
    first_pass = spec;
    first_pass.erasing = ErasingSpec();
    first_pass.mix = nullptr;
    raw.height = format.height, raw.width = format.width;
    stride = mix_stride(format);
    scratch = mix_scratch(stride * static_cast<size_t>(n));
  }
  // Without erasing, slot i is written as soon as images i and i - 1 are both decoded, by the
  // thread that finishes the second of them: its own image is still in cache, the other one in
  // the shared cache. decoded[i]: 0 pending, 1 decoded, 2 failed; written[i]: slot i claimed.
  const bool rows_now = fuse_mix && !erasing_active(spec.erasing);
  std::unique_ptr<std::atomic<uint8_t>[]> decoded(rows_now ? new std::atomic<uint8_t>[n] : nullptr);
  std::unique_ptr<std::atomic<bool>[]> written(rows_now ? new std::atomic<bool>[n] : nullptr);
  for (int i = 0; rows_now && i < n; ++i) decoded[i].store(0), written[i].store(false);
  const size_t row_bytes = rows_now ? slot_bytes / static_cast<size_t>(format.height) + kMixRowSlack : 0;
  auto write_when_ready = [&](Worker& w, int i) {
    const int p = i == 0 ? n - 1 : i - 1;
    if (decoded[i].load() != 1 || decoded[p].load() != 1 || written[i].exchange(true)) return;
    mix_output_rows(format, scratch + stride * static_cast<size_t>(i), scratch + stride * static_cast<size_t>(p),
                    static_cast<size_t>(format.width) * 3, static_cast<uint8_t*>(out) + slot_bytes * i, *spec.mix,
                    w.mix_own.data(), w.mix_prev.data());
  };
  auto work = [&](int i) {
    SampleBox box;
    box.x0 = box.y0 = box.x1 = box.y1 = __builtin_nan("");
    void* slot = static_cast<uint8_t*>(out) + slot_bytes * i;
    ImageOutcome oc;
    try {
      const uint64_t key = sample_key(seed, epoch, static_cast<uint64_t>(indices[i]));
      double* op_trace =
          results->pixel_traces
              ? results->pixel_traces + static_cast<size_t>(i) * spec.pixel_ops.ops.size() * kTraceValuesPerOp
              : nullptr;
      double* erase_trace =
          results->erase_traces ? results->erase_traces + static_cast<size_t>(i) * kErasingTraceValues : nullptr;
      double* warp_trace =
          results->warp_traces ? results->warp_traces + static_cast<size_t>(i) * kWarpTraceValues : nullptr;
      if (fuse_mix) {
        if (rows_now) {
          Worker& w = this_worker();
          if (w.mix_own.size() < row_bytes) w.mix_own.resize(row_bytes), w.mix_prev.resize(row_bytes);
        }
        oc = decode_one(images[i], first_pass, raw, scratch + stride * static_cast<size_t>(i), key, options, &box,
                        op_trace, nullptr, warp_trace);
      } else {
        oc = decode_one(images[i], spec, format, slot, key, options, &box, op_trace, erase_trace, warp_trace);
      }
    } catch (const std::bad_alloc&) {
      oc.status = Status::kInternal;
      oc.message = "out of memory";
    } catch (const std::exception& e) {
      oc.status = Status::kInternal;
      oc.message = e.what();
    }
    results->status[i] = static_cast<int32_t>(oc.status);
    if (oc.status != Status::kOk) {
      results->errors[i] = oc.message.empty() ? status_name(oc.status) : oc.message;
      // A failed slot holds zeros, never stale pixels (the Pillow path overwrites deferred ones).
      if (oc.status != Status::kNeedsPillow) std::memset(slot, 0, slot_bytes);
      box.x0 = box.y0 = box.x1 = box.y1 = __builtin_nan("");
      box.flip = box.vflip = false;
    }
    results->boxes[4 * i] = box.x0, results->boxes[4 * i + 1] = box.y0;
    results->boxes[4 * i + 2] = box.x1, results->boxes[4 * i + 3] = box.y1;
    results->flips[i] = box.flip ? 1 : 0;
    if (results->vflips != nullptr) results->vflips[i] = box.vflip ? 1 : 0;
    if (oc.warnings) warnings.fetch_add(oc.warnings, std::memory_order_relaxed);
    if (oc.sliced) sliced.fetch_add(1, std::memory_order_relaxed);
    if (oc.slice_fallback) fallbacks.fetch_add(1, std::memory_order_relaxed);
    if (rows_now) {
      // Sequentially consistent flags: of two threads finishing neighbours, at least one sees both.
      decoded[i].store(oc.status == Status::kOk ? 1 : 2);
      if (oc.status == Status::kOk) {
        Worker& w = this_worker();
        write_when_ready(w, i);
        write_when_ready(w, i + 1 == n ? 0 : i + 1);
      }
    }
  };
  ThreadPool::instance().run(n, threads, work);
  results->warnings = warnings.load();
  results->sliced = sliced.load();
  results->slice_fallbacks = fallbacks.load();
  if (fuse_mix)
    output_mixed(spec, format, scratch, stride, out, seed, epoch, indices, n, threads, written.get(), results);
}

void resize_encode_batch(const std::vector<ImageRef>& images, int shorter, int quality, int threads,
                         const DecodeSettings& options, std::vector<EncodedImage>* results) {
  const int n = static_cast<int>(images.size());
  results->assign(n, EncodedImage());
  auto work = [&](int i) {
    EncodedImage& r = (*results)[i];
    try {
      Worker& w = this_worker();
      JpegInfo info;
      ImageOutcome opened;
      DecodeSettings plain = options;
      plain.use_restart_slices = false;  // a whole-image resize has nothing to slice
      if (!open_image(w, images[i], plain, &info, &opened)) {
        r.status = opened.status;
        r.message = opened.message;
        return;
      }
      // im2rec's arithmetic: the shorter side becomes `shorter`, the other scales by floor division.
      const long long W = info.width, H = info.height;
      const long long ow = H > W ? shorter : W * shorter / H;
      const long long oh = H > W ? H * shorter / W : shorter;
      if (ow < 1 || oh < 1 || ow > JPEG_MAX_DIMENSION || oh > JPEG_MAX_DIMENSION) {
        r.status = Status::kUnsupported;
        r.message = "cannot resize " + std::to_string(W) + "x" + std::to_string(H) + " to shorter side " +
                    std::to_string(shorter);
        return;
      }
      PipelineSpec spec;
      spec.geometry.kind = GeometryKind::kResize;
      spec.geometry.out_w = static_cast<int>(ow);
      spec.geometry.out_h = static_cast<int>(oh);
      const GeometryParams& op = spec.geometry;
      OutputFormat fmt;  // uint8 NHWC
      fmt.height = op.out_h, fmt.width = op.out_w;
      w.pixels.resize(fmt.slot_bytes());
      SampleBox box;
      const ImageOutcome oc = decode_opened(w, images[i], info, spec, fmt, w.pixels.data(), 0, plain, &box);
      if (oc.status != Status::kOk) {
        r.status = oc.status;
        r.message = oc.message;
        return;
      }
      r.width = op.out_w, r.height = op.out_h;
      if (!w.encoder.encode(w.pixels.data(), op.out_w, op.out_h, quality, &r.jpeg, &r.message)) {
        r.status = Status::kInternal;
      }
    } catch (const std::bad_alloc&) {
      r.status = Status::kInternal;
      r.message = "out of memory";
    } catch (const std::exception& e) {
      r.status = Status::kInternal;
      r.message = e.what();
    }
  };
  ThreadPool::instance().run(n, threads, work);
}

Status open_single(const uint8_t* data, size_t size, const DecodeSettings& settings, JpegInfo* info, std::string* msg) {
  Worker& w = this_worker();
  Status st = w.decoder.open(data, size, settings, info);
  if (st == Status::kOk && settings.apply_exif && info->orientation != 1) {
    *msg = "EXIF orientation " + std::to_string(info->orientation) + " is applied by the Pillow path";
    return Status::kNeedsPillow;
  }
  if (st != Status::kOk) *msg = w.decoder.message();
  return st;
}

Status decode_single(uint8_t* dst, std::string* msg) {
  Worker& w = this_worker();
  const Status st = w.decoder.decode_full(dst);
  if (st != Status::kOk) *msg = w.decoder.message();
  return st;
}

void set_pool_threads(int threads) { ThreadPool::instance().set_workers(std::max(0, threads - 1)); }

int pool_threads() { return ThreadPool::instance().workers() + 1; }

}  // namespace fastload
