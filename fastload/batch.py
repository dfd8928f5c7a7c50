"""Batch slots: the ring of preallocated (pinned) batch buffers, and the leases that say when a slot may be refilled.

Every batch the loader yields lives in a *slot*: one preallocated array per field (for the image
loader ``images``, ``labels``, ``indices``; any ``name -> (shape, dtype)`` for other users of the
ring). The ring starts with ``prefetch + 2`` slots, allocated once when the loader is built.

Ownership rule (what a consumer may rely on):

    **A batch is never overwritten while anything derived from it is alive.** The arrays of a
    :class:`Batch` are numpy views whose ``.base`` chain holds a per-batch *lease*; the ring
    refills the slot only after the lease has been garbage-collected, i.e. after the last array,
    slice, ``torch.from_numpy`` tensor or zero-copy MXNet NDArray made from those views is gone,
    and after every *fence* attached to the slot has completed.

    Keep batches as long as you like. In the usual loop (take a batch, use it, drop it) each slot
    comes back as soon as the loop moves on, and nothing is allocated or copied. If the consumer
    holds more than ``HELD_BATCHES`` (2) batches at once (``list(loader)``, a batch kept for
    logging, a metric computed on the previous batch) and no slot is free, the ring grows by one
    slot at a time up to ``max_extra_slots`` extra slots. At that bound it runs one garbage
    collection (a batch kept alive only by a reference cycle is then returned); if that frees
    nothing it hands out batches decoded into freshly allocated memory (one allocation per batch,
    never a wait), and the loader emits one :class:`~fastload.errors.KeptBatchesWarning`. The ring
    never deadlocks on a kept batch and never overwrites one.

What keeps a lease alive (checked by ``tests/test_lifetime.py``): numpy views and slices of the
arrays; ``torch.from_numpy(view)`` and every tensor sharing its storage (slices, ``permute``,
``.numpy()`` round trips); ``mx.nd.from_numpy(view, zero_copy=True)`` (MXNet 1.9.1's DLPack import),
its slices and reshapes, and MXNet engine operations still queued on it: MXNet releases the numpy
view only after the last operation reading it has run, on one of its engine threads. Copies
(``.copy()``, ``torch.tensor(view)``, ``mx.nd.array(view)``) do not hold it, as they should not.
Adapters must wrap these views, not the allocator's owner objects (:attr:`Batch.owners`): a
reference to an owner is invisible to the lease.

Fences: :meth:`Batch.add_fence` attaches an object with ``query() -> bool`` (a
``torch.cuda.Event``, an MXNet engine wait) that must report completion before the slot is
refilled. A ring may also have a *release hook*, called when a lease dies, that returns fences to
attach then: the torch adapter records a CUDA event on each initialized device's current stream,
so that a user's own ``non_blocking`` copy out of a pinned batch finishes before the slot is
refilled. The producer takes a free slot whose fences have completed when there is one; otherwise
it blocks on the oldest free slot's fences with their ``synchronize()`` (a CUDA event's host wait,
GIL released), never a sleep loop (a fence without ``synchronize`` is re-queried on every ring
event and at most every ``poll`` seconds).

Waits (:attr:`BatchRing.waits`, and ``on_wait`` for the loader's stats): the producer waits only
for one of three reasons, counted apart. ``consumer``: ``ahead`` filled batches already wait for the
consumer (back-pressure: the consumer is the slower side, the healthy state of a model-bound run).
``slot``: the prefetch queue is short, yet no slot is free: the consumer holds every other slot
without holding more than its share (a slot comes back when the consumer drops a batch: a lease's
death wakes the producer at once, it never waits for a timer or a garbage collection). ``fence``:
a free slot's device work is still running. A consumer that holds more than its share is
*keeping* batches: that never makes the producer wait (the ring grows, see above).

Threads: leases die on whatever thread drops the last reference (the consumer's, a garbage
collection on the producer's, an MXNet engine thread, interpreter shutdown). The release path only
calls the hook and puts the slot on a ``queue.SimpleQueue`` (reentrant, lock-free for the caller);
it never takes the ring's lock, so it cannot deadlock with a thread that holds it. The producer
drains that queue when it needs a slot.

Memory comes from an *allocator* ``allocator(shape, dtype) -> (numpy_view, owner)``: the default
uses numpy; the torch adapter supplies pinned tensors and the mxnet adapter ``mx.cpu_pinned()``
NDArrays. ``owner`` keeps the memory alive. :meth:`BatchRing.close` drops the ring's references:
each slot's memory is freed once no lease holds it any more.
"""

