"""Device stage (MXNet): ``NDArrayIter``, a drop-in for ``mx.io.NDArrayIter`` that assembles batches ahead.

Batches are gathered on a producer thread (``fastload.prefetch``) straight into a ring of
``mx.cpu_pinned()`` buffers; CSR inputs stay sparse end to end (rows are gathered from
``indptr``/``indices``/``data`` with numpy, never densified). Inputs may be numpy arrays,
``mx.nd.NDArray``, ``CSRNDArray``, ``scipy.sparse`` CSR matrices, lists or dicts of them, or the
path of a folder written by ``fastload pack-arrays`` (streamed from memory-mapped shards).

Semantics follow ``mx.io.NDArrayIter`` batch for batch (names, sorted dict keys, ``pad`` /
``discard`` / ``roll_over``, the ``pad`` field) when ``num_parts == 1``; the one deliberate
difference is where the shuffle comes from: ``fastload.order`` with ``seed`` (drawn from numpy's
global generator when not given, as MXNet draws its shuffles) and the epoch, so a run resumes
exactly through :meth:`NDArrayIter.state_dict`. MXNet refuses CSR inputs unless
``last_batch_handle='discard'``; here every mode works for CSR.

Batch lifetime: the ``DataBatch`` returned by ``next()`` and the one before it stay valid; older
batches' buffers are rewritten by the producer (after ``wait_to_write``, so device copies that MXNet's
engine has queued on them finish first). Not run on a GPU here: see ``fastload.mxnet.placement``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

import mxnet as mx

from fastload import order as order_mod
from fastload.mxnet.distributed import resolve_parts
from fastload.mxnet.placement import normalize_contexts, place, pinned_empty, split_slices, wait_to_write
from fastload.prefetch import Producer

__all__ = ["NDArrayIter", "LAST_BATCH_HANDLES", "csr_take_rows", "plan_epoch"]

LAST_BATCH_HANDLES = ("pad", "discard", "roll_over")
# Ring slots beyond the prefetch depth: the batch being consumed, the one before it (Module.fit reads
# the previous batch's labels after taking the next one) and the one the producer writes.
_EXTRA_SLOTS = 3

try:  # scipy is optional for MXNet users; only needed when they pass scipy matrices.
    import scipy.sparse as _sp
except ImportError:  # pragma: no cover - scipy is in the project's environment
    _sp = None


def csr_take_rows(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
                  rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gather rows of a CSR matrix without densifying.

    Args:
        indptr: Row pointer array (length ``num_rows + 1``); may be a memory map.
        indices: Column indices.
        data: Values.
        rows: int64 row numbers to take, in output order (repeats allowed).

    Returns:
        ``(data, indices, indptr)`` of the gathered rows; ``indptr`` starts at 0.
    """
    starts = np.asarray(indptr[rows], dtype=np.int64)
    counts = np.asarray(indptr[rows + 1], dtype=np.int64) - starts
    new_indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=new_indptr[1:])
    total = int(new_indptr[-1])
    # Position of every output nonzero in the source arrays: its row's source start plus its rank
    # within the row.
    pos = np.arange(total, dtype=np.int64)
    pos += np.repeat(starts - new_indptr[:-1], counts)
    return np.asarray(data[pos]), np.asarray(indices[pos], dtype=np.int64), new_indptr


# --- sources: one named input array, dense or CSR, in memory or streamed ------------------------


class _DenseSource:
    stype = "default"

    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array
        self.shape, self.dtype = tuple(array.shape), np.dtype(array.dtype)

    def make_slot(self, batch_size: int):
        view, nd = pinned_empty((batch_size,) + self.shape[1:], self.dtype)
        return (view, nd)

    def fill(self, slot, rows: np.ndarray) -> "mx.nd.NDArray":
        view, nd = slot
        wait_to_write(nd)  # queued device copies of this slot's previous batch must finish first
        if isinstance(self.array, np.ndarray):
            np.take(self.array, rows, axis=0, out=view)
        else:  # fastload.records.arrays.DenseArray: memory-mapped row shards
            self.array.take_into(rows, view)
        return nd


class _CSRSource:
    stype = "csr"

    def __init__(self, name: str, indptr, indices, data, shape: Tuple[int, int]) -> None:
        self.name = name
        self.indptr, self.indices, self.data = indptr, indices, data
        self.shape, self.dtype = (int(shape[0]), int(shape[1])), np.dtype(data.dtype)

    def make_slot(self, batch_size: int):
        return None  # CSR batches have data-dependent sizes: each is a fresh pinned CSRNDArray

    def fill(self, slot, rows: np.ndarray) -> "mx.nd.sparse.CSRNDArray":
        data, indices, indptr = csr_take_rows(self.indptr, self.indices, self.data, rows)
        return mx.nd.sparse.csr_matrix((data, indices, indptr), shape=(len(rows), self.shape[1]),
                                       ctx=mx.cpu_pinned(), dtype=self.dtype)


