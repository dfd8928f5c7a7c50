"""Device stage (MXNet): ``NDArrayIter``, a drop-in for ``mx.io.NDArrayIter`` that assembles batches ahead.

Batches are gathered on a producer thread (``fastload.prefetch``) into the same lease-tracked ring of
``mx.cpu_pinned()`` slots the image loader uses (``fastload.batch.BatchRing``, one field per dense
input and three per CSR input). CSR inputs stay sparse end to end (rows are gathered from
``indptr``/``indices``/``data`` with numpy, never densified). Inputs may be numpy arrays,
``mx.nd.NDArray``, ``CSRNDArray``, ``scipy.sparse`` CSR matrices, lists or dicts of them, or the
path of a folder written by ``fastload pack-arrays`` (streamed from memory-mapped shards).

Semantics follow ``mx.io.NDArrayIter`` batch for batch (names, sorted dict keys, ``pad`` /
``discard`` / ``roll_over``, the ``pad`` field, the pull API ``iter_next`` / ``getdata`` /
``getlabel`` / ``getpad``, and the attributes ``idx``, ``cursor``, ``num_data``, ``data``, ``label``
with MXNet's meaning) when ``num_parts == 1``. Deliberate differences:

- the shuffle comes from ``fastload.order`` with ``seed`` (drawn from numpy's global generator when
  not given, as MXNet draws its shuffles) and the epoch, so a run resumes exactly
  (:meth:`NDArrayIter.state_dict`);
- MXNet refuses CSR inputs unless ``last_batch_handle='discard'``; here every mode works for CSR,
  equal batch for batch to MXNet's dense batches;
- ``getindex()`` / ``DataBatch.index`` give the batch's row numbers (MXNet: None);
- ``data`` / ``label`` are computed when read (MXNet keeps a shuffled copy of every input).

Input checks: CSR inputs are checked before anything else sees them (MXNet's ``csr_matrix`` and
its operators crash or compute garbage on malformed ones): ``indptr`` has ``rows + 1`` entries,
starts at 0, never decreases and ends at the number of stored values; every column index is in
``[0, columns)`` and the indices of a row strictly increase (scipy matrices are first brought to
canonical form, duplicates summed). A streamed CSR input's ``indptr`` is checked when opened and
its column indices batch by batch, as they are read.

Batch lifetime: dense batch arrays are zero-copy NDArrays over the slot's lease views
(:func:`fastload.mxnet.placement.wrap_view`, context ``cpu(0)``), so a batch stays intact for as
long as it (or an engine operation reading it) is alive: ``[b.data[0] for b in it]`` is safe. CSR
batches are new ``cpu_pinned`` ``CSRNDArray`` s copied from the slot (MXNet cannot wrap numpy
memory as CSR). A consumer that keeps many batches makes the ring grow, then get fresh memory with
one ``KeptBatchesWarning``. Not run on a GPU here: see ``fastload.mxnet.placement``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import mxnet as mx
import numpy as np
from numpy.typing import NDArray

import fastload.order as order_mod
from fastload.batch import HELD_BATCHES, Batch, BatchRing, Slot
from fastload.errors import KeptBatchesWarning, ResumeStateError
from fastload.mxnet.array_sources import CSRSource, DenseSource, init_sources, stored_source
from fastload.mxnet.distributed import resolve_parts
from fastload.mxnet.placement import normalize_contexts, pinned_allocator, place, split_slices
from fastload.mxnet.protocol import BatchIter
from fastload.position import Position, make_state, order_fingerprint, read_state
from fastload.prefetch import Producer

if TYPE_CHECKING:
    pass

__all__ = ["LAST_BATCH_HANDLES", "NDArrayIter", "plan_epoch"]

LAST_BATCH_HANDLES = ("pad", "discard", "roll_over")

_KIND = "fastload.mxnet.NDArrayIter"

# What the producer hands over: the leased batch, its CSR outputs by key, its rows and its pad.
_Filled = tuple[Batch, dict[str, Any], NDArray[np.int64], int]


# --- the batch plan: which rows go in each batch, and its pad value --------------------------------


def plan_epoch(
    share: NDArray[np.int64], batch_size: int, last_batch_handle: str, carry: NDArray[np.int64] | None
) -> tuple[list[tuple[NDArray[np.int64], int]], NDArray[np.int64] | None]:
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
    batches: list[tuple[NDArray[np.int64], int]] = []
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
            batches.append((share[s : s + batch_size], 0))
        rest = share[head + full * batch_size :]
        return batches, (rest.copy() if len(rest) else None)
    full = n // batch_size
    for b in range(full):
        batches.append((share[b * batch_size : (b + 1) * batch_size], 0))
    if last_batch_handle == "pad" and n % batch_size:
        start = full * batch_size
        # Wrap around to the start of the epoch's order (repeating it when batch_size > n).
        rows = share[(start + np.arange(batch_size)) % n]
        batches.append((rows, batch_size - (n - start)))
    return batches, None


class NDArrayIter(BatchIter):
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
        ctx: ``None`` (batches in the pinned ring) or a list of contexts: each batch array becomes a
            list of per-context copies (sliced with ``work_load_list`` like Module does).
        work_load_list: Relative shares of the contexts in ``ctx``.
        block_shuffle: For streamed shards: shuffle blocks of rows (sequential reads) instead of a
            global permutation. Default: on for paths, off for in-memory arrays.
        max_extra_slots: Slots the ring may add when the consumer keeps batches (None: as many as
            it starts with); beyond that, batches come in fresh memory.

    Attributes (MXNet's):
        idx: This epoch's row order (a permutation of the rows when ``shuffle``).
        cursor: Position in ``idx`` of the current batch's first row (``-batch_size`` before the
            first; negative for a first batch made of rows rolled over from the last epoch).
        num_data: Number of rows.
        data: ``[(name, array)]`` of the data inputs in ``idx`` order (computed when read).
        label: The same for the labels.
    """

    def __init__(
        self,
        data: Any,
        label: Any = None,
        batch_size: int = 1,
        shuffle: bool = False,
        last_batch_handle: str = "pad",
        data_name: str = "data",
        label_name: str = "softmax_label",
        layout: str = "NCHW",
        *,
        seed: int | None = None,
        part_index: int = 0,
        num_parts: int = 1,
        kvstore: mx.kv.KVStore | str | None = None,
        rank: int | None = None,
        num_workers: int | None = None,
        prefetch: int = 2,
        ctx: mx.Context | Sequence[mx.Context] | None = None,
        work_load_list: Sequence[float] | None = None,
        block_shuffle: bool | None = None,
        max_extra_slots: int | None = None,
    ) -> None:
        super().__init__(batch_size)
        self._producer: Producer[_Filled] | None = None
        self._shards = None
        self.ring: BatchRing | None = None
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive int")
        if last_batch_handle not in LAST_BATCH_HANDLES:
            raise ValueError(f"last_batch_handle={last_batch_handle!r} must be one of {LAST_BATCH_HANDLES}")
        if not isinstance(layout, str) or not layout.startswith("N"):
            raise ValueError(f"layout={layout!r}: fastload.mxnet.NDArrayIter needs the batch axis first")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch={prefetch!r} must be an int >= 1")
        self.part_index, self.num_parts = resolve_parts(
            part_index=part_index, num_parts=num_parts, kvstore=kvstore, rank=rank, num_workers=num_workers
        )
        streamed = isinstance(data, (str, os.PathLike))
        if streamed:
            if label is not None:
                raise ValueError("label must be None when data is a pack-arrays folder (labels are stored in it)")
            from fastload.records.arrays import open_arrays

            self._shards = open_arrays(os.fspath(data))
            self._data_sources = [stored_source(self._shards.array(n)) for n in sorted(self._shards.data_names)]
            self._label_sources = [stored_source(self._shards.array(n)) for n in sorted(self._shards.label_names)]
        else:
            self._data_sources = init_sources(data, False, data_name)
            self._label_sources = init_sources(label, True, label_name)
        sizes = {s.name: s.shape[0] for s in self._data_sources + self._label_sources}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"all inputs must have the same number of rows, got {sizes}")
        self.num_data = next(iter(sizes.values()))
        if seed is None:
            # As MXNet's NDArrayIter, which shuffles with numpy's global generator: np.random.seed()
            # before building the iterator makes its order reproducible.
            seed = int(np.random.randint(0, 2**31 - 1))  # noqa: NPY002
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.last_batch_handle = last_batch_handle
        self.layout = layout
        self.seed = int(seed)
        self._prefetch = prefetch
        self._max_extra_slots = max_extra_slots
        self._ctxs = normalize_contexts(ctx)
        if self._ctxs is not None:
            self._slices = split_slices(self.batch_size, len(self._ctxs), work_load_list)
        elif work_load_list is not None:
            raise ValueError("work_load_list needs ctx=[...]")
        if block_shuffle is None:
            block_shuffle = streamed
        mode = (
            order_mod.Shuffle.NONE
            if not shuffle
            else (order_mod.Shuffle.BLOCK if block_shuffle else order_mod.Shuffle.GLOBAL)
        )
        self._spec = order_mod.OrderSpec(
            num_records=self.num_data,
            batch_size=self.batch_size,
            shuffle=mode,
            seed=self.seed,
            rank=self.part_index,
            world_size=self.num_parts,
            even=order_mod.Even.PAD,
        )
        self._sources = self._data_sources + self._label_sources
        self._keys = [str(i) for i in range(len(self._sources))]
        self._epoch = 0
        self._carry: NDArray[np.int64] | None = None
        self._taken = 0  # batches handed out this epoch
        self._exhausted = False  # next() reported the end of this epoch
        self._plan: list[tuple[NDArray[np.int64], int]] = []
        self._next_carry: NDArray[np.int64] | None = None
        self._warned = False
        self._gathered: dict[str, list[tuple[str, Any]]] = {}
        self._make_plan()

    # -- MXNet DataIter interface -----------------------------------------------------------------

    @property
    def provide_data(self) -> list[mx.io.DataDesc]:
        return [
            mx.io.DataDesc(s.name, (self.batch_size, *s.shape[1:]), s.dtype, layout=self.layout)
            for s in self._data_sources
        ]

    @property
    def provide_label(self) -> list[mx.io.DataDesc]:
        return [
            mx.io.DataDesc(s.name, (self.batch_size, *s.shape[1:]), s.dtype, layout=self.layout)
            for s in self._label_sources
        ]

    @property
    def idx(self) -> NDArray[np.int64]:
        """This epoch's row order (MXNet's ``idx``); a copy."""
        return self._share.copy()

    @property
    def data(self) -> list[tuple[str, Any]]:
        """``[(name, array)]`` of the data inputs with rows in ``idx`` order (MXNet's ``data``)."""
        return self._gather("data", self._data_sources)

    @property
    def label(self) -> list[tuple[str, Any]]:
        """``[(name, array)]`` of the label inputs with rows in ``idx`` order (MXNet's ``label``)."""
        return self._gather("label", self._label_sources)

    def reset(self) -> None:
        """Start the next epoch (reshuffled when ``shuffle``); ``roll_over`` carries leftover rows."""
        self._forget_current()
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

    def _fetch(self) -> mx.io.DataBatch | None:
        self.cursor += self.batch_size
        if self._taken >= len(self._plan):
            self._exhausted = True
            return None
        producer = self._producer if self._producer is not None else self._start_producer()
        batch, csr, rows, pad = producer.get()
        self._taken += 1
        ring = self.ring
        assert ring is not None  # made by _start_producer, dropped only by close()
        if batch.slot >= 0:
            ring.taken(batch.slot, batch._generation)
        elif batch.fresh and not self._warned:
            self._warned = True
            warnings.warn(
                f"NDArrayIter: the consumer keeps more than {ring.held} batches alive: the ring grew to "
                f"{len(ring.slots)} slots (its bound) and further batches are assembled in freshly allocated "
                "memory. Kept batches stay intact; drop batches after use to avoid the allocations",
                KeptBatchesWarning,
                stacklevel=4,
            )
        arrays = [
            csr[key] if key in csr else src.output(key, batch)
            for src, key in zip(self._sources, self._keys, strict=False)
        ]
        del batch  # from here only the arrays handed out hold the slot's lease
        n_data = len(self._data_sources)
        data, label = arrays[:n_data], arrays[n_data:]
        if self._ctxs is not None:
            data = [place(a, self._ctxs, self._slices) for a in data]
            label = [place(a, self._ctxs, self._slices) for a in label]
        return mx.io.DataBatch(
            data=data,
            label=label,
            pad=pad,
            index=rows,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )

    def __len__(self) -> int:
        """Batches in the current epoch."""
        return len(self._plan)

    # -- resume -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: seed, epoch, batches taken and how many rows rolled over.

        A plain dict of ints, strings and lists (``torch.save``, ``json``, ``pickle``), versioned and
        checked on load (:mod:`fastload.position`). Any part's state resumes every part at the same
        ``num_parts``: the rolled-over rows are stored as a count, each part recomputes its own.
        """
        carry = 0 if self._carry is None else len(self._carry)
        return make_state(
            _KIND,
            Position(self._epoch),
            self._fingerprint(),
            seed=self.seed,
            batch=self._taken,
            exhausted=int(self._exhausted),
            carry=carry,
            num_parts=self.num_parts,
            batch_size=self.batch_size,
            last_batch_handle=self.last_batch_handle,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next batch is the one that would have come next.

        The saved ``seed`` replaces this iterator's (MXNet draws it at random by default).

        Raises:
            ResumeStateError: A state of other inputs or settings, a newer format, a damaged state,
                or one saved with another ``num_parts`` (refused: this iterator resumes at the same
                part count only; ``fastload.Loader`` and ``fastload.mxnet.ImageRecordIter`` restore
                under another one).
        """
        _, values = read_state(
            state,
            kind=_KIND,
            fingerprint=self._fingerprint(),
            extra={
                "seed": int,
                "batch": int,
                "exhausted": int,
                "carry": int,
                "num_parts": int,
                "batch_size": int,
                "last_batch_handle": str,
            },
        )
        for key in ("num_parts", "batch_size", "last_batch_handle"):
            if values[key] != getattr(self, key):
                extra = (
                    " (NDArrayIter resumes at the same part count only; fastload.Loader and "
                    "fastload.mxnet.ImageRecordIter restore under another one)"
                    if key == "num_parts"
                    else ""
                )
                raise ResumeStateError(
                    f"the saved NDArrayIter state has {key}={values[key]!r}, this iterator has "
                    f"{key}={getattr(self, key)!r}{extra}"
                )
        position = state["epoch"]
        carry = values["carry"]
        if not 0 <= carry < self.batch_size or values["seed"] < 0 or values["batch"] < 0:
            raise ResumeStateError(
                f"the saved NDArrayIter state is damaged: carry={carry}, seed={values['seed']}, batch={values['batch']}"
            )
        self._forget_current()
        self._stop_producer()
        self.seed = int(values["seed"])
        self._spec = dataclasses.replace(self._spec, seed=self.seed)
        self._epoch = int(position)
        self._carry = self._stream_tail(carry) if carry else None
        self._make_plan()
        self._taken = min(int(values["batch"]), len(self._plan))
        self.cursor += self._taken * self.batch_size
        self._exhausted = bool(values["exhausted"])

    def _stream_tail(self, count: int) -> NDArray[np.int64]:
        """The last ``count`` rows this part handed out before the current epoch (the rolled-over rows).

        What rolls over is always the end of the epochs before, epoch after epoch, so a count says it.
        """
        parts: list[NDArray[np.int64]] = []
        need, epoch = count, self._epoch - 1
        while need > 0:
            if epoch < 0:
                raise ResumeStateError(f"the saved NDArrayIter state is damaged: {count} rows cannot roll over yet")
            share = order_mod.EpochOrder(self._spec, epoch).share
            take = share[max(0, len(share) - need) :]
            parts.insert(0, take)
            need -= len(take)
            epoch -= 1
        return np.concatenate(parts)

    def _fingerprint(self) -> dict[str, Any]:
        arrays = ";".join(f"{s.name}:{s.stype}:{tuple(s.shape)}:{s.dtype}" for s in self._sources)
        out = order_fingerprint(dataclasses.replace(self._spec, seed=0), f"arrays {arrays}")
        del out["seed"]  # the state's seed replaces this iterator's
        return out

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the producer thread, free the ring and release the shards (idempotent)."""
        self._stop_producer()
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self._shards is not None:
            self._shards.close()
            self._shards = None

    def __enter__(self) -> NDArrayIter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stop_producer()

    # -- internals --------------------------------------------------------------------------------

    def _make_plan(self) -> None:
        self._share = order_mod.EpochOrder(self._spec, self._epoch).share
        self._plan, self._next_carry = plan_epoch(self._share, self.batch_size, self.last_batch_handle, self._carry)
        # MXNet's cursor: -batch_size before the first batch, minus the rows carried into it.
        carried = len(self._carry) if self._carry is not None and self.last_batch_handle == "roll_over" else 0
        self.cursor = -carried - self.batch_size
        self._gathered = {}

    def _gather(self, what: str, sources: Sequence[DenseSource | CSRSource]) -> list[tuple[str, Any]]:
        if what not in self._gathered:
            rows = self._share
            self._gathered[what] = [(s.name, s.gather(rows)) for s in sources]
        return self._gathered[what]

    def _make_ring(self) -> BatchRing:
        fields: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
        for src, key in zip(self._sources, self._keys, strict=False):
            fields.update(src.fields(key, self.batch_size))
        return BatchRing(
            fields,
            num_slots=self._prefetch + HELD_BATCHES,
            allocator=pinned_allocator,
            max_extra_slots=self._max_extra_slots,
        )

    def _start_producer(self) -> Producer[_Filled]:
        if self.ring is None:
            self.ring = self._make_ring()
        ring = self.ring
        plan = self._plan[self._taken :]
        first = self._taken
        epoch = self._epoch
        sources, keys = self._sources, self._keys

        def fill(slot: Slot, k: int, rows: NDArray[np.int64], pad: int) -> _Filled:
            try:
                sizes: dict[str, int] = {}
                for src, key in zip(sources, keys, strict=False):
                    sizes.update(src.fill(key, slot.arrays, rows))
                batch = ring.lease(slot, epoch=epoch, number=first + k, sizes=sizes)
            except BaseException:
                ring.unused(slot)
                raise
            # CSR outputs are copies: made here, off the consumer's thread.
            csr = {key: src.output(key, batch) for src, key in zip(sources, keys, strict=False) if src.stype == "csr"}
            return batch, csr, rows.copy(), pad

        def produce(stop: threading.Event) -> Iterator[_Filled]:
            for k, (rows, pad) in enumerate(plan):
                slot = ring.acquire(stop)
                if slot is None:
                    return
                # No local refers to the batch while this frame is suspended: a batch the consumer
                # dropped must not stay leased because the producer still names it.
                yield fill(slot, k, rows, pad)

        self._producer = Producer(produce, maxsize=self._prefetch, name="fastload-ndarrayiter", wake=ring.wake)
        return self._producer

    def _stop_producer(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
