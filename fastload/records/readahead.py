"""Read stage, ahead of the decode: records read as coalesced extents, in parallel, in decode order.

A cold epoch from a disk runs at what the disk serves: requests per second (IOPS) and bytes per
second (bandwidth). One ``pread`` per record, one at a time, makes every epoch run at the request
rate (an HDD's 150 requests per second are 150 images per second, whatever its bandwidth).
:class:`ReadAhead` is told the records the loader will decode, in order (:meth:`ReadAhead.begin`,
with where the order's shuffle windows start), and reads them ahead:

1. **groups**: the next records in decode order, up to half the byte budget (``budget``), so one
   group is being read while the one before it is decoded. A group ends at a shuffle window's
   start when one lies inside it: a block-order or shard-order window read whole is a few long
   runs of neighbouring records, where part of it would be many short ones. The automatic budget
   (:attr:`ReadAhead.budget`) starts small, a few batches, and grows only while reads fall
   behind the decode: from the page cache the read-ahead holds a few batches' bytes, on a slow
   disk as much as the order needs to be read in long runs. At a cold start
   (:meth:`ReadAhead.begin`) the first groups ramp up (the first batch's records, then doubling
   steps) where that costs little, so the first batch does not wait for a whole window.
2. **coalescing**: a group's records sorted by where they lie; neighbours (at most ``gap`` bytes
   apart: RecordIO's padding, LMDB's interleaved leaf pages, or on a disk with few IOPS, records
   not needed now) become one read, cut at a record boundary once it reaches ``max_read`` bytes.
3. **issue**: the reads are sorted by the first position in decode order that needs them and run
   ``queue_depth`` at a time on threads (``os.pread`` releases the GIL), into ``bytes`` objects the
   loader owns: no memory map (see :class:`~fastload.records.recordio.RecordIOShard` for why).
   With ``ReadOptions(direct=True)`` the long runs bypass the page cache (``O_DIRECT``:
   :mod:`fastload.records.direct_reads`).
   A group's reads start once the group before it is read where it has fewer reads than
   ``queue_depth`` (a few long runs: groups read at once would share the device), and the next
   group is issued as soon as a range is handed out, its bytes leaving the budget then.
4. **hand-out**: :meth:`ReadAhead.wait` blocks until the reads holding a range of positions are
   done (the loader's ``read_wait``), :meth:`ReadAhead.records` checks each record exactly as
   ``Dataset.image`` does (framing, length, checksum, labels: ``image_from``) and hands it out as
   a view into its read's buffer, which lives until the last view of it dies.

A read that fails (a shard truncated since it was opened, an I/O error) is redone record by record
through ``Dataset.image``: the records before the damage come back, the damaged one gets its own
error naming shard and record. Datasets without byte extents (an unpacked ImageFolder) are read
record by record, still ``queue_depth`` at a time and ahead in decode order.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fastload.errors import CorruptRecordError
from fastload.records.direct_reads import DIRECT_MIN, DirectReads
from fastload.records.read_buffers import ReadBuffers
from fastload.records.read_options import ReadCounters, ReadOptions

__all__ = [
    "AUTO_BUDGET",
    "AUTO_FLOOR",
    "FLOOR_BATCHES",
    "NO_WINDOW_BUDGET",
    "ReadAhead",
    "ReadCounters",
    "ReadOptions",
    "coalesce",
]

_MIB = 1 << 20
# The automatic budget (ReadOptions.budget=None) grows from its floor up to a ceiling: twice the
# largest shuffle window, within AUTO_BUDGET; NO_WINDOW_BUDGET for orders without windows.
AUTO_BUDGET = (64 * _MIB, 512 * _MIB)
NO_WINDOW_BUDGET = 256 * _MIB
# Its floor: this many of the largest batches asked for (two groups of two batches: the next
# batches' reads are issued two batches ahead), or one per two decode threads where that is more
# (16 threads decode a batch faster than 16 readers bring the next two from the page cache: docs/gpu.md),
# and at least AUTO_FLOOR bytes.
FLOOR_BATCHES = 4
AUTO_FLOOR = 8 * _MIB
# A group of the automatic budget is not cut inside a shuffle window where reading the window in two
# parts costs the device this many times what reading it whole does (see ReadAhead._group_end).
_SPLIT_COST = 1.5
# A ramp step at a cold start adds at most 1 / this of the cost it takes off the first batch (see _group_end).
_RAMP_SHARE = 2
# Reads of at least this many bytes go into anonymous mappings, used again once free (see ReadAhead._read_run).
_MAPPED_READ = 64 << 10
# Records per group when record sizes are unknown (datasets without extents).
_GENERIC_RECORD_GUESS = 128 << 10


def coalesce(
    shard: NDArray[np.int64], start: NDArray[np.int64], end: NDArray[np.int64], *, gap: int, max_read: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Runs of neighbouring extents, each read in one go.

    Args:
        shard: The shard of each extent (int64; any order, repeats allowed).
        start: Its first byte.
        end: The byte after its last.
        gap: Largest gap between two extents of one run.
        max_read: A run is cut before an extent that would make it longer than this (a single
            extent longer than it is a run of its own).

    Returns:
        ``(run_of, run_shard, run_start, run_end)``: the run of each input extent, and the runs.
    """
    n = len(start)
    run_of = np.zeros(n, dtype=np.int64)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return run_of, empty, empty, empty
    order = np.lexsort((start, shard))
    sh, st, en = shard[order].tolist(), start[order].tolist(), end[order].tolist()
    runs_sh, runs_st, runs_en = [sh[0]], [st[0]], [en[0]]
    of_sorted = [0] * n
    for k in range(1, n):
        s, a, b = sh[k], st[k], en[k]
        if s == runs_sh[-1] and a <= runs_en[-1] + gap and max(b, runs_en[-1]) - runs_st[-1] <= max_read:
            if b > runs_en[-1]:
                runs_en[-1] = b
        else:
            runs_sh.append(s)
            runs_st.append(a)
            runs_en.append(b)
        of_sorted[k] = len(runs_st) - 1
    run_of[order] = of_sorted
    return (
        run_of,
        np.asarray(runs_sh, dtype=np.int64),
        np.asarray(runs_st, dtype=np.int64),
        np.asarray(runs_en, dtype=np.int64),
    )


