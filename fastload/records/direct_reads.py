"""Read stage, direct I/O: the read-ahead's long runs read with ``O_DIRECT``, past the page cache.

With ``ReadOptions(direct=True)`` (:mod:`fastload.records.readahead`), every run of
:data:`DIRECT_MIN` bytes and more (1 MiB) is read through a second descriptor of its shard opened
with ``O_DIRECT``, into a mapping on huge pages; shorter reads stay buffered. Short direct reads
cost more than they give: each lands in a mapping of its own on a 2 MiB huge page and gets none of
the kernel's read-ahead (on the ssd-lite profile, where runs are one or two records, direct reads
of 64 KiB and more ran at 0.43-0.83 of the page-cache rate against 0.94-1.05 buffered). What
direct reads change on a local disk:

- **What the page cache holds no longer splits the reads.** A buffered read of a range with some
  pages cached already reaches the device as one request per uncached stretch: the pages the
  opening of an LMDB shard cached (its tree, and the kernel's read-ahead around it) split the
  epoch's long reads into about 10% more requests. A direct read asks the device for the whole
  range whatever is cached.
- **Requests as large as the device takes.** Buffered reads of several MB reach the device as
  requests of about 1 MB (the kernel's read-ahead window); direct reads are cut only at the
  device's own limit (``max_sectors_kb``).
- **No page-cache churn.** A dataset larger than the RAM pushes every other file out of the
  page cache once an epoch when read buffered, for nothing: its pages are evicted before the
  next epoch needs them. Direct reads leave the page cache alone.

The price: nothing read this way is cached, so a dataset that fits in RAM is read from the disk
again every epoch. Hence an option, off by default, for datasets larger than the RAM on a local
disk.

How a read is made: its start is rounded down and its end up to :data:`ALIGN` bytes (4096: every
logical block size of disks in use divides it) and read into the start of a mapping (mappings
are page-aligned, as ``O_DIRECT`` needs); the caller gets the view of exactly the bytes it asked
for. At the end of a file the last read is short, and the bytes asked for are all there.

The descriptor is opened on a shard's first direct read, by reopening the descriptor the dataset
reads the shard with (``/proc/self/fd``): the same file even if the path was renamed over since.
A file system that refuses ``O_DIRECT`` (tmpfs, some network and FUSE file systems: ``EINVAL``
when opening, or on the first read) gets one :class:`DirectIOWarning` naming the shard, and its
reads go on buffered. Nothing here changes process-wide state: the descriptors are this reader's,
closed by :meth:`DirectReads.close` (the read-ahead's close) once the reads in flight are done.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import warnings
from collections.abc import Callable
from typing import Any

from fastload.errors import CorruptRecordError

__all__ = ["ALIGN", "DIRECT_MIN", "DirectIOWarning", "DirectReads", "reopen"]

#: Direct reads start and end at multiples of this many bytes (offsets and lengths).
ALIGN = 4096
#: Runs of at least this many bytes are read with ``O_DIRECT``; shorter ones stay buffered.
DIRECT_MIN = 1 << 20
_O_DIRECT: int | None = getattr(os, "O_DIRECT", None)
# Where Linux says whether transparent huge pages may back a mapping that asks for them.
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


class DirectIOWarning(UserWarning):
    """Direct I/O was asked for and cannot be used for a shard: its reads go on buffered."""


def reopen(fd: int, path: str, flags: int) -> int:
    """A new descriptor of the file open as ``fd`` (named ``path``), opened with ``flags``.

    Through ``/proc/self/fd`` where there is one: the file ``fd`` reads, even if ``path`` names
    another file now. Elsewhere ``path`` is opened and must be the same file (device and inode).

    Raises:
        OSError: The open fails (``EINVAL``: the file system refuses the flags), or ``path`` is
            another file now.
    """
    flags |= os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(f"/proc/self/fd/{fd}", flags)
    except FileNotFoundError:
        pass  # no /proc: by name, checked below
    new = os.open(path, flags)
    a, b = os.fstat(fd), os.fstat(new)
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) or not stat.S_ISREG(b.st_mode):
        os.close(new)
        raise OSError(errno.ESTALE, f"{path} was replaced since it was opened")
    return new


def _huge_pages_off() -> bool:
    """Whether this kernel's transparent huge pages are off (``[never]``); False where it cannot tell."""
    try:
        with open(_THP_SETTING) as fh:
            return "[never]" in fh.read()
    except OSError:
        return False