def _to_source(name: str, value) -> Union[_DenseSource, _CSRSource]:
    if isinstance(value, mx.nd.sparse.CSRNDArray):
        return _CSRSource(name, value.indptr.asnumpy(), value.indices.asnumpy(), value.data.asnumpy(), value.shape)
    if _sp is not None and _sp.issparse(value):
        if value.format != "csr":
            raise ValueError(f"input {name!r}: scipy sparse format {value.format!r} is not supported; "
                             "convert it with .tocsr()")
        value = value.copy()
        value.sort_indices()
        return _CSRSource(name, value.indptr.astype(np.int64), value.indices.astype(np.int64), value.data, value.shape)
    if isinstance(value, mx.nd.NDArray):
        if value.stype != "default":
            raise ValueError(f"input {name!r}: storage type {value.stype!r} is not supported (dense or csr)")
        return _DenseSource(name, value.asnumpy())
    if isinstance(value, np.ndarray):
        # mx.nd.array(numpy) is float32 whatever the numpy dtype; the drop-in does the same.
        return _DenseSource(name, np.ascontiguousarray(value, dtype=np.float32))
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - report the type, as MXNet does
        arr = None
    if arr is None or arr.dtype == object:
        raise TypeError(f"input {name!r}: invalid type {type(value).__name__}; expected numpy.ndarray, "
                        "mx.nd.NDArray, CSRNDArray, scipy.sparse CSR, or a list or dict of them")
    # mx.nd.array turns Python lists into float32; do the same.
    return _DenseSource(name, np.ascontiguousarray(arr, dtype=np.float32))


def _stored_source(arr) -> Union[_DenseSource, _CSRSource]:
    if arr.stype == "csr":
        return _CSRSource(arr.name, arr.indptr, arr.indices, arr.data, arr.shape)
    return _DenseSource(arr.name, arr)


def _init_sources(data, allow_empty: bool, default_name: str) -> List[Union[_DenseSource, _CSRSource]]:
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
    return [_to_source(k, named[k]) for k in sorted(named)]


# --- the batch plan: which rows go in each batch, and its pad value --------------------------------


def plan_epoch(share: np.ndarray, batch_size: int, last_batch_handle: str,
               carry: Optional[np.ndarray]) -> Tuple[List[Tuple[np.ndarray, int]], Optional[np.ndarray]]:
    """Cut one epoch's rows into batches the way ``mx.io.NDArrayIter`` does.

    Args:
        share: This part's rows for the epoch, in order.
        batch_size: Rows per batch.
        last_batch_handle: ``pad``, ``discard`` or ``roll_over``.
        carry: Rows left over by the previous epoch (``roll_over`` only).

    Returns:
        ``([(rows, pad), ...], new_carry)``: every batch has exactly ``batch_size`` rows.
    """
    n = len(share)
    batches: List[Tuple[np.ndarray, int]] = []
    if last_batch_handle == "roll_over":
        head = 0
        if carry is not None and len(carry):
            take = batch_size - len(carry)
            if take > n:
                return [], np.concatenate([carry, share])
            # MXNet reports the number of rows carried from the previous epoch as the pad.
            batches.append((np.concatenate([carry, share[:take]]), len(carry)))
            head = take
        full = (n - head) // batch_size
        for b in range(full):
            s = head + b * batch_size
            batches.append((share[s:s + batch_size], 0))
        rest = share[head + full * batch_size:]
        return batches, (rest.copy() if len(rest) else None)
    full = n // batch_size
    for b in range(full):
        batches.append((share[b * batch_size:(b + 1) * batch_size], 0))
    if last_batch_handle == "pad" and n % batch_size:
        start = full * batch_size
        # Wrap around to the start of the epoch's order (repeating it when batch_size > n).
        rows = share[(start + np.arange(batch_size)) % n]
        batches.append((rows, batch_size - (n - start)))
    return batches, None


