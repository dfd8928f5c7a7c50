"""The loader stage: order -> records -> decode -> ring -> prefetch, framework-free.

:class:`Loader` ties the stages together. One producer thread (:mod:`fastload.prefetch`) walks this
rank's batches (:mod:`fastload.order`); for each batch it hints the OS to read ahead the records of
the batches that follow (``dataset.will_need``, in the order they will be needed), takes a free slot
from the ring (:mod:`fastload.batch`), collects zero-copy record views (``dataset.image``) and makes
**one** ``decode_batch`` call that writes the pixels straight into the slot. The consumer iterates
:class:`~fastload.batch.Batch` objects whose arrays are views into the slot.

Batch lifetime: a batch is never overwritten while anything made from it is alive. Its arrays
hold a lease on their slot; the slot is refilled only once every array, slice or zero-copy tensor
made from them has been garbage-collected (and the fences attached to it completed). Keeping
batches is safe: the ring grows by up to ``max_extra_slots`` slots, then hands out batches in fresh
memory with one :class:`~fastload.errors.KeptBatchesWarning`. ``copy=True`` still hands out
detached copies (no longer needed for safety). See :mod:`fastload.batch`.

Position, resume and epochs: iterating the loader runs one epoch. When an epoch is completed the
loader moves to the next one by itself, and :meth:`Loader.set_epoch` sets it explicitly (as with
``DistributedSampler``). The producer does not stop at the end of an epoch: it runs on into the next
one (bounded by the ring), so the next pass starts with batches already decoded; a pass that asks
for another position (abandoned mid-epoch, another ``set_epoch``, a resume) restarts it there.
:meth:`Loader.state_dict` is ``{"epoch", "batch"}`` (plus a fingerprint of everything the order
depends on); after :meth:`Loader.load_state_dict` the next iteration yields exactly the batches an
uninterrupted run would have yielded from that point, because the order and every random crop are
pure functions of ``(seed, epoch, index)``.

Threads and shutdown (one class, ``_Driver``, owns starting, continuing, restarting and stopping
the producer; everything else asks it):

- A pass (``iter(loader)``) belongs to the thread that started it until it is exhausted, closed
  (``iterator.close()``) or dropped. Meanwhile ``next()`` on it from another thread, and
  ``iter(loader)``, ``set_epoch()`` or ``load_state_dict()`` from another thread, raise
  :class:`~fastload.errors.LoaderBusy`. From the owning thread, ``iter()`` / ``set_epoch()`` /
  ``load_state_dict()`` end the open pass and start from the requested position.
  ``state_dict()``, ``stats()`` and ``close()`` work from any thread.
- ``close()`` stops the producer thread (and joins it), frees the ring's memory (a batch still held
  keeps its own slot alive) and closes a dataset the loader opened. It is idempotent. A consumer
  waiting in ``next()`` meanwhile raises :class:`~fastload.errors.LoaderClosed`, and so does every
  later ``next()`` or ``iter()``.
- The loader never refers to its iterators (only weakly), so a dropped loader is freed at once by
  reference counting, without waiting for a garbage-collection pass; its finalizer stops the thread.

Bad records: ``on_error="raise"`` raises :class:`~fastload.errors.DecodeError` naming the sample and
``dataset.locate(i)``; ``on_error="skip"`` logs each bad record once, counts it in
:meth:`Loader.stats`, and fills its position with the next record *in dataset index order*
(``i + 1``, ``i + 2``, ... wrapping) that decodes. That substitute depends only on the data, not on
the batch or resume point, so skipping is deterministic and keeps batches full and batch counts
equal across ranks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import typing
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import fastload.transforms as _transforms
from fastload.batch import HELD_BATCHES, Allocator, Batch, BatchRing, Layout, ReleaseHook, Slot, image_fields
from fastload.errors import CorruptRecordError, DecodeError, KeptBatchesWarning, LoaderBusy, LoaderClosed, OnError
from fastload.order import EpochOrder, Even, OrderSpec, Shuffle, coerce_enum
from fastload.prefetch import Producer, ProducerStopped
from fastload.stats import LoaderStats, Stage, StageTimer
from fastload.transforms import Transform, train
from fastload.transforms.mixing import mix_batch

__all__ = ["IMAGE_DTYPES", "Batch", "Even", "Layout", "Loader", "LoaderConfig", "OnError", "Shuffle"]

log = logging.getLogger("fastload.loader")

_STATE_VERSION = 1

# Image dtypes a ring slot can hold: raw pixels, or the engine's normalized floats.
IMAGE_DTYPES = (np.dtype(np.uint8), np.dtype(np.float32), np.dtype(np.float16))


def _positive_int(value, name: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")


def _transform_types() -> tuple[type, ...]:
    """The transform classes fastload.transforms offers (geometry ops, and a Pipeline when present)."""
    types = tuple(t for t in typing.get_args(_transforms.Transform) if isinstance(t, type))
    if not types and isinstance(_transforms.Transform, type):
        types = (_transforms.Transform,)
    extra = tuple(
        cls
        for cls in (getattr(_transforms, "MXNetDefaultAugment", None), getattr(_transforms, "Pipeline", None))
        if isinstance(cls, type)
    )
    return types + extra


def transform_image_dtype(transform: Any) -> np.dtype | None:
    """The image dtype a transform writes, when it says: ``output_dtype``, or its ``normalize.dtype``.

    Returns None for transforms that do not declare one (plain geometry ops write uint8).
    """
    declared = getattr(transform, "output_dtype", None)
    if declared is None:
        norm = getattr(transform, "normalize", None)
        declared = getattr(norm, "dtype", None) if norm is not None else None
    return None if declared is None else np.dtype(declared)


def _dtype_or_none(value: Any, name: str) -> np.dtype | None:
    if value is None:
        return None
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} is not a dtype") from None
    if dtype not in IMAGE_DTYPES:
        raise ValueError(f"{name}={value!r} must be one of {[d.name for d in IMAGE_DTYPES]}")
    return dtype


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How a :class:`Loader` reads, orders, decodes and buffers.

    Args:
        batch_size: Samples per batch.
        transform: The augmentation spec (:mod:`fastload.transforms`); default ``train(224)``.
        shuffle: ``"none"``, ``"global"`` (full permutation) or ``"block"`` (block + window shuffle,
            for data larger than RAM).
        seed: Non-negative seed of the order and of every random crop.
        drop_last: Drop a final batch smaller than ``batch_size``.
        even: How ranks get equal shares: ``"pad"`` (repeat records) or ``"drop"`` (drop the rest).
        rank: This process's rank.
        world_size: Number of ranks.
        num_threads: Decode threads (None: every CPU this process may use).
        prefetch: Batches decoded ahead of the consumer; the ring starts with ``prefetch + 2`` slots.
        layout: ``"NCHW"`` or ``"NHWC"`` image layout in the slots.
        on_error: ``"skip"`` or ``"raise"`` for bad records (see the module docstring).
        block_size: Records per block for ``shuffle="block"``.
        window: Blocks per shuffle window for ``shuffle="block"``.
        read_ahead: Batches beyond the one being decoded whose records are hinted to the OS.
        copy: Hand out detached copies instead of ring views (one memcpy per batch). Not needed for
            safety: ring views are never overwritten while they are alive.
        decode_options: ``fastload.decode.DecodeOptions`` (max_pixels, IDCT, ...); None for defaults.
        max_substitutes: How many following records ``on_error="skip"`` tries before giving up
            on a position (a run of that many bad records is an error).
        trace_path: Write a Chrome-trace JSON of the stages there on :meth:`Loader.close` (and
            whenever :meth:`Loader.save_trace` is called).
        image_dtype: dtype of the images in the slots: ``"uint8"``, ``"float32"`` or ``"float16"``.
            None (default) takes the transform's (a transform that normalizes declares its float
            dtype; plain geometry ops write uint8). Given together with a transform that declares
            another dtype, it is an error.
        max_extra_slots: How many slots the ring may add when the consumer keeps more than two
            batches (None: ``prefetch + 2``, so the ring at most doubles); beyond that, batches come
            in fresh memory (see :mod:`fastload.batch`).
        round_batch: Complete a final partial batch with the first records of the epoch's order
            (repeated as often as needed), as MXNet's ``ImageRecordIter(round_batch=True)``: every
            batch has ``batch_size`` rows, and the repeated rows are read and decoded like the others
            (``on_error``, stats). The epoch's last batch then repeats
            ``len(loader) * batch_size - records in this rank's share`` rows at its end.
        mix: A batch op (``fastload.transforms.MixUp``, ``CutMix`` or ``RandomChoice`` of them;
            torchvision v2 semantics) applied to every batch in the engine's output stage, keyed by
            the batch's first sample in the epoch's order; ``batch.labels`` are then the float32
            ``[B, num_classes]`` soft labels. Substituted bad records are mixed in like the others.
    """

    batch_size: int = 256
    transform: Transform = field(default_factory=train)
    shuffle: Shuffle | str = Shuffle.GLOBAL
    seed: int = 0
    drop_last: bool = False
    even: Even | str = Even.PAD
    rank: int = 0
    world_size: int = 1
    num_threads: int | None = None
    prefetch: int = 2
    layout: Layout | str = Layout.NCHW
    on_error: OnError | str = OnError.SKIP
    block_size: int = 256
    window: int = 8
    read_ahead: int = 2
    copy: bool = False
    decode_options: Any = None
    max_substitutes: int = 64
    trace_path: str | None = None
    image_dtype: Any = None
    max_extra_slots: int | None = None
    round_batch: bool = False
    mix: Any = None

    def __post_init__(self) -> None:
        _positive_int(self.batch_size, "batch_size")
        if not isinstance(self.transform, _transform_types()):
            raise ValueError(
                f"transform={self.transform!r} must be a fastload.transforms op "
                "(train(), eval_transform(), RandomResizedCrop, CenterCrop, Resize, RandomCrop, "
                "MXNetDefaultAugment, a Pipeline)"
            )
        object.__setattr__(self, "shuffle", coerce_enum(Shuffle, self.shuffle, "shuffle"))
        object.__setattr__(self, "even", coerce_enum(Even, self.even, "even"))
        object.__setattr__(self, "layout", coerce_enum(Layout, self.layout, "layout"))
        object.__setattr__(self, "on_error", coerce_enum(OnError, self.on_error, "on_error"))
        _positive_int(self.seed, "seed", 0)
        _positive_int(self.world_size, "world_size")
        if (
            isinstance(self.rank, bool)
            or not isinstance(self.rank, (int, np.integer))
            or not 0 <= self.rank < self.world_size
        ):
            raise ValueError(f"rank={self.rank!r} must be an int in [0, world_size={self.world_size})")
        if self.num_threads is not None:
            _positive_int(self.num_threads, "num_threads")
        _positive_int(self.prefetch, "prefetch")
        _positive_int(self.block_size, "block_size")
        _positive_int(self.window, "window")
        _positive_int(self.read_ahead, "read_ahead", 0)
        _positive_int(self.max_substitutes, "max_substitutes")
        if self.max_extra_slots is not None:
            _positive_int(self.max_extra_slots, "max_extra_slots", 0)
        for name in ("drop_last", "copy", "round_batch"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        if self.decode_options is not None:
            from fastload.decode import DecodeOptions

            if not isinstance(self.decode_options, DecodeOptions):
                raise ValueError(f"decode_options={self.decode_options!r} must be a fastload.decode.DecodeOptions")
        if self.trace_path is not None and not isinstance(self.trace_path, (str, os.PathLike)):
            raise ValueError(f"trace_path={self.trace_path!r} must be a path or None")
        if self.mix is not None and not isinstance(
            self.mix, (_transforms.MixUp, _transforms.CutMix, _transforms.RandomChoice)
        ):
            raise ValueError(f"mix={self.mix!r} must be a fastload.transforms MixUp, CutMix or RandomChoice, or None")
        wanted = _dtype_or_none(self.image_dtype, "image_dtype")
        declared = _dtype_or_none(transform_image_dtype(self.transform), "the transform's output dtype")
        if wanted is not None and declared is not None and wanted != declared:
            raise ValueError(f"image_dtype={wanted.name} conflicts with the transform, which writes {declared.name}")
        object.__setattr__(self, "image_dtype", wanted or declared or np.dtype(np.uint8))


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
        return _EpochIterator(self, self._driver.begin_pass())

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
        return _EpochIterator(self, self._driver.begin_pass(feed=(batches, int(seed), int(epoch)), timeout=timeout))

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


class _Pipeline:
    """The producer side: order -> read-ahead -> records -> decode into a slot (runs on the thread)."""

    def __init__(
        self,
        dataset,
        config: LoaderConfig,
        order_spec: OrderSpec,
        labels: np.ndarray,
        ring: BatchRing,
        timer: StageTimer,
        decode: Callable | None,
    ) -> None:
        if decode is None:
            from fastload.decode import decode_batch as decode
        self.dataset, self.config, self.order_spec = dataset, config, order_spec
        self.ring, self.timer = ring, timer
        self._labels = labels
        self._num_records = len(labels)
        self._decode = decode
        self._decode_kwargs = {"threads": config.num_threads, "layout": config.layout.value}
        if config.decode_options is not None:
            self._decode_kwargs["options"] = config.decode_options
        self._will_need = getattr(dataset, "will_need", None)
        self._will_read = getattr(dataset, "will_read", None)  # datasets that fetch shards ahead (remote)
        self._done_with = getattr(dataset, "done_with", None)
        self._bad: set = set()

    def _hint(self, indices: np.ndarray) -> None:
        if self._will_need is not None and len(indices):
            self._will_need(indices)

    def produce(self, epoch: int, start: int, stop: threading.Event) -> Iterator[Batch | _EpochEnd]:
        """Producer-thread body: filled batches from ``(epoch, start)`` on, epoch after epoch.

        An :class:`_EpochEnd` marker follows each epoch's last batch. Running on into the next
        epoch keeps the decode threads busy across the boundary instead of restarting cold.
        """
        while True:
            # `yield from`, not a loop variable: a batch referred to by a suspended producer frame
            # would keep its lease (and slot) alive after the consumer dropped it.
            stopped = yield from self._produce_epoch(epoch, start, stop)
            if stopped:
                return
            yield _EpochEnd(epoch)
            epoch, start = epoch + 1, 0

    def _produce_epoch(self, epoch: int, start: int, stop: threading.Event) -> typing.Generator[Batch, None, bool]:
        """The batches of one epoch from ``start``; returns True when stopped before its end."""
        order = EpochOrder(self.order_spec, epoch)
        n = len(order)
        ahead = self.config.read_ahead
        timer = self.timer
        if self._will_read is not None:
            # Every record this rank reads from here on, in order (the rest of this epoch, then the
            # next one), so the dataset fetches whole shards ahead of the decode.
            bs = self.order_spec.batch_size
            self._will_read(order.share[start * bs : n * bs], EpochOrder(self.order_spec, epoch + 1).share[: n * bs])
        with timer.span(Stage.READ, what="read-ahead"):
            # The first batches' records in the order they will be decoded.
            for k in range(start, min(n, start + 1 + ahead)):
                self._hint(order[k])
        for k in range(start, n):
            if k + 1 + ahead < n:
                with timer.span(Stage.READ, what="read-ahead"):
                    self._hint(order[k + 1 + ahead])
            with timer.span(Stage.WAIT_SLOT):
                slot = self.ring.acquire(stop)
            if slot is None:
                return True
            indices = order[k]
            if self.config.round_batch and len(indices) < self.config.batch_size:
                indices = np.concatenate(
                    [indices, order.share[np.arange(self.config.batch_size - len(indices)) % len(order.share)]]
                )
            try:
                indices = self._fill(slot, indices, epoch, k)
            except BaseException:
                self.ring.unused(slot)
                raise
            yield self.ring.lease(slot, rows=len(indices), epoch=epoch, number=k)
        return False

    def produce_batches(
        self, batches: Iterator[np.ndarray], seed: int, epoch: int, stop: threading.Event
    ) -> Iterator[Batch | _EpochEnd]:
        """Producer-thread body of :meth:`Loader.iterate_batches`: one filled batch per index array."""
        for k, indices in enumerate(batches):
            with self.timer.span(Stage.WAIT_SLOT):
                slot = self.ring.acquire(stop)
            if slot is None:
                return
            try:
                indices = self._fill(slot, np.asarray(indices, dtype=np.int64), epoch, k, seed)
            except BaseException:
                self.ring.unused(slot)
                raise
            yield self.ring.lease(slot, rows=len(indices), epoch=epoch, number=k)
        if not stop.is_set():
            yield _EpochEnd(epoch)

    def _view(self, i: int) -> tuple[Any, str | None]:
        try:
            return self.dataset.image(int(i)), None
        except (CorruptRecordError, OSError, ValueError) as exc:
            return b"", f"unreadable record: {exc}"

    def _fill(self, slot: Slot, indices: np.ndarray, epoch: int, number: int, seed: int | None = None) -> np.ndarray:
        """Decode the batch ``indices`` into ``slot``; returns the indices actually used."""
        seed = self.config.seed if seed is None else seed
        m = len(indices)
        arrays = slot.arrays
        out = arrays["images"][:m]
        timer = self.timer
        read_errors: dict[int, str] = {}
        with timer.span(Stage.READ, batch=number):
            image = self.dataset.image
            try:
                views = [image(i) for i in indices.tolist()]
            except (CorruptRecordError, OSError, ValueError):
                views = []
                for pos, i in enumerate(indices.tolist()):
                    view, err = self._view(i)
                    views.append(view)
                    if err is not None:
                        read_errors[pos] = err
        mix = self.config.mix
        first = int(indices[0]) if m else 0  # keys the batch's mix, whatever replaces a bad first record
        mix_kwargs = (
            {} if mix is None else {"mix": mix, "labels": self._labels[indices], "soft_labels": arrays["labels"][:m]}
        )
        with timer.span(Stage.DECODE, batch=number):
            result = self._decode(
                views,
                out,
                self.config.transform,
                seed=seed,
                epoch=epoch,
                indices=indices,
                **self._decode_kwargs,
                **mix_kwargs,
            )
            timer.backend = result.backend
            timer.count_slices(getattr(result, "sliced", 0), getattr(result, "slice_fallbacks", 0))
            failures = dict(result.errors)
            failures.update(read_errors)
            if failures:
                indices = indices.copy()
                self._substitute(failures, indices, out, epoch, seed)
            if mix is not None and getattr(result, "mix", None) is None:
                # Not mixed in the decode (a bad record was replaced, or a decode without mix=).
                mix_batch(
                    out,
                    self._labels[indices],
                    mix,
                    seed=seed,
                    epoch=epoch,
                    first_index=first,
                    layout=self.config.layout.value,
                    threads=self.config.num_threads,
                    out=arrays["labels"][:m],
                )
        if self._done_with is not None:
            del views  # the decoded bytes are no longer referenced by this batch
            self._done_with(indices)
        arrays["indices"][:m] = indices
        if mix is None:
            np.take(self._labels, indices, axis=0, out=arrays["labels"][:m])
        return indices

    def _report_bad(self, i: int, reason: str) -> None:
        if i not in self._bad:
            self._bad.add(i)
            log.warning("skipping bad record %d (%s): %s", i, self._locate(i), reason)

    def _locate(self, i: int) -> str:
        try:
            return str(self.dataset.locate(int(i)))
        except Exception as exc:
            return f"location unknown: {exc}"

    def _substitute(
        self, failures: dict[int, str], indices: np.ndarray, out: np.ndarray, epoch: int, seed: int
    ) -> None:
        """Apply the on_error policy to the failed positions of one batch (in place)."""
        for pos in sorted(failures):
            i = int(indices[pos])
            if self.config.on_error is OnError.RAISE:
                raise DecodeError(failures[pos], index=i, source=self._locate(i))
            self._report_bad(i, failures[pos])
            self.timer.skipped += 1
            j = i
            for _ in range(self.config.max_substitutes):
                j = (j + 1) % self._num_records
                if j in self._bad:
                    continue
                view, err = self._view(j)
                if err is None:
                    sub = np.array([j], dtype=np.int64)
                    result = self._decode(
                        [view],
                        out[pos : pos + 1],
                        self.config.transform,
                        seed=seed,
                        epoch=epoch,
                        indices=sub,
                        **self._decode_kwargs,
                    )
                    if result.ok:
                        indices[pos] = j
                        break
                    err = result.errors.get(0, "decode failed")
                self._report_bad(j, err)
            else:
                raise DecodeError(
                    f"no decodable record among the {self.config.max_substitutes} records after this one "
                    f"(on_error='skip'); the data looks damaged",
                    index=i,
                    source=self._locate(i),
                )


class _EpochEnd:
    """Marker the producer puts after the last batch of an epoch."""

    __slots__ = ("epoch",)

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch


class _Run:
    """One producer thread running from a position; only :class:`_Driver` creates and stops it.

    Attributes:
        epoch: Epoch of the next item it hands out.
        batch: Batch number of the next item it hands out.
        producer: The :class:`~fastload.prefetch.Producer`.
    """

    def __init__(self, pipeline: _Pipeline, ring: BatchRing, epoch: int, start: int, feed=None) -> None:
        self.epoch, self.batch = epoch, start
        # A run over caller-chosen batches (Loader.iterate_batches) is never continued by a later pass.
        self.external = feed is not None
        if feed is None:
            # The lambda closes over the pipeline only, never the Loader or the driver (see Loader._build).
            produce = lambda stop: pipeline.produce(epoch, start, stop)  # noqa: E731
        else:
            batches, seed, feed_epoch = feed
            produce = lambda stop: pipeline.produce_batches(batches(stop), seed, feed_epoch, stop)  # noqa: E731
        self.producer = Producer(
            produce, maxsize=ring.base_slots, name=f"fastload-loader-e{epoch}b{start}", wake=ring.wake
        )

    def stop(self) -> None:
        self.producer.close()


class _Pass:
    """The state of one pass over an epoch (what ``iter(loader)`` started), kept by the driver."""

    __slots__ = ("ended", "epoch", "external", "finished", "iterator", "start", "taken", "thread", "timeout")

    def __init__(
        self,
        epoch: int,
        start: int,
        thread: threading.Thread,
        *,
        external: bool = False,
        timeout: float | None = None,
    ) -> None:
        self.epoch, self.start, self.taken = epoch, start, 0
        self.external = external  # over caller-chosen batches: does not move the loader's position
        self.timeout = timeout
        self.finished = False  # the epoch's end was reached
        self.ended = False  # finished, or ended early (close, a new pass, set_epoch, an error)
        self.thread = thread
        self.iterator: weakref.ref | None = None

    def open(self) -> bool:
        """Still iterable: not ended, its iterator alive, its thread alive."""
        if self.ended or self.finished or not self.thread.is_alive():
            return False
        return self.iterator is None or self.iterator() is not None


class _Driver:
    """The one owner of the producer's lifecycle and of the consumer's position.

    It starts, continues, restarts and stops the producer (a :class:`_Run`), hands batches to the
    pass that owns the loader, and enforces the thread rule and ``close()`` (see the module
    docstring). The Loader's public methods and the iterators only call it; nothing else touches
    the producer or the ring's consumer side.
    """

    def __init__(
        self, pipeline: _Pipeline, ring: BatchRing, timer: StageTimer, num_batches: int, *, copy: bool
    ) -> None:
        self._pipeline, self._ring, self._timer = pipeline, ring, timer
        self.num_batches = num_batches
        self._copy = copy
        self._lock = threading.Lock()
        self.run: _Run | None = None
        self._epoch, self._resume = 0, 0  # where the next pass starts
        self._pass: _Pass | None = None  # the latest pass
        self.closed = False
        self._warned = False

    # --- position -------------------------------------------------------------------------------

    def current_epoch(self) -> int:
        with self._lock:
            ps = self._pass
            return ps.epoch if ps is not None and not ps.finished and not ps.external else self._epoch

    def position(self) -> tuple[int, int]:
        """(epoch, batch) after the last batch handed to the consumer (or where the next pass starts)."""
        with self._lock:
            ps = self._pass
            if ps is not None and not ps.finished and not ps.external:
                return ps.epoch, ps.start + ps.taken
            return self._epoch, self._resume

    def seek(self, epoch: int, batch: int, action: str) -> None:
        """The next pass starts at ``(epoch, batch)``; ends this thread's open pass."""
        with self._lock:
            self._refuse_other_thread(action)
            if self._pass is not None:
                self._end_pass_locked(self._pass)
                self._pass = None
            self._epoch, self._resume = epoch, batch

    # --- passes ---------------------------------------------------------------------------------

    def begin_pass(self, feed=None, timeout: float | None = None) -> _Pass:
        with self._lock:
            if self.closed:
                raise LoaderClosed("the loader is closed")
            self._refuse_other_thread("start iterating it")
            if self._pass is not None:
                self._end_pass_locked(self._pass)
            if feed is not None:
                # Caller-chosen batches: always a fresh run; the loader's own position stays.
                self._stop_run_locked()
                self.run = _Run(self._pipeline, self._ring, feed[2], 0, feed=feed)
                self._pass = _Pass(feed[2], 0, threading.current_thread(), external=True, timeout=timeout)
                return self._pass
            start, self._resume = self._resume, 0
            run = self.run
            if run is None or run.external or (run.epoch, run.batch) != (self._epoch, start):
                # Not where the running producer is (first pass, set_epoch to another epoch, resume,
                # an abandoned pass): restart it there. Otherwise keep what it already prefetched.
                self._stop_run_locked()
                self.run = _Run(self._pipeline, self._ring, self._epoch, start)
            self._pass = _Pass(self._epoch, start, threading.current_thread())
            return self._pass

    def take(self, ps: _Pass) -> Batch:
        """The next batch of pass ``ps`` (``StopIteration`` at the epoch's end)."""
        if ps.thread is not threading.current_thread() and not ps.ended:
            raise LoaderBusy(
                f"this pass over the loader belongs to thread {ps.thread.name!r}: call iter(loader) in "
                "the thread that consumes it (one pass at a time)"
            )
        with self._lock:
            if self.closed:
                raise LoaderClosed("the loader is closed")
            if ps.ended or ps is not self._pass or self.run is None:
                raise StopIteration
            run = self.run
        timer = self._timer
        timer.consumer_active()
        try:
            with timer.span(Stage.WAIT_DATA):
                item = run.producer.get(ps.timeout)
        except (ProducerStopped, StopIteration):
            if self.closed:
                raise LoaderClosed(
                    "the loader was closed (from another thread) while this thread waited for a batch"
                ) from None
            if ps.ended:  # ended from elsewhere (iterator.close() on another thread)
                raise StopIteration from None
            self.end_pass(ps)
            raise
        except BaseException:
            # The producer's exception (with its traceback), or Ctrl-C while waiting: the pass ends.
            self.end_pass(ps)
            raise
        with self._lock:
            if self.closed:
                raise LoaderClosed("the loader was closed (from another thread) while this thread waited for a batch")
            if ps.ended:
                raise StopIteration
            if isinstance(item, _EpochEnd):
                ps.finished = ps.ended = True
                run.epoch, run.batch = item.epoch + 1, 0
                if not ps.external:
                    self._epoch, self._resume = item.epoch + 1, 0
                timer.consumer_idle()
                raise StopIteration
            run.batch += 1
            ps.taken += 1
        self._ring.taken(item.slot, item._generation)
        timer.consumer_took(item.size)
        if item.fresh and not self._warned:
            self._warned = True
            ring = self._ring
            warnings.warn(
                f"the consumer keeps more than {ring.held} batches alive: the ring grew to {len(ring.slots)} "
                f"slots (its bound) and further batches are decoded into freshly allocated memory (one "
                f"allocation per batch). Kept batches stay intact; drop batches after use (or copy the "
                f"parts you keep) to avoid the allocations",
                KeptBatchesWarning,
                stacklevel=3,
            )
        if self._copy:
            copy = item.copy()
            del item  # the lease dies here: the slot goes back at once
            return copy
        return item

    def end_pass(self, ps: _Pass) -> None:
        """End pass ``ps`` (idempotent); a pass that did not finish its epoch stops the producer."""
        with self._lock:
            self._end_pass_locked(ps)

    def stop(self) -> None:
        """Stop the producer (between benchmark repeats); the next pass restarts it."""
        with self._lock:
            if self._pass is not None:
                self._end_pass_locked(self._pass)
            self._stop_run_locked()

    # --- shutdown -------------------------------------------------------------------------------

    def close(self, wait_fences: bool = True) -> bool:
        """Stop the producer and free the ring; True for the call that closed (idempotent, any thread).

        ``wait_fences=False`` (a dropped loader's finalizer, interpreter shutdown) never waits for
        device work still reading a slot; the ring then keeps that memory until it is freed itself.
        """
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            run, self.run = self.run, None
        # Outside the lock: a consumer waiting in take() wakes up (ProducerStopped), finds the
        # loader closed and raises LoaderClosed.
        try:
            if run is not None:
                run.stop()  # raises if the thread does not stop within its timeout
        finally:
            self._ring.close(fence_timeout=10.0 if wait_fences else None)
            self._timer.consumer_idle()
        return True

    # --- internals ------------------------------------------------------------------------------

    def _refuse_other_thread(self, action: str) -> None:
        ps = self._pass
        if ps is not None and ps.thread is not threading.current_thread() and ps.open():
            raise LoaderBusy(
                f"cannot {action}: thread {ps.thread.name!r} is iterating this loader (a pass belongs to "
                f"the thread that called iter() until it is exhausted, closed or dropped)"
            )

    def _end_pass_locked(self, ps: _Pass) -> None:
        if ps.ended:
            return
        ps.ended = True
        if not ps.finished and ps is self._pass:
            self._stop_run_locked()
        self._timer.consumer_idle()

    def _stop_run_locked(self) -> None:
        run, self.run = self.run, None
        if run is not None:
            run.stop()


class _EpochIterator:
    """One pass over an epoch: a handle on the driver's pass state.

    It keeps the loader alive while iterating (``for b in Loader(...)``); the loader refers to it
    only weakly, so no reference cycle keeps a dropped loader (and its ring) alive.
    """

    __slots__ = ("__weakref__", "_driver", "_loader", "_pass")

    def __init__(self, loader: Loader, ps: _Pass) -> None:
        self._loader = loader
        self._driver = loader._driver
        self._pass = ps
        ps.iterator = weakref.ref(self)

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return self._driver.num_batches - self._pass.start

    def __next__(self) -> Batch:
        return self._driver.take(self._pass)

    def close(self) -> None:
        """End this pass; a pass that did not finish its epoch stops the producer (idempotent)."""
        self._driver.end_pass(self._pass)

    @property
    def epoch(self) -> int:
        return self._pass.epoch

    @property
    def start(self) -> int:
        return self._pass.start

    @property
    def taken(self) -> int:
        return self._pass.taken

    @property
    def finished(self) -> bool:
        return self._pass.finished