class DirectReads:
    """``O_DIRECT`` reads of a dataset's shards, a descriptor per shard opened on first use (thread-safe).

    Args:
        dataset: Has ``open_direct(shard, flags) -> (fd, path)``
            (:meth:`fastload.records.sharded.ShardedDataset.open_direct`).

    Attributes:
        buffered: Shards whose reads go on buffered (their file system refused ``O_DIRECT``).
    """

    def __init__(self, dataset: Any) -> None:
        self._dataset = dataset
        self._lock = threading.Lock()
        self._fds: dict[int, tuple[int, str]] = {}
        self.buffered: set[int] = set()
        self._warned = False
        self._reading = 0
        self._closed = False

    @classmethod
    def for_dataset(cls, dataset: Any, wanted: bool) -> DirectReads | None:
        """Direct reads of ``dataset`` if ``wanted`` and possible, else None (with a warning saying why).

        Possible: the dataset's records lie in local shard files (``open_direct``) and the
        platform has ``O_DIRECT`` (Linux, FreeBSD...).
        """
        if not wanted:
            return None
        why = None
        if not hasattr(dataset, "open_direct"):
            why = f"{type(dataset).__name__} has no local shard files to read with it"
        elif _O_DIRECT is None:
            why = "this platform has no O_DIRECT"
        if why is not None:
            warnings.warn(
                f"direct I/O (ReadOptions(direct=True)) is not used: {why}; reads go through the page cache",
                DirectIOWarning,
                stacklevel=3,
            )
            return None
        if _huge_pages_off():
            warnings.warn(
                f"direct I/O (ReadOptions(direct=True)) with transparent huge pages off ({_THP_SETTING}: never): "
                "each direct read reaches the device as requests of at most its max_segments pages of 4 KB "
                "(512 KB for 128 segments), often more requests than buffered reads make",
                DirectIOWarning,
                stacklevel=3,
            )
        return cls(dataset)

    def read(
        self, shard: int, start: int, end: int, take: Callable[[int], memoryview]
    ) -> tuple[memoryview, int] | None:
        """Bytes ``[start, end)`` of shard number ``shard``, read with ``O_DIRECT``.

        Args:
            shard: The shard's number in the dataset.
            start: The first byte.
            end: The byte after the last.
            take: Returns a writable, page-aligned view of ``n`` bytes to read into (the read-ahead's
                :meth:`~fastload.records.read_buffers.ReadBuffers.take`).

        Returns:
            ``(view, nbytes)``: a view of exactly those bytes (into memory from ``take``) and the
            bytes read from the file (the aligned range); or None when the shard is read buffered
            (its file system refuses ``O_DIRECT``: the caller reads it as usual).

        Raises:
            CorruptRecordError: The file ends before ``end`` (truncated since it was opened?) or
                the read fails.
            ValueError: Closed.
        """
        with self._lock:
            if self._closed:
                raise ValueError("the direct reads are closed")
            if shard in self.buffered:
                return None
            self._reading += 1
        try:
            opened = self._open(shard)
            if opened is None:
                return None
            fd, path = opened
            a0 = start - start % ALIGN
            a1 = -(-end // ALIGN) * ALIGN
            buf = take(a1 - a0)
            got = 0
            try:
                while got < end - a0:
                    n = os.preadv(fd, [buf[got:]], a0 + got)
                    if n <= 0:
                        break
                    got += n
            except OSError as exc:
                if exc.errno == errno.EINVAL and got == 0:
                    self._refused(shard, path, exc)
                    return None
                raise CorruptRecordError(f"direct read failed ({exc.strerror or exc})", shard=path) from None
            if got < end - a0:
                raise CorruptRecordError(
                    f"the file ends at byte {a0 + got}, inside a read of bytes [{start}, {end}) "
                    "(truncated or rewritten since it was opened?)",
                    shard=path,
                    offset=start,
                )
            return buf[start - a0 : end - a0], got
        finally:
            with self._lock:
                self._reading -= 1
                if self._closed and not self._reading:
                    self._release()

    def _open(self, shard: int) -> tuple[int, str] | None:
        with self._lock:
            if shard in self._fds:
                return self._fds[shard]
            if shard in self.buffered:
                return None
        try:
            fd, path = self._dataset.open_direct(shard, _O_DIRECT or 0)
        except OSError as exc:
            self._refused(shard, str(getattr(exc, "filename", None) or f"shard {shard}"), exc)
            return None
        with self._lock:
            if shard in self._fds:  # another thread opened it meanwhile
                os.close(fd)
            else:
                self._fds[shard] = (fd, path)
            return self._fds[shard]

    def _refused(self, shard: int, path: str, exc: OSError) -> None:
        """Read ``shard`` buffered from now on (a descriptor it has stays open until :meth:`close`)."""
        with self._lock:
            self.buffered.add(shard)
            warn, self._warned = not self._warned, True
        if warn:
            warnings.warn(
                f"direct I/O (ReadOptions(direct=True)) is not possible for {path}: "
                f"{exc.strerror or exc}; its reads (and those of any other shard that refuses it) "
                "go through the page cache",
                DirectIOWarning,
                stacklevel=3,
            )

    def close(self) -> None:
        """Close the descriptors (idempotent); reads in flight finish first."""
        with self._lock:
            self._closed = True
            if not self._reading:
                self._release()

    def _release(self) -> None:
        fds, self._fds = self._fds, {}
        for fd, _path in fds.values():
            os.close(fd)