class _Read:
    """One ``pread`` of a run of records (or one record of a dataset without extents)."""

    __slots__ = ("future", "shard", "start")

    def __init__(self, shard: int, start: int, future: Future[Any]) -> None:
        self.shard, self.start, self.future = shard, start, future


class _Group:
    """Positions ``[p0, p1)`` of the sequence and the reads that hold them.

    ``asked`` is the first position the caller waited for when the group was issued (how far ahead
    of the decode its reads started).
    """

    __slots__ = ("asked", "extents", "nbytes", "p0", "p1", "read_of", "reads", "rel_end", "rel_start")

    def __init__(
        self,
        p0: int,
        p1: int,
        reads: list[_Read],
        read_of: NDArray[np.int64],
        rel: tuple[NDArray[np.int64], NDArray[np.int64]] | None,
        nbytes: int,
        asked: int,
    ) -> None:
        self.p0, self.p1, self.reads, self.read_of, self.nbytes = p0, p1, reads, read_of, nbytes
        self.asked = asked
        self.extents = rel is not None  # reads of byte extents, else of whole records through image()
        self.rel_start, self.rel_end = rel if rel is not None else (read_of, read_of)

    def cancel(self) -> None:
        for r in self.reads:
            r.future.cancel()


class ReadAhead:
    """Reads a sequence of records ahead of the decode; see the module docstring.

    Called from one thread (the loader's producer), except :meth:`close` and :meth:`counters`.

    Args:
        dataset: A dataset (``fastload.records``); records are read with ``extents`` /
            ``read_extent`` / ``image_from`` where it has them, else with ``image``.
        options: :class:`ReadOptions`.
        decode_threads: Threads decoding what is read: the automatic budget's floor is at least
            half as many batches.
    """

    def __init__(self, dataset: Any, options: ReadOptions | None = None, *, decode_threads: int = 1) -> None:
        self.dataset = dataset
        self._floor_batches = max(FLOOR_BATCHES, decode_threads // 2)
        self.options = options = options if options is not None else ReadOptions()
        self._has_extents = all(hasattr(dataset, m) for m in ("extents", "read_extent", "image_from"))
        self._reads_into = hasattr(dataset, "read_extent_into")
        self._odirect = DirectReads.for_dataset(dataset, options.direct)
        self._buffers = ReadBuffers(cap=AUTO_FLOOR)
        self._huge = ReadBuffers(cap=AUTO_FLOOR, huge=True) if self._odirect is not None else None  # direct reads
        self._pool = ThreadPoolExecutor(max_workers=options.queue_depth, thread_name_prefix="fastload-read")
        self._lock = threading.Lock()
        self._done = threading.Condition()  # notified as reads finish, and by interrupt()
        self._interrupted = False
        self._closed = False
        self._counts = {"bytes": 0, "reads": 0, "records": 0, "direct": 0}
        self._wait_seconds = 0.0
        # The automatic budget as grown so far (0: its floor), and the bytes of the largest range
        # waited for (a batch). Both outlive a plan: the device and the batch size stay.
        self._auto = 0
        self._grown = 0
        self._batch_bytes = 0
        self._reset()

    def _reset(self) -> None:
        # The plan from position _origin on (the positions before it were released and forgotten:
        # a run over many epochs keeps the plan of about one epoch, not of every epoch so far).
        self._origin = 0
        self._seq = np.zeros(0, dtype=np.int64)  # the record at position _origin + j: _seq[j]
        self._windows = np.zeros(0, dtype=np.int64)  # positions where shuffle windows start
        self._ext: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]] | None = None  # as _seq
        self._csum = np.zeros(1, dtype=np.int64)  # bytes of positions [_origin, _origin + j): _csum[j] - _csum[0]
        self._planned = 0
        self._released = 0
        self._groups: deque[_Group] = deque()
        self._inflight = 0  # bytes of the groups not yet handed out entirely
        self._widest = 0  # bytes of the largest shuffle window planned (0: no windows)
        self._ramp = 0  # bytes of the next ramp step at a cold start (0: no ramp; see _group_end)
        self._need = 0  # the position waited for (the ramp's first step reaches it)
        self._asked = 0  # the first position of the range waited for now
        self._splits = -1  # the end of the window (epoch) found cheap to read in parts (see _group_end)
        self._alone = False  # a cold start: the first range's reads go alone (see _top_up)
        # (p0, p1, ramp): the end of the group from p0 and the ramp after it, decided, not yet submitted
        self._cut: tuple[int, int, int] | None = None

    @property
    def budget(self) -> int:
        """The byte budget in force: the option's, or the automatic one.

        The automatic budget starts at :attr:`floor`: four batches (the largest range waited for),
        at least 8 MiB, enough for two groups of two batches, so the reads of the next batches are
        issued two batches before the decode needs them. From the page cache they are done by then
        and the budget stays there: the read-ahead holds a few batches of encoded bytes. When the
        decode waits for reads issued that far ahead, the device is slower than the decode: the
        budget doubles (reads in parallel, longer runs), up to :attr:`ceiling`. It also grows to
        hold a whole shuffle window where reading the window in parts would cost the device much
        more than reading it whole (see :meth:`_group_end`).
        """
        if self.options.budget is not None:
            return self.options.budget
        return min(self.ceiling, max(self._auto, self.floor))

    @property
    def ceiling(self) -> int:
        """The most the budget grows to: the option's, or twice the widest window (see :class:`ReadOptions`)."""
        if self.options.budget is not None:
            return self.options.budget
        if not self._widest:
            return NO_WINDOW_BUDGET
        return int(min(AUTO_BUDGET[1], max(AUTO_BUDGET[0], 2 * self._widest)))

    @property
    def floor(self) -> int:
        """Where the automatic budget starts: four of the largest batches waited for, or one per two decode threads."""
        if self.options.budget is not None:
            return self.options.budget
        return min(self.ceiling, max(AUTO_FLOOR, self._floor_batches * self._batch_bytes))

    def _grow(self, bytes_at_least: int = 0) -> None:
        """Raise the automatic budget: doubled, or to ``bytes_at_least``, within the ceiling."""
        if self.options.budget is not None:
            return
        before = self.budget
        self._auto = min(self.ceiling, max(2 * before if not bytes_at_least else before, bytes_at_least))
        if self.budget > before:
            self._grown += 1
            self._cut = None  # a group end decided under the smaller budget

    # --- the plan ---------------------------------------------------------------------------------

    @property
    def coalescing(self) -> bool:
        """Whether records are read as byte extents (False: record by record through ``image``)."""
        return self._has_extents and self._ext is not None

    def begin(self, sequence: NDArray[np.int64], windows: Sequence[int] | NDArray[np.int64] = ()) -> None:
        """Read ``sequence`` (record indices in decode order) from its start; drops the previous plan.

        Args:
            sequence: Record indices in the order they will be asked for (repeats allowed).
            windows: Positions in ``sequence`` where a shuffle window starts (the order's
                ``window_starts``); empty for orders without windows.
        """
        self._drop()
        self.extend(sequence, windows)
        self._ramp = self.options.max_read if self._ext is not None else 0
        self._alone = self._ext is not None

    def extend(self, sequence: NDArray[np.int64], windows: Sequence[int] | NDArray[np.int64] = ()) -> None:
        """Append ``sequence`` to the plan (the next epoch), its ``windows`` relative to its own start.

        Positions keep counting from :meth:`begin`; the plan forgets the ones released before
        (:meth:`records`), so a run over many epochs holds about two epochs of plan, not all of them.
        """
        self._check_open()
        self._cut = None  # a group end decided before may now lie further on
        self._forget()
        seq = np.asarray(sequence, dtype=np.int64).ravel()
        base = self.planned
        win = np.asarray(windows, dtype=np.int64).ravel() + base
        if base == 0:
            self._ext = self.dataset.extents(seq) if self._has_extents else None
            ext = self._ext
        else:
            ext = self.dataset.extents(seq) if self._ext is not None else None
            if ext is not None and self._ext is not None:
                sh, st, en = self._ext
                self._ext = (np.concatenate([sh, ext[0]]), np.concatenate([st, ext[1]]), np.concatenate([en, ext[2]]))
        if ext is not None:
            sizes = np.maximum(ext[2] - ext[1], 0)
        else:
            sizes = np.full(len(seq), _GENERIC_RECORD_GUESS, dtype=np.int64)
        self._csum = np.concatenate([self._csum, self._csum[-1] + np.cumsum(sizes, dtype=np.int64)])
        self._seq = np.concatenate([self._seq, seq])
        inside = win[(win > base) & (win < base + len(seq))]
        if inside.size:
            edges = np.concatenate([[base], inside, [base + len(seq)]])
            self._widest = max(self._widest, int(np.diff(self._csum[edges - self._origin]).max()))
        self._windows = np.concatenate([self._windows, inside, [base + len(seq)]])

    def _forget(self) -> None:
        """Drop the plan before the first position still needed (released, and in no group)."""
        cut = min(self._released, self._groups[0].p0 if self._groups else self._planned)
        k = cut - self._origin
        if k <= 0:
            return
        # Copies: a view would keep the whole array it was cut from alive.
        self._seq, self._csum = self._seq[k:].copy(), self._csum[k:].copy()
        if self._ext is not None:
            self._ext = (self._ext[0][k:].copy(), self._ext[1][k:].copy(), self._ext[2][k:].copy())
        self._windows = self._windows[self._windows >= cut]
        self._origin = cut

    @property
    def planned(self) -> int:
        """Positions in the plan (the sequences given since :meth:`begin`)."""
        return self._origin + len(self._seq)

    @property
    def unissued(self) -> int:
        """Positions of the plan whose reads are not issued yet."""
        return self.planned - self._planned

    @property
    def settled(self) -> bool:
        """Whether every read issued so far is done (nothing in flight or queued)."""
        return all(r.future.done() for g in self._groups for r in g.reads)

    def _bytes_end(self, p0: int, nbytes: int) -> int:
        """The position where ``nbytes`` of records from ``p0`` on end (at least one record)."""
        o = self._origin
        p1 = o + int(np.searchsorted(self._csum, self._csum[p0 - o] + max(1, nbytes), side="right")) - 1
        return min(self.planned, max(p0 + 1, p1))

    def _bytes(self, p0: int, p1: int) -> int:
        """Bytes of the records of positions ``[p0, p1)`` (as the extents say)."""
        return int(self._csum[p1 - self._origin] - self._csum[p0 - self._origin])

    def _group_end(self, p0: int) -> int:
        """Where the group starting at ``p0`` ends: half the budget, cut at a window start inside it.

        At a cold start (the first groups after :meth:`begin`) it ramps up. A group read whole is a
        few long runs, but in a shuffle window the first batch needs records from all over the
        group: a cold start would wait for all of it before the first batch (a shard-order window
        of 8 shards, 200 MB: 1.6 s on a 125 MB/s volume). So the first group is cut after the
        records waited for now (the first batch; at least ``max_read`` bytes of them, in decode
        order), the next after twice as many bytes, and so on: the decode starts after the first
        step and works on it while the rest is read. A step is taken only while what it adds to
        the group's cost (:meth:`_cost`: bytes, and ``gap`` bytes a request) is at most half of
        what the decode no longer waits for: on a disk with few IOPS (a large ``gap``) a batch's
        records read on their own cost about as much as the long runs around them, which still
        have to be read, and the group is read whole.

        With the automatic budget, a group that half the budget would end inside a shuffle window
        (or, in an order without windows, anywhere before the end of the epoch) is weighed the
        same way against the group the largest budget would make (up to the window's end): when
        the two parts cost the device at least ``_SPLIT_COST`` times that whole (each part read
        through the gaps the other part's records fill: a large ``gap`` against the records'
        spacing), the budget grows to hold the whole, and the group is that. Found cheaper, the
        same window (epoch) is not weighed again.
        """
        if self._cut is not None and self._cut[0] == p0:
            return self._cut[1]
        ramp = 0
        p1, cut_inside = self._budget_end(p0)
        if cut_inside and self._ext is not None and self.options.budget is None:
            wend = int(self._windows[np.searchsorted(self._windows, p1, side="right")])
            largest = min(wend, self._bytes_end(p0, self.ceiling // 2))
            if self._splits != wend and largest > p1:
                cost = self._cost(p0, largest)
                if self._cost(p0, p1) + self._cost(p1, largest) >= _SPLIT_COST * cost:
                    self._grow(2 * self._bytes(p0, largest) if largest == wend else self.ceiling)
                    p1, _ = self._budget_end(p0)
                else:
                    self._splits = wend  # read in parts at this budget (not weighed again)
        if self._ramp:
            # The first step holds at least what is waited for now (the first batch).
            step = max(self._bytes_end(p0, self._ramp), min(self._need, p1))
            if step < p1:
                whole, first, rest = self._cost(p0, p1), self._cost(p0, step), self._cost(step, p1)
                # Taken when the bytes it adds (requests included) are at most half of what the
                # decode no longer waits for.
                if _RAMP_SHARE * (first + rest - whole) <= whole - first:
                    p1, ramp = step, 2 * self._bytes(p0, step)
        self._cut = (p0, p1, ramp)
        return p1

    def _budget_end(self, p0: int) -> tuple[int, bool]:
        """Where half the budget from ``p0`` ends, cut at the last window start inside it.

        Returns:
            ``(p1, inside)``: the end, and whether it lies inside a shuffle window (no window
            starts there and the plan goes on).
        """
        n = self.planned
        p1 = self._bytes_end(p0, self.budget // 2)
        if p1 >= n:
            return p1, False
        inside = self._windows[(self._windows > p0) & (self._windows <= p1)]
        if inside.size:
            return int(inside[-1]), False
        return p1, True

    def _cost(self, p0: int, p1: int) -> int:
        """What reading positions ``[p0, p1)`` costs the device, in bytes.

        Each read's bytes plus ``gap`` for the request itself: ``gap`` is the user's break-even
        between a request and the bytes it could read instead.
        """
        assert self._ext is not None
        o = self._origin
        sh, st, en = (a[p0 - o : p1 - o] for a in self._ext)
        _, _, r_st, r_en = coalesce(sh, st, en, gap=self.options.gap, max_read=self.options.max_read)
        return int((r_en - r_st).sum()) + len(r_st) * self.options.gap

    def _submit_group(self) -> None:
        p0 = self._planned
        p1 = self._group_end(p0)
        o = self._origin
        idx = self._seq[p0 - o : p1 - o]
        reads: list[_Read] = []
        # The previous group's reads not done yet: this group's start after them (see _after) when
        # they are fewer than the queue depth. As many or more are read first anyway (the pool
        # takes reads in the order they were submitted), and the next group's first reads then
        # keep the device's queue full while the last ones finish (many short reads: global order).
        before = [r.future for r in self._groups[-1].reads if not r.future.done()] if self._groups else []
        if len(before) >= self.options.queue_depth:
            before = []
        if self._ext is not None:
            sh, st, en = (a[p0 - o : p1 - o] for a in self._ext)
            run_of, r_sh, r_st, r_en = coalesce(sh, st, en, gap=self.options.gap, max_read=self.options.max_read)
            first = np.full(len(r_st), p1, dtype=np.int64)
            np.minimum.at(first, run_of, np.arange(p0, p1, dtype=np.int64))
            for r in np.argsort(first, kind="stable").tolist():
                s, a, b = int(r_sh[r]), int(r_st[r]), int(r_en[r])
                reads.append(_Read(s, a, self._issue(before, self._read_run, s, a, b)))
            # Reads were appended in first-need order: map run numbers to their place in `reads`.
            place = np.empty(len(r_st), dtype=np.int64)
            place[np.argsort(first, kind="stable")] = np.arange(len(r_st))
            read_of = place[run_of]
            rel: tuple[NDArray[np.int64], NDArray[np.int64]] | None = (st - r_st[run_of], en - r_st[run_of])
            nbytes = int((r_en - r_st).sum())
        else:
            for i in idx.tolist():
                reads.append(_Read(-1, 0, self._issue(before, self._read_record, i)))
            read_of = np.arange(len(idx), dtype=np.int64)
            rel = None
            nbytes = self._bytes(p0, p1)
        self._groups.append(_Group(p0, p1, reads, read_of, rel, nbytes, self._asked))
        self._inflight += nbytes
        self._planned = p1
        self._ramp = self._cut[2] if self._cut is not None and self._cut[0] == p0 else 0
        self._cut = None

    def _top_up(self, need: int) -> None:
        """Submit groups through position ``need``, then more while the budget allows.

        At a cold start (:meth:`begin`) the groups after the first range waited for are issued
        once its reads are done (:meth:`wait`): on a disk they would share its bandwidth with the
        reads the first batch waits for (on a hard disk in block order, a whole window: the next
        window's reads put 0.2-0.3 s on the first batch's 1.3-1.6 s).
        """
        self._need = need
        end = self.planned
        while self._planned < min(need, end):
            self._submit_group()
        if self._alone and not self.settled:
            return
        while self._planned < end:
            nxt = self._group_end(self._planned)
            more = self._bytes(self._planned, nxt)
            if self._inflight and self._inflight + more > self.budget:
                break
            self._submit_group()

    # --- the reads (pool threads) -----------------------------------------------------------------

    def _issue(
        self, before: list[Future[Any]], fn: Callable[..., bytes | memoryview | Exception], *args: Any
    ) -> Future[Any]:
        fut = self._pool.submit(self._after, before, fn, *args) if before else self._pool.submit(fn, *args)
        fut.add_done_callback(self._notify)
        return fut

    @staticmethod
    def _after(before: list[Future[Any]], fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` once the reads in ``before`` (the previous group's) are done.

        Groups of a few long reads are read one after the other: two groups read at once share the
        device, and the one the decode needs next is done later than it would be alone (at a cold
        start on a hard disk, the second batch waited 0.15 s for its window, read beside the
        third's). Within a group the reads still run ``queue_depth`` at a time. This cannot wait
        forever: the pool runs its tasks in the order they were submitted, so every read in
        ``before`` was taken by a thread before this one (or cancelled, which counts as done).
        """
        wait_all(before)
        return fn(*args)

    def _notify(self, _fut: Future[Any]) -> None:
        with self._done:
            self._done.notify_all()

    def _read_run(self, shard: int, start: int, end: int) -> bytes | memoryview:
        """One read of a run: into a mapping of :class:`~fastload.records.read_buffers.ReadBuffers` when it is large.

        A ``bytes`` of each read came from the allocator, whose threshold for mapping a block on
        its own rises to the largest block freed (up to 32 MiB): reads of every size from 64 KB to
        16 MB, freed in another order than allocated, then fragmented its heaps (the process grew
        by tens of MB an epoch, the same data read again). Mappings are used again once their
        views have died, and kept free up to the budget in force.
        """
        data: bytes | memoryview
        nbytes = end - start
        big = nbytes >= _MAPPED_READ
        long = self._odirect is not None and nbytes >= DIRECT_MIN
        direct = self._odirect.read(shard, start, end, self._take_huge) if long else None  # type: ignore[union-attr]
        if direct is not None:
            data, nbytes = direct  # O_DIRECT: nbytes is the aligned range read (fastload.records.direct_reads)
        elif self._reads_into and big:
            data = self._take(nbytes)
            self.dataset.read_extent_into(shard, start, data)
        else:
            data = self.dataset.read_extent(shard, start, end)
        with self._lock:
            self._counts["bytes"] += nbytes
            self._counts["reads"] += 1
        return data

    def _take(self, n: int) -> memoryview:
        return self._buffers.take(n, self.budget)

    def _take_huge(self, n: int) -> memoryview:
        return self._huge.take(n, self.budget)  # type: ignore[union-attr]

    def _read_record(self, i: int) -> memoryview | Exception:
        try:
            view: memoryview = self.dataset.image(i)
        except (CorruptRecordError, OSError, ValueError) as exc:
            return exc
        with self._lock:
            self._counts["bytes"] += len(view)
            self._counts["reads"] += 1
        return view

    # --- hand-out ---------------------------------------------------------------------------------

    def _groups_for(self, start: int, stop: int) -> list[_Group]:
        return [g for g in self._groups if g.p0 < stop and g.p1 > start]

    def wait(self, start: int, stop: int) -> bool:
        """Block until the reads holding positions ``[start, stop)`` are done (submitting them if needed).

        Returns:
            True; False when :meth:`interrupt` ended the wait first (a stopping producer).
        """
        self._check_open()
        first, last = (min(max(p, self._origin), self.planned) for p in (start, stop))
        self._batch_bytes = max(self._batch_bytes, self._bytes(first, last))
        self._asked = start
        self._top_up(stop)
        futures = []
        behind = False
        for g in self._groups_for(start, stop):
            lo, hi = max(start, g.p0) - g.p0, min(stop, g.p1) - g.p0
            mine = [g.reads[r].future for r in np.unique(g.read_of[lo:hi]).tolist()]
            # Issued two ranges (batches) or more before this one and still not done: the device
            # is slower than the decode, not just starting up (a cold start's first reads, the
            # group issued with the previous batch).
            behind = behind or (start - g.asked >= 2 * (stop - start) and not all(f.done() for f in mine))
            futures += mine
        pending = [f for f in futures if not f.done()]
        if not pending:
            self._after_first(stop)
            return True
        if behind and self.budget < self.ceiling:
            self._grow()
            self._top_up(stop)  # the larger budget's reads start now, while this one waits
        t0 = time.perf_counter()
        with self._done:
            while not self._interrupted and not all(f.done() for f in pending):
                self._done.wait()
            interrupted = self._interrupted
        self._wait_seconds += time.perf_counter() - t0
        if not interrupted:
            self._after_first(stop)
        return not interrupted

    def _after_first(self, stop: int) -> None:
        """The first range of a cold start is read: the reads after it start now."""
        if self._alone:
            self._alone = False
            self._top_up(stop)

    def interrupt(self) -> None:
        """End a :meth:`wait` in progress now, and every later one until :meth:`resume` (any thread)."""
        with self._done:
            self._interrupted = True
            self._done.notify_all()

    def resume(self) -> None:
        """Let :meth:`wait` block again (a new producer run)."""
        with self._done:
            self._interrupted = False

    def records(self, start: int, stop: int) -> tuple[list[Any], dict[int, str]]:
        """The images of positions ``[start, stop)``, checked; positions before ``stop`` are released.

        Returns:
            ``(views, errors)``: one image per position (``b""`` for a bad record), and the reason
            for each bad one keyed by its place in the range.

        Raises:
            InterruptedError: :meth:`interrupt` was called (call :meth:`wait` first to find out
                without an exception).
            ValueError: ``start`` lies before what the plan still holds (positions released,
                then forgotten when the plan was extended).
        """
        if start < self._origin:
            raise ValueError(f"position {start} was released (the plan holds positions from {self._origin} on)")
        if not self.wait(start, stop):
            raise InterruptedError("the read-ahead was interrupted (the loader is stopping)")
        views: list[Any] = []
        errors: dict[int, str] = {}
        direct = handed = 0
        for p in range(start, stop):
            i = int(self._seq[p - self._origin]) if p < self.planned else -1
            view, err, how = self._one(p, i)
            views.append(view)
            if err is not None:
                errors[p - start] = err
            if how == "direct":
                direct += 1
            elif how == "read":
                handed += 1
        with self._lock:
            self._counts["direct"] += direct
            self._counts["records"] += handed
        self._release(stop)
        # The bytes handed out no longer count against the budget: the next group's reads start
        # now, beside this range's decode, not when the next range is asked for. Otherwise one
        # group fewer is in flight during every decode, and on a disk about as fast as the decode
        # the device idles each time it finishes its group before the decode finishes its range.
        self._top_up(stop)
        return views, errors

    def _one(self, p: int, i: int) -> tuple[Any, str | None, str]:
        group = next((g for g in self._groups if g.p0 <= p < g.p1), None)
        if group is None:
            return (*self._direct(i), "direct")
        k = p - group.p0
        a, b = int(group.rel_start[k]), int(group.rel_end[k])
        if group.extents and b <= a:
            return (*self._direct(i), "direct")  # no extent known: the record's own read says why
        try:
            data = group.reads[int(group.read_of[k])].future.result()
        except (CancelledError, CorruptRecordError, OSError, ValueError):
            # A failed run (a shard truncated under it, an I/O error): each record's own read
            # keeps the ones before the damage and names the damaged one.
            return (*self._direct(i), "direct")
        if not group.extents:
            if isinstance(data, Exception):
                return b"", f"unreadable record: {data}", "read"
            return data, None, "read"
        try:
            return self.dataset.image_from(i, memoryview(data)[a:b]), None, "read"
        except (CorruptRecordError, OSError, ValueError) as exc:
            return b"", f"unreadable record: {exc}", "read"

    def _direct(self, i: int) -> tuple[Any, str | None]:
        try:
            return self.dataset.image(i), None
        except (CorruptRecordError, OSError, ValueError, IndexError) as exc:
            return b"", f"unreadable record: {exc}"

    def _release(self, stop: int) -> None:
        """Forget the groups wholly before ``stop`` (their buffers die with the last view)."""
        self._released = max(self._released, stop)
        while self._groups and self._groups[0].p1 <= self._released:
            g = self._groups.popleft()
            self._inflight -= g.nbytes

    # --- lifetime ---------------------------------------------------------------------------------

    def counters(self) -> ReadCounters:
        """What was read so far (any thread)."""
        with self._lock:
            counts = dict(self._counts)
        return ReadCounters(wait_seconds=self._wait_seconds, budget=self.budget, grown=self._grown, **counts)

    def _drop(self) -> None:
        for g in self._groups:
            g.cancel()
        self._reset()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the read-ahead is closed")

    def close(self) -> None:
        """Cancel what is not read yet and wait for the reads in flight (idempotent, any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.interrupt()
        for g in list(self._groups):
            g.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._groups = deque()
        self._buffers.clear()
        if self._huge is not None:
            self._huge.clear()
        if self._odirect is not None:
            self._odirect.close()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
