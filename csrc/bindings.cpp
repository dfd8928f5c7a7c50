// Python glue of the native engine (fastload._engine): argument and buffer checks, GIL release,
// results back as numpy arrays. The only file that includes pybind11; the work lives in plain C++
// (batch_decode, jpeg_decode, jpeg_encode, resize, thread_pool, restart_index, record_framing).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "batch_decode.h"
#include "mxnet_augment.h"
#include "random_affine.h"
#include "warp.h"
#include "warp_decode.h"
#include "record_framing.h"

#ifndef FASTLOAD_JPEG_TURBO_VERSION
#define FASTLOAD_JPEG_TURBO_VERSION "unknown"
#endif

namespace py = pybind11;
using namespace fastload;

namespace {

// Holds the Py_buffer views of a batch's inputs: the bytes stay valid (and pinned, for mmap
// views) while the GIL is released; released with the GIL held, when the call returns.
class BufferViews {
 public:
  ~BufferViews() {
    for (auto& v : views_) PyBuffer_Release(&v);
  }
  ImageRef add(PyObject* obj, size_t position) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      throw py::value_error("images[" + std::to_string(position) + "] (" + std::string(Py_TYPE(obj)->tp_name) +
                            ") does not export a contiguous buffer (bytes, memoryview, numpy array)");
    }
    views_.push_back(view);
    return ImageRef{static_cast<const uint8_t*>(view.buf), static_cast<size_t>(view.len)};
  }
  // Views of every item of a sequence of n buffers, in order.
  std::vector<ImageRef> add_all(const py::sequence& items, size_t n) {
    views_.reserve(views_.size() + n);
    std::vector<ImageRef> refs;
    refs.reserve(n);
    size_t pos = 0;
    for (const py::handle item : items) refs.push_back(add(item.ptr(), pos++));
    return refs;
  }

 private:
  std::vector<Py_buffer> views_;
};

// A writable C-contiguous view of the caller's output buffer, released on scope exit.
class WritableView {
 public:
  WritableView(const py::buffer& out, int extra_flags) {
    if (PyObject_GetBuffer(out.ptr(), &view_, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | extra_flags) != 0) {
      PyErr_Clear();
      throw py::value_error("out must be a writable C-contiguous buffer");
    }
  }
  ~WritableView() { PyBuffer_Release(&view_); }
  WritableView(const WritableView&) = delete;
  WritableView& operator=(const WritableView&) = delete;
  const Py_buffer& operator*() const { return view_; }
  const Py_buffer* operator->() const { return &view_; }

 private:
  Py_buffer view_;
};

DecodeSettings parse_settings(const py::tuple& t, bool* use_slices) {
  if (t.size() != 6) throw py::value_error("options must be (max_pixels, fast_idct, fancy_upsampling, apply_exif, use_restart_slices, dct_scaling)");
  DecodeSettings s;
  s.max_pixels = t[0].cast<long long>();
  s.fast_idct = t[1].cast<bool>();
  s.fancy_upsampling = t[2].cast<bool>();
  s.apply_exif = t[3].cast<bool>();
  if (use_slices) *use_slices = t[4].cast<bool>();
  s.dct_scaling = t[5].cast<bool>();
  if (s.max_pixels <= 0) throw py::value_error("max_pixels must be positive");
  return s;
}

OpParams parse_op(const py::tuple& t) {
  if (t.size() != 9) throw py::value_error("op must be (kind, out_h, out_w, scale_lo, scale_hi, ratio_lo, ratio_hi, flip, resize)");
  OpParams op;
  const int kind = t[0].cast<int>();
  if (kind < 0 || kind > 2) throw py::value_error("op kind " + std::to_string(kind) + " is not 0, 1 or 2");
  op.kind = static_cast<OpKind>(kind);
  op.out_h = t[1].cast<int>();
  op.out_w = t[2].cast<int>();
  op.scale_lo = t[3].cast<double>();
  op.scale_hi = t[4].cast<double>();
  op.ratio_lo = t[5].cast<double>();
  op.ratio_hi = t[6].cast<double>();
  op.flip = t[7].cast<double>();
  op.resize = t[8].cast<int>();
  if (op.out_h <= 0 || op.out_w <= 0 || op.out_h > 16384 || op.out_w > 16384)
    throw py::value_error("output size " + std::to_string(op.out_h) + "x" + std::to_string(op.out_w) + " must be in 1..16384");
  if (!(op.scale_lo > 0 && op.scale_lo <= op.scale_hi && op.scale_hi <= 1.0))
    throw py::value_error("scale range must satisfy 0 < low <= high <= 1");
  if (!(op.ratio_lo > 0 && op.ratio_lo <= op.ratio_hi)) throw py::value_error("ratio range must satisfy 0 < low <= high");
  if (op.resize < 0) throw py::value_error("resize must be >= 0");
  return op;
}

