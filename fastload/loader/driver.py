"""The loader's lifecycle: the producer thread's runs, the consumer's passes and position, ``close()``."""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable, Iterator

import numpy as np

from fastload.batch import Batch, BatchRing
from fastload.errors import KeptBatchesWarning, LoaderBusy, LoaderClosed
from fastload.loader.pipeline import _Cursor, _EpochEnd, _Pipeline
from fastload.order import EpochOrder
from fastload.prefetch import Producer, ProducerStopped
from fastload.stats import Stage, StageTimer

#: A pass over caller-chosen batches (:meth:`Loader.iterate_batches`): ``(batches, seed, epoch)``,
#: where ``batches(stop)`` yields the int64 index arrays.
Feed = tuple[Callable[[threading.Event], Iterator[np.ndarray]], int, int]


class _Run:
    """One producer thread running from a position; only :class:`_Driver` creates and stops it.

    Attributes:
        cursor: Where the order of the next item it hands out starts.
        batch: Batch number of the next item it hands out, in that order.
        producer: The :class:`~fastload.prefetch.Producer`.
    """

    def __init__(
        self, pipeline: _Pipeline, ring: BatchRing, cursor: _Cursor, start: int, feed: Feed | None = None
    ) -> None:
        self.cursor, self.batch = cursor, start
        # A run over caller-chosen batches (Loader.iterate_batches) is never continued by a later pass.
        self.external = feed is not None
        if feed is None:
            # The lambda closes over the pipeline only, never the Loader or the driver (see Loader._build).
            produce = lambda stop: pipeline.produce(cursor, start, stop)  # noqa: E731
        else:
            batches, seed, feed_epoch = feed
            produce = lambda stop: pipeline.produce_batches(batches(stop), seed, feed_epoch, stop)  # noqa: E731

        def wake() -> None:
            # Stopping: unblock the producer wherever it waits (a free slot, reads in flight).
            ring.wake()
            pipeline.wake()

        self.producer = Producer(
            produce, maxsize=ring.base_slots, name=f"fastload-loader-e{cursor.epoch}b{start}", wake=wake
        )

    def stop(self) -> None:
        self.producer.close()


class _Pass:
    """The state of one pass over an epoch (what ``iter(loader)`` started), kept by the driver."""

    __slots__ = ("cursor", "ended", "external", "finished", "iterator", "start", "taken", "thread", "timeout")

    def __init__(
        self,
        cursor: _Cursor,
        start: int,
        thread: threading.Thread,
        *,
        external: bool = False,
        timeout: float | None = None,
    ) -> None:
        self.cursor, self.start, self.taken = cursor, start, 0
        self.external = external  # over caller-chosen batches: does not move the loader's position
        self.timeout = timeout
        self.finished = False  # the epoch's end was reached
        self.ended = False  # finished, or ended early (close, a new pass, set_epoch, an error)
        self.thread = thread
        self.iterator: weakref.ref | None = None

    @property
    def epoch(self) -> int:
        return self.cursor.epoch

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
        self._next, self._resume = _Cursor(0), 0  # where the next pass starts: an order and a batch in it
        self.loaded = False  # the next pass starts at a loaded state (until a pass begins)
        self._pass: _Pass | None = None  # the latest pass
        self.closed = False
        self._warned = False

    # --- position -------------------------------------------------------------------------------

    def current_epoch(self) -> int:
        with self._lock:
            ps = self._pass
            return ps.epoch if ps is not None and not ps.finished and not ps.external else self._next.epoch

    def position(self) -> tuple[_Cursor, int]:
        """(order, batch) after the last batch handed to the consumer (or where the next pass starts)."""
        with self._lock:
            ps = self._pass
            if ps is not None and not ps.finished and not ps.external:
                return ps.cursor, ps.start + ps.taken
            return self._next, self._resume

    def order(self, cursor: _Cursor) -> EpochOrder:
        """This rank's order from ``cursor`` (:class:`~fastload.order.EpochOrder`, computed once)."""
        return self._pipeline.order(cursor)

    def pass_batches(self, ps: _Pass) -> int:
        """Batches of pass ``ps``'s order (the loader's nominal epoch for caller-chosen batches)."""
        return self.num_batches if ps.external else len(self._pipeline.order(ps.cursor))

    def seek(self, cursor: _Cursor, batch: int, action: str, *, loaded: bool = False) -> None:
        """The next pass starts at batch ``batch`` of ``cursor``'s order; ends this thread's open pass."""
        with self._lock:
            self._refuse_other_thread(action)
            if self._pass is not None:
                self._end_pass_locked(self._pass)
                self._pass = None
            self._next, self._resume = cursor, batch
            self.loaded = loaded

    # --- passes ---------------------------------------------------------------------------------

    def begin_pass(self, feed: Feed | None = None, timeout: float | None = None) -> _Pass:
        with self._lock:
            if self.closed:
                raise LoaderClosed("the loader is closed")
            self._refuse_other_thread("start iterating it")
            if self._pass is not None:
                self._end_pass_locked(self._pass)
            if feed is not None:
                # Caller-chosen batches: always a fresh run; the loader's own position stays.
                self._stop_run_locked()
                self.run = _Run(self._pipeline, self._ring, _Cursor(feed[2]), 0, feed=feed)
                self._pass = _Pass(_Cursor(feed[2]), 0, threading.current_thread(), external=True, timeout=timeout)
                return self._pass
            start, self._resume = self._resume, 0
            self.loaded = False
            run = self.run
            if run is None or run.external or (run.cursor, run.batch) != (self._next, start):
                # Not where the running producer is (first pass, set_epoch to another epoch, resume,
                # an abandoned pass): restart it there. Otherwise keep what it already prefetched.
                self._stop_run_locked()
                self.run = _Run(self._pipeline, self._ring, self._next, start)
            self._pass = _Pass(self._next, start, threading.current_thread())
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
                run.cursor, run.batch = item.next, 0
                if not ps.external:
                    self._next, self._resume = item.next, 0
                timer.consumer_idle()
                raise StopIteration
            run.batch += 1
            ps.taken += 1
        self._ring.taken(item.slot, item._generation)
        timer.consumer_took(item.size, (item.epoch, item.number))
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
            try:
                self._pipeline.close()  # the reads ahead: cancelled, those in flight waited for
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
            self._timer.drop_pending()  # its batches still queued are never handed out
