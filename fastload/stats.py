"""Loader instrumentation: per-stage time, throughput, Chrome-trace events and NVTX ranges.

Stages timed (seconds, summed over batches):

- ``read``: handing a batch's records to the decode: planning the reads, checking each record
  (framing, checksum, labels), and records read one by one on the producer thread; with reads
  ahead this runs on the loader's hand-over thread, beside the previous batch's decode;
- ``read_wait``: the producer waiting for a batch's records (the reads issued ahead by
  :mod:`fastload.records.readahead` not done yet, or a hand-over slower than the decode): time the
  loader is bound by I/O;
- ``decode``: the one ``decode_batch`` call per batch (plus any bad-record substitution);
- ``wait_slot``: the producer waiting for a ring slot to come back while the prefetch queue is
  short: every slot is held by batches the consumer has not dropped yet, or by device copies still
  reading it (fences). Near 0 in a healthy run: a slot comes back the moment its batch's last view
  dies, and a consumer that keeps batches makes the ring grow instead;
- ``wait_consumer``: the producer ``prefetch`` batches ahead, waiting for the consumer to take one
  (back-pressure: the consumer is the slower side, the normal state of a model-bound run);
- ``wait_data``: the consumer waiting for a batch (the loader is slower: input-bound);
- ``copy``: device copies issued by an adapter (for asynchronous CUDA copies, the time to issue them).

``input_bound`` = ``wait_data`` / consumer wall time answers "is my training input-bound?": near 0
means the model is the bottleneck, near 1 means the GPU waits for data. ``io_bound`` answers "bound
by what?": the share of the producer's working time (``read`` + ``read_wait`` + ``decode``) spent
waiting for storage; near 1 the disk is the limit (read ahead more, choose a more sequential order),
near 0 decoding is (more threads, smaller images).
"""

from __future__ import annotations

import enum
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["LoaderStats", "RangeHooks", "Stage", "StageTimer"]

#: ``(push(name), pop())`` called around every timed span (e.g. ``torch.cuda.nvtx.range_push`` /
#: ``range_pop``).
RangeHooks = tuple[Callable[[str], object], Callable[[], object]]


class Stage(str, enum.Enum):
    """A timed stage of the data path."""

    READ = "read"
    READ_WAIT = "read_wait"
    DECODE = "decode"
    WAIT_SLOT = "wait_slot"
    WAIT_CONSUMER = "wait_consumer"
    WAIT_DATA = "wait_data"
    COPY = "copy"


