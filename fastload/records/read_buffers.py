"""Record bytes, read side: the memory large reads go into, mapped, and used again once free.

A read of a run of records goes into an anonymous mapping of its own rather than into a ``bytes``
from the C allocator: reads of every size from 64 KB to 16 MB, freed in another order than
allocated, fragment the allocator's heaps (the process grew by tens of MB an epoch, the same data
read again). A new mapping for every read pays its pages' faults and zeroing again on each read
(about 4% of a 2-thread Loader epoch from the page cache), so a mapping whose views have all died
is used again: :class:`ReadBuffers` keeps the mappings it lent in the order it lent them, looks at
the oldest few on each request (records are decoded about in the order they were read, so those
are the ones freed first), and hands a free one that fits to the next read. Free mappings are kept
up to a byte cap (the read-ahead's budget), the rest unmapped at once. They are kept by size, so
finding one is a search of the sizes kept (a few dozen), not of every mapping: a scan of the few
hundred free mappings a budget of four batches holds cost 66 us a read under the lock, and on 16
cores it ran one read at a time (the readers' hand-out halved, 0.48x of the decode's rate).

Whether a mapping is still in use is what the mapping itself says: while any view of its bytes is
alive (a record being decoded, a ``memoryview`` slice a caller kept), it refuses to be resized.

For direct reads (``ReadBuffers(huge=True)``, see :mod:`fastload.records.direct_reads`) each view
starts on a 2 MiB boundary of its mapping, which asks for transparent huge pages
(``MADV_HUGEPAGE``, this mapping only): a direct read reaches the device as requests of at most
its ``max_segments`` physically contiguous pieces, 128 pieces of 4 KB (512 KB) for a loop device
with ordinary pages, where a huge page is one piece of 2 MB.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
from bisect import bisect_left, insort
from collections import deque

__all__ = ["ReadBuffers"]

# Mapping sizes are rounded up to this, so that a freed mapping fits the later reads of about its size.
_GRAIN = 16 << 10
# Lent mappings looked at per request: the oldest ones; one still in use goes to the back.
_LOOK = 4
# Huge mappings (direct reads): views start on this boundary, sizes are rounded up to it.
HUGE = 2 << 20


def _unused(m: mmap.mmap) -> bool | None:
    """Whether no view of ``m`` is alive (None: this platform cannot tell, e.g. no ``mremap``)."""
    try:
        m.resize(len(m))  # a no-op that mmap refuses while any buffer is exported
    except BufferError:
        return False
    except (OSError, SystemError, ValueError):
        return None
    return True


class ReadBuffers:
    """Anonymous mappings for reads, each used again once every view of it has died (thread-safe).

    Args:
        cap: Bytes of free mappings kept for later reads; more is unmapped (see :meth:`take`).
        huge: Views start on a 2 MiB boundary, in mappings that ask for transparent huge pages
            (for ``O_DIRECT`` reads: see the module docstring).
    """

    def __init__(self, cap: int, *, huge: bool = False) -> None:
        self.cap = cap
        self.huge = huge
        self._start: dict[int, int] = {}  # id of a huge mapping -> where its views start
        self._lock = threading.Lock()
        self._lent: deque[mmap.mmap] = deque()
        self._spare: dict[int, deque[mmap.mmap]] = {}  # free mappings by usable size, first freed first
        self._sizes: list[int] = []  # the keys of _spare, sorted
        self._spare_bytes = 0
        self._reuse = True
        self.mapped = 0  # mappings made
        self.reused = 0  # requests served by a mapping used before

    def take(self, n: int, cap: int | None = None) -> memoryview:
        """A writable view of ``n`` bytes in a mapping no live view shares (its old bytes are not cleared).

        The caller fills it and hands out views of it; the mapping is used again after they have all
        died. ``cap``, when given, replaces the byte cap on free mappings kept (the budget in force).
        """
        with self._lock:
            if cap is not None:
                self.cap = cap
            self._collect()
            m = self._fit(n)
            if m is not None:
                self.reused += 1
                # The view exists before the mapping is listed as lent, so no other request finds it unused.
                start = self._start.get(id(m), 0)
                view = memoryview(m)[start : start + n]
                if self._reuse:
                    self._lent.append(m)
                else:
                    self._start.pop(id(m), None)  # let go with its views: not looked at again
                return view
            self.mapped += 1
        # A new mapping is made (and its pages faulted in) outside the lock: no other request can
        # find it before it is listed, and the other readers' requests do not wait for it.
        m, start = self._huge(n) if self.huge else (self._map(n), 0)
        view = memoryview(m)[start : start + n]
        with self._lock:
            if self._reuse:
                self._lent.append(m)
                if start:
                    self._start[id(m)] = start
        return view

    @staticmethod
    def _map(n: int) -> mmap.mmap:
        return mmap.mmap(-1, -(-n // _GRAIN) * _GRAIN, flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0))

    @staticmethod
    def _huge(n: int) -> tuple[mmap.mmap, int]:
        """A mapping with ``n`` bytes from a 2 MiB boundary on, asking for huge pages there, and that boundary.

        Not populated: the first read into it faults its pages in, as huge pages where the kernel has them.
        """
        size = -(-n // HUGE) * HUGE
        m = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE)
        probe = ctypes.c_char.from_buffer(m)
        start = -ctypes.addressof(probe) % HUGE
        del probe
        if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):  # no transparent huge pages here: ordinary pages
                m.madvise(mmap.MADV_HUGEPAGE, start, size)
        return m, start

    def _unmap(self, m: mmap.mmap) -> None:
        self._start.pop(id(m), None)
        m.close()

    def clear(self) -> None:
        """Forget every mapping (each is unmapped when its last view dies)."""
        with self._lock:
            for m in self._lent:
                self._start.pop(id(m), None)
            self._lent.clear()
            for ms in self._spare.values():
                for m in ms:
                    self._unmap(m)
            self._spare.clear()
            self._sizes.clear()
            self._spare_bytes = 0

    @property
    def spare_bytes(self) -> int:
        """Bytes of free mappings kept for later reads."""
        return self._spare_bytes

    def _collect(self) -> None:
        for _ in range(min(_LOOK, len(self._lent))):
            m = self._lent[0]
            unused = _unused(m)
            if unused is None:
                # No way to tell here: lend every mapping once and let it go with its views.
                self._reuse = False
                for m in self._lent:
                    self._start.pop(id(m), None)
                self._lent.clear()
                return
            if not unused:
                self._lent.rotate(-1)  # a caller keeps it: look at the next one
                continue
            self._lent.popleft()
            if self._spare_bytes + len(m) <= self.cap:
                size = self._usable(m)
                same = self._spare.get(size)
                if same is None:
                    self._spare[size] = same = deque()
                    insort(self._sizes, size)
                same.append(m)
                self._spare_bytes += len(m)
            else:
                self._unmap(m)

    def _usable(self, m: mmap.mmap) -> int:
        # A huge mapping's views start somewhere in its first 2 MiB: it holds at least its length less those.
        return len(m) - HUGE if self.huge else len(m)

    def _fit(self, n: int) -> mmap.mmap | None:
        """The smallest free mapping of ``n`` bytes or more, and not more than about twice that."""
        k = bisect_left(self._sizes, n)
        if k == len(self._sizes) or self._sizes[k] > 2 * n + (HUGE if self.huge else _GRAIN):
            return None
        size = self._sizes[k]
        same = self._spare[size]
        m = same.popleft()
        if not same:
            del self._spare[size]
            del self._sizes[k]
        self._spare_bytes -= len(m)
        return m
