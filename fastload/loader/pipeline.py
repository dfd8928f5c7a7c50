"""The loader's producer side: order -> read-ahead -> records -> decode into a ring slot."""

from __future__ import annotations

import logging
import threading
import typing
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fastload.batch import Batch, BatchRing, Slot
from fastload.errors import CorruptRecordError, DecodeError, OnError
from fastload.loader.config import LoaderConfig
from fastload.order import EpochOrder, OrderSpec
from fastload.stats import Stage, StageTimer
from fastload.transforms.mixing import mix_batch

log = logging.getLogger("fastload.loader")


class _EpochEnd:
    """Marker the producer puts after the last batch of an epoch."""

    __slots__ = ("epoch",)

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch


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
