"""The loader's producer side: order -> read-ahead -> records -> decode into a ring slot.

Reads are :mod:`fastload.loader.reading`'s: a batch's records arrive read ahead in decode order
(or one by one), checked; this module decodes them into the slot and applies ``on_error``.
"""

from __future__ import annotations

import logging
import threading
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from fastload.batch import Batch, BatchRing, Layout, Slot
from fastload.errors import CorruptRecordError, DecodeError, OnError
from fastload.loader.config import LoaderConfig
from fastload.loader.reading import _BatchReads, _Handover
from fastload.order import EpochOrder, OrderSpec, share_length
from fastload.stats import Stage, StageTimer
from fastload.transforms.mixing import mix_batch

log = logging.getLogger("fastload.loader")


class Records(Protocol):
    """What the loader reads: the records contract (:class:`fastload.records.base.Dataset`).

    ``will_need``, ``will_read``, ``done_with`` and ``shard_starts`` are used when the dataset has them.
    """

    @property
    def labels(self) -> Any:
        """Per-record labels, ``[N]`` or ``[N, label_width]``."""

    def __len__(self) -> int: ...

    def image(self, i: int) -> Any:
        """The encoded image bytes of record ``i`` (a buffer)."""

    def locate(self, i: int) -> str:
        """Where record ``i`` lives, for messages."""

    def close(self) -> None:
        """Release the dataset's files."""


@dataclass(frozen=True)
class _Cursor:
    """Where a pass starts: an epoch, the layouts before this one in it, and the samples already handed out.

    ``history`` holds the ``(world_size, samples)`` pairs of the jobs that ran earlier in the epoch
    under other world sizes (:mod:`fastload.position`); ``offset`` is how many samples of this
    rank's share were handed out before the pass (a resume at the same world size, or the records
    MXNet's ``round_batch`` borrowed for the previous epoch's last batch).
    """

    epoch: int
    history: tuple[tuple[int, int], ...] = ()
    offset: int = 0


#: One batch handed over to the decode: its number, its record indices and ``(views, errors)`` of
#: its records (None: the producer is being stopped).
_Handed = tuple[int, NDArray[np.int64], "tuple[list[Any], dict[int, str]] | None"]


class _EpochEnd:
    """Marker the producer puts after the last batch of an epoch, with where the next epoch starts."""

    __slots__ = ("cursor", "next")

    def __init__(self, cursor: _Cursor, next_cursor: _Cursor) -> None:
        self.cursor, self.next = cursor, next_cursor

    @property
    def epoch(self) -> int:
        return self.cursor.epoch


