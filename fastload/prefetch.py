"""The prefetch queue: one producer thread, bounded, stoppable, forwarding its exceptions.

:class:`Producer` runs ``produce(stop)`` -- a generator function -- on a background thread and hands
its items to the consumer through a bounded queue. The contract:

- at most ``maxsize`` items wait in the queue; the producer blocks (checking ``stop``) when it is full;
- an exception raised by the producer is re-raised in the consumer by :meth:`Producer.get` as the
  *same* exception object, so its traceback still shows the producer's frames, with a note naming
  the thread;
- :meth:`Producer.close` is idempotent, works while the producer is blocked on a full queue or
  inside ``produce``'s own waits (which must watch ``stop``; a ``wake`` callable given to the
  producer is called right after ``stop`` is set, so such a wait can end at once instead of at its
  next poll), and joins the thread: no thread outlives its producer;
- a ``KeyboardInterrupt`` (or any exception) in the consumer while waiting closes the producer
  before propagating.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Producer", "ProducerStopped"]

T = TypeVar("T")

_DONE = object()


class ProducerStopped(RuntimeError):
    """The producer was closed while the consumer was waiting for an item."""


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _run(
    produce: Callable[[threading.Event], Iterator[Any]], q: queue.Queue[Any], stop: threading.Event, poll: float
) -> None:
    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=poll)
                return True
            except queue.Full:
                continue
        return False

    try:
        for item in produce(stop):
            handed = put(item)
            # The consumer owns the item now; a reference from this frame would keep it alive (a
            # batch's slot is recycled only when nothing refers to the batch any more).
            item = None
            if not handed:
                return
        put(_DONE)
    except BaseException as exc:
        exc.add_note(f"(raised in fastload producer thread {threading.current_thread().name!r})")
        put(_Failure(exc))


class Producer(Generic[T]):
    """A bounded background producer.

    Args:
        produce: ``produce(stop)`` returns an iterator of items; it runs on the thread and should
            return promptly once ``stop`` is set.
        maxsize: Queue bound (>= 1).
        name: Thread name (shows in tracebacks and debuggers).
        poll: Seconds between checks of the stop event while blocked.
        wake: Called (never blocking) right after the stop event is set, to interrupt a wait of
            ``produce`` that is not on the queue (the ring's wait for a free slot).
    """

    def __init__(
        self,
        produce: Callable[[threading.Event], Iterator[T]],
        *,
        maxsize: int,
        name: str = "fastload-producer",
        poll: float = 0.05,
        wake: Callable[[], None] | None = None,
    ) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize={maxsize} must be >= 1")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=maxsize)  # items, then _DONE or a _Failure
        self._stop = threading.Event()
        self._poll = poll
        self._finished = False
        self._wake = wake
        self._thread = threading.Thread(
            target=_run, args=(produce, self._queue, self._stop, poll), name=name, daemon=True
        )
        self._thread.start()
        # If the consumer drops the producer without closing it, stop the thread anyway. The
        # finalizer holds only the event, queue and thread, never self.
        self._finalizer = weakref.finalize(self, _shutdown, self._stop, self._queue, self._thread, wake)

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def get(self, timeout: float | None = None) -> T:
        """The next item; raises StopIteration at the end, or the producer's exception.

        Args:
            timeout: Seconds to wait at most (None: no limit).

        Raises:
            StopIteration: The producer finished.
            ProducerStopped: :meth:`close` was called.
            TimeoutError: No item within ``timeout`` seconds (the producer is closed).
            BaseException: Whatever the producer raised, with its original traceback.
        """
        if self._finished:
            raise StopIteration
        deadline = None if not timeout else time.monotonic() + timeout
        try:
            while True:
                try:
                    item = self._queue.get(timeout=self._poll)
                    break
                except queue.Empty:
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"no batch within {timeout} seconds") from None
                    if self._stop.is_set():
                        raise ProducerStopped("the producer was closed") from None
                    if not self._thread.is_alive() and self._queue.empty():
                        raise ProducerStopped("the producer thread ended without finishing") from None
        except ProducerStopped:
            # Whoever set the stop event is closing (and joining) the thread: return at once, even
            # while the producer still finishes an uninterruptible step.
            self._finished = True
            raise
        except BaseException:
            # Ctrl-C lands here while blocked in get(): stop the thread before propagating.
            self.close()
            raise
        if item is _DONE:
            self._finished = True
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            self.close()
            raise item.exc
        produced: T = item
        return produced

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread and wait for it (idempotent)."""
        self._finished = True
        self._finalizer.detach()
        _shutdown(self._stop, self._queue, self._thread, self._wake, timeout)

    def __enter__(self) -> Producer[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shutdown(
    stop: threading.Event,
    q: queue.Queue[Any],
    thread: threading.Thread,
    wake: Callable[[], None] | None = None,
    timeout: float = 10.0,
) -> None:
    stop.set()
    if wake is not None:
        wake()
    # Draining unblocks a producer stuck in put() at once instead of after its next poll.
    try:
        while True:
            q.get_nowait()
    except queue.Empty:
        pass
    if thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"fastload producer thread {thread.name!r} did not stop within {timeout} s")
