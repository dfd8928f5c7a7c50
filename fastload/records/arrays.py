"""Read stage: array shards written by ``fastload pack-arrays`` (dense ``.npy`` and sparse CSR), read with ``pread``.

Folder layout (``ARRAYS_MANIFEST`` is written last, atomically, so its presence means every shard it
lists is complete)::

    OUT/fastload-arrays.json
    OUT/<name>-00000.npy                      dense array: rows [row_starts[0], row_starts[1])
    OUT/<name>-00000.indptr.npy               CSR array: shard-local row pointers (start at 0)
    OUT/<name>-00000.indices.npy              CSR column indices (int64, sorted within each row)
    OUT/<name>-00000.data.npy                 CSR values

Every array is cut at the same row boundaries. Opening reads each ``.npy`` header (and the small CSR
row pointers); rows are read only when a batch gathers them, so the arrays may be far larger than RAM.
Rows are read with ``pread`` straight into the caller's buffer, never through a memory map: a shard
truncated under a running job then gives a short read, reported as a :class:`CorruptRecordError`
naming the shard, where a mapped read would kill the process with SIGBUS. A run of consecutive rows
is one ``pread``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastload.engine import native
from fastload.errors import CorruptDatasetError, CorruptRecordError, UserError
from fastload.records.containment import contained_path, show_name
from fastload.records.manifest import read_json_manifest

__all__ = [
    "ARRAYS_FORMAT",
    "ARRAYS_MANIFEST",
    "ArrayShards",
    "CSRArray",
    "DenseArray",
    "NpyShard",
    "ShardedVector",
    "open_arrays",
]

ARRAYS_MANIFEST = "fastload-arrays.json"
ARRAYS_FORMAT = "fastload-arrays"
_VERSION = 1


class NpyShard:
    """One ``.npy`` file read by ``pread`` (C order): ``shape``, ``dtype``, ``len()``, ``take_into``.

    Args:
        path: The file.
        show: How error messages name the file.

    Raises:
        CorruptRecordError: The header is damaged, the array is in Fortran order or holds objects,
            or the file is shorter than its header says.
    """

    def __init__(self, path: str, show: str) -> None:
        self.path, self._show, self._fd = path, show, -1
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            with os.fdopen(os.dup(self._fd), "rb") as f:
                # numpy's own header parser (untyped in numpy 1.23), for the two versions np.save writes.
                version = np.lib.format.read_magic(f)  # type: ignore[no-untyped-call]
                read_header: Any = {
                    (1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0,
                }[version]
                shape, fortran, dtype = read_header(f)
                self._offset = f.tell()
            size = os.fstat(self._fd).st_size
        except Exception:  # numpy's messages quote the file's header bytes; any failure means damage
            self.close()
            raise CorruptRecordError("unreadable array shard (damaged .npy header)", shard=show) from None
        if fortran or dtype.hasobject or not shape:
            self.close()
            raise CorruptRecordError("array shard is not a C-order numeric array with rows", shard=show)
        self.shape, self.dtype = tuple(int(n) for n in shape), dtype
        self._row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * dtype.itemsize
        if size < self._offset + self.shape[0] * self._row_bytes:
            self.close()
            raise CorruptRecordError(
                f"array shard is {size} bytes, its header needs {self._offset + self.shape[0] * self._row_bytes}",
                shard=show,
            )

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def row_bytes(self) -> int:
        """Bytes per row."""
        return self._row_bytes

    @property
    def data_offset(self) -> int:
        """Where row 0 starts in the file."""
        return self._offset

    def fileno(self) -> int:
        """The open file descriptor.

        Raises:
            ValueError: The shard was closed.
        """
        if self._fd < 0:
            raise ValueError(f"{self._show}: array shard is closed")
        return self._fd

    def short_read(self, row: int, error: int) -> None:
        """Raise the error for row ``row`` that could not be read in full (``error``: errno, 0 at end of file).

        Raises:
            CorruptRecordError: Always.
        """
        why = os.strerror(error) if error else "the file changed or was truncated after it was opened"
        raise CorruptRecordError(f"short read of row {row} ({why})", shard=self._show)

    def read_rows(self, start: int, out: np.ndarray) -> None:
        """Rows ``[start, start + len(out))`` into the C-contiguous ``out`` (one ``pread``)."""
        want = len(out) * self._row_bytes
        if want == 0:
            return
        view = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # numpy 1.23 lacks Buffer
        got = 0
        while got < want:  # pread may return less than asked on some filesystems: go on until EOF
            n = os.preadv(self.fileno(), [view[got:]], self._offset + start * self._row_bytes + got)
            if n <= 0:
                self.short_read(start + got // self._row_bytes, 0)
            got += n

    def take_into(self, positions: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out[i] = self[positions[i]]``, one ``pread`` per run of consecutive positions."""
        _gather_runs([self], np.zeros(len(positions), dtype=np.int64), np.asarray(positions, dtype=np.int64), out)
        return out

    def read_all(self) -> np.ndarray:
        """The whole array, in RAM."""
        out = np.empty(self.shape, dtype=self.dtype)
        self.read_rows(0, out)
        return out

    def close(self) -> None:
        """Close the file (idempotent)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


def _engine_gather() -> Any | None:
    """The engine's ``gather_rows`` (one GIL-free call per batch) when the C++ extension is loaded."""
    engine = native()
    return None if engine is None else engine.gather_rows