from __future__ import annotations

import collections
import gc
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from fastload.decode import Layout  # the engine's output layouts are the slots' layouts

__all__ = [
    "HELD_BATCHES",
    "WAIT_REASONS",
    "Allocator",
    "Batch",
    "BatchRing",
    "Fence",
    "FieldSpec",
    "Layout",
    "ReleaseHook",
    "Slot",
    "WaitObserver",
    "image_fields",
    "numpy_allocator",
]

log = logging.getLogger("fastload.batch")

# Batches a consumer holds in the usual loop: the one it works on and the previous one (a `for`
# loop variable still refers to it while the next batch is fetched). The base ring provides for
# them on top of the prefetched batches; holding more is "keeping batches" (see the module doc).
HELD_BATCHES = 2

Allocator = Callable[[tuple[int, ...], np.dtype], tuple[np.ndarray, Any]]
FieldSpec = tuple[tuple[int, ...], Any]  # (shape of the field's array in one slot, dtype)
ReleaseHook = Callable[[], Iterable[Any]]

# close(): how long it sleeps between two checks of a fence that has no synchronize() (it only
# waits for device work on memory it is about to free, never on the data path).
_FENCE_POLL = 0.0002

#: Why the producer waited in :meth:`BatchRing.acquire` (keys of :attr:`BatchRing.waits`).
WAIT_REASONS = ("consumer", "slot", "fence")

WaitObserver = Callable[[str, float, float], None]  # (reason, start, end) in time.perf_counter seconds


def numpy_allocator(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, Any]:
    """The default allocator: plain (pageable) numpy memory; the array is its own owner."""
    array = np.empty(shape, dtype=dtype)
    return array, array


def image_fields(
    *, batch_size: int, image_size: tuple[int, int], layout: Layout, label_width: int, image_dtype: Any = np.uint8
) -> dict[str, FieldSpec]:
    """The image loader's slot fields.

    Returns:
        ``images`` (``image_dtype``, ``[B, 3, H, W]`` or ``[B, H, W, 3]``), ``labels`` (float32
        ``[B, label_width]``) and ``indices`` (int64 ``[B]``).
    """
    h, w = image_size
    layout = Layout(layout)
    image_shape = (batch_size, 3, h, w) if layout is Layout.NCHW else (batch_size, h, w, 3)
    return {
        "images": (image_shape, np.dtype(image_dtype)),
        "labels": ((batch_size, label_width), np.dtype(np.float32)),
        "indices": ((batch_size,), np.dtype(np.int64)),
    }


class Fence:
    """Protocol of a completion marker attached to a slot (``torch.cuda.Event`` satisfies it).

    Only ``query()`` is used: it returns True once the work that reads the slot has finished.
    """

    def query(self) -> bool:  # pragma: no cover - protocol
        raise NotImplementedError


class Slot:
    """One batch buffer: an array per field, and its bookkeeping.

    Attributes:
        id: Position in the ring, or -1 for fresh memory that is not part of the ring.
        arrays: The slot's full arrays by field name (``slot.images`` is ``slot.arrays["images"]``).
        owners: The allocator's owner objects, by field name.
        generation: How many times the slot has been (re)filled.
        fences: Fences that must complete before the next refill.
        leased: A batch made from the slot may still be alive (its lease has not come back).
        taken: The consumer has taken that batch (as opposed to it waiting in the prefetch queue).
    """

    __slots__ = ("arrays", "fences", "generation", "id", "interfaces", "leased", "owners", "taken")

    def __init__(self, slot_id: int, arrays: dict[str, tuple[np.ndarray, Any]]) -> None:
        self.id = slot_id
        self.arrays = {k: v[0] for k, v in arrays.items()}
        # Built once: numpy makes a new dict per `__array_interface__` access (~1 us each).
        self.interfaces = {k: v.__array_interface__ for k, v in self.arrays.items()}
        self.owners = {k: v[1] for k, v in arrays.items()}
        self.generation = 0
        self.fences: list[Any] = []
        self.leased = False
        self.taken = False

    def __getattr__(self, name: str) -> np.ndarray:
        if name in ("arrays", "interfaces"):  # not set yet (during __init__): no recursion
            raise AttributeError(name)
        try:
            return self.arrays[name]
        except KeyError:
            raise AttributeError(f"slot has no field {name!r}") from None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


