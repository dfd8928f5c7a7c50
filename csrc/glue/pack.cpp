// Glue of `fastload pack` and the restart index: the resize-encode and the pass-through framing of a
// batch of files (one GIL-free call each), the pack-time restart-marker transcode
// (pack/restart_transcode.h) and the decode-time slicing (decode/restart_slice.h). Every call takes
// buffers (bytes, memoryview of an mmap, numpy uint8), releases the GIL for the libjpeg work and
// turns failures into ValueError with libjpeg's message.
#include "decode/batch_decode.h"
#include "decode/restart_slice.h"
#include "glue/glue.h"
#include "pack/record_framing.h"
#include "pack/restart_transcode.h"

namespace fastload {
namespace glue {
namespace {

py::bytes as_bytes(const std::vector<uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

// `fastload pack --resize`: one GIL-free call decodes, resizes and re-encodes a batch of files.
py::list resize_encode_batch_py(const py::sequence& images, int shorter, int quality, int threads,
                                const DecodeSettings& options) {
  check_settings(options);
  if (shorter < 1) throw py::value_error("shorter=" + std::to_string(shorter) + " must be >= 1");
  if (quality < 1 || quality > 100) throw py::value_error("quality=" + std::to_string(quality) + " must be in 1..100");
  check_threads(threads);
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
      out.append(py::make_tuple(r.status, std::string(), as_bytes(r.jpeg)));
    } else {
      out.append(py::make_tuple(r.status, std::string(status_name(r.status)) + ": " + r.message, py::none()));
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
    throw py::value_error("out holds " + std::to_string(capacity) + " bytes, the batch needs " +
                          std::to_string(needed));
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

py::tuple add_restart_markers_py(const py::object& buf, const TranscodeOptions& options) {
  const BufferView in(buf.ptr(), kReadFlags, "buf");
  const ImageRef ref = in.ref();
  std::vector<uint8_t> out;
  RestartGeometry geo;
  TranscodeNotes notes;
  std::string err;
  bool ok, same = true;
  {
    py::gil_scoped_release nogil;
    ok = add_restart_markers(ref.data, ref.size, options.max_mcus, &out, &geo, &err, &notes);
    if (ok && options.verify) same = verify_identical(ref.data, ref.size, out.data(), out.size(), &err);
  }
  if (!ok) throw py::value_error("cannot add restart markers: " + err);
  if (!same) throw py::value_error("transcoded image does not decode identically to the original: " + err);
  return py::make_tuple(as_bytes(out), geo, notes);
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
  return py::cast(geo);
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
  return py::make_tuple(as_bytes(slice.jpeg), slice.x0, slice.y0);
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

void register_pack(py::module_& m) {
  m.def("resize_encode_batch", &resize_encode_batch_py, FASTLOAD_ABI_ARGS_resize_encode_batch,
        abi_doc::resize_encode_batch);
  m.def("frame_files", &frame_files_py, FASTLOAD_ABI_ARGS_frame_files, abi_doc::frame_files);
  m.def("add_restart_markers", &add_restart_markers_py, FASTLOAD_ABI_ARGS_add_restart_markers,
        abi_doc::add_restart_markers);
  m.def("restart_geometry", &restart_geometry_py, FASTLOAD_ABI_ARGS_restart_geometry, abi_doc::restart_geometry);
  m.def("restart_slice", &restart_slice_py, FASTLOAD_ABI_ARGS_restart_slice, abi_doc::restart_slice);
  m.def("restart_verify", &restart_verify_py, FASTLOAD_ABI_ARGS_restart_verify, abi_doc::restart_verify);
  m.def("_restart_force_scalar_scan", &restart_force_scalar_scan, FASTLOAD_ABI_ARGS__restart_force_scalar_scan,
        abi_doc::_restart_force_scalar_scan);
}

}  // namespace glue
}  // namespace fastload
