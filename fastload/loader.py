"""The loader stage: order -> records -> decode -> ring -> prefetch, framework-free.

:class:`Loader` ties the stages together. One producer thread (:mod:`fastload.prefetch`) walks this
rank's batches (:mod:`fastload.order`); for each batch it hints the OS to read ahead the records of
the batches that follow (``dataset.will_need``, in the order they will be needed), takes a free slot
from the ring (:mod:`fastload.batch`), collects zero-copy record views (``dataset.image``) and makes
**one** ``decode_batch`` call that writes the pixels straight into the slot. The consumer iterates
:class:`~fastload.batch.Batch` objects whose arrays are views into the slot; see
:mod:`fastload.batch` for how long they stay valid.

Position, resume and epochs: iterating the loader runs one epoch. When an epoch is completed the
loader moves to the next one by itself, and :meth:`Loader.set_epoch` sets it explicitly (as with
``DistributedSampler``). The producer does not stop at the end of an epoch: it runs on into the next
one (bounded by the ring), so the next pass starts with batches already decoded; a pass that asks
for another position (abandoned mid-epoch, another ``set_epoch``, a resume) restarts it there. :meth:`Loader.state_dict` is ``{"epoch", "batch"}`` (plus a fingerprint of
everything the order depends on); after :meth:`Loader.load_state_dict` the next iteration yields
exactly the batches an uninterrupted run would have yielded from that point, because the order and
every random crop are pure functions of ``(seed, epoch, index)``.

Bad records: ``on_error="raise"`` raises :class:`~fastload.errors.DecodeError` naming the sample and
``dataset.locate(i)``; ``on_error="skip"`` logs each bad record once, counts it in
:meth:`Loader.stats`, and fills its position with the next record *in dataset index order*
(``i + 1``, ``i + 2``, ... wrapping) that decodes. That substitute depends only on the data, not on
the batch or resume point, so skipping is deterministic and keeps batches full and batch counts
equal across ranks.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

import numpy as np

from fastload.batch import HELD_BATCHES, Allocator, Batch, BatchRing, Layout, Slot
from fastload.errors import CorruptRecordError, DecodeError
from fastload.order import EpochOrder, Even, OrderSpec, Shuffle, coerce_enum
from fastload.prefetch import Producer
from fastload.stats import LoaderStats, Stage, StageTimer
from fastload.transforms import CenterCrop, RandomResizedCrop, Resize, Transform, train

__all__ = ["OnError", "LoaderConfig", "Loader", "Batch", "Layout", "Shuffle", "Even"]

log = logging.getLogger("fastload.loader")

_STATE_VERSION = 1


class OnError(str, enum.Enum):
    """What the loader does with a record that cannot be read or decoded."""

    SKIP = "skip"
    RAISE = "raise"


def _positive_int(value, name: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")


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
        prefetch: Batches decoded ahead of the consumer; the ring has ``prefetch + 2`` slots.
        layout: ``"NCHW"`` or ``"NHWC"`` image layout in the slots.
        on_error: ``"skip"`` or ``"raise"`` for bad records (see the module docstring).
        block_size: Records per block for ``shuffle="block"``.
        window: Blocks per shuffle window for ``shuffle="block"``.
        read_ahead: Batches beyond the one being decoded whose records are hinted to the OS.
        copy: Hand out detached copies instead of ring views (costs one memcpy per batch).
        decode_options: ``fastload.decode.DecodeOptions`` (max_pixels, IDCT, ...); None for defaults.
        max_substitutes: How many following records ``on_error="skip"`` tries before giving up
            on a position (a run of that many bad records is an error).
        trace_path: Write a Chrome-trace JSON of the stages there on :meth:`Loader.close` (and
            whenever :meth:`Loader.save_trace` is called).
    """

    batch_size: int = 256
    transform: Transform = field(default_factory=train)
    shuffle: Union[Shuffle, str] = Shuffle.GLOBAL
    seed: int = 0
    drop_last: bool = False
    even: Union[Even, str] = Even.PAD
    rank: int = 0
    world_size: int = 1
    num_threads: Optional[int] = None
    prefetch: int = 2
    layout: Union[Layout, str] = Layout.NCHW
    on_error: Union[OnError, str] = OnError.SKIP
    block_size: int = 256
    window: int = 8
    read_ahead: int = 2
    copy: bool = False
    decode_options: Any = None
    max_substitutes: int = 64
    trace_path: Optional[str] = None

    def __post_init__(self) -> None:
        _positive_int(self.batch_size, "batch_size")
        if not isinstance(self.transform, (RandomResizedCrop, CenterCrop, Resize)):
            raise ValueError(f"transform={self.transform!r} must be a fastload.transforms op "
                             "(train(), eval_transform(), RandomResizedCrop, CenterCrop, Resize)")
        object.__setattr__(self, "shuffle", coerce_enum(Shuffle, self.shuffle, "shuffle"))
        object.__setattr__(self, "even", coerce_enum(Even, self.even, "even"))
        object.__setattr__(self, "layout", coerce_enum(Layout, self.layout, "layout"))
        object.__setattr__(self, "on_error", coerce_enum(OnError, self.on_error, "on_error"))
        _positive_int(self.seed, "seed", 0)
        _positive_int(self.world_size, "world_size")
        if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank!r} must be an int in [0, world_size={self.world_size})")
        if self.num_threads is not None:
            _positive_int(self.num_threads, "num_threads")
        _positive_int(self.prefetch, "prefetch")
        _positive_int(self.block_size, "block_size")
        _positive_int(self.window, "window")
        _positive_int(self.read_ahead, "read_ahead", 0)
        _positive_int(self.max_substitutes, "max_substitutes")
        for name in ("drop_last", "copy"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        if self.decode_options is not None:
            from fastload.decode import DecodeOptions

            if not isinstance(self.decode_options, DecodeOptions):
                raise ValueError(f"decode_options={self.decode_options!r} must be a fastload.decode.DecodeOptions")
        if self.trace_path is not None and not isinstance(self.trace_path, (str, os.PathLike)):
            raise ValueError(f"trace_path={self.trace_path!r} must be a path or None")


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

    Example:
        >>> with Loader("train/", LoaderConfig(batch_size=256)) as loader:   # doctest: +SKIP
        ...     for batch in loader:
        ...         train_step(batch.images, batch.labels)
    """

    def __init__(self, dataset, config: Optional[LoaderConfig] = None, allocator: Optional[Allocator] = None, *,
                 decode: Optional[Callable] = None, range_hooks=None) -> None:
        self.config = config = config if config is not None else LoaderConfig()
        if not isinstance(config, LoaderConfig):
            raise ValueError(f"config={config!r} must be a LoaderConfig")
        self._closed = True  # until construction succeeds; keeps __del__ quiet on a failed __init__
        self._owns_dataset = isinstance(dataset, (str, os.PathLike))
        if self._owns_dataset:
            from fastload.records.dataset import open_dataset

            dataset = open_dataset(dataset)
        try:
            self._build(dataset, config, allocator, decode, range_hooks)
        except BaseException:
            if self._owns_dataset:
                dataset.close()
            raise
        self._epoch = 0
        self._resume_batch = 0
        self._iterator: Optional[_EpochIterator] = None
        self._stream: Optional[_Stream] = None
        self._closed = False

    def _build(self, dataset, config: LoaderConfig, allocator, decode, range_hooks) -> None:
        self.dataset = dataset
        self._num_records = len(dataset)
        if self._num_records == 0:
            raise ValueError("the dataset has no records")
        self._labels = np.asarray(dataset.labels, dtype=np.float32)
        if self._labels.ndim == 1:
            self._labels = self._labels[:, None]
        self.label_width = int(self._labels.shape[1])
        self.order_spec = OrderSpec(num_records=self._num_records, batch_size=config.batch_size, shuffle=config.shuffle,
                                    seed=config.seed, rank=config.rank, world_size=config.world_size,
                                    even=config.even, drop_last=config.drop_last, block_size=config.block_size,
                                    window=config.window)
        self._len = EpochOrder.batches_per_epoch(self.order_spec)
        if self._len == 0:
            raise ValueError(f"an epoch has no batches: {self._num_records} records, world_size={config.world_size}, "
                             f"batch_size={config.batch_size}, drop_last=True")
        self.ring = BatchRing(num_slots=config.prefetch + HELD_BATCHES, batch_size=config.batch_size,
                              image_size=config.transform.size, layout=config.layout, label_width=self.label_width,
                              allocator=allocator)
        self.timer = StageTimer(trace=config.trace_path is not None, range_hooks=range_hooks)
        # Everything the producer thread touches lives in the pipeline, which never refers back to
        # the Loader: a Loader the user drops is collected, and its __del__ stops the thread.
        self._pipeline = _Pipeline(dataset, config, self.order_spec, self._labels, self.ring, self.timer, decode)

    # --- public API ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank (the same on every rank and every epoch)."""
        return self._len

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs (or the current one while iterating)."""
        it = self._iterator
        return it.epoch if it is not None and not it.finished else self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its first batch (ends a running iteration)."""
        _positive_int(epoch, "epoch", 0)
        self._end_iteration()
        self._epoch, self._resume_batch = int(epoch), 0

    def __iter__(self) -> "_EpochIterator":
        if self._closed:
            raise ValueError("the loader is closed")
        self._end_iteration()
        start, self._resume_batch = self._resume_batch, 0
        stream = self._stream
        if stream is None or stream.external or (stream.epoch, stream.batch) != (self._epoch, start):
            # Not where the running producer is (first pass, set_epoch to another epoch, resume):
            # restart it there. Otherwise keep the batches it already prefetched.
            self._stop_stream(stream)
            stream = self._stream = _Stream(self._pipeline, self.ring, self._epoch, start)
        self._iterator = _EpochIterator(self, stream)
        return self._iterator

    def iterate_batches(self, batches: Callable[[threading.Event], Iterator[np.ndarray]], *, seed: int,
                        epoch: int) -> "_EpochIterator":
        """One pass over batches chosen by the caller (a sampler's) instead of the loader's own order.

        Args:
            batches: ``batches(stop)`` runs on the producer thread and yields int64 arrays of record
                indices, at most ``config.batch_size`` each; it must return promptly once ``stop`` is
                set (the torch adapter feeds it from the consumer's thread through a bounded queue).
            seed: Seed of this pass's per-sample randomness, keyed ``(seed, epoch, index)``.
            epoch: Epoch of this pass's per-sample randomness.

        Returns:
            An iterator of :class:`~fastload.batch.Batch` ending after the last batch ``batches`` yields.
            It ends any running iteration; the loader's own position (``state_dict``, ``set_epoch``) is
            not moved by it.
        """
        if self._closed:
            raise ValueError("the loader is closed")
        _positive_int(seed, "seed", 0)
        _positive_int(epoch, "epoch", 0)
        self._end_iteration()
        self._stop_stream()
        pipeline = self._pipeline
        self._stream = _Stream(self._pipeline, self.ring, int(epoch), 0,
                               produce=lambda stop: pipeline.produce_batches(batches(stop), int(seed), int(epoch), stop))
        self._iterator = _EpochIterator(self, self._stream)
        return self._iterator

    def state_dict(self) -> Dict[str, Any]:
        """The position after the last batch handed to the consumer, plus the order's fingerprint."""
        it = self._iterator
        if it is not None and not it.finished and it.taken > 0:
            epoch, batch = it.epoch, it.start + it.taken
        elif it is not None and not it.finished:
            epoch, batch = it.epoch, it.start
        else:
            epoch, batch = self._epoch, self._resume_batch
        if batch >= self._len:
            epoch, batch = epoch + 1, 0
        return {"version": _STATE_VERSION, "epoch": int(epoch), "batch": int(batch), **self._fingerprint()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume at ``state``: the next iteration starts with the batch after the saved position.

        Raises:
            ValueError: When the state comes from a loader whose order differs (seed, shuffle,
                batch size, dataset size, ranks, padding).
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
        self._end_iteration()
        self._epoch, self._resume_batch = epoch, batch

    def stats(self) -> LoaderStats:
        """Per-stage times, images/s and the input-bound fraction since construction (or reset)."""
        return self.timer.snapshot()

    def reset_stats(self) -> None:
        """Zero the counters (e.g. after a warm-up epoch)."""
        self.timer.reset()

    def save_trace(self, path: Optional[str] = None) -> str:
        """Write the Chrome-trace JSON of the stages (needs ``trace_path`` set in the config)."""
        if not self.timer.tracing:
            raise ValueError("tracing is off: set LoaderConfig(trace_path=...)")
        return self.timer.save_trace(str(path or self.config.trace_path))

    def close(self) -> None:
        """Stop the producer thread, free the ring and close an owned dataset. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._end_iteration()
        self._stop_stream()
        self.ring.close()
        if self.config.trace_path is not None:
            try:
                self.timer.save_trace(str(self.config.trace_path))
            except OSError as exc:
                log.warning("could not write the trace to %s: %s", self.config.trace_path, exc)
        if self._owns_dataset:
            self.dataset.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # Best effort: a dropped loader must not leave its producer thread running.
        try:
            if not self._closed:
                self._end_iteration()
                self._stop_stream()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # --- internals ----------------------------------------------------------------------------

    def _fingerprint(self) -> Dict[str, Any]:
        s = self.order_spec
        return {"seed": s.seed, "shuffle": s.shuffle.value, "batch_size": s.batch_size, "num_records": s.num_records,
                "rank": s.rank, "world_size": s.world_size, "even": s.even.value, "drop_last": s.drop_last,
                "block_size": s.block_size, "window": s.window}

    def _end_iteration(self) -> None:
        it, self._iterator = self._iterator, None
        if it is not None:
            it.close()

    def _stop_stream(self, stream: Optional["_Stream"] = None) -> None:
        """Stop ``stream`` if it is the running one (None: whatever runs)."""
        current = self._stream
        if current is not None and (stream is None or stream is current):
            self._stream = None
            current.close()

    def _epoch_finished(self, epoch: int) -> None:
        self._epoch, self._resume_batch = epoch + 1, 0


class _Pipeline:
    """The producer side: order -> read-ahead -> records -> decode into a slot (runs on the thread)."""

    def __init__(self, dataset, config: LoaderConfig, order_spec: OrderSpec, labels: np.ndarray, ring: BatchRing,
                 timer: StageTimer, decode: Optional[Callable]) -> None:
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
        self._done_with = getattr(dataset, "done_with", None)
        self._bad: set = set()

    def _hint(self, indices: np.ndarray) -> None:
        if self._will_need is not None and len(indices):
            self._will_need(indices)

    def produce(self, epoch: int, start: int, stop: threading.Event) -> Iterator[Union[Batch, "_EpochEnd"]]:
        """Producer-thread body: filled batches from ``(epoch, start)`` on, epoch after epoch.

        An :class:`_EpochEnd` marker follows each epoch's last batch. Running on into the next
        epoch keeps the decode threads busy across the boundary instead of restarting cold.
        """
        while True:
            for batch in self._produce_epoch(epoch, start, stop):
                if batch is None:
                    return
                yield batch
            yield _EpochEnd(epoch)
            epoch, start = epoch + 1, 0

    def _produce_epoch(self, epoch: int, start: int, stop: threading.Event) -> Iterator[Optional[Batch]]:
        order = EpochOrder(self.order_spec, epoch)
        n = len(order)
        ahead = self.config.read_ahead
        timer = self.timer
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
                yield None
                return
            try:
                indices = self._fill(slot, order[k], epoch, k)
            except BaseException:
                self.ring.unused(slot)
                raise
            m = len(indices)
            yield Batch(slot.images[:m], slot.labels[:m], slot.indices[:m], slot=slot.id, epoch=epoch, number=k,
                        owners=slot.owners, ring=self.ring, generation=slot.generation)

    def _view(self, i: int) -> Tuple[Any, Optional[str]]:
        try:
            return self.dataset.image(int(i)), None
        except (CorruptRecordError, OSError, ValueError) as exc:
            return b"", f"unreadable record: {exc}"

    def produce_batches(self, batches: Iterator[np.ndarray], seed: int, epoch: int,
                        stop: threading.Event) -> Iterator[Union[Batch, "_EpochEnd"]]:
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
            m = len(indices)
            yield Batch(slot.images[:m], slot.labels[:m], slot.indices[:m], slot=slot.id, epoch=epoch, number=k,
                        owners=slot.owners, ring=self.ring, generation=slot.generation)
        if not stop.is_set():
            yield _EpochEnd(epoch)

    def _fill(self, slot: Slot, indices: np.ndarray, epoch: int, number: int, seed: Optional[int] = None) -> np.ndarray:
        """Decode the batch ``indices`` into ``slot``; returns the indices actually used."""
        seed = self.config.seed if seed is None else seed
        m = len(indices)
        out = slot.images[:m]
        timer = self.timer
        read_errors: Dict[int, str] = {}
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
        with timer.span(Stage.DECODE, batch=number):
            result = self._decode(views, out, self.config.transform, seed=seed, epoch=epoch,
                                  indices=indices, **self._decode_kwargs)
            timer.backend = result.backend
            timer.count_slices(getattr(result, "sliced", 0), getattr(result, "slice_fallbacks", 0))
            failures = dict(result.errors)
            failures.update(read_errors)
            if failures:
                indices = indices.copy()
                self._substitute(failures, indices, out, epoch, seed)
        if self._done_with is not None:
            del views  # the decoded bytes are no longer referenced by this batch
            self._done_with(indices)
        slot.indices[:m] = indices
        np.take(self._labels, indices, axis=0, out=slot.labels[:m])
        return indices

    def _report_bad(self, i: int, reason: str) -> None:
        if i not in self._bad:
            self._bad.add(i)
            log.warning("skipping bad record %d (%s): %s", i, self._locate(i), reason)

    def _locate(self, i: int) -> str:
        try:
            return str(self.dataset.locate(int(i)))
        except Exception as exc:  # noqa: BLE001 - a location is best effort inside an error message
            return f"location unknown: {exc}"

    def _substitute(self, failures: Dict[int, str], indices: np.ndarray, out: np.ndarray, epoch: int,
                    seed: int) -> None:
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
                    result = self._decode([view], out[pos:pos + 1], self.config.transform, seed=seed,
                                          epoch=epoch, indices=sub, **self._decode_kwargs)
                    if result.ok:
                        indices[pos] = j
                        break
                    err = result.errors.get(0, "decode failed")
                self._report_bad(j, err)
            else:
                raise DecodeError(f"no decodable record among the {self.config.max_substitutes} records after this one "
                                  f"(on_error='skip'); the data looks damaged", index=i, source=self._locate(i))



class _EpochEnd:
    """Marker the producer puts after the last batch of an epoch."""

    __slots__ = ("epoch",)

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch


class _Stream:
    """The running producer and the position of the next item it will hand out."""

    def __init__(self, pipeline: "_Pipeline", ring: BatchRing, epoch: int, start: int,
                 produce: Optional[Callable[[threading.Event], Iterator[Any]]] = None) -> None:
        self.epoch, self.batch = epoch, start
        # A stream of caller-chosen batches (Loader.iterate_batches) is never resumed by __iter__.
        self.external = produce is not None
        ring.reset()
        self._ring = ring
        if produce is None:
            # The lambda closes over the pipeline only, never the Loader (see Loader._build).
            produce = lambda stop: pipeline.produce(epoch, start, stop)  # noqa: E731
        self.producer = Producer(produce, maxsize=len(ring.slots), name=f"fastload-loader-e{epoch}b{start}")

    def close(self) -> None:
        self.producer.close()
        self._ring.release_all()


class _EpochIterator:
    """One pass over an epoch, reading from the loader's stream.

    Finishing the epoch leaves the stream running into the next epoch (bounded by the ring); ending
    early (break then a new iteration, ``set_epoch``, an exception, ``close``) stops it.
    """

    def __init__(self, loader: Loader, stream: _Stream) -> None:
        self._loader, self._stream = loader, stream
        self.epoch, self.start, self.taken = stream.epoch, stream.batch, 0
        self.finished = False
        #: Seconds a ``next()`` waits for a batch at most (None: no limit); TimeoutError after that.
        self.timeout: Optional[float] = None
        self._closed = False

    def __iter__(self) -> "_EpochIterator":
        return self

    def __len__(self) -> int:
        return len(self._loader) - self.start

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        loader = self._loader
        timer = loader.timer
        timer.consumer_active()
        try:
            with timer.span(Stage.WAIT_DATA):
                item = self._stream.producer.get(self.timeout)
        except BaseException:
            self.close()
            raise
        if isinstance(item, _EpochEnd):
            self.finished = self._closed = True
            self._stream.epoch, self._stream.batch = item.epoch + 1, 0
            if not self._stream.external:
                loader._epoch_finished(item.epoch)
            timer.consumer_idle()
            raise StopIteration
        self._stream.batch += 1
        loader.ring.consumed(item.slot, item._generation)
        self.taken += 1
        timer.consumer_took(item.size)
        if loader.config.copy:
            copy = item.copy()
            item.release()
            return copy
        return item

    def close(self) -> None:
        """End this pass; a pass that did not finish its epoch stops the stream (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._loader._stop_stream(self._stream)
        self._loader.timer.consumer_idle()
