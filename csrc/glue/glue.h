// Python glue of the native engine (fastload._engine), shared by the stage glue files: buffers held
// for a call, argument checks, and the registration function of each stage.
//
// The glue is the only code that includes pybind11; the work lives in plain C++ in the stage folders.
// Everything that crosses the boundary is typed: the enums and parameter structs are generated from
// fastload/engine_abi.py (fastload_abi.h), and so is every function's py::arg list and docstring
// (FASTLOAD_ABI_ARGS_<name>, abi_doc::<name>); the stub fastload/_engine.pyi is generated from the
// same tables and checked against the built module by mypy's stubtest. No Python object is read by
// attribute name and no dict is parsed here.
//
//   glue/abi.cpp     the enums and structs (py::native_enum, py::class_ with __repr__ and __eq__)
//   glue/module.cpp  the module, the thread pool, build facts
//   glue/decode.cpp  decode_batch, decode_image, the decode stage's testing hooks
//   glue/pixel.cpp   pixel ops, erasing, MixUp / CutMix, the warp geometries' testing hooks
//   glue/pack.cpp    `fastload pack` (resize-encode, framing) and the restart index
//   glue/arrays.cpp  array shards' row gather
//   glue/ingest.cpp  the streamed pack's input side (in-memory framing, the tar header walk)
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "decode/batch_decode.h"  // ImageRef
#include "fastload_abi.h"

namespace fastload {
namespace glue {

namespace py = pybind11;

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
                            (writable ? "writable " : "") + "C-contiguous buffer (bytes, memoryview, numpy array)");
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

// Index arrays of the batch calls: one int64 per image, converted when the caller's are not.
using Indices = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

inline void check_threads(int threads) {
  if (threads < 1) throw py::value_error("threads=" + std::to_string(threads) + " must be >= 1");
}

inline void check_settings(const DecodeSettings& s) {
  if (s.max_pixels <= 0) throw py::value_error("max_pixels must be positive");
}

// The stages' bindings (one per glue file).
void register_abi(py::module_& m);
void register_decode(py::module_& m);
void register_pixel(py::module_& m);
void register_pack(py::module_& m);
void register_arrays(py::module_& m);
void register_ingest(py::module_& m);

// Checks shared by the decode and pixel glue (glue/pixel.cpp): the specs of the pixel ops, the
// output-stage ops, a batch's mix and the warp geometries, as they reach the engine.
void check_pixel_ops(const PixelOpsSpec& ops);
void check_mix(const MixParams& mix, int h, int w);
void check_affine(const AffineSpec& spec);
void check_mxnet(const MXNetAugmentSpec& spec);

}  // namespace glue
}  // namespace fastload