@dataclass(frozen=True, kw_only=True)
class LoaderStats:
    """A snapshot of a loader's counters.

    Attributes:
        seconds: Time per stage name (see the module docstring).
        batches: Batches handed to the consumer.
        images: Images handed to the consumer.
        wall: Seconds the consumer spent iterating (from asking for the first batch to taking the last).
        images_per_s: ``images / wall``.
        input_bound: Fraction of ``wall`` the consumer spent waiting for data.
        skipped: Bad records replaced under ``on_error="skip"`` in the batches handed out (occurrences).
        backend: The decode backend that produced the pixels.
        sliced: Images of the batches handed out decoded through restart-interval slices
            (restart-indexed shards).
        slice_fallbacks: Restart-marked images whose markers did not match their claimed geometry
            and took the plain decode path instead.
        ring_slots: Slots in the batch ring now (more than ``prefetch + 2`` when the consumer kept
            batches and the ring grew).
        fresh_batches: Batches handed out in freshly allocated memory because the consumer kept more
            batches than the ring may grow for.
        gc_runs: Garbage collections the ring ran to find kept batches held only by reference cycles.
        io_bound: Share of the producer's working time spent waiting for storage (``read_wait``
            over ``read + read_wait + decode``).
        bytes_read: Bytes read from storage by the read-ahead (the bytes between coalesced
            records included).
        reads: Read calls the read-ahead made (one per coalesced run of records).
        records_read: Records handed to the decode from those reads.
    """

    seconds: dict[str, float] = field(default_factory=dict)
    batches: int = 0
    images: int = 0
    wall: float = 0.0
    images_per_s: float = 0.0
    input_bound: float = 0.0
    skipped: int = 0
    backend: str = ""
    sliced: int = 0
    slice_fallbacks: int = 0
    ring_slots: int = 0
    fresh_batches: int = 0
    gc_runs: int = 0
    io_bound: float = 0.0
    bytes_read: int = 0
    reads: int = 0
    records_read: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One human-readable paragraph."""
        stages = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        verdict = (
            "input-bound"
            if self.input_bound > 0.5
            else "partly input-bound"
            if self.input_bound > 0.1
            else "not input-bound"
        )
        if self.input_bound > 0.1:
            verdict += ", on storage" if self.io_bound > 0.5 else ", on decoding"
        reads = (
            f"read {self.bytes_read / 1e6:,.1f} MB in {self.reads:,} reads "
            f"({self.records_read / self.reads:.1f} records a read); "
            if self.reads
            else ""
        )
        return (
            f"{self.batches} batches, {self.images} images in {self.wall:.2f}s = {self.images_per_s:.0f} images/s; "
            f"consumer waited {100 * self.input_bound:.0f}% of the time ({verdict}); producer waited for storage "
            f"{100 * self.io_bound:.0f}% of its time; {reads}stages: {stages}; "
            f"skipped {self.skipped}; backend {self.backend or '?'}; "
            f"sliced {self.sliced} (fallbacks {self.slice_fallbacks}); ring {self.ring_slots} slots, "
            f"{self.fresh_batches} batches in fresh memory"
        )


class StageTimer:
    """Accumulates stage times; optionally records Chrome-trace events and emits NVTX ranges.

    Args:
        trace: Keep per-span events for :meth:`save_trace`.
        max_events: Cap on kept events (memory stays bounded on long runs; later spans are counted
            but not traced).
        range_hooks: ``(push(name), pop())`` called around every span, e.g.
            ``torch.cuda.nvtx.range_push`` / ``range_pop``; None for no ranges.
    """

    def __init__(
        self,
        *,
        trace: bool = False,
        max_events: int = 200_000,
        range_hooks: RangeHooks | None = None,
    ) -> None:
        self._trace = trace
        self._max_events = max_events
        self._hooks = range_hooks
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self.reset()

    def reset(self) -> None:
        """Zero every counter and drop the trace."""
        with self._lock:
            self._seconds = {s.value: 0.0 for s in Stage}
            self._events: list[dict[str, Any]] = []
            self._thread_names: dict[int, str] = {}
            self.batches = 0
            self.images = 0
            self.skipped = 0
            self.backend = ""
            self.sliced = 0
            self.slice_fallbacks = 0
            # (epoch, number) -> (skipped, sliced, fallbacks) of batches produced, not yet handed out.
            self._pending: dict[tuple[int, int], tuple[int, int, int]] = {}
            self.bytes_read = 0
            self.reads = 0
            self.records_read = 0
            self._wall = 0.0
            self._active_since: float | None = None
            # A span that began before the reset (a producer waiting across it) counts from here.
            self._since = time.perf_counter()

    @property
    def tracing(self) -> bool:
        """Whether spans are kept for :meth:`save_trace`."""
        return self._trace

    def set_range_hooks(self, hooks: RangeHooks | None) -> None:
        """Install or remove (None) the ``(push, pop)`` range hooks."""
        self._hooks = hooks

    @contextmanager
    def span(self, stage: Stage, **args: Any) -> Iterator[None]:
        """Time the enclosed block as ``stage``."""
        hooks = self._hooks
        if hooks is not None:
            hooks[0](f"fastload.{stage.value}")
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            if hooks is not None:
                hooks[1]()
            self.add(stage, start, end, **args)

    def add(self, stage: Stage, start: float, end: float, **args: Any) -> None:
        """Account ``end - start`` seconds (``time.perf_counter`` values) to ``stage``."""
        with self._lock:
            self._seconds[stage.value] += max(0.0, end - max(start, self._since))
            if self._trace and len(self._events) < self._max_events:
                ident = threading.get_ident()  # the current thread's ident (never None, unlike .ident's type)
                self._thread_names.setdefault(ident, threading.current_thread().name)
                self._events.append(
                    {
                        "name": stage.value,
                        "ph": "X",
                        "pid": os.getpid(),
                        "tid": ident,
                        "ts": (start - self._t0) * 1e6,
                        "dur": (end - start) * 1e6,
                        "args": args,
                    }
                )

    def count_batch(self, key: tuple[int, int], *, skipped: int = 0, sliced: int = 0, fallbacks: int = 0) -> None:
        """Record what producing batch ``key`` = (epoch, number) cost: bad records replaced, restart slices.

        The counts join the totals when the consumer takes that batch (:meth:`consumer_took`), like
        ``batches`` and ``images``: a producer running ahead into the next epoch does not change the
        figures of the batches handed out so far.
        """
        if not (skipped or sliced or fallbacks):
            return
        with self._lock:
            old = self._pending.get(key, (0, 0, 0))
            self._pending[key] = (old[0] + int(skipped), old[1] + int(sliced), old[2] + int(fallbacks))

    def drop_pending(self) -> None:
        """Forget the counts of batches produced but never handed out (the producer was stopped)."""
        with self._lock:
            self._pending.clear()

    def count_reads(self, nbytes: int, reads: int, records: int) -> None:
        """Add what the read-ahead read for one batch (bytes, read calls, records handed out)."""
        with self._lock:
            self.bytes_read += int(nbytes)
            self.reads += int(reads)
            self.records_read += int(records)

    def consumer_active(self) -> None:
        """The consumer started asking for batches (start of its wall-clock)."""
        with self._lock:
            if self._active_since is None:
                self._active_since = time.perf_counter()

    def consumer_took(self, images: int, key: tuple[int, int] | None = None) -> None:
        """The consumer took a batch of ``images`` samples (``key``: its (epoch, number))."""
        with self._lock:
            now = time.perf_counter()
            if self._active_since is not None:
                self._wall += now - self._active_since
            self._active_since = now
            self.batches += 1
            self.images += images
            if key is not None and key in self._pending:
                skipped, sliced, fallbacks = self._pending.pop(key)
                self.skipped += skipped
                self.sliced += sliced
                self.slice_fallbacks += fallbacks

    def consumer_idle(self) -> None:
        """The consumer stopped iterating (end of an epoch, break, close)."""
        with self._lock:
            self._active_since = None

    def snapshot(self) -> LoaderStats:
        with self._lock:
            wall = self._wall
            sec = self._seconds
            working = sec[Stage.READ.value] + sec[Stage.READ_WAIT.value] + sec[Stage.DECODE.value]
            return LoaderStats(
                seconds=dict(self._seconds),
                batches=self.batches,
                images=self.images,
                wall=wall,
                images_per_s=self.images / wall if wall > 0 else 0.0,
                input_bound=min(1.0, self._seconds[Stage.WAIT_DATA.value] / wall) if wall > 0 else 0.0,
                skipped=self.skipped,
                backend=self.backend,
                sliced=self.sliced,
                slice_fallbacks=self.slice_fallbacks,
                io_bound=sec[Stage.READ_WAIT.value] / working if working > 0 else 0.0,
                bytes_read=self.bytes_read,
                reads=self.reads,
                records_read=self.records_read,
            )

    def save_trace(self, path: str) -> str:
        """Write the recorded spans as Chrome-trace JSON (open in chrome://tracing or Perfetto).

        Returns:
            The path written.
        """
        with self._lock:
            events = list(self._events)
            names = dict(self._thread_names)
        meta = [
            {"name": "thread_name", "ph": "M", "pid": os.getpid(), "tid": tid, "args": {"name": name}}
            for tid, name in names.items()
        ]
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump({"traceEvents": meta + events, "displayTimeUnit": "ms"}, fh)
        os.replace(tmp, path)
        return path
