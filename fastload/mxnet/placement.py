"""Device stage (MXNet): pinned host batch buffers with zero-copy numpy views, and per-context copies.

What has run where: every path here is exercised on CPU contexts only (``mx.cpu(0)``, ``mx.cpu(1)``
stand in for devices; this machine has no GPU). ``mx.cpu_pinned()`` memory is page-locked by
MXNet's storage manager only when MXNet was built with CUDA; on the CPU wheel it is ordinary host
memory carrying the ``cpu_pinned`` context, and the copy to ``mx.gpu(i)`` has not been run here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.executor_manager import _split_input_slice
from numpy.typing import DTypeLike, NDArray

__all__ = [
    "normalize_contexts",
    "numpy_view",
    "pinned_allocator",
    "pinned_empty",
    "place",
    "split_slices",
    "wait_to_write",
    "wrap_view",
]


def numpy_view(array: mx.nd.NDArray) -> NDArray[Any]:
    """A numpy array sharing memory with a dense, C-contiguous NDArray (no copy).

    Writes through the view bypass MXNet's dependency engine: call :func:`wait_to_write` on ``array``
    first whenever engine operations (for example device copies) may still read ``array``.

    Args:
        array: A dense NDArray on a CPU or ``cpu_pinned`` context.

    Returns:
        A numpy array of the same shape and dtype aliasing ``array``'s storage; it keeps
        ``array`` alive for as long as the view exists.
    """
    if array.stype != "default":
        raise ValueError(f"numpy_view needs a dense NDArray, got storage type {array.stype!r}")
    if array.context.device_type not in ("cpu", "cpu_pinned", "cpu_shared"):
        raise ValueError(f"numpy_view needs host memory, got context {array.context}")
    ptr = ctypes.c_void_p()
    # MXNDArrayGetData waits for nothing and allocates a delayed-allocation array on first use.
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(ptr)))
    dtype = np.dtype(array.dtype)
    nbytes = int(np.prod(array.shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.empty(array.shape, dtype=dtype)
    assert ptr.value is not None  # MXNDArrayGetData allocates a delayed-allocation array
    buf = (ctypes.c_char * nbytes).from_address(ptr.value)
    # numpy 1.23's stubs do not list ctypes arrays among the buffers frombuffer takes.
    view: NDArray[Any] = np.frombuffer(buf, dtype=dtype).reshape(array.shape)  # type: ignore[call-overload]
    # numpy keeps `buf` alive through view.base; `buf` must keep the NDArray alive in turn.
    buf._fastload_owner = array  # type: ignore[attr-defined]
    return view


# numpy dtypes MXNet 1.9.1's DLPack import takes (DLDataType.TYPE_MAP); others are copied.
_ZERO_COPY_DTYPES = frozenset(
    np.dtype(t) for t in ("int32", "int64", "bool", "uint8", "uint32", "uint64", "float16", "float32", "float64")
)


def wrap_view(view: NDArray[Any]) -> mx.nd.NDArray:
    """An NDArray over a batch's numpy view, zero-copy, that keeps the view's lease alive.

    ``mx.nd.from_numpy(array, zero_copy=True)`` (MXNet 1.9.1's DLPack import) holds a reference to
    the numpy array until the NDArray *and every engine operation still reading it* are gone
    (checked in ``tests/test_mxnet_lifetime.py``), so a ring slot behind the view is not refilled
    before then. MXNet labels the result ``cpu(0)`` (its DLPack import knows only CPU and GPU
    memory), whatever the memory is (the ring's slots are ``cpu_pinned``). It also marks the array
    it is given read-only, so it is given a fresh view object and the caller's stays writable.
    Dtypes the import does not take (int8, int16) and non-contiguous views are copied.
    """
    if view.dtype in _ZERO_COPY_DTYPES and view.flags.c_contiguous and view.size:
        return mx.nd.from_numpy(view.view(), zero_copy=True)
    return mx.nd.array(view, dtype=view.dtype, ctx=mx.cpu())


def wait_to_write(array: mx.nd.NDArray) -> None:
    """Block until every pending engine operation on ``array`` (reads included) has finished.

    The C API's ``MXNDArrayWaitToWrite``; the Python NDArray only exposes ``wait_to_read``, which
    does not wait for pending *reads* such as device copies of a buffer about to be rewritten.
    """
    mx.base.check_call(mx.base._LIB.MXNDArrayWaitToWrite(array.handle))


def pinned_empty(shape: Sequence[int], dtype: DTypeLike = "float32") -> tuple[NDArray[Any], mx.nd.NDArray]:
    """Allocate a dense ``mx.cpu_pinned()`` NDArray and return ``(numpy_view, ndarray)``."""
    nd = mx.nd.empty(tuple(int(s) for s in shape), ctx=mx.cpu_pinned(), dtype=np.dtype(dtype))
    return numpy_view(nd), nd


def pinned_allocator(shape: Sequence[int], dtype: DTypeLike) -> tuple[NDArray[Any], mx.nd.NDArray]:
    """The ``allocator(shape, dtype) -> (numpy_view, owner)`` the loader's ring accepts."""
    return pinned_empty(shape, dtype)


def normalize_contexts(ctx: mx.Context | Iterable[mx.Context] | None) -> list[mx.Context] | None:
    """``None`` -> ``None``; one context -> ``[ctx]``; a list -> the list (checked)."""
    if ctx is None:
        return None
    if isinstance(ctx, mx.Context):
        return [ctx]
    ctxs = list(ctx)
    if not ctxs or not all(isinstance(c, mx.Context) for c in ctxs):
        raise ValueError(f"ctx={ctx!r} must be an mx.Context or a non-empty list of them")
    return ctxs


def split_slices(batch_size: int, n_ctx: int, work_load_list: Sequence[float] | None) -> list[slice]:
    """Row ranges per context, computed exactly as ``mx.mod.Module`` splits a batch.

    Args:
        batch_size: Rows in the batch.
        n_ctx: Number of contexts.
        work_load_list: Relative share of each context (``None``: equal shares).
    """
    if work_load_list is None:
        work_load_list = [1] * n_ctx
    if len(work_load_list) != n_ctx:
        raise ValueError(f"work_load_list has {len(work_load_list)} entries for {n_ctx} contexts")
    if any(w <= 0 for w in work_load_list):
        raise ValueError(f"work_load_list={list(work_load_list)!r} entries must be positive")
    try:
        slices: list[slice] = _split_input_slice(batch_size, list(work_load_list))
        return slices
    except ValueError as exc:
        raise ValueError(
            f"cannot split a batch of {batch_size} over {n_ctx} contexts "
            f"with work_load_list={list(work_load_list)}: {exc}"
        ) from None


def place(array: mx.nd.NDArray, ctxs: Sequence[mx.Context], slices: Sequence[slice]) -> list[mx.nd.NDArray]:
    """Copy each context's rows of a host batch straight to that context.

    Every slice is copied from ``array`` (pinned host memory) on its own, never through another
    device. The copies are asynchronous engine operations that read ``array``; whoever rewrites
    ``array`` afterwards must call :func:`wait_to_write` on ``array`` first (the iterators here do).
    """
    out = []
    for ctx, s in zip(ctxs, slices, strict=False):
        part = array if (s.start, s.stop) == (0, array.shape[0]) else array[s.start : s.stop]
        # Always a copy, even to the array's own context: the slot is reused by the ring.
        out.append(part.copyto(ctx))
    return out
