// Python glue of the native engine (fastload._engine): typed parameters, argument and buffer checks,
// GIL release, results back as numpy arrays. The only file that includes pybind11; the work lives in
// plain C++ (batch_decode, jpeg_decode, jpeg_encode, jpeg_io, resize, thread_pool, restart_slice,
// restart_transcode, entropy_decode, record_framing).
//
// Every enum and parameter struct is bound from the X-macro lists of the generated fastload_abi.h
// (one definition: fastload/engine_abi.py), so the Python and C++ sides cannot drift apart. The
// stub fastload/_engine.pyi describes this module to type checkers (tests run mypy's stubtest on it).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#if PYBIND11_VERSION_MAJOR >= 3
#include <pybind11/native_enum.h>
#endif

#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "batch_decode.h"
#include "entropy_decode.h"
#include "fastload_abi.h"
#include "mxnet_augment.h"
#include "random_affine.h"
#include "warp.h"
#include "warp_decode.h"
#include "record_framing.h"
#include "restart_slice.h"
#include "row_gather.h"
#include "restart_transcode.h"
#include "thread_pool.h"

#ifndef FASTLOAD_JPEG_TURBO_VERSION
#define FASTLOAD_JPEG_TURBO_VERSION "unknown"
#endif

namespace py = pybind11;
using namespace fastload;

// The warp geometries' glue (defined with their test hooks below): the Python specs
// (fastload.transforms.affine.RandomAffine, fastload.transforms.mxnet_augment.MXNetDefaultAugment,
// read by attribute name) as the plain structs of random_affine.h / mxnet_augment.h.
namespace warp_glue {
AffineSpec affine_spec(const py::handle& t);
MXNetAugmentSpec mxnet_spec(const py::handle& t);
}  // namespace warp_glue

namespace {

// ---- buffers ------------------------------------------------------------------------------------

// One Python buffer held for the duration of a call: the bytes stay valid (and pinned, for mmap
// views) while the GIL is released; released with the GIL held, when the view goes out of scope.
class BufferView {
 public:
  // `what` names the argument in error messages ("images[3]", "out").
  BufferView(PyObject* obj, int flags, const std::string& what) {
    if (PyObject_GetBuffer(obj, &view_, flags) != 0) {
      PyErr_Clear();
      const bool writable = (flags & PyBUF_WRITABLE) != 0;
      throw py::value_error(what + " (" + std::string(Py_TYPE(obj)->tp_name) + ") does not export a " +
                            (writable ? "writable " : "") +
                            "C-contiguous buffer (bytes, memoryview, numpy array)");
    }
  }
  ~BufferView() {
    if (view_.obj != nullptr) PyBuffer_Release(&view_);
  }
  BufferView(BufferView&& other) noexcept : view_(other.view_) { other.view_.obj = nullptr; }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  BufferView& operator=(BufferView&&) = delete;

  const Py_buffer& operator*() const { return view_; }
  const Py_buffer* operator->() const { return &view_; }
  ImageRef ref() const { return ImageRef{static_cast<const uint8_t*>(view_.buf), static_cast<size_t>(view_.len)}; }

 private:
  Py_buffer view_{};
};

constexpr int kReadFlags = PyBUF_C_CONTIGUOUS;

// The read-only views of a sequence of n buffers (a batch's inputs), in order.
class BufferViews {
 public:
  std::vector<ImageRef> add_all(const py::sequence& items, size_t n, const char* name) {
    views_.reserve(views_.size() + n);
    std::vector<ImageRef> refs;
    refs.reserve(n);
    size_t pos = 0;
    for (const py::handle item : items) {
      views_.emplace_back(item.ptr(), kReadFlags, std::string(name) + "[" + std::to_string(pos++) + "]");
      refs.push_back(views_.back().ref());
    }
    return refs;
  }

