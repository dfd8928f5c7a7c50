"""Device stage (MXNet): ``NDArrayIter``'s inputs, one named array each, dense or CSR, in memory or streamed.

A source gathers a batch's rows: dense arrays with numpy takes, CSR inputs from ``indptr`` /
``indices`` / ``data`` without densifying. CSR inputs are checked before anything else sees them
(``check_csr``; MXNet's ``csr_matrix`` and its operators crash or compute garbage on malformed ones);
a streamed CSR input's column indices are checked batch by batch, as they are read.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import mxnet as mx
import numpy as np
from numpy.typing import NDArray

from fastload.batch import Batch
from fastload.mxnet.placement import wrap_view

if TYPE_CHECKING:
    from fastload.records.arrays import CSRArray, DenseArray, ShardedVector

__all__ = ["CSRSource", "DenseSource", "check_csr", "csr_take_rows", "init_sources", "stored_source", "to_source"]

try:  # scipy is optional for MXNet users; only needed when they pass scipy matrices.
    import scipy.sparse as _sp
except ImportError:  # pragma: no cover - scipy is in the project's environment
    _sp = None


def csr_take_rows(
    indptr: NDArray[np.int64],
    indices: NDArray[np.int64] | ShardedVector,
    data: NDArray[Any] | ShardedVector,
    rows: NDArray[np.int64],
    out: tuple[NDArray[Any], NDArray[np.int64], NDArray[np.int64]] | None = None,
) -> tuple[NDArray[Any], NDArray[np.int64], NDArray[np.int64]]:
    """Gather rows of a CSR matrix without densifying.

    Args:
        indptr: Row pointer array (length ``num_rows + 1``).
        indices: Column indices (a numpy array or a ``ShardedVector`` of memory-mapped shards).
        data: Values (same kinds).
        rows: int64 row numbers to take, in output order (repeats allowed).
        out: ``(data, indices, indptr)`` buffers to write into (long enough); None: new arrays.

    Returns:
        ``(data, indices, indptr)`` of the gathered rows (views of ``out`` when given); ``indptr``
        starts at 0.
    """
    starts = np.asarray(indptr[rows], dtype=np.int64)
    counts = np.asarray(indptr[rows + 1], dtype=np.int64) - starts
    new_indptr = np.empty(len(rows) + 1, dtype=np.int64) if out is None else out[2][: len(rows) + 1]
    new_indptr[0] = 0
    np.cumsum(counts, out=new_indptr[1:])
    total = int(new_indptr[-1])
    # Position of every output nonzero in the source arrays: its row's source start plus its rank
    # within the row.
    pos = np.arange(total, dtype=np.int64)
    pos += np.repeat(starts - new_indptr[:-1], counts)
    if out is None:
        return np.asarray(data[pos]), np.asarray(indices[pos], dtype=np.int64), new_indptr
    out_data, out_indices = out[0][:total], out[1][:total]
    for src, dst in ((data, out_data), (indices, out_indices)):
        if src.dtype != dst.dtype:
            np.copyto(dst, np.asarray(src[pos]), casting="unsafe")
        elif isinstance(src, np.ndarray):
            np.take(src, pos, out=dst)
        else:  # fastload.records.arrays.ShardedVector: memory-mapped shards
            src.take_into(pos, dst)
    return out_data, out_indices, new_indptr


def _check_indices(name: str, indptr: NDArray[Any], indices: NDArray[Any], cols: int, first_row: int = 0) -> None:
    """Column indices in range and strictly increasing within each row (``indptr`` local, from 0)."""
    if not len(indices):
        return
    idx = np.asarray(indices)
    bad = np.flatnonzero((idx < 0) | (idx >= cols))
    if bad.size:
        pos = int(bad[0])
        row = int(np.searchsorted(indptr, pos, side="right")) - 1 + first_row
        raise ValueError(
            f"input {name!r}: CSR column index {int(idx[pos])} (stored value {pos}, row {row}) is outside [0, {cols})"
        )
    step = np.diff(idx)
    inside = np.ones(len(step), dtype=bool)
    boundaries = np.asarray(indptr[1:-1], dtype=np.int64)
    boundaries = boundaries[(boundaries > 0) & (boundaries < len(idx))]
    inside[boundaries - 1] = False  # the first index of a row may be anything
    bad = np.flatnonzero(inside & (step <= 0))
    if bad.size:
        pos = int(bad[0]) + 1
        row = int(np.searchsorted(indptr, pos, side="right")) - 1 + first_row
        raise ValueError(
            f"input {name!r}: CSR column indices of row {row} are not strictly increasing "
            f"({int(idx[pos - 1])} then {int(idx[pos])}): sort them and merge duplicates"
        )


def check_csr(
    name: str, indptr: NDArray[Any], indices: NDArray[Any] | None, data_len: int, shape: tuple[int, ...]
) -> None:
    """Refuse a malformed CSR matrix with a clear ``ValueError`` (see the module docstring).

    Args:
        name: The input's name (for messages).
        indptr: Row pointers.
        indices: Column indices, or None to check the structure only (streamed inputs).
        data_len: Number of stored values.
        shape: ``(rows, columns)``.
    """
    if len(shape) != 2 or min(shape) < 0:
        raise ValueError(f"input {name!r}: CSR shape {tuple(shape)} must be (rows, columns) with rows, columns >= 0")
    rows, cols = int(shape[0]), int(shape[1])
    indptr = np.asarray(indptr)
    if indptr.ndim != 1 or len(indptr) != rows + 1:
        raise ValueError(f"input {name!r}: CSR indptr has {indptr.shape} entries, expected {rows + 1} (rows + 1)")
    if not np.issubdtype(indptr.dtype, np.integer):
        raise ValueError(f"input {name!r}: CSR indptr has dtype {indptr.dtype}, expected integers")
    if int(indptr[0]) != 0:
        raise ValueError(f"input {name!r}: CSR indptr starts at {int(indptr[0])}, expected 0")
    dec = np.flatnonzero(np.diff(indptr) < 0)
    if dec.size:
        r = int(dec[0])
        raise ValueError(
            f"input {name!r}: CSR indptr decreases at row {r} ({int(indptr[r])} then {int(indptr[r + 1])})"
        )
    if int(indptr[-1]) != data_len:
        raise ValueError(f"input {name!r}: CSR indptr ends at {int(indptr[-1])} but {data_len} values are stored")
    if indices is not None:
        if len(indices) != data_len:
            raise ValueError(f"input {name!r}: CSR has {len(indices)} column indices for {data_len} values")
        if len(indices) and not np.issubdtype(np.asarray(indices[:1]).dtype, np.integer):
            raise ValueError(f"input {name!r}: CSR column indices must be integers")
        _check_indices(name, indptr, indices, cols)


# --- sources: one named input array, dense or CSR, in memory or streamed ------------------------


class DenseSource:
    stype = "default"

    def __init__(self, name: str, array: NDArray[Any] | DenseArray) -> None:
        self.name, self.array = name, array
        self.shape, self.dtype = tuple(array.shape), np.dtype(array.dtype)

    def fields(self, key: str, batch_size: int) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
        return {key: ((batch_size, *self.shape[1:]), self.dtype)}

    def fill(self, key: str, arrays: dict[str, NDArray[Any]], rows: NDArray[np.int64]) -> dict[str, int]:
        out = arrays[key]
        if isinstance(self.array, np.ndarray):
            np.take(self.array, rows, axis=0, out=out)
        else:  # fastload.records.arrays.DenseArray: memory-mapped row shards
            self.array.take_into(rows, out)
        return {}

    def output(self, key: str, batch: Batch) -> mx.nd.NDArray:
        return wrap_view(batch.fields[key])

    def gather(self, rows: NDArray[np.int64]) -> mx.nd.NDArray:
        out = np.empty((len(rows), *self.shape[1:]), dtype=self.dtype)
        if isinstance(self.array, np.ndarray):
            np.take(self.array, rows, axis=0, out=out)
        else:
            self.array.take_into(rows, out)
        return mx.nd.array(out, dtype=self.dtype)


class CSRSource:
    stype = "csr"

    def __init__(
        self,
        name: str,
        indptr: NDArray[np.int64],
        indices: NDArray[np.int64] | ShardedVector,
        data: NDArray[Any] | ShardedVector,
        shape: tuple[int, ...],
        *,
        streamed: bool = False,
    ) -> None:
        self.name = name
        self.indptr, self.indices, self.data = indptr, indices, data
        self.shape, self.dtype = (int(shape[0]), int(shape[1])), np.dtype(data.dtype)
        self.streamed = streamed
        if streamed:
            check_csr(name, indptr, None, len(data), self.shape)
        else:
            assert isinstance(indices, np.ndarray)  # in-memory inputs are numpy arrays (to_source)
            check_csr(name, indptr, indices, len(data), self.shape)
        self._row_nnz = np.diff(np.asarray(indptr, dtype=np.int64))

    def nnz_bound(self, batch_size: int) -> int:
        """Most stored values one batch can hold.

        That is when its rows are the largest ones, each present at most ``ceil(batch_size / rows) + 1``
        times (padding wraps around; ``roll_over`` carries rows that the next epoch's order may repeat).
        """
        rows = max(1, len(self._row_nnz))
        times = math.ceil(batch_size / rows) + 1
        largest = np.sort(self._row_nnz)[::-1][:batch_size]
        return max(1, int(np.repeat(largest, times)[:batch_size].sum()))

    def fields(self, key: str, batch_size: int) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
        bound = self.nnz_bound(batch_size)
        return {
            f"{key}.data": ((bound,), self.dtype),
            f"{key}.indices": ((bound,), np.dtype(np.int64)),
            f"{key}.indptr": ((batch_size + 1,), np.dtype(np.int64)),
        }

    def fill(self, key: str, arrays: dict[str, NDArray[Any]], rows: NDArray[np.int64]) -> dict[str, int]:
        out = (arrays[f"{key}.data"], arrays[f"{key}.indices"], arrays[f"{key}.indptr"])
        data, indices, indptr = csr_take_rows(self.indptr, self.indices, self.data, rows, out=out)
        if self.streamed:
            _check_indices(self.name, indptr, indices, self.shape[1])
        return {f"{key}.data": len(data), f"{key}.indices": len(indices)}

    def output(self, key: str, batch: Batch) -> mx.nd.sparse.CSRNDArray:
        # csr_matrix copies the three arrays synchronously into MXNet memory.
        return mx.nd.sparse.csr_matrix(
            (batch.fields[f"{key}.data"], batch.fields[f"{key}.indices"], batch.fields[f"{key}.indptr"]),
            shape=(len(batch.fields[f"{key}.indptr"]) - 1, self.shape[1]),
            ctx=mx.cpu_pinned(),
            dtype=self.dtype,
        )

    def gather(self, rows: NDArray[np.int64]) -> mx.nd.sparse.CSRNDArray:
        data, indices, indptr = csr_take_rows(self.indptr, self.indices, self.data, rows)
        return mx.nd.sparse.csr_matrix((data, indices, indptr), shape=(len(rows), self.shape[1]), dtype=self.dtype)


def to_source(name: str, value: Any) -> DenseSource | CSRSource:
    if isinstance(value, mx.nd.sparse.CSRNDArray):
        return CSRSource(name, value.indptr.asnumpy(), value.indices.asnumpy(), value.data.asnumpy(), value.shape)
    if _sp is not None and _sp.issparse(value):
        if value.format != "csr":
            raise ValueError(
                f"input {name!r}: scipy sparse format {value.format!r} is not supported; convert it with .tocsr()"
            )
        # Structure first: scipy's own canonicalization must not run on out-of-range indices.
        check_csr(name, value.indptr, None, len(value.data), value.shape)
        _check_range_only(name, value.indices, value.shape[1], value.indptr)
        value = value.copy()
        value.sum_duplicates()  # sorted indices, duplicates summed: MXNet's CSR format
        return CSRSource(name, value.indptr.astype(np.int64), value.indices.astype(np.int64), value.data, value.shape)
    if isinstance(value, mx.nd.NDArray):
        if value.stype != "default":
            raise ValueError(f"input {name!r}: storage type {value.stype!r} is not supported (dense or csr)")
        return DenseSource(name, value.asnumpy())
    if isinstance(value, np.ndarray):
        # mx.nd.array(numpy) is float32 whatever the numpy dtype; the drop-in does the same.
        return DenseSource(name, np.ascontiguousarray(value, dtype=np.float32))
    try:
        arr = np.asarray(value)
    except Exception:
        arr = None
    if arr is None or arr.dtype == object:
        raise TypeError(
            f"input {name!r}: invalid type {type(value).__name__}; expected numpy.ndarray, "
            "mx.nd.NDArray, CSRNDArray, scipy.sparse CSR, or a list or dict of them"
        )
    # mx.nd.array turns Python lists into float32; do the same.
    return DenseSource(name, np.ascontiguousarray(arr, dtype=np.float32))


def _check_range_only(name: str, indices: NDArray[Any], cols: int, indptr: NDArray[Any]) -> None:
    idx = np.asarray(indices)
    bad = np.flatnonzero((idx < 0) | (idx >= cols))
    if bad.size:
        pos = int(bad[0])
        row = int(np.searchsorted(indptr, pos, side="right")) - 1
        raise ValueError(
            f"input {name!r}: CSR column index {int(idx[pos])} (stored value {pos}, row {row}) is outside [0, {cols})"
        )


def stored_source(arr: DenseArray | CSRArray) -> DenseSource | CSRSource:
    if arr.stype == "csr":
        return CSRSource(arr.name, arr.indptr, arr.indices, arr.data, arr.shape, streamed=True)
    return DenseSource(arr.name, arr)


def init_sources(data: Any, allow_empty: bool, default_name: str) -> list[DenseSource | CSRSource]:
    """MXNet's naming: one array -> ``default_name``; a list -> ``_i_<name>``; dict keys sorted."""
    if data is None:
        if not allow_empty:
            raise ValueError("data must not be None")
        return []
    if not isinstance(data, (list, tuple, dict)):
        data = [data]
    if isinstance(data, (list, tuple)):
        if not data and not allow_empty:
            raise ValueError("data must not be an empty list")
        named = {default_name: data[0]} if len(data) == 1 else {f"_{i}_{default_name}": d for i, d in enumerate(data)}
    else:
        named = dict(data)
    return [to_source(k, named[k]) for k in sorted(named)]
