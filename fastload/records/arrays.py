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

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastload.errors import CorruptRecordError, UserError
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
        self.num_rows = int(manifest["num_rows"])
        self._row_starts = np.asarray(manifest["row_starts"], dtype=np.int64)
        self._arrays: dict[str, DenseArray | CSRArray] = {}
        self.data_names: list[str] = []
        self.label_names: list[str] = []
        for entry in manifest["arrays"]:
            arr = self._open_entry(entry)
            self._arrays[entry["name"]] = arr
            (self.label_names if entry["role"] == "label" else self.data_names).append(entry["name"])

    def _map(self, file: str, rows_expected: int | None = None) -> np.ndarray:
        full = os.path.join(self.path, file)
        try:
            arr = np.load(full, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise UserError(f"{full}: shard listed in {ARRAYS_MANIFEST} is missing") from None
        except ValueError as exc:
            raise CorruptRecordError(f"unreadable array shard ({exc})", shard=full) from None
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


def open_arrays(path: str) -> ArrayShards:
    """Open a folder written by ``fastload pack-arrays``."""
    if not os.path.isdir(path):
        raise UserError(f"{path}: not a folder (expected the output of fastload pack-arrays)")
    return ArrayShards(path)