class _Pipeline:
    """The producer side: order -> read-ahead -> records -> decode into a slot (runs on the thread)."""

    def __init__(
        self,
        dataset: Records,
        config: LoaderConfig,
        order_spec: OrderSpec,
        labels: NDArray[np.float32],
        ring: BatchRing,
        timer: StageTimer,
        decode: Callable[..., Any] | None,
    ) -> None:
        if decode is None:
            from fastload.decode import decode_batch

            decode = decode_batch
        self.dataset, self.config, self.order_spec = dataset, config, order_spec
        self.ring, self.timer = ring, timer
        self._labels = labels
        self._num_records = len(labels)
        self._decode = decode
        self._decode_kwargs: dict[str, Any] = {"threads": config.num_threads, "layout": Layout(config.layout).value}
        if config.decode_options is not None:
            self._decode_kwargs["options"] = config.decode_options
        self._will_read = getattr(dataset, "will_read", None)  # datasets that fetch shards ahead (remote)
        self._done_with = getattr(dataset, "done_with", None)
        self._bad: set[int] = set()
        # The orders of the last cursors asked for: the consumer (state_dict, len) and the producer
        # share them, so a resumed epoch's remaining records are computed once.
        self._orders: dict[_Cursor, EpochOrder] = {}
        self._orders_lock = threading.Lock()
        self.reads = _BatchReads(dataset, config, order_spec, timer)
        self._handover = _Handover(timer)

    def order(self, cursor: _Cursor) -> EpochOrder:
        """This rank's order from ``cursor`` (raises ValueError for a cursor that does not fit the order)."""
        with self._orders_lock:
            order = self._orders.get(cursor)
            if order is None:
                order = EpochOrder(self.order_spec, cursor.epoch, consumed=cursor.history, offset=cursor.offset)
                if len(self._orders) >= 4:
                    self._orders.pop(next(iter(self._orders)))
                self._orders[cursor] = order
            return order

    def next_cursor(self, cursor: _Cursor) -> _Cursor:
        """Where the epoch after ``cursor``'s starts: its first record, or after what ``round_batch`` borrowed.

        MXNet's ``round_batch``: the last batch is completed with the first records of the next
        epoch's order, and that epoch then starts after them (the following ones too, when a batch
        is larger than a share).
        """
        if not self.config.round_batch:
            return _Cursor(cursor.epoch + 1)
        order = self.order(cursor)
        n = len(order)
        borrowed = max(0, n * self.config.batch_size - len(order.rest))
        share = share_length(self.order_spec.num_records, self.order_spec.world_size, self.order_spec.even)
        epoch, offset = cursor.epoch + 1 + borrowed // share, borrowed % share
        return _Cursor(epoch, (), offset)

    def _borrowed(self, cursor: _Cursor, count: int) -> NDArray[np.int64]:
        """The first ``count`` records of the orders after ``cursor``'s epoch (``round_batch`` padding)."""
        parts, epoch = [], cursor.epoch + 1
        while count > 0:
            share = self.order(_Cursor(epoch)).share
            parts.append(share[:count])
            count -= len(parts[-1])
            epoch += 1
        return np.concatenate(parts)

    def wake(self) -> None:
        """The producer is being stopped: end its wait for reads (any thread)."""
        self.reads.wake()
        self._handover.wake()

    def close(self) -> None:
        """Stop the hand-over and the reads ahead (after the producer stopped; idempotent)."""
        self._handover.close()
        self.reads.close()

    def _handed(self, items: Iterator[_Handed], stop: threading.Event) -> Iterator[_Handed]:
        """Each batch's hand-over one batch ahead while reading ahead (else on the producer thread).

        Records read one by one (no read-ahead, or a remote dataset that fetches whole shards) stay
        on the producer thread: such a dataset's ``done_with`` must not run beside its reads.
        """
        return self._handover.run(items, stop) if self.reads.reading_ahead else items

    def produce(self, cursor: _Cursor, start: int, stop: threading.Event) -> Iterator[Batch | _EpochEnd]:
        """Producer-thread body: filled batches from batch ``start`` of ``cursor``'s order on, epoch after epoch.

        An :class:`_EpochEnd` marker follows each epoch's last batch. Running on into the next
        epoch keeps the decode threads busy across the boundary instead of restarting cold.
        """
        while True:
            # `yield from`, not a loop variable: a batch referred to by a suspended producer frame
            # would keep its lease (and slot) alive after the consumer dropped it.
            stopped = yield from self._produce_epoch(cursor, start, stop)
            if stopped:
                return
            following = self.next_cursor(cursor)
            yield _EpochEnd(cursor, following)
            cursor, start = following, 0

    def _produce_epoch(self, cursor: _Cursor, start: int, stop: threading.Event) -> typing.Generator[Batch, None, bool]:
        """The batches of one epoch from ``start``; returns True when stopped before its end."""
        epoch = cursor.epoch
        order = self.order(cursor)
        n = len(order)
        following = self.order(self.next_cursor(cursor))
        self._handover.settle()  # a stopped run's hand-over is done with the reads before they restart
        if self._will_read is not None:
            # Every record this rank reads from here on, in order (the rest of this epoch, then the
            # next one), so the dataset fetches whole shards ahead of the decode.
            bs = self.order_spec.batch_size
            self._will_read(order.rest[start * bs : n * bs], following.rest[: len(following) * bs])
        self.reads.start_epoch(order, start, following)
        return (yield from self._fill_handed(self._handed(self._epoch_reads(cursor, order, start), stop), epoch, stop))

    def _epoch_reads(self, cursor: _Cursor, order: EpochOrder, start: int) -> Iterator[_Handed]:
        """``(k, indices, records)`` for the batches of ``order`` from ``start`` (records None: stopping)."""
        bs = self.order_spec.batch_size
        for k in range(start, len(order)):
            indices = order[k]
            if self.config.round_batch and len(indices) < bs:
                indices = np.concatenate([indices, self._borrowed(cursor, bs - len(indices))])
            got = self.reads.batch(k, indices)
            yield k, indices, got
            if got is None:
                return

    def _fill_handed(
        self, handed: Iterator[_Handed], epoch: int, stop: threading.Event, seed: int | None = None
    ) -> typing.Generator[Batch, None, bool]:
        """Decode each handed-over batch into a ring slot; returns True when stopped before the end."""
        for k, indices, got in handed:
            if got is None:  # stopping
                return True
            slot = self.ring.acquire(stop)  # its waits reach the timer through the ring's on_wait
            if slot is None:
                return True
            try:
                indices = self._fill(slot, indices, epoch, k, got, seed)
            except BaseException:
                self.ring.unused(slot)
                raise
            del got  # the records' bytes: not kept alive by this frame while it is suspended
            yield self.ring.lease(slot, rows=len(indices), epoch=epoch, number=k)
        return stop.is_set()  # the hand-over ends early when stopped

    def produce_batches(
        self, batches: Iterator[NDArray[np.int64]], seed: int, epoch: int, stop: threading.Event
    ) -> Iterator[Batch | _EpochEnd]:
        """Producer-thread body of :meth:`Loader.iterate_batches`: one filled batch per index array."""
        self._handover.settle()
        self.reads.start_feed()
        stopped = yield from self._fill_handed(self._handed(self._fed_reads(batches), stop), epoch, stop, seed)
        if not stopped:
            yield _EpochEnd(_Cursor(epoch), _Cursor(epoch + 1))

    def _fed_reads(self, batches: Iterator[NDArray[np.int64]]) -> Iterator[_Handed]:
        """``(k, indices, records)`` for the caller's index arrays (records None: stopping)."""
        for k, indices in enumerate(batches):
            indices = np.asarray(indices, dtype=np.int64)
            got = self.reads.fed(k, indices)
            yield k, indices, got
            if got is None:
                return

    def _view(self, i: int) -> tuple[Any, str | None]:
        try:
            return self.dataset.image(int(i)), None
        except (CorruptRecordError, OSError, ValueError) as exc:
            return b"", f"unreadable record: {exc}"

    def _fill(
        self,
        slot: Slot,
        indices: NDArray[np.int64],
        epoch: int,
        number: int,
        read: tuple[list[Any], dict[int, str]],
        seed: int | None = None,
    ) -> NDArray[np.int64]:
        """Decode the batch ``indices`` (their records ``read``) into ``slot``; returns the indices used."""
        seed = self.config.seed if seed is None else seed
        m = len(indices)
        arrays = slot.arrays
        out = arrays["images"][:m]
        timer = self.timer
        views, read_errors = read
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
            failures = dict(result.errors)
            failures.update(read_errors)
            if failures:
                indices = indices.copy()
                self._substitute(failures, indices, out, epoch, seed)
            timer.count_batch(
                (epoch, number),
                skipped=len(failures),
                sliced=getattr(result, "sliced", 0),
                fallbacks=getattr(result, "slice_fallbacks", 0),
            )
            if mix is not None and getattr(result, "mix", None) is None:
                # Not mixed in the decode (a bad record was replaced, or a decode without mix=).
                mix_batch(
                    out,
                    self._labels[indices],
                    mix,
                    seed=seed,
                    epoch=epoch,
                    first_index=first,
                    layout=Layout(self.config.layout).value,
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
        self, failures: dict[int, str], indices: NDArray[np.int64], out: NDArray[Any], epoch: int, seed: int
    ) -> None:
        """Apply the on_error policy to the failed positions of one batch (in place)."""
        for pos in sorted(failures):
            i = int(indices[pos])
            if self.config.on_error is OnError.RAISE:
                raise DecodeError(failures[pos], index=i, source=self._locate(i))
            self._report_bad(i, failures[pos])
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
