"""The loader stage: ``Loader``, the framework-free face over the pipeline, driver and iterators."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fastload.batch import HELD_BATCHES, Allocator, BatchRing, ReleaseHook, image_fields
from fastload.loader.config import LoaderConfig, _positive_int
from fastload.loader.driver import _Driver, _Run
from fastload.loader.iterator import _EpochIterator
from fastload.loader.pipeline import _Pipeline
from fastload.order import EpochOrder, OrderSpec, Shuffle
from fastload.stats import LoaderStats, StageTimer

log = logging.getLogger("fastload.loader")

_STATE_VERSION = 1


class Loader:
    """Framework-free streaming loader over a dataset.

    Args:
        dataset: A dataset implementing the Records contract (``fastload.open_dataset``), or a path
            ``open_dataset`` accepts (fastload folder, ``.rec``, LMDB folder, unpacked ImageFolder);
            a dataset opened from a path is closed with the loader.
        config: :class:`LoaderConfig` (defaults when None).
        allocator: ``allocator(shape, dtype) -> (numpy_view, owner)`` for the ring's buffers
            (pinned memory from an adapter); numpy when None.
        decode: A callable with ``fastload.decode.decode_batch``'s signature (tests, other engines).
        range_hooks: ``(push(name), pop())`` called around each timed stage (NVTX ranges).
        release_hook: Called (on any thread) when a batch's last view dies; returns fences the slot
            must wait for before it is refilled (the torch adapter's CUDA events). It must not block.

    Example:
        >>> with Loader("train/", LoaderConfig(batch_size=256)) as loader:   # doctest: +SKIP
        ...     for batch in loader:
        ...         train_step(batch.images, batch.labels)
    """

    def __init__(
        self,
        dataset,
        config: LoaderConfig | None = None,
        allocator: Allocator | None = None,
        *,
        decode: Callable | None = None,
        range_hooks=None,
        release_hook: ReleaseHook | None = None,
    ) -> None:
        self.config = config = config if config is not None else LoaderConfig()
        if not isinstance(config, LoaderConfig):
            raise ValueError(f"config={config!r} must be a LoaderConfig")
        self._driver: _Driver | None = None  # until construction succeeds; keeps __del__ quiet
        self._owns_dataset = isinstance(dataset, (str, os.PathLike))
        if self._owns_dataset:
            from fastload.records.dataset import open_dataset

            dataset = open_dataset(dataset)
        try:
            self._build(dataset, config, allocator, decode, range_hooks, release_hook)
        except BaseException:
            if self._owns_dataset:
                dataset.close()
            raise

    def _build(self, dataset, config: LoaderConfig, allocator, decode, range_hooks, release_hook) -> None:
        self.dataset = dataset
        self._num_records = len(dataset)
        if self._num_records == 0:
            raise ValueError("the dataset has no records")
        self._labels = np.asarray(dataset.labels, dtype=np.float32)
        if self._labels.ndim == 1:
            self._labels = self._labels[:, None]
        if config.mix is not None and self._labels.shape[1] not in (1, config.mix.num_classes):
            raise ValueError(
                f"mix needs class indices or {config.mix.num_classes} probabilities per record; the dataset's "
                f"labels have {self._labels.shape[1]} values per record"
            )
        self.label_width = int(self._labels.shape[1]) if config.mix is None else int(config.mix.num_classes)
        self.order_spec = OrderSpec(
            num_records=self._num_records,
            batch_size=config.batch_size,
            shuffle=config.shuffle,
            seed=config.seed,
            rank=config.rank,
            world_size=config.world_size,
            even=config.even,
            drop_last=config.drop_last,
            block_size=config.block_size,
            window=config.window,
            shard_starts=getattr(dataset, "shard_starts", None) if config.shuffle is Shuffle.SHARD else None,
        )
        self._len = EpochOrder.batches_per_epoch(self.order_spec)
        if self._len == 0:
            raise ValueError(
                f"an epoch has no batches: {self._num_records} records, world_size={config.world_size}, "
                f"batch_size={config.batch_size}, drop_last=True"
            )
        fields = image_fields(
            batch_size=config.batch_size,
            image_size=config.transform.size,
            layout=config.layout,
            label_width=self.label_width,
            image_dtype=config.image_dtype,
        )
        self.ring = BatchRing(
            fields,
            num_slots=config.prefetch + HELD_BATCHES,
            allocator=allocator,
            max_extra_slots=config.max_extra_slots,
            release_hook=release_hook,
            ahead=config.prefetch,
        )
        self.timer = StageTimer(trace=config.trace_path is not None, range_hooks=range_hooks)
        # Everything the producer thread touches lives in the pipeline, which never refers back to
        # the Loader or the driver: a Loader the user drops is freed, and its __del__ stops the thread.
        pipeline = _Pipeline(dataset, config, self.order_spec, self._labels, self.ring, self.timer, decode)
        self._driver = _Driver(pipeline, self.ring, self.timer, self._len, copy=config.copy)

    # --- public API ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank (the same on every rank and every epoch)."""
        return self._len

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs (or the current one while iterating)."""
        return self._driver.current_epoch()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._driver.closed

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its first batch (ends this thread's running pass).

        Raises:
            LoaderBusy: Another thread is iterating the loader.
        """
        _positive_int(epoch, "epoch", 0)
        self._driver.seek(int(epoch), 0, "set the epoch")

    def __iter__(self) -> _EpochIterator:
        """Start a pass over the current epoch (see the module docstring for the thread rule).

        Raises:
            LoaderClosed: The loader is closed.
            LoaderBusy: Another thread is iterating the loader.
        """
        return _EpochIterator(self, self._driver, self._driver.begin_pass())

    def iterate_batches(
        self,
        batches: Callable[[threading.Event], Iterator[np.ndarray]],
        *,
        seed: int,
        epoch: int,
        timeout: float | None = None,
    ) -> _EpochIterator:
        """One pass over batches chosen by the caller (a sampler's) instead of the loader's own order.

        Args:
            batches: ``batches(stop)`` runs on the producer thread and yields int64 arrays of record
                indices, at most ``config.batch_size`` each; it must return promptly once ``stop`` is
                set (the torch adapter feeds it from the consumer's thread through a queue).
            seed: Seed of this pass's per-sample randomness, keyed ``(seed, epoch, index)``.
            epoch: Epoch of this pass's per-sample randomness.
            timeout: Seconds a ``next()`` waits for a batch at most (``TimeoutError`` after that).

        Returns:
            An iterator of :class:`~fastload.batch.Batch` ending after the last batch ``batches``
            yields. It ends this thread's open pass; the loader's own position (``state_dict``,
            ``set_epoch``) does not move.

        Raises:
            LoaderClosed: The loader is closed.
            LoaderBusy: Another thread is iterating the loader.
        """
        _positive_int(seed, "seed", 0)
        _positive_int(epoch, "epoch", 0)
        driver = self._driver
        return _EpochIterator(self, driver, driver.begin_pass(feed=(batches, int(seed), int(epoch)), timeout=timeout))

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed to the consumer, plus the order's fingerprint."""
        epoch, batch = self._driver.position()
        if batch >= self._len:
            epoch, batch = epoch + 1, 0
        return {"version": _STATE_VERSION, "epoch": int(epoch), "batch": int(batch), **self._fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``: the next iteration starts with the batch after the saved position.

        Raises:
            ValueError: When the state comes from a loader whose order differs (seed, shuffle,
                batch size, dataset size, ranks, padding).
            LoaderBusy: Another thread is iterating the loader.
        """
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a fastload loader state (version {_STATE_VERSION}): {state!r}")
        mine = self._fingerprint()
        diff = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: saved {a!r} != now {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"the saved loader state does not match this loader's order ({detail})")
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if epoch < 0 or not 0 <= batch <= self._len:
            raise ValueError(f"invalid position epoch={epoch} batch={batch} (epoch has {self._len} batches)")
        if batch == self._len:
            epoch, batch = epoch + 1, 0
        self._driver.seek(epoch, batch, "load a state")

    def stats(self) -> LoaderStats:
        """Per-stage times, images/s and the input-bound fraction since construction (or reset).

        Also the ring's size and what keeping batches cost (``ring_slots``, ``fresh_batches``,
        ``gc_runs``).
        """
        ring = self.ring
        return dataclasses.replace(
            self.timer.snapshot(), ring_slots=len(ring.slots), fresh_batches=ring.fresh_batches, gc_runs=ring.gc_runs
        )

    def reset_stats(self) -> None:
        """Zero the counters (e.g. after a warm-up epoch)."""
        self.timer.reset()

    def save_trace(self, path: str | None = None) -> str:
        """Write the Chrome-trace JSON of the stages (needs ``trace_path`` set in the config)."""
        if not self.timer.tracing:
            raise ValueError("tracing is off: set LoaderConfig(trace_path=...)")
        return self.timer.save_trace(str(path or self.config.trace_path))

    def close(self) -> None:
        """Stop the producer thread, free the ring and close an owned dataset. Idempotent, any thread.

        A consumer waiting for a batch meanwhile raises :class:`~fastload.errors.LoaderClosed`.
        """
        driver = self._driver
        if driver is None:
            return
        first = True  # when driver.close() raises, it was the call that closed
        try:
            first = driver.close()
        finally:
            if first:
                self._after_close()

    def _after_close(self) -> None:
        if self.config.trace_path is not None:
            try:
                self.timer.save_trace(str(self.config.trace_path))
            except OSError as exc:
                log.warning("could not write the trace to %s: %s", self.config.trace_path, exc)
        if self._owns_dataset:
            self.dataset.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # A dropped loader must not leave its producer thread running nor hold the ring's memory.
        try:
            driver = self._driver
            if driver is not None and driver.close(wait_fences=False) and self._owns_dataset:
                self.dataset.close()
        except Exception:
            pass

    # --- internals ----------------------------------------------------------------------------

    @property
    def _stream(self) -> _Run | None:
        """The running producer (None when stopped); tests and benchmarks check it."""
        return self._driver.run

    def _fingerprint(self) -> dict[str, Any]:
        s = self.order_spec
        return {
            "seed": s.seed,
            "shuffle": s.shuffle.value,
            "batch_size": s.batch_size,
            "num_records": s.num_records,
            "rank": s.rank,
            "world_size": s.world_size,
            "even": s.even.value,
            "drop_last": s.drop_last,
            "block_size": s.block_size,
            "window": s.window,
        }