class NDArrayIter(mx.io.DataIter):
    """Drop-in ``mx.io.NDArrayIter`` that builds batches in pinned memory on a background thread.

    Args:
        data: Input array(s): numpy, ``mx.nd.NDArray``, ``CSRNDArray``, scipy CSR, a list or dict
            of them, or the path of a ``fastload pack-arrays`` folder (its arrays become data and,
            when stored as labels, labels).
        label: Label array(s), same forms (``None``: no labels).
        batch_size: Rows per batch.
        shuffle: Shuffle rows every epoch (every ``reset()``).
        last_batch_handle: ``'pad'``, ``'discard'`` or ``'roll_over'``, as MXNet.
        data_name: Name of a single data input.
        label_name: Name of a single label input.
        layout: Data layout; the batch axis must be first (``'N...'``), as in every MXNet model zoo
            iterator.
        seed: Shuffle seed (default: drawn from ``np.random``, like MXNet's own shuffle).
        part_index: This worker's part when the rows are split over ``num_parts`` workers.
        num_parts: Number of parts; every part yields the same number of batches.
        kvstore: A ``dist_*`` kvstore (object or name): sets part_index/num_parts from its rank and
            number of workers.
        rank: This worker's rank (with ``num_workers``), instead of a kvstore.
        num_workers: Number of workers.
        prefetch: Batches assembled ahead of the consumer.
        ctx: ``None`` (batches on ``cpu_pinned``) or a list of contexts: each batch array becomes a
            list of per-context copies (sliced with ``work_load_list`` like Module does).
        work_load_list: Relative shares of the contexts in ``ctx``.
        block_shuffle: For streamed shards: shuffle blocks of rows (sequential reads) instead of a
            global permutation. Default: on for paths, off for in-memory arrays.
    """

    def __init__(self, data, label=None, batch_size: int = 1, shuffle: bool = False,
                 last_batch_handle: str = "pad", data_name: str = "data",
                 label_name: str = "softmax_label", layout: str = "NCHW", *,
                 seed: Optional[int] = None, part_index: int = 0, num_parts: int = 1, kvstore=None,
                 rank: Optional[int] = None, num_workers: Optional[int] = None,
                 prefetch: int = 2, ctx=None, work_load_list: Optional[Sequence[float]] = None,
                 block_shuffle: Optional[bool] = None) -> None:
        super().__init__(batch_size)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive int")
        if last_batch_handle not in LAST_BATCH_HANDLES:
            raise ValueError(f"last_batch_handle={last_batch_handle!r} must be one of {LAST_BATCH_HANDLES}")
        if not isinstance(layout, str) or not layout.startswith("N"):
            raise ValueError(f"layout={layout!r}: fastload.mxnet.NDArrayIter needs the batch axis first")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch={prefetch!r} must be an int >= 1")
        self.part_index, self.num_parts = resolve_parts(part_index=part_index, num_parts=num_parts,
                                                        kvstore=kvstore, rank=rank, num_workers=num_workers)
        self._shards = None
        streamed = isinstance(data, (str, os.PathLike))
        if streamed:
            if label is not None:
                raise ValueError("label must be None when data is a pack-arrays folder (labels are stored in it)")
            from fastload.records.arrays import open_arrays

            self._shards = open_arrays(os.fspath(data))
            self._data = [_stored_source(self._shards.array(n)) for n in sorted(self._shards.data_names)]
            self._label = [_stored_source(self._shards.array(n)) for n in sorted(self._shards.label_names)]
        else:
            self._data = _init_sources(data, False, data_name)
            self._label = _init_sources(label, True, label_name)
        sizes = {s.name: s.shape[0] for s in self._data + self._label}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"all inputs must have the same number of rows, got {sizes}")
        self.num_data = next(iter(sizes.values()))
        if seed is None:
            seed = int(np.random.randint(0, 2**31 - 1))
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.last_batch_handle = last_batch_handle
        self.layout = layout
        self.seed = int(seed)
        self._prefetch = prefetch
        self._ctxs = normalize_contexts(ctx)
        if self._ctxs is not None:
            self._slices = split_slices(self.batch_size, len(self._ctxs), work_load_list)
        elif work_load_list is not None:
            raise ValueError("work_load_list needs ctx=[...]")
        if block_shuffle is None:
            block_shuffle = streamed
        mode = order_mod.Shuffle.NONE if not shuffle else (order_mod.Shuffle.BLOCK if block_shuffle else order_mod.Shuffle.GLOBAL)
        self._spec = order_mod.OrderSpec(num_records=self.num_data, batch_size=self.batch_size, shuffle=mode,
                                         seed=self.seed, rank=self.part_index, world_size=self.num_parts,
                                         even=order_mod.Even.PAD)
        self._sources = self._data + self._label
        self._ring = None
        self._ring_pos = 0  # ring slot of the first batch of the running producer
        self._run_start = 0  # self._taken when that producer started
        self._producer: Optional[Producer] = None
        self._epoch = 0
        self._carry: Optional[np.ndarray] = None
        self._taken = 0  # batches handed out this epoch
        self._exhausted = False  # next() reported the end of this epoch
        self._plan: List[Tuple[np.ndarray, int]] = []
        self._next_carry: Optional[np.ndarray] = None
        self._make_plan()

    # -- MXNet DataIter interface -----------------------------------------------------------------

    @property
    def provide_data(self) -> List[mx.io.DataDesc]:
        return [mx.io.DataDesc(s.name, (self.batch_size,) + s.shape[1:], s.dtype, layout=self.layout)
                for s in self._data]

    @property
    def provide_label(self) -> List[mx.io.DataDesc]:
        return [mx.io.DataDesc(s.name, (self.batch_size,) + s.shape[1:], s.dtype, layout=self.layout)
                for s in self._label]

    def reset(self) -> None:
        """Start the next epoch (reshuffled when ``shuffle``); ``roll_over`` carries leftover rows."""
        self._stop_producer()
        self._epoch += 1
        # MXNet carries the leftover rows only when next() ran into them (the epoch was read to its end).
        self._carry = self._next_carry if (self._exhausted and self.last_batch_handle == "roll_over") else None
        self._taken = 0
        self._exhausted = False
        self._make_plan()

    def hard_reset(self) -> None:
        """Start the next epoch and drop any rolled-over rows."""
        self._next_carry = None
        self.reset()

    def next(self) -> mx.io.DataBatch:
        if self._taken >= len(self._plan):
            self._exhausted = True
            raise StopIteration
        if self._producer is None:
            self._start_producer()
        item = self._producer.get()
        data, label, rows, pad = item
        self._taken += 1
        if self._ctxs is not None:
            data = [place(a, self._ctxs, self._slices) for a in data]
            label = [place(a, self._ctxs, self._slices) for a in label]
        return mx.io.DataBatch(data=data, label=label, pad=pad, index=rows,
                               provide_data=self.provide_data, provide_label=self.provide_label)

    def iter_next(self) -> bool:
        return self._taken < len(self._plan)

    def __len__(self) -> int:
        """Batches in the current epoch."""
        return len(self._plan)

    # -- resume -----------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The position to resume from: seed, epoch, batches taken and any rolled-over rows."""
        return {"seed": self.seed, "epoch": self._epoch, "batch": self._taken, "exhausted": self._exhausted,
                "carry": None if self._carry is None else self._carry.tolist(),
                "num_data": self.num_data, "batch_size": self.batch_size, "part_index": self.part_index,
                "num_parts": self.num_parts, "last_batch_handle": self.last_batch_handle,
                "shuffle": self.shuffle}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next batch is the one that would have come next."""
        for key in ("num_data", "batch_size", "part_index", "num_parts", "last_batch_handle", "shuffle"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"state_dict was saved with {key}={state.get(key)!r}, "
                                 f"this iterator has {key}={getattr(self, key)!r}")
        self._stop_producer()
        self.seed = int(state["seed"])
        self._spec = dataclasses.replace(self._spec, seed=self.seed)
        self._epoch = int(state["epoch"])
        self._carry = None if state["carry"] is None else np.asarray(state["carry"], dtype=np.int64)
        self._make_plan()
        self._taken = min(int(state["batch"]), len(self._plan))
        self._exhausted = bool(state.get("exhausted", False))

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the producer thread and release the shards (idempotent)."""
        self._stop_producer()
        if self._shards is not None:
            self._shards.close()
            self._shards = None

    def __enter__(self) -> "NDArrayIter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._stop_producer()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- internals --------------------------------------------------------------------------------

    def _make_plan(self) -> None:
        share = order_mod.EpochOrder(self._spec, self._epoch).share
        self._plan, self._next_carry = plan_epoch(share, self.batch_size, self.last_batch_handle, self._carry)

    def _start_producer(self) -> None:
        if self._ring is None:
            n = self._prefetch + _EXTRA_SLOTS
            self._ring = [[s.make_slot(self.batch_size) for s in self._sources] for _ in range(n)]
        plan = self._plan[self._taken:]
        ring = self._ring
        start = self._ring_pos
        self._run_start = self._taken
        sources = self._sources
        n_data = len(self._data)

        def produce(stop: threading.Event) -> Iterator[tuple]:
            for k, (rows, pad) in enumerate(plan):
                if stop.is_set():
                    return
                slots = ring[(start + k) % len(ring)]
                arrays = [src.fill(slot, rows) for src, slot in zip(sources, slots)]
                yield arrays[:n_data], arrays[n_data:], rows, pad

        self._producer = Producer(produce, maxsize=self._prefetch, name="fastload-ndarrayiter")

    def _stop_producer(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
            # The next producer continues right after the last batch handed out, so the batches
            # the consumer may still hold keep their slots.
            self._ring_pos = (self._ring_pos + self._taken - self._run_start) % len(self._ring)
