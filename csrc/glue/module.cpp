// The module fastload._engine: the ABI types, each stage's functions, the persistent thread pool and
// the build facts.
#include "common/thread_pool.h"
#include "decode/entropy_decode.h"
#include "decode/output.h"
#include "decode/resize.h"
#include "glue/glue.h"
#include "pixel/pixel_ops.h"

#ifndef FASTLOAD_JPEG_TURBO_VERSION
#define FASTLOAD_JPEG_TURBO_VERSION "unknown"
#endif

namespace fastload {
namespace glue {
namespace {

void set_threads_py(int threads) {
  check_threads(threads);
  py::gil_scoped_release release;
  set_pool_threads(threads);
}

py::dict info_py() {
  py::dict d;
  d["libjpeg_turbo"] = FASTLOAD_JPEG_TURBO_VERSION;
  d["simd"] = resize_kernel_name();
  d["output_simd"] = output_kernel_name();
  d["pixel_simd"] = pixel_ops_kernel_name();
  d["slice_entropy_available"] = interval_entropy_available();
  d["threads"] = pool_threads();
#if defined(__SANITIZE_ADDRESS__)
  d["sanitized"] = true;  // FASTLOAD_SANITIZE=1 build (ASan + UBSan)
#else
  d["sanitized"] = false;
#endif
  return d;
}

void pool_hold_creation_lock_py(int milliseconds) {
  if (milliseconds < 0 || milliseconds > 60000) throw py::value_error("milliseconds must be in 0..60000");
  py::gil_scoped_release release;
  hold_pool_creation_lock_for_testing(milliseconds);
}

}  // namespace
}  // namespace glue
}  // namespace fastload

PYBIND11_MODULE(_engine, m) {
  using namespace fastload;
  using namespace fastload::glue;
  m.doc() = "fastload's native engine: libjpeg-turbo region decode fused with the pipeline's augmentations";
  register_abi(m);
  register_decode(m);
  register_pixel(m);
  register_pack(m);
  register_arrays(m);
  register_ingest(m);
  m.def("set_threads", &set_threads_py, FASTLOAD_ABI_ARGS_set_threads, abi_doc::set_threads);
  m.def("get_threads", &pool_threads, abi_doc::get_threads);
  m.def("info", &info_py, abi_doc::info);
  m.def("_pool_hold_creation_lock", &pool_hold_creation_lock_py, FASTLOAD_ABI_ARGS__pool_hold_creation_lock,
        abi_doc::_pool_hold_creation_lock);
}