class _Lease:
    """Alive while anything made from one batch's arrays is alive; its finalizer returns the slot."""

    __slots__ = ("__weakref__",)


class _LeasedArray:
    """Presents one slot array to numpy while holding the batch's lease.

    ``np.asarray`` of this object is a view of the slot whose ``.base`` is this object, so every
    array, slice or zero-copy tensor derived from that view keeps the lease alive.
    """

    __slots__ = ("__array_interface__", "_array", "_lease")

    def __init__(self, array: np.ndarray, interface: dict[str, Any], lease: _Lease) -> None:
        self.__array_interface__ = interface
        self._array = array  # the memory outlives the ring while a lease holds it
        self._lease = lease


def _lease_ended(returns: queue.SimpleQueue, slot_id: int, generation: int, hook: ReleaseHook | None) -> None:
    """A lease's finalizer: runs on any thread, never blocks, never takes a lock of the ring."""
    fences: tuple[Any, ...] = ()
    error: BaseException | None = None
    try:
        if hook is not None:
            try:
                fences = tuple(hook() or ())
            except Exception as exc:
                error = exc
        returns.put((slot_id, generation, fences, error))
    except BaseException:
        pass


class Batch:
    """A batch: views into a ring slot (or fresh memory) that keep the slot's lease alive.

    Attributes:
        images: The images, ``size`` rows (uint8, float32 or float16).
        labels: float32 ``[size, label_width]``.
        indices: int64 ``[size]`` global record indices (after bad-record substitution).
        fields: Every field's view by name (other fields are attributes too: ``batch.name``).
        slot: Ring slot id, or -1 for a batch in memory of its own (a copy, or fresh memory when
            the consumer keeps more batches than the ring may grow for).
        epoch: Epoch the batch belongs to.
        number: Batch number inside the epoch (for this rank).
        owners: Allocator owners of the slot's full buffers. Do not wrap them in framework arrays:
            a reference to an owner does not keep the lease alive (use the views).
        fresh: The batch was decoded into fresh memory because the ring had reached its bound.
    """

    __slots__ = (
        "__weakref__",
        "_full",
        "_generation",
        "_ring",
        "epoch",
        "fields",
        "fresh",
        "images",
        "indices",
        "labels",
        "number",
        "owners",
        "slot",
    )

    def __init__(
        self,
        images: np.ndarray | None = None,
        labels: np.ndarray | None = None,
        indices: np.ndarray | None = None,
        *,
        slot: int = -1,
        epoch: int = 0,
        number: int = 0,
        owners: dict[str, Any] | None = None,
        ring: BatchRing | None = None,
        generation: int = 0,
        fields: dict[str, np.ndarray] | None = None,
        full: dict[str, np.ndarray] | None = None,
        fresh: bool = False,
    ) -> None:
        fields = dict(fields or {})
        for name, value in (("images", images), ("labels", labels), ("indices", indices)):
            if value is not None:
                fields[name] = value
        self.fields = fields
        self.images, self.labels, self.indices = fields.get("images"), fields.get("labels"), fields.get("indices")
        self.slot, self.epoch, self.number = slot, epoch, number
        self.owners = owners or {}
        self.fresh = fresh
        self._full = full
        self._ring = weakref.ref(ring) if ring is not None else None  # a kept batch must not keep the whole ring
        self._generation = generation

    def __getattr__(self, name: str) -> np.ndarray:
        if name in ("fields", "_full", "_ring"):  # during __init__
            raise AttributeError(name)
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(f"batch has no field {name!r}") from None

    @property
    def size(self) -> int:
        """Samples in this batch (smaller than the batch size only for a final partial batch)."""
        arr = self.indices if self.indices is not None else next(iter(self.fields.values()))
        return int(arr.shape[0])

    def slot_view(self, name: str) -> np.ndarray:
        """The field's whole slot (every row, not only ``size``), holding the lease like the field views.

        Adapters that complete a partial batch in place (MXNet's ``round_batch``) wrap this.
        """
        if self._full is not None:
            return self._full[name]
        return self.fields[name]

    def _live_ring(self) -> BatchRing | None:
        return self._ring() if self._ring is not None else None

    @property
    def intact(self) -> bool:
        """True while the slot still holds this batch (always True for a batch in its own memory).

        With leases this stays True for as long as the batch is reachable, unless :meth:`release`
        gave the slot back early.
        """
        ring = self._live_ring()
        return ring is None or self.slot < 0 or ring.slot_generation(self.slot) == self._generation

    def add_fence(self, fence: Any) -> None:
        """Keep the slot from being refilled until ``fence.query()`` is True (e.g. a CUDA event)."""
        ring = self._live_ring()
        if ring is not None and self.slot >= 0:
            ring.add_fence(self.slot, fence, self._generation)

    def release(self) -> None:
        """Give the slot back now, before the batch's arrays are garbage-collected. Idempotent.

        The arrays must not be used afterwards: the slot may be refilled at once. Never needed for
        safety (the lease returns the slot when the arrays die); useful only to return memory
        early when something the consumer cannot drop still refers to the arrays.
        """
        ring = self._live_ring()
        if ring is not None and self.slot >= 0:
            ring.release(self.slot, self._generation)

    def copy(self) -> Batch:
        """A detached copy in fresh numpy memory that stays valid forever."""
        return Batch(
            slot=-1, epoch=self.epoch, number=self.number, fields={k: v.copy() for k, v in self.fields.items()}
        )

    def __repr__(self) -> str:
        images = self.images.shape if self.images is not None else None
        return f"Batch(size={self.size}, images={images}, epoch={self.epoch}, number={self.number}, slot={self.slot})"


