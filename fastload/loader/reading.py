"""The loader's reads: each batch's records, read ahead in decode order or one by one.

With ``LoaderConfig.read_options`` (the default), a :class:`~fastload.records.readahead.ReadAhead`
is given the records of the rest of the epoch in decode order, with where the order's shuffle
windows start (:func:`fastload.order.window_starts`), and the next epoch's once every read of this
one is done: reads run on across the epoch boundary, as the producer does. The producer then
asks for each batch's positions: the time it waits for reads still in flight is the ``read_wait``
stage, handing the records over (each checked as ``Dataset.image`` checks it) the ``read`` stage,
and what was read (bytes, read calls, records) goes into the stats. Batches chosen by the caller
(:meth:`Loader.iterate_batches`, a sampler's) are added to the plan one at a time: their records
are read in parallel and coalesced, without reading ahead of the sampler.

With reads ahead, each batch's hand-over (its records checked one by one in Python, tens of us a
record) runs on a thread of its own one batch ahead (:class:`_Handover`): batch ``k + 1``'s while
batch ``k`` decodes, since the decode releases the GIL. ``read_wait`` is then the producer waiting
for a hand-over not done yet: for reads still in flight, or for checks slower than the decode.

Without read options (``read_options=None``), or for a dataset that fetches whole shards ahead of
the loader itself (remote datasets: ``will_read``), records are read one by one on the producer
thread and the OS is hinted ``read_ahead`` batches ahead (``will_need``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, InvalidStateError, wait
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from fastload.errors import CorruptRecordError
from fastload.loader.config import LoaderConfig
from fastload.order import EpochOrder, OrderSpec, window_starts
from fastload.records.readahead import ReadAhead
from fastload.stats import Stage, StageTimer

T = TypeVar("T")
_END = object()


def _cpus() -> int:
    """The CPUs this process may run on: the decode's threads when ``num_threads`` is None.

    Counted here, not through ``fastload.decode``: importing it from this module changes when the
    engine is loaded, and MXNet's distributed workers then aborted at exit
    (``tests/test_mxnet_clients.py``, the ``dist_sync`` run).
    """
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _BatchReads:
    """The producer's source of record bytes (see the module docstring); used on the producer thread."""

    def __init__(self, dataset: Any, config: LoaderConfig, spec: OrderSpec, timer: StageTimer) -> None:
        self.dataset, self.spec, self.timer = dataset, spec, timer
        self._ahead = config.read_ahead
        self._will_need = getattr(dataset, "will_need", None)
        remote = getattr(dataset, "will_read", None) is not None
        self._reader = (
            ReadAhead(dataset, config.read_options, decode_threads=config.num_threads or _cpus())
            if config.read_options is not None and not remote
            else None
        )
        self._order: EpochOrder | None = None
        self._following: EpochOrder | None = None  # the order after this one (planned once reads are done)
        self._base = 0  # plan position of the epoch's batch 0
        self._batches = 0
        self._next: tuple[EpochOrder, int] | None = None  # (order, plan position) already appended to the plan
        self._last = (0, 0, 0)  # the reader's counters at the last batch

    @property
    def reading_ahead(self) -> bool:
        """Whether records are read ahead (False: one by one with OS hints)."""
        return self._reader is not None

    # --- the plan ---------------------------------------------------------------------------------

    def _span(self, order: EpochOrder) -> int:
        """Positions of the order's ``rest`` its batches cover (drop_last may leave a tail out)."""
        return min(len(order) * self.spec.batch_size, len(order.rest))

    def _windows(self, order: EpochOrder, first: int) -> NDArray[np.int64]:
        """Where shuffle windows start in ``order.rest[first:]``.

        Empty in a layout resumed under another world size, whose share cuts across the windows:
        the read groups are then cut by the budget alone.
        """
        if order.level:
            return np.zeros(0, dtype=np.int64)
        return window_starts(self.spec, order.epoch) - order.offset - first

    def start_epoch(self, order: EpochOrder, start: int, following: EpochOrder) -> None:
        """The producer starts ``order`` (one epoch, or what is left of it) at batch ``start``.

        ``following`` is the order the producer runs on into afterwards (the next epoch, started
        after the records MXNet's ``round_batch`` borrowed): its reads are planned once this
        order's are done.
        """
        self._order, self._following, self._batches = order, following, len(order)
        bs = self.spec.batch_size
        if self._reader is not None:
            self._reader.resume()
        if self._reader is None:
            with self.timer.span(Stage.READ, what="read-ahead"):
                for k in range(start, min(len(order), start + 1 + self._ahead)):
                    self._hint(order[k])
            return
        if self._next is not None and self._next[0] is order and start == 0:
            self._base = self._next[1]  # planned already, as the continuation of the last epoch
        else:
            with self.timer.span(Stage.READ, what="read-ahead"):
                self._reader.begin(order.rest[start * bs : self._span(order)], self._windows(order, start * bs))
            self._base = -start * bs
        self._next = None

    def start_feed(self) -> None:
        """The producer starts a run over caller-chosen batches."""
        self._order, self._following, self._next, self._base = None, None, None, 0
        if self._reader is not None:
            self._reader.resume()
            self._reader.begin(np.zeros(0, dtype=np.int64))

    def _continue(self) -> None:
        """Append the next epoch to the plan once all of this one's reads are done.

        Not before: on a disk the next epoch's reads would share the bandwidth with this epoch's
        last ones and delay them; the batches left to decode hide the next epoch's first reads.
        """
        reader, nxt = self._reader, self._following
        if reader is None or nxt is None or self._next is not None or reader.unissued or not reader.settled:
            return
        self._next = (nxt, reader.planned)
        reader.extend(nxt.rest[: self._span(nxt)], self._windows(nxt, 0))

    def _hint(self, indices: NDArray[np.int64]) -> None:
        if self._will_need is not None and len(indices):
            self._will_need(indices)

    # --- a batch ----------------------------------------------------------------------------------

    def batch(self, k: int, indices: NDArray[np.int64]) -> tuple[list[Any], dict[int, str]] | None:
        """The records of the epoch's batch ``k``.

        Args:
            k: The batch number.
            indices: ``order[k]``, plus any rows that complete a short final batch
                (``round_batch``), which are read directly.

        Returns:
            ``(views, errors)``: one image per row, and the reason for each unreadable row; None
            when the producer is being stopped (:meth:`wake`).
        """
        if self._reader is None:
            order = self._order
            if order is not None and k + 1 + self._ahead < self._batches:
                with self.timer.span(Stage.READ, what="read-ahead"):
                    self._hint(order[k + 1 + self._ahead])
            return self._direct(indices, k)
        planned = len(self._order[k]) if self._order is not None else 0
        p0 = self._base + k * self.spec.batch_size
        got = self._from_reader(p0, p0 + planned, k)
        if got is None:
            return None
        views, errors = got
        if planned < len(indices):
            more, more_errors = self._direct(indices[planned:], k)
            views += more
            errors.update({planned + pos: why for pos, why in more_errors.items()})
        self._continue()
        return views, errors

    def fed(self, k: int, indices: NDArray[np.int64]) -> tuple[list[Any], dict[int, str]] | None:
        """The records of a caller-chosen batch (added to the plan, read in parallel and coalesced).

        Returns None when the producer is being stopped.
        """
        if self._reader is None:
            return self._direct(indices, k)
        p0 = self._reader.planned
        self._reader.extend(indices)
        return self._from_reader(p0, p0 + len(indices), k)

    def _from_reader(self, p0: int, p1: int, k: int) -> tuple[list[Any], dict[int, str]] | None:
        reader = self._reader
        assert reader is not None
        # Not a read_wait span: this runs on the hand-over thread, beside the previous batch's decode;
        # the producer's own wait for the hand-over is the read_wait (_Handover.run).
        if not reader.wait(p0, p1):
            return None
        with self.timer.span(Stage.READ, batch=k):
            views, errors = reader.records(p0, p1)
        c = reader.counters()
        last, self._last = self._last, (c.bytes, c.reads, c.records)
        self.timer.count_reads(c.bytes - last[0], c.reads - last[1], c.records - last[2])
        return views, errors

    def _direct(self, indices: NDArray[np.int64], k: int) -> tuple[list[Any], dict[int, str]]:
        """Each record read on this thread with ``Dataset.image``."""
        errors: dict[int, str] = {}
        with self.timer.span(Stage.READ, batch=k):
            image = self.dataset.image
            try:
                return [image(i) for i in indices.tolist()], errors
            except (CorruptRecordError, OSError, ValueError):
                views = []
                for pos, i in enumerate(indices.tolist()):
                    try:
                        views.append(image(i))
                    except (CorruptRecordError, OSError, ValueError) as exc:
                        views.append(b"")
                        errors[pos] = f"unreadable record: {exc}"
                return views, errors

    def wake(self) -> None:
        """End a wait for reads now: the producer is being stopped (any thread)."""
        if self._reader is not None:
            self._reader.interrupt()

    def close(self) -> None:
        """Stop the reads not started and wait for those in flight (idempotent, any thread)."""
        if self._reader is not None:
            self._reader.close()


