// Glue of array shards' reads: gather_rows, a batch of fixed-size rows read with pread in one
// GIL-free call (arrays/row_gather.h).
#include "arrays/row_gather.h"
#include "glue/glue.h"

namespace fastload {
namespace glue {
namespace {

RowGatherFailure gather_rows_py(const py::array_t<int32_t, py::array::c_style>& fds,
                                const py::array_t<int64_t, py::array::c_style>& offsets, size_t row_bytes,
                                const py::buffer& out) {
  const size_t n = static_cast<size_t>(fds.size());
  if (static_cast<size_t>(offsets.size()) != n) throw py::value_error("fds and offsets must have one entry per row");
  const BufferView outv(out.ptr(), PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS, "out");
  if (row_bytes != 0 && static_cast<size_t>(outv->len) / row_bytes < n)
    throw py::value_error("out holds " + std::to_string(outv->len) + " bytes, " + std::to_string(n) + " rows need " +
                          std::to_string(n * row_bytes));
  py::gil_scoped_release release;
  return gather_rows(fds.data(), offsets.data(), n, row_bytes, static_cast<uint8_t*>(outv->buf));
}

}  // namespace

void register_arrays(py::module_& m) {
  m.def("gather_rows", &gather_rows_py, FASTLOAD_ABI_ARGS_gather_rows, abi_doc::gather_rows);
}

}  // namespace glue
}  // namespace fastload