class BatchRing:
    """The slots shared by one producer and one consumer, recycled through per-batch leases.

    The producer calls :meth:`acquire` (waits while every slot is held, queued or fenced; grows the
    ring or returns fresh memory when the consumer keeps batches, see the module doc), fills the
    slot, and calls :meth:`lease` to make the :class:`Batch` it hands out. The consumer calls
    :meth:`taken` for each batch it receives (required: it tells batches the consumer keeps from
    batches still waiting in the prefetch queue, and lets the producer run ``ahead`` again).

    Args:
        fields: ``name -> (shape, dtype)`` of one slot's arrays (:func:`image_fields` for images).
        num_slots: Slots allocated up front (the loader uses ``prefetch + HELD_BATCHES``).
        allocator: ``allocator(shape, dtype) -> (numpy_view, owner)``; numpy when None.
        max_extra_slots: How many slots the ring may add when the consumer keeps batches (None:
            ``num_slots``, i.e. the ring may double); 0 goes straight to fresh memory.
        release_hook: Called (on any thread) when a lease dies; returns fences to attach to the slot.
        held: Batches the consumer may hold before it counts as keeping them (``HELD_BATCHES``).
        ahead: At most this many filled batches wait for the consumer (not yet :meth:`taken`);
            :meth:`acquire` waits beyond it even when slots are free (None: ``num_slots - held``).
        poll: Longest sleep of a waiting :meth:`acquire` between two checks of ``stop`` (a set stop
            is normally followed by :meth:`wake`, which ends the wait at once).
        on_wait: Called ``(reason, start, end)`` (``time.perf_counter`` seconds) for each span
            :meth:`acquire` waited, on the producer's thread; ``reason`` is one of
            :data:`WAIT_REASONS` (the loader's ``wait_consumer`` / ``wait_slot`` stats).

    Attributes:
        waits: How many times :meth:`acquire` had to wait, by reason (:data:`WAIT_REASONS`).
        wait_seconds: Seconds it waited, by reason.
        fresh_batches: Batches handed out in fresh memory (the ring was at its bound).
        gc_runs: Garbage collections run at the bound.
    """

    def __init__(
        self,
        fields: Mapping[str, FieldSpec],
        *,
        num_slots: int,
        allocator: Allocator | None = None,
        max_extra_slots: int | None = None,
        release_hook: ReleaseHook | None = None,
        held: int = HELD_BATCHES,
        ahead: int | None = None,
        poll: float = 0.05,
        on_wait: WaitObserver | None = None,
    ) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < held + 1:
            raise ValueError(
                f"num_slots={num_slots!r} must be an int >= {held + 1} (the batches the consumer holds "
                "plus one being filled)"
            )
        if max_extra_slots is None:
            max_extra_slots = num_slots
        if isinstance(max_extra_slots, bool) or not isinstance(max_extra_slots, int) or max_extra_slots < 0:
            raise ValueError(f"max_extra_slots={max_extra_slots!r} must be an int >= 0")
        if not fields:
            raise ValueError("a ring needs at least one field")
        self.fields: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            str(k): (tuple(int(s) for s in shape), np.dtype(dtype)) for k, (shape, dtype) in fields.items()
        }
        self._allocator = allocator or numpy_allocator
        self.base_slots = num_slots
        self.max_extra_slots = max_extra_slots
        self.held = held
        self.ahead = num_slots - held if ahead is None else ahead
        if isinstance(self.ahead, bool) or not isinstance(self.ahead, int) or self.ahead < 1:
            raise ValueError(f"ahead={ahead!r} must be an int >= 1")
        self._poll = poll
        self._hook = release_hook
        self.slots: list[Slot] = [self._new_slot(i) for i in range(num_slots)]
        # Producer and consumer bookkeeping; never taken by a lease's finalizer.
        self._lock = threading.Lock()
        # Lease deaths, from any thread: (slot id, generation, fences, hook error), or None to wake.
        self._returns: queue.SimpleQueue = queue.SimpleQueue()
        # FIFO of free slots so every slot is reused in turn (a just-returned slot waits longest,
        # which gives its fences the most time to complete).
        self._free: collections.deque[int] = collections.deque(range(num_slots))
        self._closed = False
        self._collected = False  # one garbage collection per episode of kept batches
        self._hook_failed = False
        self.fresh_batches = 0
        self.gc_runs = 0
        self._on_wait = on_wait
        self.waits: dict[str, int] = dict.fromkeys(WAIT_REASONS, 0)
        self.wait_seconds: dict[str, float] = dict.fromkeys(WAIT_REASONS, 0.0)

    # --- sizes and counters -----------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes held by the ring's slots."""
        return sum(s.nbytes for s in self.slots)

    @property
    def extra_slots(self) -> int:
        """Slots added because the consumer kept batches."""
        return len(self.slots) - self.base_slots

    def slot_generation(self, slot_id: int) -> int:
        return self.slots[slot_id].generation

    def held_count(self) -> int:
        """Batches the consumer has taken whose leases have not come back yet."""
        with self._lock:
            self._drain_locked()
            return self._held_locked()

    # --- producer side ----------------------------------------------------------------------

    def acquire(self, stop: threading.Event) -> Slot | None:
        """A slot to fill (generation already advanced), or None when ``stop`` is set or the ring closed.

        Waits while ``ahead`` filled batches wait for the consumer, or every slot is leased or
        queued and the consumer holds no more than ``held`` batches (the consumer is slower:
        back-pressure). When the consumer holds more and the queue is short because of it,
        grows the ring by a slot at once; at the bound, runs one garbage collection per such
        episode (until the consumer holds no more than ``held`` again), then returns fresh memory
        (``slot.id == -1``): it never waits on kept batches. Every wait is counted by reason
        (:attr:`waits`, ``on_wait``; see the module doc).
        """
        waiting = None  # the reason of the wait in progress, counted once per acquire and reason
        while True:
            if stop.is_set() or self._closed:
                return None
            keeping = False
            with self._lock:
                self._drain_locked()
                held = self._held_locked()
                if held <= self.held:
                    self._collected = False  # the episode of kept batches is over
                ahead_ok = self._in_flight_locked() < self.ahead
                slot: Slot | None = self._take_free_locked() if self._free and ahead_ok else None
                if slot is None:
                    # Keeping batches: the consumer holds more than its share and the prefetch
                    # queue is short because of it. A full queue is ordinary back-pressure.
                    keeping = held > self.held and ahead_ok
            if slot is not None:
                return self._wait_for_fences(slot, stop)
            if keeping:
                if len(self.slots) < self.base_slots + self.max_extra_slots:
                    return self._grow()
                if not self._collected and gc.isenabled():
                    # At the bound, before fresh memory: a kept batch may be garbage held only by a
                    # reference cycle. One collection per episode (a full pass costs ~70 ms with
                    # torch imported), outside the lock: the leases' finalizers run here.
                    self._collected = True
                    self.gc_runs += 1
                    gc.collect()
                    continue
                self.fresh_batches += 1
                return self._new_slot(-1)
            reason = "slot" if ahead_ok else "consumer"
            if waiting != reason:
                waiting = reason
                self.waits[reason] += 1
            # Woken by a lease's death, a taken batch (both put an item) or wake() after a stop.
            t0 = time.perf_counter()
            try:
                item = self._returns.get(timeout=self._poll)
            except queue.Empty:
                item = None
            self._waited(reason, t0, time.perf_counter())
            with self._lock:
                self._apply_return_locked(item)

    def _take_free_locked(self) -> Slot:
        """The free slot to fill next: the oldest whose fences have completed, else the oldest."""
        for k, slot_id in enumerate(self._free):
            slot = self.slots[slot_id]
            if slot.fences:
                slot.fences = [f for f in slot.fences if not f.query()]
            if not slot.fences:
                del self._free[k]
                return slot
        return self.slots[self._free.popleft()]

    def _waited(self, reason: str, start: float, end: float) -> None:
        self.wait_seconds[reason] += end - start
        if self._on_wait is not None:
            self._on_wait(reason, start, end)

    def _wait_for_fences(self, slot: Slot, stop: threading.Event) -> Slot | None:
        """Block until ``slot``'s fences have completed, then hand it out (None on stop / close)."""
        counted = False
        while True:
            with self._lock:
                pending = list(slot.fences)
                if pending and (stop.is_set() or self._closed):
                    self._free.appendleft(slot.id)
                    return None
            if not pending:
                break
            if not counted:
                counted = True
                self.waits["fence"] += 1
            fence = pending[0]
            t0 = time.perf_counter()
            if not fence.query():
                if callable(getattr(fence, "synchronize", None)):
                    fence.synchronize()  # the device ends this work in bounded time: a host wait, no polling
                else:
                    # A fence that can only be queried: asked again after the next ring event (or `poll`).
                    try:
                        item = self._returns.get(timeout=self._poll)
                    except queue.Empty:
                        item = None
                    with self._lock:
                        self._apply_return_locked(item)
                    if not fence.query():
                        self._waited("fence", t0, time.perf_counter())
                        continue
            self._waited("fence", t0, time.perf_counter())
            with self._lock:
                slot.fences = [f for f in slot.fences if f is not fence]
        with self._lock:
            slot.generation += 1
            slot.leased, slot.taken = True, False
        return slot

    def _grow(self) -> Slot:
        slot = self._new_slot(len(self.slots))
        slot.generation, slot.leased = 1, True
        with self._lock:
            self.slots.append(slot)
        log.info(
            "the consumer keeps more than %d batches: the ring grew to %d slots (bound %d)",
            self.held,
            len(self.slots),
            self.base_slots + self.max_extra_slots,
        )
        return slot

    def unused(self, slot: Slot) -> None:
        """Return a slot the producer acquired but did not hand out."""
        if slot.id < 0:
            return
        with self._lock:
            if slot.leased:
                slot.leased = slot.taken = False
                self._free.appendleft(slot.id)

    def lease(
        self,
        slot: Slot,
        *,
        rows: int | None = None,
        epoch: int = 0,
        number: int = 0,
        sizes: Mapping[str, int] | None = None,
    ) -> Batch:
        """The batch to hand out from a filled ``slot``: views holding a new lease.

        Args:
            slot: A slot returned by :meth:`acquire`.
            rows: Rows of every field that belong to the batch (None: all).
            epoch: Epoch recorded on the batch.
            number: Batch number recorded on the batch.
            sizes: Per-field row counts overriding ``rows`` (fields whose first axis is not the batch).
        """

        def cut(name: str, array: np.ndarray) -> np.ndarray:
            n = sizes.get(name, rows) if sizes else rows
            return array if n is None else array[:n]

        if slot.id < 0:  # fresh memory: the arrays own it, nothing to return
            full = dict(slot.arrays)
            return Batch(
                slot=-1,
                epoch=epoch,
                number=number,
                owners=slot.owners,
                ring=None,
                fields={k: cut(k, v) for k, v in full.items()},
                full=full,
                fresh=True,
            )
        lease = _Lease()
        finalizer = weakref.finalize(lease, _lease_ended, self._returns, slot.id, slot.generation, self._hook)
        finalizer.atexit = False  # at interpreter exit nothing is refilled: do not call hooks then
        interfaces = slot.interfaces
        full = {k: np.asarray(_LeasedArray(v, interfaces[k], lease)) for k, v in slot.arrays.items()}
        return Batch(
            slot=slot.id,
            epoch=epoch,
            number=number,
            owners=slot.owners,
            ring=self,
            generation=slot.generation,
            fields={k: cut(k, v) for k, v in full.items()},
            full=full,
        )

    def wake(self) -> None:
        """Wake a producer waiting in :meth:`acquire` (after setting its stop event). Never blocks."""
        self._returns.put(None)

    # --- consumer side ----------------------------------------------------------------------

    def taken(self, slot_id: int, generation: int) -> None:
        """Record that the consumer received the batch of ``slot_id`` / ``generation``."""
        if slot_id < 0:
            return
        with self._lock:
            slot = self.slots[slot_id] if slot_id < len(self.slots) else None
            if slot is not None and slot.generation == generation and slot.leased:
                slot.taken = True
        self._returns.put(None)  # a producer waiting because `ahead` batches were queued may go on

    def add_fence(self, slot_id: int, fence: Any, generation: int | None = None) -> None:
        """Keep ``slot_id`` from being refilled until ``fence.query()`` is True.

        With ``generation``, the fence is dropped when the slot has already moved on (the batch it
        was meant for is gone, so there is nothing left to protect).
        """
        with self._lock:
            if slot_id >= len(self.slots):
                return
            slot = self.slots[slot_id]
            if generation is None or slot.generation == generation:
                slot.fences.append(fence)

    def release(self, slot_id: int, generation: int) -> None:
        """Return one handed-out batch's slot now (idempotent; a stale release is ignored)."""
        self._returns.put((slot_id, generation, (), None))

    # --- shared -------------------------------------------------------------------------------

    def _drain_locked(self) -> None:
        while True:
            try:
                item = self._returns.get_nowait()
            except queue.Empty:
                return
            self._apply_return_locked(item)

    def _apply_return_locked(self, item) -> None:
        if item is None:
            return
        slot_id, generation, fences, error = item
        if error is not None and not self._hook_failed:
            self._hook_failed = True
            log.warning("the ring's release hook failed (the slot is refilled without its fences): %r", error)
        if not 0 <= slot_id < len(self.slots):
            return
        slot = self.slots[slot_id]
        if slot.generation != generation or not slot.leased:
            return  # stale: released early, or already returned
        slot.leased = slot.taken = False
        slot.fences.extend(fences)
        self._free.append(slot_id)

    def _held_locked(self) -> int:
        return sum(1 for s in self.slots if s.leased and s.taken)

    def _in_flight_locked(self) -> int:
        """Filled slots not yet taken by the consumer (waiting in the prefetch queue)."""
        return sum(1 for s in self.slots if s.leased and not s.taken)

    def _new_slot(self, slot_id: int) -> Slot:
        return Slot(slot_id, {k: _allocate(self._allocator, shape, dtype) for k, (shape, dtype) in self.fields.items()})

    def close(self, fence_timeout: float | None = 10.0) -> None:
        """Refuse further :meth:`acquire` calls and drop the ring's memory. Idempotent.

        Args:
            fence_timeout: Seconds to wait for the fences of returned slots, so that no device copy
                still reads memory being freed (None: do not wait; the ring then keeps fenced slots'
                memory until it is itself freed). The memory of slots still leased is freed when
                their last view dies.

        Never blocks on the lock: called from a finalizer on a thread that holds it, it leaves the
        memory to the garbage collector.
        """
        self._closed = True
        self._returns.put(None)
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._drain_locked()
            deadline = time.monotonic() + (fence_timeout or 0.0)
            for slot in self.slots:
                while fence_timeout is not None and slot.fences and time.monotonic() < deadline:
                    slot.fences = [f for f in slot.fences if not f.query()]
                    if slot.fences:
                        time.sleep(_FENCE_POLL)
                if not slot.fences:
                    # Leased slots' arrays stay alive through their leases' views.
                    slot.arrays, slot.owners, slot.interfaces = {}, {}, {}
            self._free.clear()
        finally:
            self._lock.release()

    @property
    def closed(self) -> bool:
        return self._closed


def _allocate(allocator: Allocator, shape: tuple[int, ...], dtype) -> tuple[np.ndarray, Any]:
    view, owner = allocator(tuple(shape), np.dtype(dtype))
    if not isinstance(view, np.ndarray) or view.shape != tuple(shape) or view.dtype != np.dtype(dtype):
        raise ValueError(
            f"allocator returned {getattr(view, 'shape', type(view))} "
            f"{getattr(view, 'dtype', '')}, expected a numpy array {shape} {np.dtype(dtype)}"
        )
    if not view.flags.c_contiguous or not view.flags.writeable:
        raise ValueError(f"allocator returned a non-contiguous or read-only array for {shape}")
    return view, owner
