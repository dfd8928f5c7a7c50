// Glue of the pixel ops (pixel/pixel_ops.h) and the warp geometries (warp/): the batch forms of the
// pixel ops, the output-stage ops and MixUp / CutMix on already-decoded batches, and the testing
// hooks that expose single primitives, the plan builders and the resampler. The specs arrive as the
// generated structs (built in Python by fastload.engine_abi.to_native); the work runs with the GIL
// released.
#include <cmath>
#include <cstring>

#include "decode/warp_decode.h"
#include "glue/glue.h"
#include "pixel/pixel_color.h"
#include "pixel/pixel_ops.h"
#include "pixel/timm_ops.h"
#include "warp/mxnet_augment.h"
#include "warp/random_affine.h"
#include "warp/warp.h"

namespace fastload {
namespace glue {

// ---- checks shared with glue/decode.cpp -----------------------------------------------------------

void check_pixel_ops(const PixelOpsSpec& spec) {
  if (spec.ops.size() > static_cast<size_t>(kMaxPixelOps))
    throw py::value_error(std::to_string(spec.ops.size()) + " pixel ops: at most " + std::to_string(kMaxPixelOps));
  for (const PixelOp& op : spec.ops) {
    for (const PolicyOp& p : op.candidates)
      if (!p.warps.empty() && p.warps.size() != p.magnitudes.size() * 2 * kWarpValues)
        throw py::value_error("a policy op's warps must hold 14 numbers per magnitude bin");
    if (op.kind == PixelOpKind::kRandAugment) {
      if (op.num_ops < 1 || op.num_ops > 31) throw py::value_error("num_ops must be in [1, 31]");
      for (const PolicyOp& p : op.candidates)
        if (!p.magnitudes.empty() && (op.magnitude < 0 || static_cast<size_t>(op.magnitude) >= p.magnitudes.size()))
          throw py::value_error("magnitude bin out of range");
    }
    if ((op.kind == PixelOpKind::kRandAugment || op.kind == PixelOpKind::kTrivialAugmentWide) && op.candidates.empty())
      throw py::value_error(std::string(abi_name(op.kind)) + " needs its candidate ops");
    if (op.kind == PixelOpKind::kAutoAugment && op.subpolicies.empty())
      throw py::value_error("auto_augment needs its sub-policies");
    if (op.kind == PixelOpKind::kTimmRandAugment || op.kind == PixelOpKind::kTimmAutoAugment ||
        op.kind == PixelOpKind::kTimmAugmix) {
      std::string error;
      if (!check_timm_policy(op, &error)) throw py::value_error(error);
    }
  }
}

void check_mix(const MixParams& p, int h, int w) {
  if (p.cutmix && !(0 <= p.x0 && p.x0 <= p.x1 && p.x1 <= w && 0 <= p.y0 && p.y0 <= p.y1 && p.y1 <= h))
    throw py::value_error("box must lie within the image");
  if (!std::isfinite(p.lam)) throw py::value_error("lam must be finite");
}

void check_affine(const AffineSpec& s) {
  if (s.shear_count != 0 && s.shear_count != 2 && s.shear_count != 4)
    throw py::value_error("shear_count must be 0, 2 or 4");
  if (s.kernel != WarpKernel::kNearest && s.kernel != WarpKernel::kLinear && s.kernel != WarpKernel::kCubic)
    throw py::value_error("RandomAffine's kernel must be NEAREST, LINEAR or CUBIC");
}

void check_mxnet(const MXNetAugmentSpec& s) {
  if (s.out_h <= 0 || s.out_w <= 0 || s.out_h > 16384 || s.out_w > 16384)
    throw py::value_error("data_shape height and width must be in 1..16384");
  auto size_ok = [](int v, bool off_allowed) { return (off_allowed && v == -1) || (v >= 1 && v <= 65535); };
  if (!size_ok(s.resize, true) || !size_ok(s.max_crop_size, true) || !size_ok(s.min_crop_size, true) || s.pad < 0 ||
      s.pad > 65535)
    throw py::value_error("resize, max_crop_size, min_crop_size must be -1 or in 1..65535, pad in 0..65535");
  if (s.fill_value < 0 || s.fill_value > 255) throw py::value_error("fill_value must be in 0..255");
  const int m = s.inter_method;
  if (!((m >= 0 && m <= 4) || m == 9 || m == 10)) throw py::value_error("inter_method must be 0..4, 9 or 10");
  if (s.max_crop_size != -1 || s.min_crop_size != -1) {
    if (s.min_crop_size < 1 || s.min_crop_size > s.max_crop_size)
      throw py::value_error("min_crop_size and max_crop_size must both be set, with min <= max");
  }
}

namespace {

// ---- batches --------------------------------------------------------------------------------------

DType sample_type(const py::buffer_info& info) {
  if (info.itemsize == 1 && (info.format == "B" || info.format == "=B" || info.format == "|B")) return DType::kUint8;
  if (info.itemsize == 4 && (info.format == "f" || info.format == "=f" || info.format == "<f")) return DType::kFloat32;
  if (info.itemsize == 2 && (info.format == "e" || info.format == "=e" || info.format == "<e")) return DType::kFloat16;
  throw py::value_error("images must be uint8, float32 or float16 (format " + info.format + ")");
}

void check_writable_contiguous(const py::array& a, const char* name) {
  if (!(a.flags() & py::array::c_style) || !a.writeable())
    throw py::value_error(std::string(name) + " must be a writeable C-contiguous array");
}

// A batch [B, H, W, 3] or [B, 3, H, W] of 3-channel samples.
struct BatchShape {
  int n = 0, h = 0, w = 0;
};

BatchShape batch_shape(const py::buffer_info& info, bool channels_first) {
  if (info.ndim != 4) throw py::value_error("images must be 4-D");
  if ((channels_first ? info.shape[1] : info.shape[3]) != 3) throw py::value_error("images must have 3 channels");
  BatchShape s;
  s.n = static_cast<int>(info.shape[0]);
  s.h = static_cast<int>(channels_first ? info.shape[2] : info.shape[1]);
  s.w = static_cast<int>(channels_first ? info.shape[3] : info.shape[2]);
  return s;
}

// Runs the ops on a batch of HWC uint8 images [B, H, W, 3] in place, keys from (seed, epoch, indices),
// spread over the engine's pool; returns the traces [B, ops, 64] or None.
py::object pixel_ops_batch_py(py::array_t<uint8_t> images, const PixelOpsSpec& spec, uint64_t seed, uint64_t epoch,
                              const Indices& indices, int threads, bool want_trace) {
  check_writable_contiguous(images, "images");
  if (images.ndim() != 4 || images.shape(3) != 3) throw py::value_error("images must be [B, H, W, 3] uint8");
  check_pixel_ops(spec);
  const int n = static_cast<int>(images.shape(0)), h = static_cast<int>(images.shape(1)),
            w = static_cast<int>(images.shape(2));
  if (indices.ndim() != 1 || indices.shape(0) != n) throw py::value_error("indices must hold one index per image");
  check_threads(threads);
  py::object out = py::none();
  double* tr = nullptr;
  if (want_trace) {
    py::array_t<double> t({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(spec.ops.size()),
                           static_cast<py::ssize_t>(kTraceValuesPerOp)});
    tr = t.mutable_data();
    out = t;
  }
  uint8_t* base = images.mutable_data();
  const int64_t* idx = indices.data();
  {
    py::gil_scoped_release release;
    apply_pixel_ops_batch(base, n, h, w, spec, seed, epoch, idx, threads, tr);
  }
  return out;
}

// Runs the output-stage ops on a batch [B, H, W, 3] or [B, 3, H, W] (uint8 / float32 / float16) in place.
py::object erasing_batch_py(py::array images, bool channels_first, const ErasingSpec& spec, uint64_t seed,
                            uint64_t epoch, const Indices& indices, int threads, bool want_trace) {
  check_writable_contiguous(images, "images");
  const py::buffer_info info = images.request(true);
  const DType type = sample_type(info);
  const BatchShape s = batch_shape(info, channels_first);
  if (indices.ndim() != 1 || indices.shape(0) != s.n) throw py::value_error("indices must hold one index per image");
  check_threads(threads);
  py::object out = py::none();
  double* tr = nullptr;
  if (want_trace) {
    py::array_t<double> t({static_cast<py::ssize_t>(s.n), static_cast<py::ssize_t>(kErasingTraceValues)});
    tr = t.mutable_data();
    out = t;
  }
  void* base = info.ptr;
  const int64_t* idx = indices.data();
  {
    py::gil_scoped_release release;
    apply_erasing_batch(base, type, channels_first, s.n, s.h, s.w, spec, seed, epoch, idx, threads, tr);
  }
  return out;
}

void mix_batch_py(py::array images, const py::array_t<float, py::array::c_style | py::array::forcecast>& labels,
                  py::array_t<float> soft, const MixParams& params, bool channels_first, int threads) {
  check_writable_contiguous(images, "images");
  check_writable_contiguous(soft, "soft");
  const py::buffer_info info = images.request(true);
  const DType type = sample_type(info);
  const BatchShape s = batch_shape(info, channels_first);
  if (labels.ndim() != 2 || labels.shape(0) != s.n) throw py::value_error("labels must be [B, num_classes]");
  const int classes = static_cast<int>(labels.shape(1));
  if (soft.ndim() != 2 || soft.shape(0) != s.n || soft.shape(1) != classes)
    throw py::value_error("soft must be shaped like labels");
  check_threads(threads);
  check_mix(params, s.h, s.w);
  void* data = info.ptr;
  const float* lab = labels.data();
  float* out = soft.mutable_data();
  py::gil_scoped_release release;
  mix_batch(data, type, channels_first, s.n, s.h, s.w, params, lab, classes, out, threads);
}

// ---- single primitives (testing hooks) --------------------------------------------------------------

uint8_t* hwc_image(py::array_t<uint8_t>& image, size_t* pixels) {
  check_writable_contiguous(image, "image");
  if (image.ndim() != 3 || image.shape(2) != 3) throw py::value_error("image must be [H, W, 3] uint8");
  *pixels = static_cast<size_t>(image.shape(0)) * static_cast<size_t>(image.shape(1));
  return image.mutable_data();
}

// One primitive (torchvision's arithmetic) with fixed parameters, in place.
void pixel_prim_py(py::array_t<uint8_t> image, PixelPrim prim, double magnitude, const std::vector<double>& warp,
                   bool bilinear, const std::array<uint8_t, 3>& fill) {
  size_t pixels = 0;
  uint8_t* data = hwc_image(image, &pixels);
  if (!warp.empty() && warp.size() != kWarpValues) throw py::value_error("warp must hold 7 numbers");
  const int h = static_cast<int>(image.shape(0)), w = static_cast<int>(image.shape(1));
  py::gil_scoped_release release;
  apply_pixel_prim(data, h, w, prim, magnitude, warp.empty() ? nullptr : warp.data(), bilinear, fill.data());
}

// One step of MXNet's colour augmenter, in place.
void pixel_mx_prim_py(py::array_t<uint8_t> image, MXNetColorStep step, const std::vector<double>& a) {
  size_t px = 0;
  uint8_t* data = hwc_image(image, &px);
  const size_t need = step == MXNetColorStep::kHls || step == MXNetColorStep::kPca ? 3 : 1;
  if (a.size() != need)
    throw py::value_error(std::string(abi_name(step)) + " takes " + std::to_string(need) + " arguments");
  switch (step) {
    case MXNetColorStep::kBrightness: pixel::mx_brightness(data, px, static_cast<float>(a[0])); break;
    case MXNetColorStep::kContrast: pixel::mx_contrast(data, px, static_cast<float>(a[0])); break;
    case MXNetColorStep::kSaturation: pixel::mx_saturation(data, px, static_cast<float>(a[0])); break;
    case MXNetColorStep::kHls:
      pixel::mx_hls(data, px, static_cast<int>(a[0]), static_cast<int>(a[1]), static_cast<int>(a[2]));
      break;
    case MXNetColorStep::kPca: {
      const float pca[3] = {static_cast<float>(a[0]), static_cast<float>(a[1]), static_cast<float>(a[2])};
      pixel::mx_pca(data, px, pca);
      break;
    }
  }
}

// ---- warp geometries (testing hooks) ----------------------------------------------------------------

void check_plan(const WarpPlan& w) {
  if (w.out_h <= 0 || w.out_w <= 0 || w.out_h > 16384 || w.out_w > 16384)
    throw py::value_error("plan output size must be in 1..16384");
  if (!(w.scale_x > 0 && w.scale_y > 0 && w.scale_x < 1e6 && w.scale_y < 1e6))
    throw py::value_error("plan scale must be positive and finite");
}

py::tuple affine_plan_py(const AffineSpec& spec, const std::array<double, 4>& box, bool flip, int out_h, int out_w,
                         uint64_t key, WarpKernel crop_kernel, bool crop_antialias) {
  check_affine(spec);
  if (out_h <= 0 || out_w <= 0) throw py::value_error("output size must be positive");
  AffineParams prm;
  const WarpPlan plan = affine_plan(spec, box.data(), flip, out_h, out_w, key, crop_kernel, crop_antialias, &prm);
  return py::make_tuple(plan, py::make_tuple(prm.angle, static_cast<double>(prm.tx), static_cast<double>(prm.ty),
                                             prm.scale, prm.shear_x, prm.shear_y));
}

py::tuple mxnet_plan_py(const MXNetAugmentSpec& spec, int width, int height, uint64_t key) {
  check_mxnet(spec);
  if (width <= 0 || height <= 0) throw py::value_error("image size must be positive");
  WarpPlan plan;
  MXNetParams prm;
  std::string error;
  if (!mxnet_plan(spec, width, height, key, &plan, &prm, &error)) throw py::value_error(error);
  double values[kMXNetParamCount];
  mxnet_params_values(prm, values);
  py::tuple params(kMXNetParamCount);
  for (int i = 0; i < kMXNetParamCount; ++i) params[i] = values[i];
  return py::make_tuple(plan, params);
}

py::array_t<uint8_t> hwc_out(const WarpPlan& plan) {
  return py::array_t<uint8_t>(
      {static_cast<py::ssize_t>(plan.out_h), static_cast<py::ssize_t>(plan.out_w), static_cast<py::ssize_t>(3)});
}

// Evaluates a plan on a full-resolution HWC image, through the same source rectangle the decode
// path would read (copied out, so a tap outside it would read the copy's clamped edge, not memory
// beyond it).
py::array_t<uint8_t> warp_image_py(const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& src,
                                   const WarpPlan& plan) {
  check_plan(plan);
  if (src.ndim() != 3 || src.shape(2) != 3) throw py::value_error("src must be [H, W, 3] uint8");
  const int h = static_cast<int>(src.shape(0)), w = static_cast<int>(src.shape(1));
  if (h <= 0 || w <= 0) throw py::value_error("src must not be empty");
  py::array_t<uint8_t> out = hwc_out(plan);
  const uint8_t* s = src.data();
  uint8_t* d = out.mutable_data();
  {
    py::gil_scoped_release release;
    const SourceRect r = warp_source_rect(plan, 1, w, h);
    const int rw = r.x1 - r.x0, rh = r.y1 - r.y0;
    std::vector<uint8_t> region(static_cast<size_t>(rw) * rh * 3);
    for (int y = 0; y < rh; ++y)
      std::memcpy(region.data() + static_cast<size_t>(y) * rw * 3, s + (static_cast<size_t>(r.y0 + y) * w + r.x0) * 3,
                  static_cast<size_t>(rw) * 3);
    SourceRegion reg;
    reg.data = region.data(), reg.stride = static_cast<size_t>(rw) * 3;
    reg.x0 = r.x0, reg.y0 = r.y0, reg.width = rw, reg.height = rh, reg.image_w = w, reg.image_h = h, reg.denom = 1;
    WarpScratch scratch;
    warp_region(plan, reg, d, static_cast<size_t>(plan.out_w) * 3, &scratch);
  }
  return out;
}

py::tuple source_rect_py(const WarpPlan& plan, int denom, int scaled_w, int scaled_h) {
  check_plan(plan);
  if (denom != 1 && denom != 2 && denom != 4 && denom != 8) throw py::value_error("denom must be 1, 2, 4 or 8");
  const SourceRect r = warp_source_rect(plan, denom, scaled_w, scaled_h);
  return py::make_tuple(r.x0, r.y0, r.x1, r.y1);
}

// Region decode + warp of one JPEG on the calling thread: (status, message, image, denom).
py::tuple warp_decode_py(const py::object& buf, const WarpPlan& plan, const DecodeSettings& settings) {
  check_plan(plan);
  check_settings(settings);
  const BufferView view(buf.ptr(), kReadFlags, "buf");
  const ImageRef ref = view.ref();
  py::array_t<uint8_t> out = hwc_out(plan);
  uint8_t* d = out.mutable_data();
  std::string msg;
  int denom = 1;
  Status st;
  {
    py::gil_scoped_release release;
    st = warp_decode_single(ref.data, ref.size, settings, plan, d, static_cast<size_t>(plan.out_w) * 3, &denom, &msg);
  }
  if (st != Status::kOk) return py::make_tuple(static_cast<int>(st), msg, py::none(), 0);
  return py::make_tuple(0, std::string(), out, denom);
}

}  // namespace

void register_pixel(py::module_& m) {
  m.def("pixel_ops_batch", &pixel_ops_batch_py, FASTLOAD_ABI_ARGS_pixel_ops_batch, abi_doc::pixel_ops_batch);
  m.def("erasing_batch", &erasing_batch_py, FASTLOAD_ABI_ARGS_erasing_batch, abi_doc::erasing_batch);
  m.def("mix_batch", &mix_batch_py, FASTLOAD_ABI_ARGS_mix_batch, abi_doc::mix_batch);
  m.def("pixel_prim", &pixel_prim_py, FASTLOAD_ABI_ARGS_pixel_prim, abi_doc::pixel_prim);
  m.def("pixel_mx_prim", &pixel_mx_prim_py, FASTLOAD_ABI_ARGS_pixel_mx_prim, abi_doc::pixel_mx_prim);
  m.def(
      "pixel_kernels", [](const std::string& name) { return pixel_ops_force_kernels(name.c_str()); },
      FASTLOAD_ABI_ARGS_pixel_kernels, abi_doc::pixel_kernels);
  m.def("pixel_kernel_name", [] { return std::string(pixel_ops_kernel_name()); }, abi_doc::pixel_kernel_name);
  m.def("_warp_affine_plan", &affine_plan_py, FASTLOAD_ABI_ARGS__warp_affine_plan, abi_doc::_warp_affine_plan);
  m.def("_warp_mxnet_plan", &mxnet_plan_py, FASTLOAD_ABI_ARGS__warp_mxnet_plan, abi_doc::_warp_mxnet_plan);
  m.def("_warp_image", &warp_image_py, FASTLOAD_ABI_ARGS__warp_image, abi_doc::_warp_image);
  m.def("_warp_source_rect", &source_rect_py, FASTLOAD_ABI_ARGS__warp_source_rect, abi_doc::_warp_source_rect);
  m.def("_warp_decode", &warp_decode_py, FASTLOAD_ABI_ARGS__warp_decode, abi_doc::_warp_decode);
}

}  // namespace glue
}  // namespace fastload
