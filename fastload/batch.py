"""Batch slots: the ring of preallocated (pinned) batch buffers and its ownership rule.

Every batch the loader yields lives in one of ``prefetch + 2`` slots allocated once, when the
loader is built: memory is bounded by the ring, and nothing is allocated per batch.

Ownership rule (what a consumer may rely on):

    A :class:`Batch` stays intact until the consumer has taken **two further batches** from the
    same loader (so the current and the previous batch are always valid, across epoch boundaries
    too), or until it calls :meth:`Batch.release`, or the loader's producer is restarted (an
    iteration abandoned mid-epoch, ``set_epoch`` / ``load_state_dict`` to another position,
    ``close``), whichever comes first. After that the slot may be refilled. Additionally, a slot is never refilled before every *fence* attached to it (a device
    copy's ``torch.cuda.Event``, for instance) reports completion. To keep a batch longer, copy it
    (:meth:`Batch.copy`, or ``LoaderConfig(copy=True)`` which hands out copies).

:attr:`Batch.intact` checks the rule at run time: each slot counts its fills, and a batch
remembers the count it was produced with.

Memory comes from an *allocator* ``allocator(shape, dtype) -> (numpy_view, owner)``: the default
uses numpy; the torch adapter supplies pinned tensors and the mxnet adapter ``mx.cpu_pinned()``
NDArrays. ``owner`` keeps the memory alive and is handed back on the batch (:attr:`Batch.owners`)
so an adapter can use its own array type without a copy.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np

from fastload.decode import Layout  # the engine's output layouts are the slots' layouts

__all__ = ["Layout", "Allocator", "numpy_allocator", "Fence", "Slot", "Batch", "BatchRing", "HELD_BATCHES"]

# How many batches a consumer may hold at once under the ownership rule (current + previous).
HELD_BATCHES = 2

Allocator = Callable[[Tuple[int, ...], np.dtype], Tuple[np.ndarray, Any]]


def numpy_allocator(shape: Tuple[int, ...], dtype: np.dtype) -> Tuple[np.ndarray, Any]:
    """The default allocator: plain (pageable) numpy memory; the array is its own owner."""
    array = np.empty(shape, dtype=dtype)
    return array, array


class Fence:
    """Protocol of a completion marker attached to a slot (``torch.cuda.Event`` satisfies it).

    Only ``query()`` is used: it returns True once the work that reads the slot has finished.
    """

    def query(self) -> bool:  # pragma: no cover - protocol
        raise NotImplementedError


class Slot:
    """One preallocated batch buffer (images, labels, indices) and its bookkeeping.

    Attributes:
        id: Position in the ring.
        images: uint8 ``[B, H, W, 3]`` or ``[B, 3, H, W]``.
        labels: float32 ``[B, label_width]``.
        indices: int64 ``[B]`` global record indices.
        owners: The allocator's owner objects, by field name.
        generation: How many times the slot has been (re)filled.
    """

    def __init__(self, slot_id: int, arrays: Dict[str, Tuple[np.ndarray, Any]]) -> None:
        self.id = slot_id
        self.images, self.labels, self.indices = (arrays[k][0] for k in ("images", "labels", "indices"))
        self.owners = {k: v[1] for k, v in arrays.items()}
        self.generation = 0
        self.fences: List[Any] = []


class Batch:
    """A batch yielded by the loader: views into a ring slot (see the module's ownership rule).

    Attributes:
        images: uint8 images, ``size`` rows.
        labels: float32 ``[size, label_width]``.
        indices: int64 ``[size]`` global record indices (after bad-record substitution).
        slot: Ring slot id, or -1 for a detached copy.
        epoch: Epoch the batch belongs to.
        number: Batch number inside the epoch (for this rank).
        owners: Allocator owners of the slot's full buffers (slice ``[:size]`` for this batch).
    """

    __slots__ = ("images", "labels", "indices", "slot", "epoch", "number", "owners", "_ring", "_generation", "__weakref__")

    def __init__(self, images: np.ndarray, labels: np.ndarray, indices: np.ndarray, *, slot: int, epoch: int,
                 number: int, owners: Optional[Dict[str, Any]] = None, ring: "Optional[BatchRing]" = None,
                 generation: int = 0) -> None:
        self.images, self.labels, self.indices = images, labels, indices
        self.slot, self.epoch, self.number = slot, epoch, number
        self.owners = owners or {}
        self._ring, self._generation = ring, generation

    @property
    def size(self) -> int:
        """Samples in this batch (smaller than the batch size only for a final partial batch)."""
        return int(self.indices.shape[0])

    @property
    def intact(self) -> bool:
        """True while the slot still holds this batch (always True for a copy)."""
        return self._ring is None or self._ring.slot_generation(self.slot) == self._generation

    def add_fence(self, fence: Any) -> None:
        """Keep the slot from being refilled until ``fence.query()`` is True (e.g. a CUDA event)."""
        if self._ring is not None:
            self._ring.add_fence(self.slot, fence, self._generation)

    def release(self) -> None:
        """Give the slot back early; the arrays must not be used afterwards. Idempotent."""
        if self._ring is not None:
            self._ring.release(self.slot, self._generation)

    def copy(self) -> "Batch":
        """A detached copy in fresh numpy memory that stays valid forever."""
        return Batch(self.images.copy(), self.labels.copy(), self.indices.copy(), slot=-1,
                     epoch=self.epoch, number=self.number)

    def __repr__(self) -> str:
        return (f"Batch(size={self.size}, images={self.images.shape}, epoch={self.epoch}, "
                f"number={self.number}, slot={self.slot})")


class BatchRing:
    """A fixed set of batch slots shared by one producer and one consumer.

    The producer calls :meth:`acquire` (blocks while every slot is held or fenced) and fills the
    slot; the consumer calls :meth:`consumed` for each batch it takes, which releases the batch taken
    ``HELD_BATCHES`` steps earlier (the ownership rule).

    Args:
        num_slots: Number of slots (the loader uses ``prefetch + HELD_BATCHES``).
        batch_size: Rows per slot.
        image_size: ``(height, width)`` of the output images.
        layout: ``Layout.NCHW`` or ``Layout.NHWC``.
        label_width: Labels per sample.
        allocator: ``allocator(shape, dtype) -> (numpy_view, owner)``; numpy when None.
    """

    def __init__(self, *, num_slots: int, batch_size: int, image_size: Tuple[int, int], layout: Layout,
                 label_width: int, allocator: Optional[Allocator] = None) -> None:
        if num_slots < HELD_BATCHES + 1:
            raise ValueError(f"num_slots={num_slots} must be >= {HELD_BATCHES + 1}")
        allocator = allocator or numpy_allocator
        h, w = image_size
        layout = Layout(layout)
        image_shape = (batch_size, 3, h, w) if layout is Layout.NCHW else (batch_size, h, w, 3)
        self.layout = layout
        self.batch_size = batch_size
        self.slots: List[Slot] = []
        for i in range(num_slots):
            arrays = {
                "images": _allocate(allocator, image_shape, np.uint8),
                "labels": _allocate(allocator, (batch_size, label_width), np.float32),
                "indices": _allocate(allocator, (batch_size,), np.int64),
            }
            self.slots.append(Slot(i, arrays))
        self._cond = threading.Condition()
        # FIFO of free slots so every slot is reused in turn (a just-released slot waits longest,
        # which gives its fences the most time to complete).
        self._free: Deque[int] = collections.deque(range(num_slots))
        self._held: Deque[Tuple[int, int]] = collections.deque()
        self._closed = False

    @property
    def nbytes(self) -> int:
        """Bytes held by all slots."""
        return sum(s.images.nbytes + s.labels.nbytes + s.indices.nbytes for s in self.slots)

    def slot_generation(self, slot_id: int) -> int:
        return self.slots[slot_id].generation

    def acquire(self, stop: threading.Event, poll: float = 0.05) -> Optional[Slot]:
        """Wait for a free slot whose fences have completed; None when ``stop`` is set or closed.

        The returned slot's generation is already advanced: batches previously made from it are no
        longer :attr:`Batch.intact`.
        """
        with self._cond:
            while not self._free:
                if stop.is_set() or self._closed:
                    return None
                self._cond.wait(poll)
            if stop.is_set() or self._closed:
                return None
            slot = self.slots[self._free.popleft()]
        # Device copies still reading the slot: poll (never block) so stop and close stay prompt.
        while True:
            with self._cond:
                slot.fences = [f for f in slot.fences if not f.query()]
                if not slot.fences:
                    slot.generation += 1
                    return slot
            if stop.is_set() or self._closed:
                self._put_back(slot)
                return None
            time.sleep(0.0002)

    def _put_back(self, slot: Slot) -> None:
        with self._cond:
            self._free.appendleft(slot.id)
            self._cond.notify_all()

    def unused(self, slot: Slot) -> None:
        """Return a slot the producer acquired but did not hand out."""
        self._put_back(slot)

    def add_fence(self, slot_id: int, fence: Any, generation: Optional[int] = None) -> None:
        """Keep ``slot_id`` from being refilled until ``fence.query()`` is True.

        With ``generation``, the fence is dropped when the slot has already moved on (the batch it
        was meant for is gone, so there is nothing left to protect).
        """
        with self._cond:
            slot = self.slots[slot_id]
            if generation is None or slot.generation == generation:
                slot.fences.append(fence)

    def consumed(self, slot_id: int, generation: int) -> None:
        """Record that the consumer took the batch in ``slot_id``; releases the one ``HELD_BATCHES`` back."""
        with self._cond:
            self._held.append((slot_id, generation))
            while len(self._held) > HELD_BATCHES:
                self._release_locked(*self._held.popleft())

    def release(self, slot_id: int, generation: int) -> None:
        """Release one handed-out batch now (idempotent: a stale or repeated release is ignored)."""
        with self._cond:
            try:
                self._held.remove((slot_id, generation))
            except ValueError:
                return
            self._release_locked(slot_id, generation)

    def _release_locked(self, slot_id: int, generation: int) -> None:
        if self.slots[slot_id].generation == generation and slot_id not in self._free:
            self._free.append(slot_id)
            self._cond.notify_all()

    def release_all(self) -> None:
        """Release every held batch (the iterator that took them has ended)."""
        with self._cond:
            while self._held:
                self._release_locked(*self._held.popleft())

    def reset(self) -> None:
        """Make every slot free again (a new iterator starts; fences are kept)."""
        with self._cond:
            self._held.clear()
            self._free = collections.deque(range(len(self.slots)))
            self._closed = False
            self._cond.notify_all()

    def close(self) -> None:
        """Wake and refuse any waiting :meth:`acquire`. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _allocate(allocator: Allocator, shape: Tuple[int, ...], dtype) -> Tuple[np.ndarray, Any]:
    view, owner = allocator(tuple(shape), np.dtype(dtype))
    if not isinstance(view, np.ndarray) or view.shape != tuple(shape) or view.dtype != np.dtype(dtype):
        raise ValueError(f"allocator returned {getattr(view, 'shape', type(view))} "
                         f"{getattr(view, 'dtype', '')}, expected a numpy array {shape} {np.dtype(dtype)}")
    if not view.flags.c_contiguous or not view.flags.writeable:
        raise ValueError(f"allocator returned a non-contiguous or read-only array for {shape}")
    return view, owner