 private:
  std::vector<BufferView> views_;
};

// ---- typed parameters -----------------------------------------------------------------------------

// __repr__ of the parameter structs: Python syntax, enum members by their Python names.
template <typename T>
std::string repr_value(const T& v) {
  std::ostringstream s;
  s << std::setprecision(12) << v;
  return s.str();
}
std::string repr_value(bool v) { return v ? "True" : "False"; }
std::string repr_value(const std::array<double, 3>& v) {
  return "(" + repr_value(v[0]) + ", " + repr_value(v[1]) + ", " + repr_value(v[2]) + ")";
}
std::string upper(const char* name) {
  std::string s(name);
  for (char& c : s) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return s;
}
#define FASTLOAD_REPR_ENUM(E) \
  std::string repr_value(E v) { return std::string(#E ".") + upper(abi_name(v)); }
FASTLOAD_REPR_ENUM(Layout)
FASTLOAD_REPR_ENUM(GeometryKind)
FASTLOAD_REPR_ENUM(Interpolation)
FASTLOAD_REPR_ENUM(PaddingMode)
FASTLOAD_REPR_ENUM(DType)
FASTLOAD_REPR_ENUM(EntropyDecoder)
#undef FASTLOAD_REPR_ENUM

#define FASTLOAD_BIND_VALUE(Enum, cpp, py_name) .value(py_name, Enum::cpp)
#define FASTLOAD_BIND_FIELD(Struct, field, doc) .def_readwrite(#field, &Struct::field, doc)
#define FASTLOAD_REPR_FIELD(Struct, field, doc) \
  out += std::string(first ? "" : ", ") + #field "=" + repr_value(v.field); \
  first = false;

// pybind11 3 binds the enums as real enum.IntEnum classes, like those of engine_abi.py: members
// compare equal to their ints and to the Python-side members. Older pybind11: arithmetic py::enum_.
#if PYBIND11_VERSION_MAJOR >= 3
#define FASTLOAD_BIND_ENUM(m, Enum, doc) \
  py::native_enum<Enum>(m, #Enum, "enum.IntEnum", doc) FASTLOAD_ABI_ENUM_##Enum(FASTLOAD_BIND_VALUE).finalize();
#else
#define FASTLOAD_BIND_ENUM(m, Enum, doc) \
  py::enum_<Enum>(m, #Enum, doc, py::arithmetic()) FASTLOAD_ABI_ENUM_##Enum(FASTLOAD_BIND_VALUE);
#endif

#define FASTLOAD_BIND_STRUCT(m, Struct, doc)                                              \
  py::class_<Struct>(m, #Struct, doc)                                                     \
      .def(py::init<>())                                                                  \
      .def("__repr__", [](const Struct& v) {                                              \
        std::string out = #Struct "(";                                                    \
        bool first = true;                                                                \
        FASTLOAD_ABI_FIELDS_##Struct(FASTLOAD_REPR_FIELD) return out + ")";               \
      }) FASTLOAD_ABI_FIELDS_##Struct(FASTLOAD_BIND_FIELD);

void register_abi(py::module_& m) {
  FASTLOAD_BIND_ENUM(m, Status, "Per-image outcome of a decode.")
  FASTLOAD_BIND_ENUM(m, Layout, "Memory layout of an output batch.")
  FASTLOAD_BIND_ENUM(m, GeometryKind, "The geometric op that maps a decoded image to the output size.")
  FASTLOAD_BIND_ENUM(m, Interpolation, "Resampling filter of the geometry ops.")
  FASTLOAD_BIND_ENUM(m, PaddingMode, "How RandomCrop fills its padding.")
  FASTLOAD_BIND_ENUM(m, DType, "Element type of an output batch.")
  FASTLOAD_BIND_ENUM(m, EntropyDecoder, "Which Huffman decoder restart-interval slices use.")
  FASTLOAD_BIND_ENUM(m, PixelPrim, "Single-image primitives of the pixel ops.")
  FASTLOAD_BIND_ENUM(m, PixelOpKind, "The pixel op specs the engine runs on the output-sized image.")
  FASTLOAD_BIND_ENUM(m, TimmOpName, "The ops of timm's augmentation policies.")
  FASTLOAD_BIND_ENUM(m, WarpMode, "How a geometric pixel primitive maps pixels.")
  FASTLOAD_BIND_STRUCT(m, DecodeSettings, "Decoder options of one call (fastload.decode.DecodeOptions).")
  FASTLOAD_BIND_STRUCT(m, GeometryParams, "The geometry op of a pipeline (fastload.transforms).")
  FASTLOAD_BIND_STRUCT(m, OutputParams, "The output stage of a pipeline: dtype, layout, normalization.")
}

void check_settings(const DecodeSettings& s) {
  if (s.max_pixels <= 0) throw py::value_error("max_pixels must be positive");
}

void check_geometry(const GeometryParams& op) {
  if (op.out_h <= 0 || op.out_w <= 0 || op.out_h > 16384 || op.out_w > 16384)
    throw py::value_error("output size " + std::to_string(op.out_h) + "x" + std::to_string(op.out_w) +
                          " must be in 1..16384");
  if (!(op.scale_lo > 0 && op.scale_lo <= op.scale_hi && op.scale_hi <= 1.0))
    throw py::value_error("scale range must satisfy 0 < low <= high <= 1");
  if (!(op.ratio_lo > 0 && op.ratio_lo <= op.ratio_hi)) throw py::value_error("ratio range must satisfy 0 < low <= high");
  if (!(op.flip >= 0.0 && op.flip <= 1.0) || !(op.vflip >= 0.0 && op.vflip <= 1.0))
    throw py::value_error("flip and vflip must be probabilities in [0, 1]");
  if (op.resize < 0) throw py::value_error("resize must be >= 0");
  if (op.pad_left < 0 || op.pad_top < 0 || op.pad_right < 0 || op.pad_bottom < 0)
    throw py::value_error("padding must be >= 0");
  if (static_cast<long long>(op.pad_left) + op.pad_right > 65536 || static_cast<long long>(op.pad_top) + op.pad_bottom > 65536)
    throw py::value_error("padding must be at most 65536 pixels per axis");
  for (double f : op.fill)
    if (!(f >= 0.0 && f <= 255.0)) throw py::value_error("fill values must be in 0..255");
}

// ---- decode ----------------------------------------------------------------------------------------

#ifdef FASTLOAD_HAVE_PIXEL_OPS
// The pixel-op glue (csrc/pixel_ops.h's owner adds these to this file): converts the Pipeline's
// `ops` (Python op specs, in order) and `erase` (a RandomErasing or None; MXNet's normalization
// jitter comes from an MXNetColorAugment in `ops`) into the engine's structs.
PixelOpsSpec pixel_ops_from_python(const py::sequence& ops, const GeometryParams& geometry);
ErasingSpec erasing_from_python(const py::object& erase, const py::sequence& ops, const OutputParams& output);
#endif

// The element format numpy / the buffer protocol reports for each output dtype.
bool format_matches(DType dtype, const std::string& fmt, Py_ssize_t itemsize) {
  auto is = [&](char c) { return fmt == std::string(1, c) || fmt == std::string("=") + c || fmt == std::string("<") + c ||
                                 fmt == std::string("|") + c; };
  switch (dtype) {
    case DType::kUint8: return itemsize == 1 && (is('B') || fmt == "c");
    case DType::kFloat32: return itemsize == 4 && is('f');
    case DType::kFloat16: return itemsize == 2 && is('e');
  }
  return false;
}

#ifdef FASTLOAD_HAVE_PIXEL_OPS
// (cutmix, lam, (x0, y0, x1, y1), lam_labels): one batch's MixUp / CutMix draw, checked against an
// h x w output (mix_batch_py's checks).
MixParams mix_from_python(const py::object& mix, int h, int w) {
  const py::tuple t = py::cast<py::tuple>(mix);
  if (py::len(t) != 4) throw py::value_error("mix must be (cutmix, lam, (x0, y0, x1, y1), lam_labels)");
  const py::sequence box = t[2].cast<py::sequence>();
  if (py::len(box) != 4) throw py::value_error("box must be (x0, y0, x1, y1)");
  MixParams p;
  p.cutmix = t[0].cast<bool>();
  p.lam = t[1].cast<double>();
  p.lam_labels = t[3].cast<double>();
  p.x0 = box[0].cast<int>(), p.y0 = box[1].cast<int>(), p.x1 = box[2].cast<int>(), p.y1 = box[3].cast<int>();
  if (p.cutmix && !(0 <= p.x0 && p.x0 <= p.x1 && p.x1 <= w && 0 <= p.y0 && p.y0 <= p.y1 && p.y1 <= h))
    throw py::value_error("box must lie within the image");
  if (!std::isfinite(p.lam)) throw py::value_error("lam must be finite");
  return p;
}
#endif

py::dict decode_batch_py(const py::sequence& images, const py::buffer& out, const GeometryParams& op,
                         const OutputParams& output, const py::sequence& ops, const py::object& erase, uint64_t seed,
                         uint64_t epoch, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& indices,
                         int threads, const DecodeSettings& options, bool want_params, const py::object& warp,
                         const py::object& mix) {
  check_geometry(op);
  check_settings(options);
  if (threads < 1) throw py::value_error("threads=" + std::to_string(threads) + " must be >= 1");
  PipelineSpec spec;
  spec.geometry = op;
  spec.output = output;
  if (op.kind == GeometryKind::kMxnetAugment) {
    if (warp.is_none()) throw py::value_error("geometry kind MXNET_AUGMENT needs its MXNetDefaultAugment as warp");
    spec.mxnet = warp_glue::mxnet_spec(warp);
    if (spec.mxnet.out_h != op.out_h || spec.mxnet.out_w != op.out_w)
      throw py::value_error("the MXNetDefaultAugment's data_shape does not match the geometry's output size");
  } else if (!warp.is_none()) {
    if (op.kind == GeometryKind::kRandomCrop || op.vflip != 0.0)
      throw py::value_error("RandomAffine follows RandomResizedCrop, CenterCrop or Resize without a vertical flip");
    spec.affine = warp_glue::affine_spec(warp);
    spec.has_affine = true;
  }
#ifdef FASTLOAD_HAVE_PIXEL_OPS
  spec.pixel_ops = pixel_ops_from_python(ops, op);
  spec.erasing = erasing_from_python(erase, ops, output);
  MixParams mix_params;
  if (!mix.is_none()) {
    mix_params = mix_from_python(mix, op.out_h, op.out_w);
    spec.mix = &mix_params;
  }
#else
  if (!mix.is_none()) throw py::value_error("this engine was built without pixel ops (csrc/pixel_ops.h): no mix");
  if (py::len(ops) != 0 || !erase.is_none())
    throw py::value_error("this engine was built without pixel ops (csrc/pixel_ops.h): ops and erase must be empty");
#endif
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

  py::array_t<int32_t> status(static_cast<py::ssize_t>(n));
  py::array_t<double> boxes({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(4)});
  py::array_t<bool> flips(static_cast<py::ssize_t>(n));
  py::array_t<bool> vflips(static_cast<py::ssize_t>(n));
  BatchResults results;
  results.status = status.mutable_data();
  results.boxes = boxes.mutable_data();
  results.flips = reinterpret_cast<uint8_t*>(flips.mutable_data());
  results.vflips = reinterpret_cast<uint8_t*>(vflips.mutable_data());
  py::object pixel_traces = py::none(), erase_traces = py::none();
#ifdef FASTLOAD_HAVE_PIXEL_OPS
  if (want_params && spec.has_pixel_ops()) {
    py::array_t<double> t({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(spec.pixel_ops.ops.size()),
                           static_cast<py::ssize_t>(kTraceValuesPerOp)});
    std::fill(t.mutable_data(), t.mutable_data() + t.size(), std::numeric_limits<double>::quiet_NaN());
    results.pixel_traces = t.mutable_data();
    pixel_traces = t;
  }
  if (want_params && spec.erasing.active()) {
    py::array_t<double> t({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(kErasingTraceValues)});
    std::fill(t.mutable_data(), t.mutable_data() + t.size(), std::numeric_limits<double>::quiet_NaN());
    results.erase_traces = t.mutable_data();
    erase_traces = t;
  }
#else
  (void)want_params;
#endif
  py::object warp_traces = py::none();
  if (want_params && (spec.has_affine || op.kind == GeometryKind::kMxnetAugment)) {
    // [B, 18]: a RandomAffine fills the first 6 columns.
    py::array_t<double> t({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(kWarpTraceValues)});
    std::fill(t.mutable_data(), t.mutable_data() + t.size(), std::numeric_limits<double>::quiet_NaN());
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
  py::array_t<uint8_t> arr({static_cast<py::ssize_t>(info.height), static_cast<py::ssize_t>(info.width), static_cast<py::ssize_t>(3)});
  uint8_t* dst = arr.mutable_data();
  {
    py::gil_scoped_release release;
    st = decode_single(dst, &msg);
  }
  if (st != Status::kOk) return py::make_tuple(st, msg, py::none());
  return py::make_tuple(Status::kOk, std::string(), arr);
}

// `fastload pack --resize`: one GIL-free call decodes, resizes and re-encodes a batch of files.
py::list resize_encode_batch_py(const py::sequence& images, int shorter, int quality, int threads,
                                const DecodeSettings& options) {
  check_settings(options);
  if (shorter < 1) throw py::value_error("shorter=" + std::to_string(shorter) + " must be >= 1");
  if (quality < 1 || quality > 100) throw py::value_error("quality=" + std::to_string(quality) + " must be in 1..100");
  if (threads < 1) throw py::value_error("threads=" + std::to_string(threads) + " must be >= 1");
  const size_t n = static_cast<size_t>(py::len(images));
  BufferViews views;
  const std::vector<ImageRef> refs = views.add_all(images, n, "images");
  std::vector<EncodedImage> results;
  {
    py::gil_scoped_release release;
    resize_encode_batch(refs, shorter, quality, threads, options, &results);
  }
  py::list out;
  for (const EncodedImage& r : results) {
    if (r.status == Status::kOk) {
      out.append(py::make_tuple(r.status, std::string(), py::bytes(reinterpret_cast<const char*>(r.jpeg.data()), r.jpeg.size())));
    } else {
      out.append(py::make_tuple(r.status, std::string(status_name(r.status)) + ": " + r.message, py::none()));
    }
  }
  return out;
}

// ---- pack ------------------------------------------------------------------------------------------

// Pass-through `fastload pack`: one GIL-free call reads, checks and frames a batch of files into
// the caller's buffer (the pack reuses its buffers: fresh multi-megabyte allocations page-fault).
py::tuple gather_rows_py(const py::array_t<int32_t, py::array::c_style>& fds,
                        const py::array_t<int64_t, py::array::c_style>& offsets, size_t row_bytes,
                        const py::buffer& out) {
  const size_t n = static_cast<size_t>(fds.size());
  if (static_cast<size_t>(offsets.size()) != n) throw py::value_error("fds and offsets must have one entry per row");
  const BufferView outv(out.ptr(), PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS, "out");
  if (row_bytes != 0 && static_cast<size_t>(outv->len) / row_bytes < n)
    throw py::value_error("out holds " + std::to_string(outv->len) + " bytes, " + std::to_string(n) + " rows need " +
                          std::to_string(n * row_bytes));
  RowGatherFailure failure;
  {
    py::gil_scoped_release release;
    failure = gather_rows(fds.data(), offsets.data(), n, row_bytes, static_cast<uint8_t*>(outv->buf));
  }
  return py::make_tuple(failure.row, failure.error);
}

py::tuple frame_files_py(const py::sequence& paths, const py::sequence& sizes, const py::sequence& heads,
                         const py::buffer& out) {
  const size_t n = static_cast<size_t>(py::len(paths));
  if (static_cast<size_t>(py::len(sizes)) != n || static_cast<size_t>(py::len(heads)) != n)
    throw py::value_error("paths, sizes and heads must have one entry per file");
  BufferViews views;
  const std::vector<ImageRef> head_refs = views.add_all(heads, n, "heads");
  std::vector<FrameJob> jobs(n);
  for (size_t i = 0; i < n; ++i) {
    py::handle p = paths[i];
    if (!PyBytes_Check(p.ptr())) throw py::type_error("paths[" + std::to_string(i) + "] must be bytes (os.fsencode)");
    jobs[i].path = p.cast<std::string>();
    const long long size = sizes[i].cast<long long>();
    if (size < 0) throw py::value_error("sizes[" + std::to_string(i) + "] is negative");
    jobs[i].size = static_cast<size_t>(size);
    jobs[i].head = head_refs[i].data;
    jobs[i].head_len = head_refs[i].size;
  }
  const BufferView outv(out.ptr(), PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS, "out");
  const size_t capacity = static_cast<size_t>(outv->len);
  const size_t needed = frame_capacity(jobs);
  if (capacity < needed)
    throw py::value_error("out holds " + std::to_string(capacity) + " bytes, the batch needs " + std::to_string(needed));
  py::array_t<int64_t> framed(static_cast<py::ssize_t>(n));
  int64_t* fs = framed.mutable_data();
  uint8_t* dst = static_cast<uint8_t*>(outv->buf);
  size_t used = 0;
  {
    py::gil_scoped_release release;
    used = frame_files(jobs, dst, capacity, fs);
  }
  return py::make_tuple(framed, used);
}

// ---- restart index ---------------------------------------------------------------------------------
// Pack-time transcode (restart_transcode.h) and decode-time slicing (restart_slice.h). Every call
// takes a buffer (bytes, memoryview of an mmap, numpy uint8), releases the GIL for the libjpeg work
// and turns failures into ValueError with libjpeg's message.

py::dict geometry_dict(const RestartGeometry& g) {
  py::dict d;
  d["width"] = g.width;
  d["height"] = g.height;
  d["components"] = g.components;
  d["mcu_width"] = g.mcu_width;
  d["mcu_height"] = g.mcu_height;
  d["mcus_per_row"] = g.mcus_per_row;
  d["mcu_rows"] = g.mcu_rows;
  d["restart_interval"] = g.restart_interval;
  d["intervals_per_row"] = g.intervals_per_row;
  return d;
}

py::tuple add_restart_markers_py(const py::object& buf, int max_mcus, bool verify) {
  const BufferView in(buf.ptr(), kReadFlags, "buf");
  const ImageRef ref = in.ref();
  std::vector<uint8_t> out;
  RestartGeometry geo;
  TranscodeNotes notes;
  std::string err;
  bool ok, same = true;
  {
    py::gil_scoped_release nogil;
    ok = add_restart_markers(ref.data, ref.size, max_mcus, &out, &geo, &err, &notes);
    if (ok && verify) same = verify_identical(ref.data, ref.size, out.data(), out.size(), &err);
  }
  if (!ok) throw py::value_error("cannot add restart markers: " + err);
  if (!same) throw py::value_error("transcoded image does not decode identically to the original: " + err);
  py::dict d = geometry_dict(geo);
  d["source_progressive"] = notes.source_progressive;
  d["source_arithmetic"] = notes.source_arithmetic;
  d["source_warnings"] = notes.source_warnings;
  d["source_bytes"] = notes.source_bytes;
  d["output_bytes"] = notes.output_bytes;
  d["verified"] = verify;
  return py::make_tuple(py::bytes(reinterpret_cast<const char*>(out.data()), out.size()), d);
}

py::object restart_geometry_py(const py::object& buf) {
  const BufferView in(buf.ptr(), kReadFlags, "buf");
  const ImageRef ref = in.ref();
  RestartGeometry geo;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = parse_restart_geometry(ref.data, ref.size, &geo, nullptr);
  }
  if (!ok || geo.restart_interval == 0) return py::none();
  return geometry_dict(geo);
}

py::tuple restart_slice_py(const py::object& buf, int x, int y, int w, int h, int scale_denom) {
  const BufferView in(buf.ptr(), kReadFlags, "buf");
  const ImageRef ref = in.ref();
  RestartSlice slice;
  std::string why;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = build_restart_slice(ref.data, ref.size, x, y, w, h, &slice, &why, scale_denom);
  }
  if (!ok) throw py::value_error("cannot slice by restart intervals: " + why);
  return py::make_tuple(py::bytes(reinterpret_cast<const char*>(slice.jpeg.data()), slice.jpeg.size()), slice.x0,
                        slice.y0);
}

bool restart_verify_py(const py::object& a, const py::object& b) {
  const BufferView ia(a.ptr(), kReadFlags, "a"), ib(b.ptr(), kReadFlags, "b");
  const ImageRef ra = ia.ref(), rb = ib.ref();
  std::string why;
  bool same;
  {
    py::gil_scoped_release nogil;
    same = verify_identical(ra.data, ra.size, rb.data, rb.size, &why);
  }
  return same;
}

}  // namespace


// ==== pixel ops ===========================================================================
// Glue of the pixel ops (csrc/pixel_ops.h): the Python specs arrive as plain dicts built by
// fastload.transforms.pixel.engine_specs (numbers only: ranges, magnitude tables, warp matrices)
// and are copied into the C++ structs here; the work runs with the GIL released.
#include "pixel_color.h"
#include "pixel_ops.h"

namespace pixel_glue {

template <size_t N>
void read_array(const py::handle& seq, double (&out)[N], const char* name) {
  const py::sequence s = py::reinterpret_borrow<py::sequence>(seq);
  if (static_cast<size_t>(py::len(s)) != N) throw py::value_error(std::string(name) + " must hold " + std::to_string(N) + " numbers");
  for (size_t i = 0; i < N; ++i) out[i] = s[i].cast<double>();
}

void read_range(const py::dict& d, const char* name, bool* has, double (&out)[2]) {
  const py::object v = d[name];
  *has = !v.is_none();
  if (*has) read_array(v, out, name);
}

void read_fill(const py::dict& d, uint8_t (&fill)[3]) {
  const py::sequence f = d["fill"].cast<py::sequence>();
  if (py::len(f) != 3) throw py::value_error("fill must hold 3 values");
  for (size_t i = 0; i < 3; ++i) {
    const int v = f[i].cast<int>();
    if (v < 0 || v > 255) throw py::value_error("fill values must be in [0, 255]");
    fill[i] = static_cast<uint8_t>(v);
  }
}

PixelPrim read_prim(const py::handle& h) {
  const int v = h.cast<int>();
  if (v < 0 || v >= kNumPixelPrims) throw py::value_error("unknown pixel primitive " + std::to_string(v));
  return static_cast<PixelPrim>(v);
}

std::vector<double> read_vector(const py::handle& h) {
  std::vector<double> out;
  for (const py::handle x : py::reinterpret_borrow<py::sequence>(h)) out.push_back(x.cast<double>());
  return out;
}

PixelOp parse_op(const py::dict& d) {
  PixelOp op;
  const int kind = d["kind"].cast<int>();
  if (kind < 0 || kind >= kPixelOpKindCount) throw py::value_error("unknown pixel op kind " + std::to_string(kind));
  op.kind = static_cast<PixelOpKind>(kind);
  switch (op.kind) {
    case PixelOpKind::kColorJitter:
      read_range(d, "brightness", &op.has_brightness, op.brightness);
      read_range(d, "contrast", &op.has_contrast, op.contrast);
      read_range(d, "saturation", &op.has_saturation, op.saturation);
      read_range(d, "hue", &op.has_hue, op.hue);
      break;
    case PixelOpKind::kRandomGrayscale: op.p = d["p"].cast<double>(); break;
    case PixelOpKind::kLighting:
      op.alphastd = d["alphastd"].cast<double>();
      read_array(d["eigval"], op.eigval, "eigval");
      read_array(d["eigvec"], op.eigvec, "eigvec");
      break;
    case PixelOpKind::kMxnetColor:
      op.mx_brightness = d["brightness"].cast<double>();
      op.mx_contrast = d["contrast"].cast<double>();
      op.mx_saturation = d["saturation"].cast<double>();
      op.mx_pca_noise = d["pca_noise"].cast<double>();
      op.random_h = d["random_h"].cast<int>();
      op.random_s = d["random_s"].cast<int>();
      op.random_l = d["random_l"].cast<int>();
      break;
    case PixelOpKind::kAutoAugment:
      for (const py::handle sub : d["subpolicies"].cast<py::sequence>()) {
        std::vector<PolicyStep> steps;
        for (const py::handle st : py::reinterpret_borrow<py::sequence>(sub)) {
          const py::tuple t = py::reinterpret_borrow<py::tuple>(st);
          PolicyStep s;
          s.prim = read_prim(t[0]);
          s.prob = t[1].cast<double>();
          s.magnitude = t[2].cast<double>();
          s.is_signed = t[3].cast<bool>();
          const std::vector<double> w = read_vector(t[4]);
          if (!w.empty()) {
            if (w.size() != 2 * kWarpValues) throw py::value_error("a policy step's warps must hold 14 numbers");
            std::copy(w.begin(), w.end(), s.warps);
          }
          steps.push_back(s);
        }
        op.subpolicies.push_back(std::move(steps));
      }
      op.bilinear = d["bilinear"].cast<bool>();
      read_fill(d, op.fill);
      break;
    case PixelOpKind::kRandAugment:
    case PixelOpKind::kTrivialAugmentWide:
      for (const py::handle c : d["candidates"].cast<py::sequence>()) {
        const py::tuple t = py::reinterpret_borrow<py::tuple>(c);
        PolicyOp p;
        p.prim = read_prim(t[0]);
        p.is_signed = t[1].cast<bool>();
        p.magnitudes = read_vector(t[2]);
        p.warps = read_vector(t[3]);
        if (!p.warps.empty() && p.warps.size() != p.magnitudes.size() * 2 * kWarpValues)
          throw py::value_error("a policy op's warps must hold 14 numbers per magnitude bin");
        op.candidates.push_back(std::move(p));
      }
      if (op.kind == PixelOpKind::kRandAugment) {
        op.num_ops = d["num_ops"].cast<int>();
        op.magnitude = d["magnitude"].cast<int>();
        if (op.num_ops < 1 || op.num_ops > 31) throw py::value_error("num_ops must be in [1, 31]");
        for (const PolicyOp& p : op.candidates)
          if (!p.magnitudes.empty() && (op.magnitude < 0 || static_cast<size_t>(op.magnitude) >= p.magnitudes.size()))
            throw py::value_error("magnitude bin out of range");
      }
      op.bilinear = d["bilinear"].cast<bool>();
      read_fill(d, op.fill);
      break;
    case PixelOpKind::kTimmRandAugment:
    case PixelOpKind::kTimmAutoAugment:
    case PixelOpKind::kTimmAugmix: {
      read_fill(d, op.fill);
      std::string error;
      if (!timm_policy_from_numbers(op.kind, read_vector(d["timm_ops"]), read_vector(d["timm_groups"]),
                                    read_vector(d["timm_weights"]), read_vector(d["timm_params"]), op.fill, &op.timm,
                                    &error))
        throw py::value_error(error);
      break;
    }
  }
  return op;
}

PixelOpsSpec parse_ops(const py::sequence& ops) {
  PixelOpsSpec spec;
  if (py::len(ops) > kMaxPixelOps) throw py::value_error("too many pixel ops");
  for (const py::handle o : ops) spec.ops.push_back(parse_op(py::reinterpret_borrow<py::dict>(o)));
  return spec;
}

ErasingSpec parse_erasing(const py::dict& d) {
  ErasingSpec s;
  s.mx_jitter = d["mx_jitter"].cast<bool>();
  if (s.mx_jitter) {
    s.max_random_contrast = d["max_random_contrast"].cast<double>();
    s.max_random_illumination = d["max_random_illumination"].cast<double>();
    s.mx_counter_base = d["mx_counter_base"].cast<uint64_t>();
    double sc[3];
    read_array(d["illumination_scale"], sc, "illumination_scale");
    for (int i = 0; i < 3; ++i) s.illumination_scale[i] = static_cast<float>(sc[i]);
  }
  s.erase = d["erase"].cast<bool>();
  if (s.erase) {
    s.p = d["p"].cast<double>();
    read_array(d["scale"], s.scale, "scale");
    read_array(d["log_ratio"], s.log_ratio, "log_ratio");
    s.random_value = d["random_value"].cast<bool>();
    s.random_color = d.contains("random_color") && d["random_color"].cast<bool>();
    read_array(d["value"], s.value, "value");
  }
  return s;
}

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

// Runs the ops on a batch of HWC uint8 images [B, H, W, 3] in place, keys from (seed, epoch, indices),
// spread over the engine's pool; returns the traces [B, ops, 64] or None.
py::object pixel_ops_batch(py::array_t<uint8_t> images, const py::sequence& ops_t, uint64_t seed, uint64_t epoch,
                           const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& indices, int threads,
                           bool want_trace) {
  check_writable_contiguous(images, "images");
  if (images.ndim() != 4 || images.shape(3) != 3) throw py::value_error("images must be [B, H, W, 3] uint8");
  const PixelOpsSpec spec = parse_ops(ops_t);
  const int n = static_cast<int>(images.shape(0)), h = static_cast<int>(images.shape(1)), w = static_cast<int>(images.shape(2));
  if (indices.ndim() != 1 || indices.shape(0) != n) throw py::value_error("indices must hold one index per image");
  if (threads < 1) throw py::value_error("threads must be >= 1");
  py::object out = py::none();
  double* tr = nullptr;
  if (want_trace) {
    py::array_t<double> t({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(spec.ops.size()), static_cast<py::ssize_t>(kTraceValuesPerOp)});
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
py::object erasing_batch(py::array images, bool channels_first, const py::dict& spec_d, uint64_t seed, uint64_t epoch,
                         const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& indices, int threads,
                         bool want_trace) {
  check_writable_contiguous(images, "images");
  const py::buffer_info info = images.request(true);
  const DType type = sample_type(info);
  if (info.ndim != 4) throw py::value_error("images must be 4-D");
  const int n = static_cast<int>(info.shape[0]);
  const int h = static_cast<int>(channels_first ? info.shape[2] : info.shape[1]);
  const int w = static_cast<int>(channels_first ? info.shape[3] : info.shape[2]);
  if ((channels_first ? info.shape[1] : info.shape[3]) != 3) throw py::value_error("images must have 3 channels");
  if (indices.ndim() != 1 || indices.shape(0) != n) throw py::value_error("indices must hold one index per image");
  if (threads < 1) throw py::value_error("threads must be >= 1");
  const ErasingSpec spec = parse_erasing(spec_d);
  py::object out = py::none();
  double* tr = nullptr;
  if (want_trace) {
    py::array_t<double> t({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(kErasingTraceValues)});
    tr = t.mutable_data();
    out = t;
  }
  void* base = info.ptr;
  const int64_t* idx = indices.data();
  {
    py::gil_scoped_release release;
    apply_erasing_batch(base, type, channels_first, n, h, w, spec, seed, epoch, idx, threads, tr);
  }
  return out;
}

void mix_batch_py(py::array images, const py::array_t<float, py::array::c_style | py::array::forcecast>& labels,
                  py::array_t<float> soft, bool cutmix, double lam, const py::sequence& box, double lam_labels,
                  bool channels_first, int threads) {
  check_writable_contiguous(images, "images");
  check_writable_contiguous(soft, "soft");
  const py::buffer_info info = images.request(true);
  const DType type = sample_type(info);
  if (info.ndim != 4) throw py::value_error("images must be 4-D");
  const int n = static_cast<int>(info.shape[0]);
  const int h = static_cast<int>(channels_first ? info.shape[2] : info.shape[1]);
  const int w = static_cast<int>(channels_first ? info.shape[3] : info.shape[2]);
  if ((channels_first ? info.shape[1] : info.shape[3]) != 3) throw py::value_error("images must have 3 channels");
  if (labels.ndim() != 2 || labels.shape(0) != n) throw py::value_error("labels must be [B, num_classes]");
  const int classes = static_cast<int>(labels.shape(1));
  if (soft.ndim() != 2 || soft.shape(0) != n || soft.shape(1) != classes) throw py::value_error("soft must be shaped like labels");
  if (threads < 1) throw py::value_error("threads must be >= 1");
  if (py::len(box) != 4) throw py::value_error("box must be (x0, y0, x1, y1)");
  MixParams p;
  p.cutmix = cutmix;
  p.lam = lam;
  p.lam_labels = lam_labels;
  p.x0 = box[0].cast<int>(), p.y0 = box[1].cast<int>(), p.x1 = box[2].cast<int>(), p.y1 = box[3].cast<int>();
  if (cutmix && !(0 <= p.x0 && p.x0 <= p.x1 && p.x1 <= w && 0 <= p.y0 && p.y0 <= p.y1 && p.y1 <= h))
    throw py::value_error("box must lie within the image");
  void* data = info.ptr;
  const float* lab = labels.data();
  float* out = soft.mutable_data();
  py::gil_scoped_release release;
  mix_batch(data, type, channels_first, n, h, w, p, lab, classes, out, threads);
}

// Testing hooks: one primitive (torchvision or MXNet arithmetic) with fixed parameters, in place.
void pixel_prim(py::array_t<uint8_t> image, int prim, double magnitude, const py::sequence& warp, bool bilinear,
                const py::sequence& fill_t) {
  check_writable_contiguous(image, "image");
  if (image.ndim() != 3 || image.shape(2) != 3) throw py::value_error("image must be [H, W, 3] uint8");
  const PixelPrim p = read_prim(py::int_(prim));
  std::vector<double> w;
  for (const py::handle x : warp) w.push_back(x.cast<double>());
  if (!w.empty() && w.size() != kWarpValues) throw py::value_error("warp must hold 7 numbers");
  uint8_t fill[3];
  py::dict d;
  d["fill"] = fill_t;
  read_fill(d, fill);
  uint8_t* data = image.mutable_data();
  const int h = static_cast<int>(image.shape(0)), wd = static_cast<int>(image.shape(1));
  py::gil_scoped_release release;
  apply_pixel_prim(data, h, wd, p, magnitude, w.empty() ? nullptr : w.data(), bilinear, fill);
}

void pixel_mx_prim(py::array_t<uint8_t> image, const std::string& name, const py::sequence& args) {
  check_writable_contiguous(image, "image");
  if (image.ndim() != 3 || image.shape(2) != 3) throw py::value_error("image must be [H, W, 3] uint8");
  uint8_t* data = image.mutable_data();
  const size_t px = static_cast<size_t>(image.shape(0)) * static_cast<size_t>(image.shape(1));
  std::vector<double> a;
  for (const py::handle x : args) a.push_back(x.cast<double>());
  auto need = [&](size_t n) {
    if (a.size() != n) throw py::value_error(name + " takes " + std::to_string(n) + " arguments");
  };
  if (name == "brightness") {
    need(1);
    pixel::mx_brightness(data, px, static_cast<float>(a[0]));
  } else if (name == "contrast") {
    need(1);
    pixel::mx_contrast(data, px, static_cast<float>(a[0]));
  } else if (name == "saturation") {
    need(1);
    pixel::mx_saturation(data, px, static_cast<float>(a[0]));
  } else if (name == "hls") {
    need(3);
    pixel::mx_hls(data, px, static_cast<int>(a[0]), static_cast<int>(a[1]), static_cast<int>(a[2]));
  } else if (name == "pca") {
    need(3);
    const float pca[3] = {static_cast<float>(a[0]), static_cast<float>(a[1]), static_cast<float>(a[2])};
    pixel::mx_pca(data, px, pca);
  } else {
    throw py::value_error("unknown MXNet primitive " + name);
  }
}

void register_functions(py::module_& m) {
  m.def("pixel_prim", &pixel_prim, py::arg("image"), py::arg("prim"), py::arg("magnitude"), py::arg("warp"),
        py::arg("bilinear"), py::arg("fill"), "Testing hook: one pixel primitive with fixed parameters, in place.");
  m.def("pixel_mx_prim", &pixel_mx_prim, py::arg("image"), py::arg("name"), py::arg("args"),
        "Testing hook: one step of MXNet's colour augmenter ('brightness', 'contrast', 'saturation' (alpha), "
        "'hls' (dh, dl, ds), 'pca' (r, g, b)), in place.");
  m.def("pixel_ops_batch", &pixel_ops_batch, py::arg("images"), py::arg("ops"), py::arg("seed"), py::arg("epoch"),
        py::arg("indices"), py::arg("threads"), py::arg("want_trace"),
        "Run pixel ops (engine spec dicts) on [B, H, W, 3] uint8 images in place; traces [B, ops, 64] or None.");
  m.def("erasing_batch", &erasing_batch, py::arg("images"), py::arg("channels_first"), py::arg("spec"), py::arg("seed"),
        py::arg("epoch"), py::arg("indices"), py::arg("threads"), py::arg("want_trace"),
        "Run the output-stage ops (MXNet jitter, RandomErasing) on a batch in place; traces [B, 8] or None.");
  m.def("mix_batch", &mix_batch_py, py::arg("images"), py::arg("labels"), py::arg("soft"), py::arg("cutmix"),
        py::arg("lam"), py::arg("box"), py::arg("lam_labels"), py::arg("channels_first"), py::arg("threads"),
        "MixUp / CutMix a batch in place (one call, GIL released); soft receives the mixed labels.");
  m.def("pixel_kernels", [](const std::string& name) { return pixel_ops_force_kernels(name.c_str()); }, py::arg("name"),
        "Testing hook: pixel-op kernels 'scalar', 'avx512' or 'best'; False if unavailable.");
  m.def("pixel_kernel_name", [] { return std::string(pixel_ops_kernel_name()); });
}

}  // namespace pixel_glue

namespace {

// The decode path's pixel-op glue (declared with decode_batch_py): the Pipeline's ops and erase
// become plain dicts through fastload.transforms (cached per op and output size), then structs.
PixelOpsSpec pixel_ops_from_python(const py::sequence& ops, const GeometryParams& geometry) {
  if (py::len(ops) == 0) return PixelOpsSpec();
  const py::object specs = py::module_::import("fastload.transforms.pixel").attr("engine_specs")(ops, geometry.out_h, geometry.out_w);
  return pixel_glue::parse_ops(specs);
}

ErasingSpec erasing_from_python(const py::object& erase, const py::sequence& ops, const OutputParams& output) {
  const py::object spec =
      py::module_::import("fastload.transforms.erasing").attr("engine_output_spec")(ops, py::none(), erase);
  ErasingSpec e = pixel_glue::parse_erasing(spec.cast<py::dict>());
  // MXNet's illumination is in pixel units times the Normalize's scale / std (1 without one).
  for (int c = 0; c < 3; ++c)
    e.illumination_scale[c] = output.normalize ? static_cast<float>(output.scale / output.std_dev[c]) : 1.0f;
  return e;
}

}  // namespace
// ==== end pixel ops =======================================================================

// ==== warp geometries (RandomAffine, MXNetDefaultAugment) ================================
// Converts the Python specs (fastload.transforms.affine / mxnet_augment / warp dataclasses, read
// by attribute name) to the plain C++ structs of random_affine.h, mxnet_augment.h and warp.h, and
// exposes the samplers and the resampler to the tests.
namespace warp_glue {

WarpKernel kernel_from_name(const std::string& name) {
  if (name == "nearest") return WarpKernel::kNearest;
  if (name == "bilinear") return WarpKernel::kLinear;
  if (name == "bicubic") return WarpKernel::kCubic;
  throw py::value_error("interpolation '" + name + "' must be 'nearest', 'bilinear' or 'bicubic'");
}

void fill_from(const py::handle& seq, uint8_t fill[3]) {
  const py::sequence f = py::reinterpret_borrow<py::sequence>(seq);
  if (py::len(f) != 3) throw py::value_error("fill must hold 3 values");
  for (int c = 0; c < 3; ++c) {
    const int v = f[c].cast<int>();
    if (v < 0 || v > 255) throw py::value_error("fill values must be in 0..255");
    fill[c] = static_cast<uint8_t>(v);
  }
}

AffineSpec affine_spec(const py::handle& t) {
  AffineSpec s;
  const py::tuple deg = t.attr("degrees").cast<py::tuple>();
  s.degrees_lo = deg[0].cast<double>(), s.degrees_hi = deg[1].cast<double>();
  if (!t.attr("translate").is_none()) {
    const py::tuple tr = t.attr("translate").cast<py::tuple>();
    s.has_translate = true, s.translate_x = tr[0].cast<double>(), s.translate_y = tr[1].cast<double>();
  }
  if (!t.attr("scale").is_none()) {
    const py::tuple sc = t.attr("scale").cast<py::tuple>();
    s.has_scale = true, s.scale_lo = sc[0].cast<double>(), s.scale_hi = sc[1].cast<double>();
  }
  if (!t.attr("shear").is_none()) {
    const py::tuple sh = t.attr("shear").cast<py::tuple>();
    s.shear_count = static_cast<int>(py::len(sh));
    if (s.shear_count != 2 && s.shear_count != 4) throw py::value_error("shear must hold 2 or 4 values");
    for (int i = 0; i < s.shear_count; ++i) s.shear[i] = sh[i].cast<double>();
  }
  s.kernel = kernel_from_name(t.attr("interpolation").cast<std::string>());
  fill_from(t.attr("fill"), s.fill);
  if (!t.attr("center").is_none()) {
    const py::tuple c = t.attr("center").cast<py::tuple>();
    s.has_center = true, s.center_x = c[0].cast<double>(), s.center_y = c[1].cast<double>();
  }
  return s;
}

MXNetAugmentSpec mxnet_spec(const py::handle& t) {
  MXNetAugmentSpec s;
  const py::tuple shape = t.attr("data_shape").cast<py::tuple>();
  s.out_h = shape[1].cast<int>(), s.out_w = shape[2].cast<int>();
  s.resize = t.attr("resize").cast<int>();
  s.rand_crop = t.attr("rand_crop").cast<bool>();
  s.random_resized_crop = t.attr("random_resized_crop").cast<bool>();
  s.max_rotate_angle = t.attr("max_rotate_angle").cast<int>();
  s.max_aspect_ratio = t.attr("max_aspect_ratio").cast<float>();
  if (!t.attr("min_aspect_ratio").is_none()) {
    s.has_min_aspect_ratio = true, s.min_aspect_ratio = t.attr("min_aspect_ratio").cast<float>();
  }
  s.max_shear_ratio = t.attr("max_shear_ratio").cast<float>();
  s.max_crop_size = t.attr("max_crop_size").cast<int>(), s.min_crop_size = t.attr("min_crop_size").cast<int>();
  s.max_random_scale = t.attr("max_random_scale").cast<float>();
  s.min_random_scale = t.attr("min_random_scale").cast<float>();
  s.max_random_area = t.attr("max_random_area").cast<float>();
  s.min_random_area = t.attr("min_random_area").cast<float>();
  s.max_img_size = t.attr("max_img_size").cast<float>(), s.min_img_size = t.attr("min_img_size").cast<float>();
  s.rotate = t.attr("rotate").cast<int>();
  s.fill_value = t.attr("fill_value").cast<int>();
  s.inter_method = t.attr("inter_method").cast<int>();
  s.pad = t.attr("pad").cast<int>();
  s.rand_mirror = t.attr("rand_mirror").cast<bool>();
  s.mirror = t.attr("mirror").cast<bool>();
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
  return s;
}

Affine2 affine_from(const py::handle& m) {
  const py::tuple t = m.cast<py::tuple>();
  if (py::len(t) != 6) throw py::value_error("an affine map has 6 coefficients");
  Affine2 a;
  a.a = t[0].cast<double>(), a.b = t[1].cast<double>(), a.c = t[2].cast<double>();
  a.d = t[3].cast<double>(), a.e = t[4].cast<double>(), a.f = t[5].cast<double>();
  return a;
}

py::tuple affine_tuple(const Affine2& a) { return py::make_tuple(a.a, a.b, a.c, a.d, a.e, a.f); }

WarpPlan plan_from(const py::handle& p) {
  WarpPlan w;
  w.out_h = p.attr("out_h").cast<int>(), w.out_w = p.attr("out_w").cast<int>();
  if (w.out_h <= 0 || w.out_w <= 0 || w.out_h > 16384 || w.out_w > 16384)
    throw py::value_error("plan output size must be in 1..16384");
  w.to_frame = affine_from(p.attr("to_frame"));
  if (!p.attr("frame").is_none()) {
    const py::tuple f = p.attr("frame").cast<py::tuple>();
    w.has_frame = true;
    for (int i = 0; i < 4; ++i) w.frame[i] = f[i].cast<double>();
  }
  w.snap = p.attr("snap").cast<bool>();
  w.to_source = affine_from(p.attr("to_source"));
  const py::tuple sc = p.attr("scale").cast<py::tuple>();
  w.scale_x = sc[0].cast<double>(), w.scale_y = sc[1].cast<double>();
  const int kernel = p.attr("kernel").cast<int>(), border = p.attr("border").cast<int>();
  if (kernel < 0 || kernel > 5) throw py::value_error("plan kernel must be 0..5");
  if (border < 0 || border > 2) throw py::value_error("plan border must be 0..2");
  w.kernel = static_cast<WarpKernel>(kernel);
  w.border = static_cast<WarpBorder>(border);
  w.antialias = p.attr("antialias").cast<bool>();
  const py::tuple sh = p.attr("nearest_shift").cast<py::tuple>();
  w.shift_x = sh[0].cast<double>(), w.shift_y = sh[1].cast<double>();
  fill_from(p.attr("fill"), w.fill);
  w.dct_scaling = p.attr("dct_scaling").cast<bool>();
  w.quantize = p.attr("quantize").cast<bool>();
  if (!(w.scale_x > 0 && w.scale_y > 0 && w.scale_x < 1e6 && w.scale_y < 1e6))
    throw py::value_error("plan scale must be positive and finite");
  return w;
}

// The plan's fields under warp.py's WarpPlan names (the tests compare them with the reference).
py::dict plan_dict(const WarpPlan& w) {
  py::dict d;
  d["out_h"] = w.out_h, d["out_w"] = w.out_w;
  d["to_frame"] = affine_tuple(w.to_frame);
  d["frame"] = w.has_frame ? py::object(py::make_tuple(w.frame[0], w.frame[1], w.frame[2], w.frame[3])) : py::none();
  d["snap"] = w.snap;
  d["to_source"] = affine_tuple(w.to_source);
  d["scale"] = py::make_tuple(w.scale_x, w.scale_y);
  d["kernel"] = static_cast<int>(w.kernel);
  d["antialias"] = w.antialias;
  d["nearest_shift"] = py::make_tuple(w.shift_x, w.shift_y);
  d["border"] = static_cast<int>(w.border);
  d["fill"] = py::make_tuple(int(w.fill[0]), int(w.fill[1]), int(w.fill[2]));
  d["dct_scaling"] = w.dct_scaling;
  d["quantize"] = w.quantize;
  return d;
}

py::tuple affine_plan_py(const py::object& spec, const py::tuple& box, bool flip, int out_h, int out_w, uint64_t key,
                         const std::string& crop_interpolation, bool crop_antialias) {
  const AffineSpec s = affine_spec(spec);
  const double b[4] = {box[0].cast<double>(), box[1].cast<double>(), box[2].cast<double>(), box[3].cast<double>()};
  if (out_h <= 0 || out_w <= 0) throw py::value_error("output size must be positive");
  AffineParams prm;
  const WarpPlan plan = affine_plan(s, b, flip, out_h, out_w, key, kernel_from_name(crop_interpolation), crop_antialias, &prm);
  return py::make_tuple(plan_dict(plan), py::make_tuple(prm.angle, static_cast<double>(prm.tx), static_cast<double>(prm.ty),
                                                         prm.scale, prm.shear_x, prm.shear_y));
}

py::tuple mxnet_plan_py(const py::object& spec, int width, int height, uint64_t key) {
  const MXNetAugmentSpec s = mxnet_spec(spec);
  if (width <= 0 || height <= 0) throw py::value_error("image size must be positive");
  WarpPlan plan;
  MXNetParams prm;
  std::string error;
  if (!mxnet_plan(s, width, height, key, &plan, &prm, &error)) throw py::value_error(error);
  double values[kMXNetParamCount];
  mxnet_params_values(prm, values);
  py::tuple params(kMXNetParamCount);
  for (int i = 0; i < kMXNetParamCount; ++i) params[i] = values[i];
  return py::make_tuple(plan_dict(plan), params);
}

// Evaluates a plan on a full-resolution HWC image, through the same source rectangle the decode
// path would read (copied out, so a tap outside it would read the copy's clamped edge, not memory
// beyond it).
py::array_t<uint8_t> warp_image_py(const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& src,
                                   const py::object& plan_obj) {
  const WarpPlan plan = plan_from(plan_obj);
  if (src.ndim() != 3 || src.shape(2) != 3) throw py::value_error("src must be [H, W, 3] uint8");
  const int h = static_cast<int>(src.shape(0)), w = static_cast<int>(src.shape(1));
  if (h <= 0 || w <= 0) throw py::value_error("src must not be empty");
  py::array_t<uint8_t> out({static_cast<py::ssize_t>(plan.out_h), static_cast<py::ssize_t>(plan.out_w), static_cast<py::ssize_t>(3)});
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

py::tuple source_rect_py(const py::object& plan_obj, int denom, int scaled_w, int scaled_h) {
  const WarpPlan plan = plan_from(plan_obj);
  if (denom != 1 && denom != 2 && denom != 4 && denom != 8) throw py::value_error("denom must be 1, 2, 4 or 8");
  const SourceRect r = warp_source_rect(plan, denom, scaled_w, scaled_h);
  return py::make_tuple(r.x0, r.y0, r.x1, r.y1);
}

// Region decode + warp of one JPEG on the calling thread: (status, message, image, denom).
py::tuple warp_decode_py(const py::object& buf, const py::object& plan_obj, const DecodeSettings& settings) {
  const WarpPlan plan = plan_from(plan_obj);
  check_settings(settings);
  const BufferView view(buf.ptr(), kReadFlags, "buf");
  const ImageRef ref = view.ref();
  py::array_t<uint8_t> out({static_cast<py::ssize_t>(plan.out_h), static_cast<py::ssize_t>(plan.out_w), static_cast<py::ssize_t>(3)});
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

void register_functions(py::module_& m) {
  m.def("_warp_affine_plan", &affine_plan_py, py::arg("spec"), py::arg("box"), py::arg("flip"), py::arg("out_h"),
        py::arg("out_w"), py::arg("key"), py::arg("crop_interpolation") = "bilinear", py::arg("crop_antialias") = true,
        "Testing hook: the engine's RandomAffine plan and drawn (angle, tx, ty, scale, shear_x, shear_y).");
  m.def("_warp_mxnet_plan", &mxnet_plan_py, py::arg("spec"), py::arg("width"), py::arg("height"), py::arg("key"),
        "Testing hook: the engine's MXNetDefaultAugment plan and parameters (MXNET_PARAM_NAMES order).");
  m.def("_warp_image", &warp_image_py, py::arg("src"), py::arg("plan"),
        "Testing hook: evaluate a WarpPlan on a full-resolution [H, W, 3] uint8 image.");
  m.def("_warp_source_rect", &source_rect_py, py::arg("plan"), py::arg("denom"), py::arg("scaled_w"), py::arg("scaled_h"),
        "Testing hook: the source rectangle (x0, y0, x1, y1) the plan reads at DCT scale 1/denom.");
  m.def("_warp_decode", &warp_decode_py, py::arg("buf"), py::arg("plan"), py::arg("options"),
        "Testing hook: region decode + warp of one JPEG: (status, message, image or None, denom).");
}

}  // namespace warp_glue
// ==== end warp geometries ================================================================

PYBIND11_MODULE(_engine, m) {
  m.doc() = "fastload's native decode engine: libjpeg-turbo region decode fused with crop/resize/flip";
  register_abi(m);

  m.def("decode_batch", &decode_batch_py, py::arg("images"), py::arg("out"), py::arg("geometry"), py::arg("output"),
        py::arg("ops"), py::arg("erase"), py::arg("seed"), py::arg("epoch"), py::arg("indices"), py::arg("threads"),
        py::arg("options"), py::arg("want_params") = false, py::arg("warp") = py::none(),
        py::arg("mix") = py::none(),
        "Decode a batch into out (GIL released once) through the pipeline geometry (warp: the "
        "MXNetDefaultAugment of an MXNET_AUGMENT geometry, or a RandomAffine after the crop) -> pixel "
        "ops -> output stage (dtype, layout, normalization) -> erasing; returns a dict of per-image "
        "results (with want_params, the pixel ops' traces [B, ops, 64], the output stage's [B, 8] and "
        "the warp's draws [B, 18], RandomAffine's in the first 6 columns). mix: the batch's MixUp / "
        "CutMix draw (cutmix, lam, box, lam_labels), fused into the output stage; 'mixed' says whether "
        "it was applied (every image decoded).");
  m.def("decode_image", &decode_image_py, py::arg("buf"), py::arg("options"),
        "Full-size RGB decode: (status, message, array or None).");
  m.def("resize_encode_batch", &resize_encode_batch_py, py::arg("images"), py::arg("shorter"), py::arg("quality"),
        py::arg("threads"), py::arg("options"),
        "Decode, resize (shorter side to `shorter`, im2rec's arithmetic) and re-encode at `quality` each "
        "image, in one GIL-free call; returns [(status, message, jpeg_bytes or None)].");
  m.def("gather_rows", &gather_rows_py, py::arg("fds"), py::arg("offsets"), py::arg("row_bytes"), py::arg("out"),
        "Read row i (row_bytes bytes of file fds[i] at offsets[i]) into out[i] for every row, with pread, in one "
        "GIL-free call (runs of consecutive rows are one read). Returns (row, errno): row = -1 when every row was "
        "read, else the first row that was not (errno 0: the file ended early).");
  m.def("frame_files", &frame_files_py, py::arg("paths"), py::arg("sizes"), py::arg("heads"), py::arg("out"),
        "Read, check and frame a batch of files as RecordIO records (payload = head + file bytes) into out "
        "in one GIL-free call; out needs 1 + sum(8 + round_up_4(len(head) + size)) bytes. Returns "
        "(framed_sizes, used): records back to back from out[0], framed_sizes[i] > 0 for a framed record, "
        "< 0 for a file left to the Python path.");
  m.def("set_threads", [](int threads) {
    if (threads < 1) throw py::value_error("threads must be >= 1");
    py::gil_scoped_release release;
    set_pool_threads(threads);
  }, py::arg("threads"), "Resize the persistent pool to threads - 1 workers (the caller is the other).");
  m.def("get_threads", [] { return pool_threads(); }, "Threads of the persistent pool (its workers + the caller).");
  m.def("info", [] {
    py::dict d;
    d["libjpeg_turbo"] = FASTLOAD_JPEG_TURBO_VERSION;
    d["simd"] = resize_kernel_name();
    d["output_simd"] = output_kernel_name();
#ifdef FASTLOAD_HAVE_PIXEL_OPS
    d["pixel_ops"] = true;
#else
    d["pixel_ops"] = false;
#endif
    d["slice_entropy_available"] = interval_entropy_available();
    d["threads"] = pool_threads();
#if defined(__SANITIZE_ADDRESS__)
    d["sanitized"] = true;  // FASTLOAD_SANITIZE=1 build (ASan + UBSan)
#else
    d["sanitized"] = false;
#endif
    return d;
  }, "Build facts: libjpeg-turbo version, resize kernels, whether the interval Huffman decoder is built, "
     "whether this is a sanitizer build.");
  m.def("_pool_hold_creation_lock", [](int milliseconds) {
    if (milliseconds < 0 || milliseconds > 60000) throw py::value_error("milliseconds must be in 0..60000");
    py::gil_scoped_release release;
    hold_pool_creation_lock_for_testing(milliseconds);
  }, py::arg("milliseconds"),
        "Testing hook: a background thread holds the pool-creation lock for this long (fork-safety tests).");
  m.def("_resize_force_kernels", [](const std::string& name) {
    if (!resize_force_kernels(name)) return false;
    output_force_kernels(name == "scalar" ? "scalar" : "best");  // the output stage's scalar twin too
    return true;
  }, py::arg("name"),
        "Testing hook: resample (and write the output) with the 'scalar', 'ssse3', 'avx2' or 'best' kernels; "
        "False if unavailable.");
  m.def("_force_hwc_scratch", &force_hwc_scratch, py::arg("on"),
        "Testing hook: every image goes through the per-thread HWC scratch and the whole-image output write.");

  m.def("add_restart_markers", &add_restart_markers_py, py::arg("buf"), py::arg("max_mcus") = 4,
        py::arg("verify") = false,
        "Losslessly add restart markers every N MCUs (N = largest divisor of the MCU row width <= "
        "max_mcus); returns (jpeg_bytes, geometry dict). verify=True decodes both and requires "
        "bit-identical pixels. Raises ValueError with libjpeg's message.");
  m.def("restart_geometry", &restart_geometry_py, py::arg("buf"),
        "The restart geometry (frame, MCU grid, DRI) a baseline JPEG's headers claim, or None.");
  m.def("restart_slice", &restart_slice_py, py::arg("buf"), py::arg("x"), py::arg("y"), py::arg("w"), py::arg("h"),
        py::arg("scale_denom") = 1,
        "A small JPEG made of the restart intervals covering the crop: (jpeg_bytes, x0, y0) in "
        "full-size pixels; crop (x - x0, y - y0, w, h) from its decode. With scale_denom d the slice "
        "is meant to be decoded at 1/d: scaled pixels [x/d, ceil((x+w)/d)) then match a 1/d decode "
        "of the whole image, at offset x0/d. Raises ValueError when the markers do not match the "
        "geometry the headers claim.");
  m.def("restart_verify", &restart_verify_py, py::arg("a"), py::arg("b"),
        "Whether two JPEGs decode to bit-identical pixels (libjpeg defaults).");
  m.def("_restart_force_scalar_scan", &restart_force_scalar_scan, py::arg("scalar"),
        "Testing hook: the slicer's portable interval scan instead of the AVX-512 one.");

  // ---- pixel ops bindings ----
  pixel_glue::register_functions(m);
  // ---- end of pixel ops bindings ----

  // ---- warp geometries (RandomAffine, MXNetDefaultAugment): engine-warp's bindings ----
  warp_glue::register_functions(m);
}
