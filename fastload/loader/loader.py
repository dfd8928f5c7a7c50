"""The loader stage: ``Loader``, the framework-free face over the pipeline, driver and iterators."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np

from fastload.batch import HELD_BATCHES, Allocator, BatchRing, Layout, ReleaseHook, image_fields
from fastload.errors import ResumeStateError
from fastload.loader.config import LoaderConfig, _positive_int
from fastload.loader.driver import _Driver, _Run
from fastload.loader.iterator import _EpochIterator
from fastload.loader.pipeline import Records, _Cursor, _Pipeline
from fastload.order import EpochOrder, OrderSpec, Shuffle
from fastload.position import Position, dataset_identity, make_state, order_fingerprint, read_state
from fastload.stats import LoaderStats, RangeHooks, Stage, StageTimer

log = logging.getLogger("fastload.loader")

_KIND = "fastload.Loader"


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

    # Set last in _build: a loader whose construction failed has none (close() and __del__ check).
    _driver: _Driver

    def __init__(
        self,
        dataset: Records | str | os.PathLike[str],
        config: LoaderConfig | None = None,
        allocator: Allocator | None = None,
        *,
        decode: Callable[..., Any] | None = None,
        range_hooks: RangeHooks | None = None,
        release_hook: ReleaseHook | None = None,
    ) -> None:
        self.config = config = config if config is not None else LoaderConfig()
        if not isinstance(config, LoaderConfig):
            raise ValueError(f"config={config!r} must be a LoaderConfig")
        self._owns_dataset = isinstance(dataset, (str, os.PathLike))
        if isinstance(dataset, (str, os.PathLike)):
            from fastload.records.dataset import open_dataset

            dataset = open_dataset(dataset)
        try:
            self._build(dataset, config, allocator, decode, range_hooks, release_hook)
        except BaseException:
            if self._owns_dataset:
                dataset.close()
            raise

    def _build(
        self,
        dataset: Records,
        config: LoaderConfig,
        allocator: Allocator | None,
        decode: Callable[..., Any] | None,
        range_hooks: RangeHooks | None,
        release_hook: ReleaseHook | None,
    ) -> None:
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
            # Every geometry op stores its size as (h, w) once constructed; the field also takes one int.
            image_size=cast("tuple[int, int]", config.transform.size),
            layout=Layout(config.layout),
            label_width=self.label_width,
            image_dtype=config.image_dtype,
        )
        self.timer = StageTimer(trace=config.trace_path is not None, range_hooks=range_hooks)
        self.ring = BatchRing(
            fields,
            num_slots=config.prefetch + HELD_BATCHES,
            allocator=allocator,
            max_extra_slots=config.max_extra_slots,
            release_hook=release_hook,
            ahead=config.prefetch,
            on_wait=_ring_waits(self.timer),
        )
        # Everything the producer thread touches lives in the pipeline, which never refers back to
        # the Loader or the driver: a Loader the user drops is freed, and its __del__ stops the thread.
        pipeline = _Pipeline(dataset, config, self.order_spec, self._labels, self.ring, self.timer, decode)
        self._pipeline = pipeline
        self._identity: list[str | None] = []  # the dataset's identity, computed when a state needs it
        self._driver = _Driver(pipeline, self.ring, self.timer, self._len, copy=config.copy)

    # --- public API ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank (the same on every rank and every whole epoch).

        A resumed epoch, and with ``round_batch`` an epoch that starts after records the previous
        one borrowed, has fewer: ``len(iter(loader))`` says how many its pass hands out.
        """
        return self._len

    def pass_batches(self) -> int:
        """Batches the pass at the current position hands out in all: ``len(self)`` for a whole epoch.

        Fewer for a resumed epoch, or (``round_batch``) one that starts after records the
        previous epoch's last batch borrowed.
        """
        cursor, batch = self._driver.position()
        order = self._driver.order(cursor)
        if batch >= len(order):
            order = self._driver.order(self._pipeline.next_cursor(cursor))
        return len(order)

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

        After :meth:`load_state_dict`, ``set_epoch`` of the loaded epoch keeps the loaded position
        (a training loop calls ``set_epoch(epoch)`` at each epoch's start, the resumed one too).

        Raises:
            LoaderBusy: Another thread is iterating the loader.
        """
        _positive_int(epoch, "epoch", 0)
        driver = self._driver
        if driver.loaded and driver.current_epoch() == epoch:
            return
        driver.seek(_Cursor(int(epoch)), 0, "set the epoch")

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
        """The position after the last batch handed to the consumer, counted in samples.

        A plain dict (ints, strings, lists) that ``torch.save``, ``json`` and ``pickle`` round-trip,
        the same on every rank of a job at a step boundary; :meth:`load_state_dict` restores it
        under any world size, batch size, thread count or prefetch depth (:mod:`fastload.position`).
        Batches decoded ahead are not counted. After an epoch's last batch it is the next epoch's
        start (with ``round_batch``, after the records the last batch borrowed from it).
        """
        cursor, batch = self._driver.position()
        order = self._driver.order(cursor)
        if batch >= len(order):
            cursor, batch = self._pipeline.next_cursor(cursor), 0
            order = self._driver.order(cursor)
        spec = self.order_spec
        position = Position.at(cursor.epoch, cursor.history, spec.world_size, order.position(batch))
        return make_state(_KIND, position, self._fingerprint())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``, saved by this loader or by any rank of a job of any world size.

        With the same world size the next iteration yields exactly the batches the saving run would
        have yielded next; with another one, this rank's share of the records not yet handed out
        (see :mod:`fastload.position`). A state at a point where no batch is left for the ranks
        resumes at the next epoch's start.

        Raises:
            ResumeStateError: A state of another dataset, seed, shuffle mode or padding, a newer
                format, or a damaged one (a ``ValueError``; the message names what differs).
            LoaderBusy: Another thread is iterating the loader.
        """
        position, _ = read_state(state, kind=_KIND, fingerprint=self._fingerprint())
        history, offset = position.plan(self.order_spec.world_size)
        cursor = _Cursor(position.epoch, history, offset)
        try:
            order = self._driver.order(cursor)  # computed once: the producer starts from it
        except ValueError as exc:
            raise ResumeStateError(f"the saved position does not fit this dataset's order: {exc}") from None
        if len(order) == 0:
            cursor = self._pipeline.next_cursor(cursor)
        self._driver.seek(cursor, 0, "load a state", loaded=True)

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
        driver: _Driver | None = getattr(self, "_driver", None)
        if driver is None:  # construction failed before the driver existed
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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A dropped loader must not leave its producer thread running nor hold the ring's memory.
        try:
            driver: _Driver | None = getattr(self, "_driver", None)
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
        if not self._identity:
            self._identity.append(dataset_identity(self.dataset))
        return order_fingerprint(self.order_spec, self._identity[0])


def _ring_waits(timer: StageTimer) -> Callable[[str, float, float], None]:
    """The ring's ``on_wait``: back-pressure as ``wait_consumer``, a slot not back yet as ``wait_slot``."""
    stages = {"consumer": Stage.WAIT_CONSUMER, "slot": Stage.WAIT_SLOT, "fence": Stage.WAIT_SLOT}

    def waited(reason: str, start: float, end: float) -> None:
        timer.add(stages[reason], start, end)

    return waited
