// Glue of the decode stage: decode_batch (one GIL-free call per batch into the caller's memory) and
// decode_image, with their argument and buffer checks; results come back as numpy arrays.
#include <cmath>
#include <limits>

#include "decode/batch_decode.h"
#include "decode/output.h"
#include "decode/resize.h"
#include "glue/glue.h"

namespace fastload {
namespace glue {
namespace {

void check_geometry(const GeometryParams& op) {
  if (op.out_h <= 0 || op.out_w <= 0 || op.out_h > 16384 || op.out_w > 16384)
    throw py::value_error("output size " + std::to_string(op.out_h) + "x" + std::to_string(op.out_w) +
                          " must be in 1..16384");
  if (!(op.scale_lo > 0 && op.scale_lo <= op.scale_hi && op.scale_hi <= 1.0))
    throw py::value_error("scale range must satisfy 0 < low <= high <= 1");
  if (!(op.ratio_lo > 0 && op.ratio_lo <= op.ratio_hi))
    throw py::value_error("ratio range must satisfy 0 < low <= high");
  if (!(op.flip >= 0.0 && op.flip <= 1.0) || !(op.vflip >= 0.0 && op.vflip <= 1.0))
    throw py::value_error("flip and vflip must be probabilities in [0, 1]");
  if (op.resize < 0) throw py::value_error("resize must be >= 0");
  if (op.pad_left < 0 || op.pad_top < 0 || op.pad_right < 0 || op.pad_bottom < 0)
    throw py::value_error("padding must be >= 0");
  if (static_cast<long long>(op.pad_left) + op.pad_right > 65536 ||
      static_cast<long long>(op.pad_top) + op.pad_bottom > 65536)
    throw py::value_error("padding must be at most 65536 pixels per axis");
  for (double f : op.fill)
    if (!(f >= 0.0 && f <= 255.0)) throw py::value_error("fill values must be in 0..255");
}

// The element format numpy / the buffer protocol reports for each output dtype.
bool format_matches(DType dtype, const std::string& fmt, Py_ssize_t itemsize) {
  auto is = [&](char c) {
    return fmt == std::string(1, c) || fmt == std::string("=") + c || fmt == std::string("<") + c ||
           fmt == std::string("|") + c;
  };
  switch (dtype) {
    case DType::kUint8: return itemsize == 1 && (is('B') || fmt == "c");
    case DType::kFloat32: return itemsize == 4 && is('f');
    case DType::kFloat16: return itemsize == 2 && is('e');
  }
  return false;
}

// The batch's transform from the typed specs: the geometry, its warp (an MXNet augmenter for an
// MXNET_AUGMENT geometry, or a RandomAffine after the crop), the pixel ops, the output stage and its
// ops (MXNet's illumination is in pixel units times the Normalize's scale / std, 1 without one).
PipelineSpec pipeline_spec(const GeometryParams& op, const OutputParams& output, const PixelOpsSpec& ops,
                           const ErasingSpec& erasing, const AffineSpec* affine, const MXNetAugmentSpec* mxnet) {
  PipelineSpec spec;
  spec.geometry = op;
  spec.output = output;
  if (op.kind == GeometryKind::kMxnetAugment) {
    if (mxnet == nullptr) throw py::value_error("geometry kind MXNET_AUGMENT needs its MXNetAugmentSpec (mxnet=)");
    if (affine != nullptr) throw py::value_error("a RandomAffine cannot follow an MXNET_AUGMENT geometry");
    check_mxnet(*mxnet);
    if (mxnet->out_h != op.out_h || mxnet->out_w != op.out_w)
      throw py::value_error("the MXNetAugmentSpec's output size does not match the geometry's");
    spec.mxnet = *mxnet;
  } else {
    if (mxnet != nullptr) throw py::value_error("an MXNetAugmentSpec needs the geometry kind MXNET_AUGMENT");
    if (affine != nullptr) {
      if (op.kind == GeometryKind::kRandomCrop || op.vflip != 0.0)
        throw py::value_error("RandomAffine follows RandomResizedCrop, CenterCrop or Resize without a vertical flip");
      check_affine(*affine);
      spec.affine = *affine;
      spec.has_affine = true;
    }
  }
  check_pixel_ops(ops);
  spec.pixel_ops = ops;
  spec.erasing = erasing;
  for (int c = 0; c < 3; ++c)
    spec.erasing.illumination_scale[c] = output.normalize ? static_cast<float>(output.scale / output.std_dev[c]) : 1.0f;
  return spec;
}

py::array_t<double> nan_array(std::initializer_list<py::ssize_t> shape) {
  py::array_t<double> t{std::vector<py::ssize_t>(shape)};
  std::fill(t.mutable_data(), t.mutable_data() + t.size(), std::numeric_limits<double>::quiet_NaN());
  return t;
}

py::dict decode_batch_py(const py::sequence& images, const py::buffer& out, const GeometryParams& op,
                         const OutputParams& output, const PixelOpsSpec& ops, const ErasingSpec& erasing, uint64_t seed,
                         uint64_t epoch, const Indices& indices, int threads, const DecodeSettings& options,
                         bool want_params, const AffineSpec* affine, const MXNetAugmentSpec* mxnet,
                         const MixParams* mix) {
  check_geometry(op);
  check_settings(options);
  check_threads(threads);
  PipelineSpec spec = pipeline_spec(op, output, ops, erasing, affine, mxnet);
  if (mix != nullptr) {
    check_mix(*mix, op.out_h, op.out_w);
    spec.mix = mix;
  }
  OutputFormat format;
  std::string why;
  if (!make_output_format(output, op.out_h, op.out_w, &format, &why)) throw py::value_error(why);
  const size_t n = static_cast<size_t>(py::len(images));

  const BufferView out_view(out.ptr(), PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, "out");
  const Py_buffer& outv = *out_view;
  const std::string fmt = outv.format ? outv.format : "B";
  if (!format_matches(output.dtype, fmt, outv.itemsize))
    throw py::value_error(std::string("out must hold ") + abi_name(output.dtype) + " (buffer format " + fmt + ")");
  if (outv.ndim != 4) throw py::value_error("out must be 4-D, got " + std::to_string(outv.ndim) + "-D");
  const Py_ssize_t* sh = outv.shape;
  const bool nhwc = output.layout == Layout::kNhwc;
  const bool ok_shape = nhwc ? (sh[1] == op.out_h && sh[2] == op.out_w && sh[3] == 3)
                             : (sh[1] == 3 && sh[2] == op.out_h && sh[3] == op.out_w);
  if (!ok_shape || static_cast<size_t>(sh[0]) != n)
    throw py::value_error("out shape [" + std::to_string(sh[0]) + ", " + std::to_string(sh[1]) + ", " +
                          std::to_string(sh[2]) + ", " + std::to_string(sh[3]) + "] does not match " +
                          std::to_string(n) + " images of " + std::to_string(op.out_h) + "x" +
                          std::to_string(op.out_w) + (nhwc ? " NHWC" : " NCHW"));
  if (indices.ndim() != 1 || static_cast<size_t>(indices.shape(0)) != n)
    throw py::value_error("indices must be 1-D with one entry per image");

  BufferViews views;
  const std::vector<ImageRef> refs = views.add_all(images, n, "images");

  const auto rows = static_cast<py::ssize_t>(n);
  py::array_t<int32_t> status(rows);
  py::array_t<double> boxes({rows, static_cast<py::ssize_t>(4)});
  py::array_t<bool> flips(rows);
  py::array_t<bool> vflips(rows);
  BatchResults results;
  results.status = status.mutable_data();
  results.boxes = boxes.mutable_data();
  results.flips = reinterpret_cast<uint8_t*>(flips.mutable_data());
  results.vflips = reinterpret_cast<uint8_t*>(vflips.mutable_data());
  py::object pixel_traces = py::none(), erase_traces = py::none(), warp_traces = py::none();
  if (want_params && spec.has_pixel_ops()) {
    py::array_t<double> t = nan_array(
        {rows, static_cast<py::ssize_t>(spec.pixel_ops.ops.size()), static_cast<py::ssize_t>(kTraceValuesPerOp)});
    results.pixel_traces = t.mutable_data();
    pixel_traces = t;
  }
  if (want_params && erasing_active(spec.erasing)) {
    py::array_t<double> t = nan_array({rows, static_cast<py::ssize_t>(kErasingTraceValues)});
    results.erase_traces = t.mutable_data();
    erase_traces = t;
  }
  if (want_params && (spec.has_affine || op.kind == GeometryKind::kMxnetAugment)) {
    // [B, 18]: a RandomAffine fills the first 6 columns.
    py::array_t<double> t = nan_array({rows, static_cast<py::ssize_t>(kWarpTraceValues)});
    results.warp_traces = t.mutable_data();
    warp_traces = t;
  }
  const int64_t* idx = indices.data();
  {
    py::gil_scoped_release release;
    decode_batch(refs, outv.buf, spec, format, seed, epoch, idx, threads, options, &results);
  }
  py::dict errors;
  for (size_t i = 0; i < n; ++i) {
    if (status.at(i) != 0) {
      const char* name = status_name(static_cast<Status>(status.at(i)));
      errors[py::int_(i)] = py::str(std::string(name) + ": " + results.errors[i]);
    }
  }
  py::dict r;
  r["status"] = status;
  r["errors"] = errors;
  r["boxes"] = boxes;
  r["flips"] = flips;
  r["vflips"] = vflips;
  r["warnings"] = results.warnings;
  r["sliced"] = results.sliced;
  r["slice_fallbacks"] = results.slice_fallbacks;
  r["pixel_traces"] = pixel_traces;
  r["erase_traces"] = erase_traces;
  r["warp_traces"] = warp_traces;
  r["mixed"] = results.mixed;
  return r;
}

py::tuple decode_image_py(const py::object& buf, const DecodeSettings& options) {
  check_settings(options);
  const BufferView view(buf.ptr(), kReadFlags, "buf");
  const ImageRef ref = view.ref();
  JpegInfo info;
  std::string msg;
  // The header parse takes microseconds: it runs with the GIL held. Releasing the GIL twice per
  // image made Python threads calling decode_image queue for it twice (each re-acquire can wait a
  // whole switch interval behind the other thread), so 2 threads ran slower than 1.
  Status st = open_single(ref.data, ref.size, options, &info, &msg);
  if (st != Status::kOk) return py::make_tuple(st, msg, py::none());
  py::array_t<uint8_t> arr(
      {static_cast<py::ssize_t>(info.height), static_cast<py::ssize_t>(info.width), static_cast<py::ssize_t>(3)});
  uint8_t* dst = arr.mutable_data();
  {
    py::gil_scoped_release release;
    st = decode_single(dst, &msg);
  }
  if (st != Status::kOk) return py::make_tuple(st, msg, py::none());
  return py::make_tuple(Status::kOk, std::string(), arr);
}

bool resize_force_kernels_py(const std::string& name) {
  if (!resize_force_kernels(name)) return false;
  output_force_kernels(name == "scalar" ? "scalar" : "best");  // the output stage's scalar twin too
  return true;
}

}  // namespace

void register_decode(py::module_& m) {
  m.def("decode_batch", &decode_batch_py, FASTLOAD_ABI_ARGS_decode_batch, abi_doc::decode_batch);
  m.def("decode_image", &decode_image_py, FASTLOAD_ABI_ARGS_decode_image, abi_doc::decode_image);
  m.def("_resize_force_kernels", &resize_force_kernels_py, FASTLOAD_ABI_ARGS__resize_force_kernels,
        abi_doc::_resize_force_kernels);
  m.def("_force_hwc_scratch", &force_hwc_scratch, FASTLOAD_ABI_ARGS__force_hwc_scratch, abi_doc::_force_hwc_scratch);
}

}  // namespace glue
}  // namespace fastload