_GATHER = _engine_gather()


def _gather_runs(parts: Sequence[NpyShard], which: np.ndarray, local: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = parts[which[i]][local[i]]``, one ``pread`` per run of consecutive rows of one part.

    The engine does the reads in one GIL-free call, one syscall per run in C++ instead of a Python
    call per run (128 random rows of 784 float32: ~90 us against ~240 us from Python, ~40 us through
    a memory map, which is what safety against SIGBUS costs); without the extension the same runs are
    read from Python.
    """
    if not len(local):
        return
    if not out.flags.c_contiguous:
        tmp = np.empty_like(out, order="C")
        _gather_runs(parts, which, local, tmp)
        out[...] = tmp
        return
    row_bytes = parts[0].row_bytes
    if _GATHER is not None:
        fds = np.array([p.fileno() for p in parts], dtype=np.int32)[which]
        bases = np.array([p.data_offset for p in parts], dtype=np.int64)[which]
        failure = _GATHER(fds, bases + local * row_bytes, row_bytes, out.reshape(-1).view(np.uint8))
        if failure.row >= 0:
            parts[int(which[failure.row])].short_read(int(local[failure.row]), failure.error)
        return
    breaks = np.flatnonzero((np.diff(local) != 1) | (np.diff(which) != 0)) + 1
    starts = np.concatenate(([0], breaks)).tolist()
    ends = np.concatenate((breaks, [len(local)])).tolist()
    for a, b in zip(starts, ends, strict=True):
        parts[int(which[a])].read_rows(int(local[a]), out[a:b])


class ShardedVector:
    """Several ``.npy`` shards seen as one concatenation along axis 0 (never materialized).

    Args:
        parts: The pieces, in order; all share dtype and trailing shape.
    """

    def __init__(self, parts: Sequence[NpyShard]) -> None:
        if not parts:
            raise ValueError("ShardedVector needs at least one part")
        self.parts = list(parts)
        lengths = np.array([len(p) for p in self.parts], dtype=np.int64)
        self.starts = np.concatenate(([0], np.cumsum(lengths)))
        self.shape = (int(self.starts[-1]), *tuple(self.parts[0].shape[1:]))
        self.dtype = self.parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def take_into(self, positions: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out[i] = self[positions[i]]`` reading only the touched rows of the touched shards."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) and (positions.min() < 0 or positions.max() >= self.shape[0]):
            raise IndexError(f"row positions outside [0, {self.shape[0]})")
        which = np.searchsorted(self.starts, positions, side="right") - 1
        _gather_runs(self.parts, which, positions - self.starts[which], out)
        return out

    def __getitem__(self, positions: Any) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        out = np.empty(positions.shape + self.shape[1:], dtype=self.dtype)
        return self.take_into(positions.reshape(-1), out.reshape((-1, *self.shape[1:]))).reshape(out.shape)


class DenseArray:
    """A dense array stored as row shards: ``shape``, ``dtype``, ``take_into(rows, out)``."""

    stype = "default"

    def __init__(self, name: str, vector: ShardedVector) -> None:
        self.name, self.vector = name, vector
        self.shape, self.dtype = vector.shape, vector.dtype

    def take_into(self, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        return self.vector.take_into(rows, out)


class CSRArray:
    """A CSR matrix stored as row shards; ``indptr`` is global (in RAM), ``indices``/``data`` read on demand."""

    stype = "csr"

    def __init__(
        self, name: str, indptr: np.ndarray, indices: ShardedVector, data: ShardedVector, shape: tuple[int, ...]
    ) -> None:
        self.name, self.indptr, self.indices, self.data = name, indptr, indices, data
        self.shape, self.dtype = (int(shape[0]), int(shape[1])), data.dtype


class ArrayShards:
    """An opened ``fastload pack-arrays`` folder.

    Attributes:
        path: The folder.
        manifest: The parsed manifest.
        num_rows: Rows in every array.
        data_names: Names of the arrays stored as data.
        label_names: Names of the arrays stored as labels.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        mpath = os.path.join(path, ARRAYS_MANIFEST)
        manifest = read_json_manifest(path, ARRAYS_MANIFEST, what="a fastload pack-arrays folder", max_version=_VERSION)
        if manifest.get("format") != ARRAYS_FORMAT:
            raise UserError(f"{mpath}: not a {ARRAYS_FORMAT} manifest")
        self.manifest = manifest
        self._source = mpath
        _check_arrays_manifest(manifest, mpath)
        self.num_rows = int(manifest["num_rows"])
        self._row_starts = np.asarray(manifest["row_starts"], dtype=np.int64)
        self._arrays: dict[str, DenseArray | CSRArray] = {}
        self._opened: list[NpyShard] = []
        self.data_names: list[str] = []
        self.label_names: list[str] = []
        for k, entry in enumerate(manifest["arrays"]):
            self._entry = k
            arr = self._open_entry(entry)
            self._arrays[entry["name"]] = arr
            (self.label_names if entry["role"] == "label" else self.data_names).append(entry["name"])

    def _map(self, file: str, rows_expected: int | None = None) -> NpyShard:
        full = contained_path(self.path, file, source=self._source, field=f"arrays[{self._entry}].files")
        try:
            arr = NpyShard(full, full)
        except FileNotFoundError:
            raise UserError(f"{full}: shard listed in {ARRAYS_MANIFEST} is missing") from None
        except OSError as e:
            raise CorruptRecordError(f"cannot open array shard ({e.strerror})", shard=full) from None
        self._opened.append(arr)
        if rows_expected is not None and len(arr) != rows_expected:
            raise CorruptRecordError(f"holds {len(arr)} rows, manifest says {rows_expected}", shard=full)
        return arr

    def _open_entry(self, entry: dict[str, Any]) -> DenseArray | CSRArray:
        name, shape = entry["name"], tuple(entry["shape"])
        rows = np.diff(self._row_starts)
        if entry["stype"] == "default":
            parts = [self._map(f, int(r)) for f, r in zip(entry["files"], rows, strict=True)]
            return DenseArray(name, ShardedVector(parts))
        if entry["stype"] != "csr":
            raise UserError(f"{self.path}: array {name!r} has unknown storage type {entry['stype']!r}")
        indptrs, indices, data = [], [], []
        for f, r in zip(entry["files"], rows, strict=True):
            ip = self._map(f + ".indptr.npy", int(r) + 1).read_all()
            ind, dat = self._map(f + ".indices.npy"), self._map(f + ".data.npy")
            if int(ip[-1]) != len(ind) or len(ind) != len(dat):
                raise CorruptRecordError(
                    f"CSR shard indptr ends at {int(ip[-1])} but holds {len(ind)} indices and {len(dat)} values",
                    shard=os.path.join(self.path, f),
                )
            indptrs.append(ip)
            indices.append(ind)
            data.append(dat)
        # One global int64 row pointer (8 bytes per row) so row gathers need no shard lookups.
        offsets = np.concatenate(([0], np.cumsum([len(d) for d in data])))
        indptr = np.concatenate(
            [np.asarray(ip[:-1], dtype=np.int64) + off for ip, off in zip(indptrs, offsets[:-1], strict=True)]
            + [np.array([offsets[-1]], dtype=np.int64)]
        )
        return CSRArray(name, indptr, ShardedVector(indices), ShardedVector(data), shape)

    def array(self, name: str) -> DenseArray | CSRArray:
        """The stored array ``name``."""
        try:
            return self._arrays[name]
        except KeyError:
            raise KeyError(f"{self.path}: no array {name!r} (has {sorted(self._arrays)})") from None

    def close(self) -> None:
        """Close the shard files (idempotent); arrays handed out earlier can no longer be read."""
        self._arrays = {}
        for shard in self._opened:
            shard.close()
        self._opened = []

    def __enter__(self) -> ArrayShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_arrays_manifest(manifest: dict[str, Any], path: str) -> None:
    """The fields a reader uses: types and row boundaries (paths are checked where they are opened)."""

    def bad(field: str, what: str) -> CorruptDatasetError:
        return CorruptDatasetError(what, file=path, field=field)

    rows = manifest.get("num_rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or not 0 < rows < 1 << 48:
        raise bad("num_rows", f"must be a positive integer, not {show_name(rows)}")
    starts = manifest.get("row_starts")
    if (
        not isinstance(starts, list)
        or len(starts) < 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in starts)
        or starts[0] != 0
        or starts[-1] != rows
        or any(b <= a for a, b in itertools.pairwise(starts))
    ):
        raise bad("row_starts", f"must be increasing integers from 0 to num_rows ({rows})")
    arrays = manifest.get("arrays")
    if not isinstance(arrays, list) or not arrays:
        raise bad("arrays", "must be a non-empty list")
    for k, entry in enumerate(arrays):
        if not isinstance(entry, dict):
            raise bad(f"arrays[{k}]", "must be an object")
        if not isinstance(entry.get("name"), str) or entry.get("role") not in ("data", "label"):
            raise bad(f"arrays[{k}]", "needs a string name and a role of 'data' or 'label'")
        shape = entry.get("shape")
        if not isinstance(shape, list) or not shape or not all(isinstance(x, int) and x >= 0 for x in shape):
            raise bad(f"arrays[{k}].shape", f"must be a list of non-negative integers, not {show_name(shape)}")
        files = entry.get("files")
        if not isinstance(files, list) or len(files) != len(starts) - 1:
            raise bad(f"arrays[{k}].files", f"must list one file per shard ({len(starts) - 1})")


def open_arrays(path: str) -> ArrayShards:
    """Open a folder written by ``fastload pack-arrays``."""
    if not os.path.isdir(path):
        raise UserError(f"{path}: not a folder (expected the output of fastload pack-arrays)")
    return ArrayShards(path)
