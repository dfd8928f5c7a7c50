"""Read stage: array shards written by ``fastload pack-arrays`` (dense ``.npy`` and sparse CSR), memory-mapped.

Folder layout (``ARRAYS_MANIFEST`` is written last, atomically, so its presence means every shard it
lists is complete)::

    OUT/fastload-arrays.json
    OUT/<name>-00000.npy                      dense array: rows [row_starts[0], row_starts[1])
    OUT/<name>-00000.indptr.npy               CSR array: shard-local row pointers (start at 0)
    OUT/<name>-00000.indices.npy              CSR column indices (int64, sorted within each row)
    OUT/<name>-00000.data.npy                 CSR values

Every array is cut at the same row boundaries. Opening maps the files; rows are read only when a
batch gathers them, so the arrays may be far larger than RAM.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastload.errors import CorruptDatasetError, CorruptRecordError, UserError
from fastload.records.containment import contained_path, show_name
from fastload.records.manifest import read_json_manifest

__all__ = [
    "ARRAYS_FORMAT",
    "ARRAYS_MANIFEST",
    "ArrayShards",
    "CSRArray",
    "DenseArray",
    "ShardedVector",
    "open_arrays",
]

ARRAYS_MANIFEST = "fastload-arrays.json"
ARRAYS_FORMAT = "fastload-arrays"
_VERSION = 1


class ShardedVector:
    """Several memory-mapped arrays seen as one concatenation along axis 0 (never materialized).

    Args:
        parts: The pieces, in order; all share dtype and trailing shape.
    """

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
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
        """``out[i] = self[positions[i]]`` reading only the touched pages of the touched shards."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(self.parts) == 1:
            np.take(self.parts[0], positions, axis=0, out=out)
            return out
        which = np.searchsorted(self.starts, positions, side="right") - 1
        for shard in np.unique(which):
            sel = np.nonzero(which == shard)[0]
            out[sel] = self.parts[shard][positions[sel] - self.starts[shard]]
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
    """A CSR matrix stored as row shards; ``indptr`` is global (in RAM), ``indices``/``data`` mapped."""

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
        self.data_names: list[str] = []
        self.label_names: list[str] = []
        for k, entry in enumerate(manifest["arrays"]):
            self._entry = k
            arr = self._open_entry(entry)
            self._arrays[entry["name"]] = arr
            (self.label_names if entry["role"] == "label" else self.data_names).append(entry["name"])

    def _map(self, file: str, rows_expected: int | None = None) -> np.ndarray:
        full = contained_path(self.path, file, source=self._source, field=f"arrays[{self._entry}].files")
        try:
            arr = np.load(full, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise UserError(f"{full}: shard listed in {ARRAYS_MANIFEST} is missing") from None
        except Exception:  # numpy's messages quote the file's header bytes; any failure means damage
            raise CorruptRecordError("unreadable array shard (damaged .npy header or data)", shard=full) from None
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
            ip = self._map(f + ".indptr.npy", int(r) + 1)
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
        """Drop the memory maps (idempotent); arrays handed out earlier keep theirs alive."""
        self._arrays = {}

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
