"""Device stage (torch), iteration: one pass of a DataLoader on the engine, delivered as torch would.

The sampler's index batches are fed to the engine's Loader; each decoded batch reaches the caller
collated as torch's ``default_collate`` (or timm's ``fast_collate``) would build it, zero-copy from the
ring (:mod:`fastload.torch.collate`), or as the samples a custom ``collate_fn`` receives after the
per-sample ops the compiler left; with ``num_workers >= 2`` that function runs in forked processes,
several batches in flight (:mod:`fastload.torch.collate_procs`).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from collections import deque
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from fastload.batch import Batch
from fastload.errors import LoaderClosed
from fastload.stats import Stage
from fastload.torch.collate import Collation, classify_collate
from fastload.torch.collate_procs import CollateProcesses
from fastload.torch.compile import Plan
from fastload.torch.placement import Placement
from fastload.torch.planning import _EnginePlanning
from fastload.torch.sampler import IndexFeed
from fastload.torch.state import _generators, _load_generator_states, _sampler_states, _WorkerLike

_MASK63 = (1 << 63) - 1
_IN_PROCESS = object()  # a queued batch whose value a collate process computes
_FORK = "fork" in multiprocessing.get_all_start_methods()  # the collate processes are forked
_AFFINITY = hasattr(os, "sched_getaffinity")


class _FastIterator:
    """One pass of a :class:`DataLoader` on the engine (what ``iter(loader)`` returns)."""

    def __init__(self, loader: _EnginePlanning, plan: Plan) -> None:
        # The iterator never refers to its DataLoader (which refers to it as its last pass): no cycle,
        # so a dropped loader and its decode thread go at once. It keeps what it needs instead.
        self._holder = SimpleNamespace(
            generator=loader.generator, sampler=loader.sampler, batch_sampler=loader.batch_sampler
        )
        self._index_sampler = loader._index_sampler
        self._collate_fn, self._num_workers = loader.collate_fn, loader.num_workers
        self._timeout, self._copy = loader.timeout, loader.copy
        self._warned = loader._warned_plans
        self.plan = plan
        self.finished = False
        self._closed = False
        # torch's _BaseDataLoaderIter.__init__: the pin_memory warnings, then the sampler iterator,
        # then the base seed.
        if loader.pin_memory and loader.pin_memory_device:
            warnings.warn(
                "pin_memory_device is deprecated, the current accelerator will be used as the device,"
                f"ignore pin_memory_device='{loader.pin_memory_device}'.",
                stacklevel=3,
            )
        if loader.pin_memory and not torch.accelerator.is_available():
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, "
                "then device pinned memory won't be used.",
                stacklevel=3,
            )
        self._pin = loader.pin_memory and torch.accelerator.is_available()
        if loader.num_workers > 0 and loader.prefetch_factor is not None and loader.prefetch_factor <= 0:
            raise ValueError("prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter")
        self._auto_collation = loader._auto_collation
        self._sampler_iter = iter(loader._index_sampler)
        resume = loader._resume
        loader._resume = None
        self._resume = resume
        if resume is None:
            self.base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item())
            self.iteration, epoch = loader._begin_pass()
        else:
            self.base_seed = int(resume["base_seed"])
            self.iteration, epoch = int(resume["iteration"]), int(resume["epoch"])
            loader._next_epoch = self.iteration + 1
        self.epoch = epoch
        source = loader._source
        assert source is not None  # the fast path runs on a Source
        self._source = source
        self._index_map = source.index_map
        self._num_records = len(source.records)
        self._dataset_len = len(self._index_map) if self._index_map is not None else self._num_records
        transform_ok = plan.is_tensor and not plan.rest
        self._target_transform = source.target_transform
        collation = classify_collate(loader.collate_fn, uint8_images=not plan.is_float)
        if not (self._auto_collation and transform_ok and self._target_transform is None):
            collation = Collation("samples", collation.note)
        self._collation = collation
        self._fast_collate = collation.zero_copy
        placement = loader._placement_args
        if placement["targets"] is not None and not self._fast_collate:
            raise ValueError(
                "device= / devices= need the default collate_fn (or timm's fast_collate), no target_transform "
                f"and a transform the engine runs whole (this pass: {plan.describe()})"
            )
        channels_last = placement["memory_format"] == torch.channels_last
        # Per-sample ops on PIL images want contiguous HWC rows; channels-last output is NHWC too.
        layout = "NHWC" if (plan.kind == "pil" or channels_last) else "NCHW"
        self._layout = layout
        capacity = getattr(loader.batch_sampler, "batch_size", None) if self._auto_collation else 1
        if not isinstance(capacity, int) or capacity < 1:
            capacity = loader.batch_size if isinstance(loader.batch_size, int) and loader.batch_size > 0 else 256
        self._capacity = capacity
        self._core = loader._core_loader(plan, capacity, layout)
        self._convert = plan.engine_transform()[1] if plan.is_float else None
        if placement["targets"] is not None:
            self._convert = None  # converted on each device after the copy (Placement)
        self._placement = (
            Placement(
                placement["targets"],
                single=placement["single"],
                convert=placement["convert"],
                memory_format=placement["memory_format"],
            )
            if placement["targets"]
            else None
        )
        self._feed = IndexFeed()
        seed, aug_epoch = (self.base_seed & _MASK63, 0) if loader.seed is None else (loader.seed, epoch)
        self._batches = self._core.iterate_batches(
            self._feed.batches, seed=seed, epoch=aug_epoch, timeout=loader.timeout if loader.timeout else None
        )
        # Per sampler batch not yet handed out, in order: (engine batches it was cut into, its samples).
        self._parts: list[tuple[int, int]] = []
        self._pulled = 0
        self._sampler_done = False
        self.taken = 0
        self.samples = 0  # samples of the batches handed out in this pass (OrderSampler positions)
        self.snapshot: dict[str, Any] | None = None
        self._ahead = loader.prefetch + 1
        self._multi_label = source.multi_label
        self._t_rest = 0.0
        self._warn_pending = bool(plan.rest)
        self._superseded: bool = False
        self._prefetch_factor = loader.prefetch_factor
        self._job = _SamplesJob(
            plan, loader.collate_fn, self._target_transform, self._auto_collation, self._multi_label
        )
        # A custom collate function runs in forked processes, as torch's workers run it
        # (fastload.torch.collate_procs): on the caller's thread it is one batch at a time. No more
        # processes than cores: beyond them they only take turns with the decode threads.
        self._nprocs = min(self._num_workers, len(os.sched_getaffinity(0)) if _AFFINITY else os.cpu_count() or 1)
        self._use_procs = (
            not self._fast_collate
            and self._nprocs >= 2
            and plan.kind != "pil"
            and not plan.rest
            and collation.note is None
            and layout == "NCHW"
            and _FORK
        )
        self._procs: CollateProcesses | None = None
        self._queue: deque[tuple[Any, int]] = deque()  # (collated value or _IN_PROCESS, samples), in order
        self._drained = False

    def prime(self) -> None:
        """Pull the first index batches where torch's iterator does, at ``iter()``.

        The DataLoader calls it once this pass is its current one.
        """
        if self._num_workers > 0:
            # torch's multi-process iterator primes prefetch_factor batches per worker at iter().
            self._pull(max(self._ahead, (self._prefetch_factor or 2) * self._num_workers))

    # --- the sampler side (caller's thread) -------------------------------------------------

    def _snapshot(self) -> dict[str, Any]:
        return {
            "default": torch.get_rng_state(),
            "generators": [g.get_state() for g in _generators(self._holder)],
            "samplers": _sampler_states(self._holder),
        }

    def _next_indices(self) -> NDArray[np.int64] | None:
        try:
            item = next(self._sampler_iter)
        except StopIteration:
            return None
        return self._check_indices(item)

    def _check_indices(self, item: Any) -> NDArray[np.int64]:
        if self._auto_collation:
            idx = np.asarray(item if not isinstance(item, torch.Tensor) else item.numpy())
            idx = idx.reshape(-1)
        else:
            idx = np.asarray([int(item)])
        floating = np.issubdtype(idx.dtype, np.floating) or idx.dtype == object
        if idx.size and not np.issubdtype(idx.dtype, np.integer) and floating:
            idx = np.asarray([int(i) for i in idx.tolist()])
        idx = idx.astype(np.int64, copy=False)
        n = self._dataset_len
        idx = np.where(idx < 0, idx + n, idx)  # negative indices count from the end, as list indexing
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"the sampler yielded index {bad}, out of range for a dataset of {n} samples")
        return idx if self._index_map is None else self._index_map[idx]

    def _start(self) -> None:
        """First draw from the sampler: remember the states it starts from (for state_dict)."""
        resume = self._resume
        if resume is None or "snapshot" not in resume:
            # A fresh pass, or an OrderSampler's position: the sampler itself starts where it was.
            self.snapshot = self._snapshot()
            return
        snap = resume["snapshot"]
        self.snapshot = snap
        user_default = torch.get_rng_state()
        torch.set_rng_state(snap["default"])
        _load_generator_states(self._holder, snap["generators"])
        try:
            # Replay the batches already handed out before the interruption, without decoding them.
            for _ in range(int(resume["batches"])):
                if self._next_indices() is None:
                    break
                self.taken += 1
        finally:
            torch.set_rng_state(user_default)

    def _pull(self, count: int) -> None:
        for _ in range(count):
            if self._sampler_done:
                return
            if self.snapshot is None:
                self._start()
            idx = self._next_indices()
            if idx is None:
                self._sampler_done = True
                self._feed.finish()
                return
            if len(idx) == 0:
                raise ValueError("the batch sampler yielded an empty batch")
            # A batch larger than the ring's slots goes through in slot-sized parts, joined again on
            # the way out (a copy).
            parts = [idx[lo : lo + self._capacity] for lo in range(0, len(idx), self._capacity)]
            for part in parts:
                self._feed.put(part)
            self._parts.append((len(parts), len(idx)))
            self._pulled += 1

    # --- the batch side -------------------------------------------------------------------

    def __iter__(self) -> _FastIterator:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self) -> Any:
        if self._superseded and not self.finished:
            raise RuntimeError(
                "this DataLoader iterator was superseded by a newer iter() of the same "
                "fastload.torch.DataLoader, which runs one pass at a time"
            )
        if self._core.closed:
            raise LoaderClosed("the DataLoader is closed")
        if self._closed or self.finished:
            raise StopIteration
        if self._use_procs:
            return self._next_from_procs()
        taken = self._take()
        assert taken is not None
        batches, samples = taken
        self.taken += 1
        self.samples += samples
        try:
            out = self._deliver(batches)
        except BaseException:
            self.close()
            raise
        return out

    def _take(self, end: bool = True) -> tuple[list[Batch], int] | None:
        """The engine batches of the next sampler batch and its sample count.

        At the end of the pass: StopIteration, or None where ``end`` is False (batches still in flight).
        """
        try:
            self._pull(self._ahead if self._pulled == 0 else 1)
        except BaseException:  # the sampler's own error (a bad index, ...): the pass ends with it
            self.close()
            raise
        if not self._parts:
            if not end:
                return None
            self._finish()
            raise StopIteration
        nparts, samples = self._parts.pop(0)
        timeout = self._timeout
        batches = []
        try:
            for _ in range(nparts):
                batches.append(next(self._batches))
        except TimeoutError:
            self.close()
            raise RuntimeError(f"DataLoader timed out after {timeout} seconds") from None
        except StopIteration:
            self._finish()
            if self._core.closed:
                raise LoaderClosed("the DataLoader was closed while this thread waited for a batch") from None
            if self._closed:  # this pass was closed from another thread
                raise
            raise RuntimeError("the loader ended before the sampler's batches were decoded") from None
        except BaseException:
            self.close()
            raise
        return batches, samples

    def _next_from_procs(self) -> Any:
        """The next batch, its collate function run in a process (:mod:`fastload.torch.collate_procs`)."""
        queue = self._queue
        while len(queue) < self._nprocs + 1 and not self._drained:
            taken = self._take(end=False)
            if taken is None:
                self._drained = True
                break
            batches, samples = taken
            seed = (self.base_seed + self.taken + len(queue) + 1) & _MASK63
            try:
                images, targets = self._collate_inputs(batches)
                del batches  # the ring slot goes back now: the images are copied below
                procs = self._procs
                if procs is None:
                    procs = CollateProcesses(self._job, images, self._capacity, self._nprocs)
                    self._procs = procs
                if procs.fits(images):
                    procs.submit(images, targets, seed)
                    queue.append((_IN_PROCESS, samples))
                else:  # a batch larger than the buffers (cut into ring-sized parts): here, in order
                    queue.append((self._job(images, targets, seed), samples))
            except BrokenProcessPool as exc:  # a process died before this batch was handed to one
                self.close()
                raise _collate_process_died() from exc
            except BaseException:
                self.close()
                raise
        if not queue:
            self._finish()
            raise StopIteration
        value, samples = queue.popleft()
        try:
            if value is _IN_PROCESS:
                assert self._procs is not None
                value = self._procs.result(self._timeout if self._timeout else None)
        except TimeoutError:  # torch's error for a batch that took longer than ``timeout``
            self.close()
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None
        except BrokenProcessPool as exc:  # a process died (killed, out of memory): the pass ends
            self.close()
            raise _collate_process_died() from exc
        except BaseException:
            self.close()
            raise
        self.taken += 1
        self.samples += samples
        return _pin(value) if self._pin else value

    def _collate_inputs(self, batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self._tensors(batches)
        if self._convert is not None:
            images = self._convert(images)
        return images, labels if self._multi_label else labels[:, 0].to(torch.int64)

    def _deliver(self, batches: list[Batch]) -> Any:
        images, labels = self._tensors(batches)
        if self._convert is not None:
            images = self._convert(images)
        if self._copy and images.dtype == torch.uint8 and self._placement is None:
            images = images.clone()
        targets = labels if self._multi_label else labels[:, 0].to(torch.int64)
        if self._fast_collate:
            if self._placement is not None:
                core = self._core
                with core.timer.span(Stage.COPY, batch=batches[0].number):
                    placed = self._placement.place(
                        images, targets, batches[0].add_fence if len(batches) == 1 else (lambda fence: None)
                    )
                if isinstance(placed, list):
                    return [self._collation.build(*p) for p in placed]
                return self._collation.build(*placed)
            out = self._collation.build(images, targets)
            return _pin(out) if self._pin else out
        out = self._samples_collated(images, targets)
        return _pin(out) if self._pin else out

    def _tensors(self, batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        if len(batches) == 1:
            b = batches[0]
            images = torch.from_numpy(b.images)
            labels = torch.from_numpy(b.labels)
        else:
            images = torch.from_numpy(np.concatenate([b.images for b in batches]))
            labels = torch.from_numpy(np.concatenate([b.labels for b in batches]))
        if self._layout == "NHWC" and self.plan.kind != "pil":
            images = images.permute(0, 3, 1, 2)  # channels-last strides, no data movement
        return images, labels

    def _samples_collated(self, images: torch.Tensor, targets: torch.Tensor) -> Any:
        plan = self.plan
        n = images.shape[0]
        rng = _WorkerLike((self.base_seed + self.taken) & _MASK63) if self._num_workers > 0 else None
        t0 = time.perf_counter()
        if rng is not None:
            rng.__enter__()
        try:
            out = self._job.collate(images, targets)
        finally:
            if rng is not None:
                rng.__exit__(None, None, None)
        seconds = time.perf_counter() - t0
        note = self._collation.note
        if note is not None and ("collate", note) not in self._warned:
            self._warned.add(("collate", note))
            warnings.warn(
                f"fastload: {note}: {seconds * 1e3:.1f} ms in Python for this batch of {n}",
                UserWarning,
                stacklevel=4,
            )
        if self._warn_pending:
            self._warn_pending = False
            key = ("rest", plan.describe())
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(
                    f"fastload: {plan.stop}; it and the ops after it run per sample in Python on the "
                    f"calling thread, outside the engine: {seconds * 1e3:.1f} ms for this batch of {n} "
                    f"({seconds / max(n, 1) * 1e6:.0f} us per sample) on top of the engine's decode. "
                    f"Plan: {plan.describe()}",
                    UserWarning,
                    stacklevel=4,
                )
        return out

    def _finish(self) -> None:
        self.finished = True
        self._closed = True
        self._close_procs()

    def _close_procs(self) -> None:
        self._queue.clear()
        if self._procs is not None:
            self._procs.close()
            self._procs = None

    @property
    def handed_all(self) -> bool:
        """Every batch the sampler yields in this pass was handed out (the pass may not know it yet)."""
        return self.finished or (self._sampler_done and not self._parts and not self._queue)

    def close(self) -> None:
        """Stop this pass (idempotent); held batches stay valid."""
        if self._closed:
            return
        self._closed = True
        self._close_procs()
        self._feed.finish()
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class _SamplesJob:
    """A batch as the samples a custom ``collate_fn`` receives, and the function's value of them.

    Holds no reference to the iterator: the collate processes keep it for the pass.
    """

    plan: Plan
    collate_fn: Any
    target_transform: Any
    auto_collation: bool
    multi_label: bool

    def collate(self, images: torch.Tensor, targets: torch.Tensor) -> Any:
        plan = self.plan
        n = images.shape[0]
        if plan.kind == "pil":
            from PIL import Image

            arr = images.numpy()
            pics: list[Any] = [Image.fromarray(arr[i]) for i in range(n)]
        elif plan.as_numpy:  # timm's ToNumpy: CHW uint8 arrays
            pics = [p.numpy() for p in images.unbind(0)]
        else:
            pics = list(images.unbind(0))
            if plan.tv_image:
                from torchvision import tv_tensors

                pics = [tv_tensors.Image(p) for p in pics]
        tgts: list[Any] = list(targets.unbind(0)) if self.multi_label else targets.tolist()
        if plan.rest:
            pics = [_apply(plan.rest, p) for p in pics]
        if self.target_transform is not None:
            tgts = [self.target_transform(t) for t in tgts]
        samples: list[Any] = list(zip(pics, tgts, strict=False))
        return self.collate_fn(samples) if self.auto_collation else self.collate_fn(samples[0])

    def __call__(self, images: torch.Tensor, targets: torch.Tensor, seed: int) -> Any:
        """:meth:`collate` as a torch worker runs it: RNGs seeded with ``seed``, one intra-op thread."""
        with _WorkerLike(seed):
            return self.collate(images, targets)


def _collate_process_died() -> RuntimeError:
    return RuntimeError("a collate process of the DataLoader exited unexpectedly (killed, or out of memory?)")


def _apply(ops: Sequence[Any], sample: Any) -> Any:
    for op in ops:
        sample = op(sample)
    return sample


def _pin(data: Any) -> Any:
    from torch.utils.data._utils.pin_memory import pin_memory

    acc = torch.accelerator.current_accelerator()
    # torch's pin_memory helper (a private module of torch.utils.data) has no annotations.
    return pin_memory(data, acc.type if acc is not None else None)  # type: ignore[no-untyped-call]