class _Handover:
    """Runs an iterator of batch hand-overs one item ahead, on a thread of its own.

    Handing a batch's records to the decode on the producer thread, between two decode calls, left
    the engine's threads idle for that time: on 16 cores a batch of 256 decodes in about 30 ms, and
    its hand-over took 10-25 ms more. :meth:`run` computes item ``k + 1`` while the caller works on
    item ``k`` (the decode releases the GIL); the caller waits only for what is not done yet, timed
    as ``read_wait``.

    One item is in flight at most. A run whose caller stopped early leaves it pending: :meth:`settle`
    waits for it (it ends promptly once its producer's stop is set: the reads' waits are
    interrupted, an index feed watches the stop event) before anything else uses the reads. The
    thread is a daemon, like the producer's: an item blocked on a feed nobody fills any more (a pass
    left open at interpreter exit) must not hold the exit, which a ``ThreadPoolExecutor`` would.
    """

    def __init__(self, timer: StageTimer) -> None:
        self._timer = timer
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pending: Future[Any] | None = None
        self._woken: Future[None] = Future()  # done once the running run's producer is being stopped

    def _submit(self, fn: Callable[[], Any]) -> Future[Any]:
        if self._thread is None:
            self._thread = threading.Thread(target=_serve, args=(self._jobs,), name="fastload-handover", daemon=True)
            self._thread.start()
        fut: Future[Any] = Future()
        self._jobs.put((fut, fn))
        self._pending = fut
        return fut

    def run(self, items: Iterator[T], stop: threading.Event) -> Iterator[T]:
        """The items of ``items``, each next one computed on the hand-over thread meanwhile.

        Ends early once ``stop`` is set (and :meth:`wake` called): the producer does not wait for
        a hand-over still in flight, which :meth:`settle` then waits for (the caller settles
        before the reads restart, so a run starts with none in flight).
        """
        woken = self._woken = Future()
        timer = self._timer
        step: Callable[[], Any] = lambda: next(items, _END)  # noqa: E731
        fut = self._submit(step)
        while not stop.is_set():  # a wake() before this run's `woken` existed came after stop.set()
            with timer.span(Stage.READ_WAIT):
                wait([fut, woken], return_when=FIRST_COMPLETED)
                if not fut.done():
                    return
                item = fut.result()  # its exception, with the hand-over's frames in its traceback
            if item is _END:
                self._pending = None
                return
            fut = self._submit(step)
            yield item
            # Not kept while the next hand-over is waited for: the records' buffers (the read-ahead's
            # groups) of a decoded batch die with its last view.
            del item

    def wake(self) -> None:
        """The producer is being stopped (called after its stop event is set; any thread)."""
        woken = self._woken
        if not woken.done():
            with contextlib.suppress(InvalidStateError):  # set by a concurrent wake()
                woken.set_result(None)

    def settle(self) -> None:
        """Wait for the item a stopped run left in flight (the reads are the next run's after it)."""
        fut, self._pending = self._pending, None
        if fut is not None and not sys.is_finalizing():
            # Its batch was abandoned with its run: whatever it returns or raises is not used.
            # (During interpreter shutdown a daemon thread never runs again: a loader closed by a
            # module's teardown would wait for it forever, and nothing reuses the reads then.)
            wait([fut])

    def close(self) -> None:
        """Settle and end the hand-over thread (idempotent; after the producer stopped)."""
        self.settle()
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            if not sys.is_finalizing():
                thread.join()


def _serve(jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]) -> None:
    """The hand-over thread: runs each job into its future, until ``None``."""
    while (job := jobs.get()) is not None:
        fut, fn = job
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn())
            except BaseException as exc:  # the caller re-raises it from fut.result()
                fut.set_exception(exc)
        del job, fut, fn  # nothing of a finished batch stays referenced by this frame
