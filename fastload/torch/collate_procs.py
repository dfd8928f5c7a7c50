"""Device stage (torch): a custom ``collate_fn`` run in forked processes, as torch's workers run it.

The engine decodes and augments a whole batch in C++ on its threads; what is left of a batch with a
custom ``collate_fn`` (torchvision's reference ``mixup_cutmix(*default_collate(batch))``, timm's
``FastCollateMixup``, any function of the samples) is Python and batch-sized torch ops. On the
caller's thread that is one batch at a time, whatever the thread count: measured on torchvision's
reference recipe (224 px float batches of 64, MixUp / CutMix), 140-170 ms per batch, two thirds of it
the page faults of the fresh 38.5 MB tensors ``torch.stack`` / ``roll`` / ``mul`` / ``clone`` allocate,
which is a cap of 400-800 img/s on any machine. torch's DataLoader runs the collate function in its
``num_workers`` processes; so does this stage, for the batches of a pass with ``num_workers >= 2``
(``min(num_workers, cores)`` processes: more only take turns with the decode threads):

- the processes are forked at the pass's first batch (the function is never pickled: closures work,
  as with torch's fork workers); the parent's garbage is collected just before the fork, so no
  unreachable object of the parent (a dropped batch, the engine's) is finalized in a child;
- each batch's images are copied once into one of ``depth`` input buffers, anonymous shared memory
  mapped before the fork (no ``/dev/shm`` file, no file descriptor per batch); the targets go by
  value. The child builds the samples (views of the buffer) and runs the function under
  :class:`~fastload.torch.state._WorkerLike` seeded with the batch's ordinal: the seed the caller's
  thread would use, so the same values;
- the result's contiguous plain tensors of 1 MiB or more are copied into an output buffer of the same kind (its pages
  faulted in once a pass: a copy, where torch's shared-memory pickling of a fresh tensor costs a new mapping and
  its page faults, as much as the collate's own ``torch.stack``) and handed out as views of it; the
  buffer is reused once every tensor viewing it is gone. With every output buffer still held, the
  result goes through torch's pickling; smaller tensors and other values always do;
- results come back in order; a child's error is raised at its batch, with the child's traceback.

Side effects of the function happen in the children, as with torch's workers (a list it appends to
stays empty in the caller).
"""

from __future__ import annotations

import gc
import itertools
import mmap
import multiprocessing
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.multiprocessing  # registers the shared-memory reductions of tensors
from numpy.typing import NDArray

__all__ = ["CollateProcesses"]

Job = Callable[[torch.Tensor, torch.Tensor, int], Any]
_PLACED_MIN = 1 << 20  # result tensors from this size on go through an output buffer


