// Glue of the streamed pack's input side (`fastload pack` from tars and parquet): the pass-through
// framing of a batch of images already in memory (pack/buffer_framing.h) and the walk of a tar
// chunk's headers (pack/tar_walk.h), one GIL-free call each.
#include "glue/glue.h"
#include "pack/buffer_framing.h"
#include "pack/tar_walk.h"

namespace fastload {
namespace glue {
namespace {

// Streamed pass-through pack: one GIL-free call checks and frames a batch of in-memory images (views
// of a tar chunk, of an Arrow column: nothing is copied before this call) into the caller's buffer,
// the images copied there or left where they are (gather).
py::tuple frame_buffers_py(const py::sequence& images, const py::sequence& heads, int64_t max_pixels, bool gather,
                           const py::buffer& out) {
  const size_t n = static_cast<size_t>(py::len(images));
  if (static_cast<size_t>(py::len(heads)) != n) throw py::value_error("images and heads must have one entry per image");
  if (max_pixels < 1) throw py::value_error("max_pixels must be positive");
  BufferViews views;
  const std::vector<ImageRef> image_refs = views.add_all(images, n, "images");
  const std::vector<ImageRef> head_refs = views.add_all(heads, n, "heads");
  std::vector<BufferFrameJob> jobs(n);
  for (size_t i = 0; i < n; ++i) {
    jobs[i].data = image_refs[i].data;
    jobs[i].size = image_refs[i].size;
    jobs[i].head = head_refs[i].data;
    jobs[i].head_len = head_refs[i].size;
  }
  const BufferView outv(out.ptr(), PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS, "out");
  const size_t capacity = static_cast<size_t>(outv->len);
  const size_t needed = frame_buffers_capacity(jobs, gather);
  if (capacity < needed)
    throw py::value_error("out holds " + std::to_string(capacity) + " bytes, the batch needs " +
                          std::to_string(needed));
  py::array_t<int64_t> framed(static_cast<py::ssize_t>(n));
  int64_t* fs = framed.mutable_data();
  uint8_t* dst = static_cast<uint8_t*>(outv->buf);
  size_t used = 0;
  {
    py::gil_scoped_release release;
    used = frame_buffers(jobs, max_pixels, gather, dst, capacity, fs);
  }
  return py::make_tuple(framed, used);
}

// Tar reading: the whole members of a chunk from `pos` on, as (names, [start, data, size, kind] rows,
// where the walk stopped). Names are decoded as the Python reader decodes them (UTF-8,
// surrogateescape).
py::tuple walk_tar_py(const py::buffer& buf, int64_t pos, int64_t max_members) {
  const BufferView in(buf.ptr(), kReadFlags, "buf");
  const ImageRef ref = in.ref();
  if (pos < 0 || static_cast<uint64_t>(pos) > ref.size)
    throw py::value_error("pos=" + std::to_string(pos) + " is outside the buffer of " + std::to_string(ref.size) +
                          " bytes");
  if (max_members < 0) throw py::value_error("max_members must be >= 0");
  std::vector<TarWalkEntry> entries;
  size_t stop = 0;
  {
    py::gil_scoped_release release;
    stop = walk_tar(ref.data, ref.size, static_cast<size_t>(pos), static_cast<size_t>(max_members), &entries);
  }
  py::list names(entries.size());
  py::array_t<int64_t> fields({static_cast<py::ssize_t>(entries.size()), static_cast<py::ssize_t>(4)});
  auto f = fields.mutable_unchecked<2>();
  for (size_t i = 0; i < entries.size(); ++i) {
    const TarWalkEntry& e = entries[i];
    PyObject* name = PyUnicode_DecodeUTF8(e.name.data(), static_cast<Py_ssize_t>(e.name.size()), "surrogateescape");
    if (name == nullptr) throw py::error_already_set();
    names[i] = py::reinterpret_steal<py::object>(name);
    const auto row = static_cast<py::ssize_t>(i);
    f(row, 0) = static_cast<int64_t>(e.start);
    f(row, 1) = static_cast<int64_t>(e.data);
    f(row, 2) = static_cast<int64_t>(e.size);
    f(row, 3) = static_cast<int64_t>(static_cast<uint8_t>(e.kind));
  }
  return py::make_tuple(names, fields, static_cast<int64_t>(stop));
}

}  // namespace

void register_ingest(py::module_& m) {
  m.def("frame_buffers", &frame_buffers_py, FASTLOAD_ABI_ARGS_frame_buffers, abi_doc::frame_buffers);
  m.def("walk_tar", &walk_tar_py, FASTLOAD_ABI_ARGS_walk_tar, abi_doc::walk_tar);
}

}  // namespace glue
}  // namespace fastload