py::dict decode_batch_py(const py::sequence& images, const py::buffer& out, int layout, const py::tuple& op_t,
                         uint64_t seed, uint64_t epoch, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& indices,
                         int threads, const py::tuple& options_t) {
  const OpParams op = parse_op(op_t);
  BatchOptions options;
  options.decode = parse_settings(options_t, &options.use_restart_slices);
  if (layout != 0 && layout != 1) throw py::value_error("layout must be 0 (NHWC) or 1 (NCHW)");
  if (threads < 1) throw py::value_error("threads=" + std::to_string(threads) + " must be >= 1");
  const size_t n = static_cast<size_t>(py::len(images));

  const WritableView out_view(out, PyBUF_FORMAT);
  const Py_buffer& outv = *out_view;
  const std::string fmt = outv.format ? outv.format : "B";
  if (outv.itemsize != 1 || (fmt != "B" && fmt != "=B" && fmt != "<B" && fmt != "|B" && fmt != "c"))
    throw py::value_error("out must hold uint8 (format " + fmt + ")");
  if (outv.ndim != 4) throw py::value_error("out must be 4-D, got " + std::to_string(outv.ndim) + "-D");
  const Py_ssize_t* sh = outv.shape;
  const bool ok_shape = layout == 0 ? (sh[1] == op.out_h && sh[2] == op.out_w && sh[3] == 3)
                                    : (sh[1] == 3 && sh[2] == op.out_h && sh[3] == op.out_w);
  if (!ok_shape || static_cast<size_t>(sh[0]) != n)
    throw py::value_error("out shape [" + std::to_string(sh[0]) + ", " + std::to_string(sh[1]) + ", " + std::to_string(sh[2]) +
                          ", " + std::to_string(sh[3]) + "] does not match " + std::to_string(n) + " images of " +
                          std::to_string(op.out_h) + "x" + std::to_string(op.out_w) + (layout == 0 ? " NHWC" : " NCHW"));
  if (indices.ndim() != 1 || static_cast<size_t>(indices.shape(0)) != n)
    throw py::value_error("indices must be 1-D with one entry per image");

  BufferViews views;
  const std::vector<ImageRef> refs = views.add_all(images, n);

  py::array_t<int32_t> status(static_cast<py::ssize_t>(n));
  py::array_t<double> boxes({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(4)});
  py::array_t<bool> flips(static_cast<py::ssize_t>(n));
  BatchResults results;
  results.status = status.mutable_data();
  results.boxes = boxes.mutable_data();
  results.flips = reinterpret_cast<uint8_t*>(flips.mutable_data());
  const int64_t* idx = indices.data();
  uint8_t* dst = static_cast<uint8_t*>(outv.buf);
  {
    py::gil_scoped_release release;
    decode_batch(refs, dst, layout == 0 ? Layout::kNHWC : Layout::kNCHW, op, seed, epoch, idx, threads, options, &results);
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
  r["warnings"] = results.warnings;
  r["sliced"] = results.sliced;
  r["slice_fallbacks"] = results.slice_fallbacks;
  return r;
}

py::tuple decode_image_py(const py::object& buf, const py::tuple& options_t) {
  const DecodeSettings settings = parse_settings(options_t, nullptr);
  BufferViews views;
  const ImageRef ref = views.add(buf.ptr(), 0);
  JpegInfo info;
  std::string msg;
  // The header parse takes microseconds: it runs with the GIL held. Releasing the GIL twice per
  // image made Python threads calling decode_image queue for it twice (each re-acquire can wait a
  // whole switch interval behind the other thread), so 2 threads ran slower than 1.
  Status st = open_single(ref.data, ref.size, settings, &info, &msg);
  if (st != Status::kOk) return py::make_tuple(static_cast<int>(st), msg, py::none());
  py::array_t<uint8_t> arr({static_cast<py::ssize_t>(info.height), static_cast<py::ssize_t>(info.width), static_cast<py::ssize_t>(3)});
  uint8_t* dst = arr.mutable_data();
  {
    py::gil_scoped_release release;
    st = decode_single(dst, &msg);
  }
  if (st != Status::kOk) return py::make_tuple(static_cast<int>(st), msg, py::none());
  return py::make_tuple(0, std::string(), arr);
}

// `fastload pack --resize`: one GIL-free call decodes, resizes and re-encodes a batch of files.
py::list resize_encode_batch_py(const py::sequence& images, int shorter, int quality, int threads,
                                const py::tuple& options_t) {
  BatchOptions options;
  options.decode = parse_settings(options_t, &options.use_restart_slices);
  if (shorter < 1) throw py::value_error("shorter=" + std::to_string(shorter) + " must be >= 1");
  if (quality < 1 || quality > 100) throw py::value_error("quality=" + std::to_string(quality) + " must be in 1..100");
  if (threads < 1) throw py::value_error("threads=" + std::to_string(threads) + " must be >= 1");
  const size_t n = static_cast<size_t>(py::len(images));
  BufferViews views;
  const std::vector<ImageRef> refs = views.add_all(images, n);
  std::vector<EncodedImage> results;
  {
    py::gil_scoped_release release;
    resize_encode_batch(refs, shorter, quality, threads, options, &results);
  }
  py::list out;
  for (const EncodedImage& r : results) {
    if (r.status == Status::kOk) {
      out.append(py::make_tuple(0, std::string(), py::bytes(reinterpret_cast<const char*>(r.jpeg.data()), r.jpeg.size())));
    } else {
      out.append(py::make_tuple(static_cast<int>(r.status), std::string(status_name(r.status)) + ": " + r.message, py::none()));
    }
  }
  return out;
}

// Pass-through `fastload pack`: one GIL-free call reads, checks and frames a batch of files into
// the caller's buffer (the pack reuses its buffers: fresh multi-megabyte allocations page-fault).
py::tuple frame_files_py(const py::sequence& paths, const py::sequence& sizes, const py::sequence& heads,
                         const py::buffer& out) {
  const size_t n = static_cast<size_t>(py::len(paths));
  if (static_cast<size_t>(py::len(sizes)) != n || static_cast<size_t>(py::len(heads)) != n)
    throw py::value_error("paths, sizes and heads must have one entry per file");
  BufferViews views;
  const std::vector<ImageRef> head_refs = views.add_all(heads, n);
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
  const WritableView outv(out, 0);
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

}  // namespace

// ==== restart index (issue 7) ============================================================
// Owned by the restart-index work: csrc/restart_index.{h,cpp} hold the logic; this section is the
// Python glue only. Every call takes a buffer (bytes, memoryview of an mmap, numpy uint8), releases
// the GIL for the libjpeg work and turns failures into ValueError with libjpeg's message.
#include "entropy_decode.h"
#include "restart_index.h"

namespace restart_index_glue {

// A read-only C-contiguous view of a Python buffer, released on scope exit.
class ReadBuffer {
 public:
  explicit ReadBuffer(const py::object& obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
  }
  ~ReadBuffer() { PyBuffer_Release(&view_); }
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

py::dict geometry_dict(const fastload::RestartGeometry& g) {
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

py::tuple add_restart_markers(const py::object& buf, int max_mcus, bool verify) {
  ReadBuffer in(buf);
  std::vector<uint8_t> out;
  fastload::RestartGeometry geo;
  fastload::TranscodeNotes notes;
  std::string err;
  bool ok, same = true;
  {
    py::gil_scoped_release nogil;
    ok = fastload::add_restart_markers(in.data(), in.size(), max_mcus, &out, &geo, &err, &notes);
    if (ok && verify) same = fastload::verify_identical(in.data(), in.size(), out.data(), out.size(), &err);
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

py::object restart_geometry(const py::object& buf) {
  ReadBuffer in(buf);
  fastload::RestartGeometry geo;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::parse_restart_geometry(in.data(), in.size(), &geo, nullptr);
  }
  if (!ok || geo.restart_interval == 0) return py::none();
  return geometry_dict(geo);
}

py::tuple restart_slice(const py::object& buf, int x, int y, int w, int h, int scale_denom) {
  ReadBuffer in(buf);
  fastload::RestartSlice slice;
  std::string why;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = fastload::build_restart_slice(in.data(), in.size(), x, y, w, h, &slice, &why, scale_denom);
  }
  if (!ok) throw py::value_error("cannot slice by restart intervals: " + why);
  return py::make_tuple(py::bytes(reinterpret_cast<const char*>(slice.jpeg.data()), slice.jpeg.size()),
                        slice.x0, slice.y0);
}

py::bool_ restart_verify(const py::object& a, const py::object& b) {
  ReadBuffer ia(a), ib(b);
  std::string why;
  bool same;
  {
    py::gil_scoped_release nogil;
    same = fastload::verify_identical(ia.data(), ia.size(), ib.data(), ib.size(), &why);
  }
  return py::bool_(same);
}

void register_functions(py::module_& m) {
  m.def("add_restart_markers", &add_restart_markers, py::arg("buf"), py::arg("max_mcus") = 4,
        py::arg("verify") = false,
        "Losslessly add restart markers every N MCUs (N = largest divisor of the MCU row width <= "
        "max_mcus); returns (jpeg_bytes, geometry dict). verify=True decodes both and requires "
        "bit-identical pixels. Raises ValueError with libjpeg's message.");
  m.def("restart_geometry", &restart_geometry, py::arg("buf"),
        "The restart geometry (frame, MCU grid, DRI) a baseline JPEG's headers claim, or None.");
  m.def("restart_slice", &restart_slice, py::arg("buf"), py::arg("x"), py::arg("y"), py::arg("w"),
        py::arg("h"), py::arg("scale_denom") = 1,
        "A small JPEG made of the restart intervals covering the crop: (jpeg_bytes, x0, y0) in "
        "full-size pixels; crop (x - x0, y - y0, w, h) from its decode. With scale_denom d the slice "
        "is meant to be decoded at 1/d: scaled pixels [x/d, ceil((x+w)/d)) then match a 1/d decode "
        "of the whole image, at offset x0/d. Raises ValueError when the markers do not match the "
        "geometry the headers claim.");
  m.def("restart_verify", &restart_verify, py::arg("a"), py::arg("b"),
        "Whether two JPEGs decode to bit-identical pixels (libjpeg defaults).");
  m.def("_restart_force_scalar_scan", &fastload::restart_force_scalar_scan, py::arg("scalar"),
        "Testing hook: the slicer's portable interval scan instead of the AVX-512 one.");
  m.def("_slice_entropy", [](const std::string& name) {
    if (name != "fastload" && name != "libjpeg") throw py::value_error("slice entropy decoder must be 'fastload' or 'libjpeg'");
    if (name == "fastload" && !fastload::interval_entropy_available()) return false;
    fastload::set_interval_entropy_enabled(name == "fastload");
    return true;
  }, py::arg("name"),
        "Which Huffman decoder restart-interval slices use: 'fastload' (the interval decoder, default "
        "where built) or 'libjpeg' (slices keep their RST markers). False if 'fastload' is not built.");
}

}  // namespace restart_index_glue
// ==== end restart index ==================================================================

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
py::tuple warp_decode_py(const py::object& buf, const py::object& plan_obj, const py::tuple& options_t) {
  const WarpPlan plan = plan_from(plan_obj);
  const DecodeSettings settings = parse_settings(options_t, nullptr);
  BufferViews views;
  const ImageRef ref = views.add(buf.ptr(), 0);
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
  m.def("decode_batch", &decode_batch_py, py::arg("images"), py::arg("out"), py::arg("layout"), py::arg("op"),
        py::arg("seed"), py::arg("epoch"), py::arg("indices"), py::arg("threads"), py::arg("options"),
        "Decode a batch into out (GIL released once); returns a dict of per-image results.");
  m.def("resize_encode_batch", &resize_encode_batch_py, py::arg("images"), py::arg("shorter"), py::arg("quality"),
        py::arg("threads"), py::arg("options"),
        "Decode, resize (shorter side to `shorter`, im2rec's arithmetic) and re-encode at `quality` each "
        "image, in one GIL-free call; returns [(status, message, jpeg_bytes or None)].");
  m.def("frame_files", &frame_files_py, py::arg("paths"), py::arg("sizes"), py::arg("heads"), py::arg("out"),
        "Read, check and frame a batch of files as RecordIO records (payload = head + file bytes) into out "
        "in one GIL-free call; out needs 1 + sum(8 + round_up_4(len(head) + size)) bytes. Returns "
        "(framed_sizes, used): records back to back from out[0], framed_sizes[i] > 0 for a framed record, "
        "< 0 for a file left to the Python path.");
  m.def("decode_image", &decode_image_py, py::arg("buf"), py::arg("options"),
        "Full-size RGB decode: (status, message, array or None).");
  m.def("set_threads", [](int threads) {
    if (threads < 1) throw py::value_error("threads must be >= 1");
    py::gil_scoped_release release;
    set_pool_threads(threads);
  }, py::arg("threads"), "Resize the persistent pool to threads - 1 workers (the caller is the other).");
  m.def("get_threads", [] { return pool_threads(); });
  m.def("info", [] {
    py::dict d;
    d["libjpeg_turbo"] = FASTLOAD_JPEG_TURBO_VERSION;
    d["simd"] = resize_kernel_name();
    d["slice_entropy"] = interval_entropy_enabled() ? "fastload" : "libjpeg";
    d["slice_entropy_available"] = interval_entropy_available();
    d["threads"] = pool_threads();
    py::dict names;
    for (int s = 0; s <= static_cast<int>(Status::kInternal); ++s) names[py::int_(s)] = status_name(static_cast<Status>(s));
    d["status_names"] = names;
    return d;
  });
  m.def("_resize_force_kernels", &resize_force_kernels, py::arg("name"),
        "Testing hook: resample with the 'scalar', 'ssse3', 'avx2' or 'best' kernels; False if unavailable.");

  // ---- restart-index (issue 7) bindings: owned by the restart-index helper, below this line ----
  restart_index_glue::register_functions(m);
  // ---- end of restart-index bindings ----

  // ---- warp geometries (RandomAffine, MXNetDefaultAugment): engine-warp's bindings ----
  warp_glue::register_functions(m);
}