class _Buffer:
    """Anonymous shared memory, mapped before the fork: parent and children share its pages."""

    def __init__(self, nbytes: int) -> None:
        self.map = mmap.mmap(-1, max(nbytes, 1))
        self.nbytes = nbytes
        self.address = np.frombuffer(self.map, np.uint8).ctypes.data

    def tensor(self, dtype: torch.dtype, shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
        count = int(np.prod(shape, dtype=np.int64))
        return torch.frombuffer(self.map, dtype=dtype, count=count, offset=offset).view(shape)

    def holds(self, t: torch.Tensor) -> bool:
        return self.address <= t.untyped_storage().data_ptr() < self.address + self.nbytes


# The children look their job, buffers and image shape up here: entries made before the fork, inherited.
_JOBS: dict[int, tuple[Job, list[_Buffer], list[_Buffer], tuple[tuple[int, ...], torch.dtype]]] = {}
_KEYS = itertools.count()


class _Placed(NamedTuple):
    """A result tensor the child wrote into an output buffer."""

    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    cls: type


def _child_init() -> None:
    torch.set_num_threads(1)


def _walk(obj: Any, fn: Callable[[Any], Any], leaf: type) -> Any:
    if isinstance(obj, leaf):
        return fn(obj)
    if isinstance(obj, list):
        return [_walk(o, fn, leaf) for o in obj]
    if isinstance(obj, tuple):
        items = [_walk(o, fn, leaf) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, dict):
        return type(obj)((k, _walk(v, fn, leaf)) for k, v in obj.items())
    return obj


def _placeable(t: torch.Tensor) -> bool:
    """A tensor the output buffer carries as it is: dense, contiguous, no autograd, no metadata."""
    return (
        t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.is_quantized
        and not t.requires_grad
        and not t.is_conj()
        and not t.is_neg()
        and t.is_contiguous()
        and not t.__dict__  # tv_tensors' BoundingBoxes / KeyPoints keep their format and size here
    )


def _like(copy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    if type(t) is torch.Tensor:
        return copy
    out = copy.as_subclass(type(t))
    out.__dict__.update(t.__dict__)
    return out


def _child_run(key: int, slot: int, n: int, targets: NDArray[Any], seed: int, out_slot: int) -> Any:
    job, inputs, outputs, (shape, dtype) = _JOBS[key]
    source = inputs[slot]
    result = job(source.tensor(dtype, (n, *shape)), torch.from_numpy(targets), seed)
    out = outputs[out_slot] if out_slot >= 0 else None
    used = 0

    def place(t: torch.Tensor) -> Any:
        nonlocal used
        nbytes = t.numel() * t.element_size()
        if out is not None and nbytes >= _PLACED_MIN and used + nbytes <= out.nbytes and _placeable(t):
            out.tensor(t.dtype, tuple(t.shape), used).copy_(t)
            placed = _Placed(used, tuple(t.shape), t.dtype, type(t))
            used += (nbytes + 63) // 64 * 64
            return placed
        if source.holds(t):  # a view of the input buffer, which is refilled
            return _like(t.clone(), t)
        return t

    return _walk(result, place, torch.Tensor)


class CollateProcesses:
    """``workers`` forked processes running ``job(images, targets, seed)``, ``depth`` batches in flight."""

    def __init__(self, job: Job, example: torch.Tensor, rows: int, workers: int) -> None:
        self.depth = workers + 1
        self.rows = rows
        self.shape, self.dtype = tuple(example.shape[1:]), example.dtype
        nbytes = rows * int(np.prod(self.shape, dtype=np.int64)) * example.element_size()
        # Mapped before the fork: the children share these pages.
        self._inputs = [_Buffer(nbytes) for _ in range(self.depth)]
        self._outputs = [_Buffer(nbytes) for _ in range(self.depth + 2)]
        self._key = next(_KEYS)
        _JOBS[self._key] = (job, self._inputs, self._outputs, (self.shape, self.dtype))
        self._free = deque(range(self.depth))
        self._lock = threading.Lock()  # output buffers come back on whichever thread drops their last view
        self._out_free = deque(range(len(self._outputs)))
        self._inflight: deque[tuple[Future[Any], int, int]] = deque()
        self._pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("fork"), initializer=_child_init
        )
        self._started = False

    def fits(self, images: torch.Tensor) -> bool:
        return images.shape[0] <= self.rows and tuple(images.shape[1:]) == self.shape and images.dtype == self.dtype

    def submit(self, images: torch.Tensor, targets: torch.Tensor, seed: int) -> None:
        slot = self._free.popleft()
        n = images.shape[0]
        self._inputs[slot].tensor(self.dtype, (n, *self.shape)).copy_(images)
        with self._lock:
            out_slot = self._out_free.popleft() if self._out_free else -1
        labels = targets.numpy()
        if self._started:
            future = self._pool.submit(_child_run, self._key, slot, n, labels, seed, out_slot)
        else:
            gc.collect()  # before the fork: nothing the parent dropped is left for a child to finalize
            with warnings.catch_warnings():  # the fork of a process whose engine threads run
                warnings.simplefilter("ignore", DeprecationWarning)
                future = self._pool.submit(_child_run, self._key, slot, n, labels, seed, out_slot)
            self._started = True
        self._inflight.append((future, slot, out_slot))

    def result(self, timeout: float | None) -> Any:
        """The oldest batch's collated value (raises the child's error)."""
        future, slot, out_slot = self._inflight.popleft()
        try:
            value = future.result(timeout)
        except BaseException:
            self._release(out_slot)
            raise
        finally:
            self._free.append(slot)
        if out_slot < 0:
            return value
        out = self._outputs[out_slot]
        views: list[NDArray[np.uint8]] = []

        def unplace(p: _Placed) -> torch.Tensor:
            count = int(np.prod(p.shape, dtype=np.int64)) * p.dtype.itemsize
            owner = np.frombuffer(out.map, np.uint8, count=count, offset=p.offset)
            views.append(owner)
            t = torch.frombuffer(owner, dtype=p.dtype).view(p.shape)
            return t if p.cls is torch.Tensor else t.as_subclass(p.cls)

        value = _walk(value, unplace, _Placed)
        if not views:
            self._release(out_slot)
            return value
        pending = [len(views)]

        def gone() -> None:
            with self._lock:
                pending[0] -= 1
                if pending[0] == 0:
                    self._out_free.append(out_slot)

        for v in views:
            weakref.finalize(v, gone)
        return value

    def _release(self, out_slot: int) -> None:
        if out_slot >= 0:
            with self._lock:
                self._out_free.append(out_slot)

    def close(self) -> None:
        self._inflight.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        _JOBS.pop(self._key, None)
