"""Read stage: where each value of an LMDB data file lies, found by reading its pages with ``pread``.

fastload reads its LMDB shards without the LMDB library: py-lmdb (like LMDB itself) maps
``data.mdb``, and a data file that shrinks under the mapping (truncated or rewritten in place while
a loader or ``fastload verify`` reads it) turns the next access to a page past its new end into
``SIGBUS``, which kills the process; only a process-wide signal handler could catch it, and library
code installs none. Reading the pages with ``pread`` turns the same event into a short read,
reported as a :class:`~fastload.errors.CorruptRecordError`. (The writer still uses py-lmdb.)

What is read is the subset of LMDB's on-disk format (``MDB_DATA_VERSION`` 1, LMDB 0.9, 64-bit
builds) that a fastload shard uses: the two meta pages (the one with the newer transaction id is
current), the main database's B-tree of branch and leaf pages, and values stored in the leaf
(small) or on overflow pages (large). Sub-databases, duplicate keys and fixed-size key pages are
refused. Everything is checked before use: page numbers inside the file the meta page describes,
node offsets inside their page, each page's own number and kind, tree depth, no page visited twice,
the entry count of the meta page; damage is one error naming the file and the page.

Cost: the tree is walked once, lazily, on a shard's first read (leaf pages vectorized with numpy:
a few hundred microseconds per thousand records); a value is then one ``pread`` at a known offset,
no B-tree search per read.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import threading
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fastload.errors import CorruptRecordError
from fastload.records.direct_reads import reopen

__all__ = ["LmdbFile", "LmdbMeta"]

_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_PAGEHDRSZ = 16
_NODESIZE = 8
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_P_INVALID = (1 << 64) - 1
_PAGE = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper (or the overflow page count)
_META = struct.Struct("<II8xQ")  # magic, version, (address), mapsize; at PAGEHDRSZ
_DB = struct.Struct("<IHHQQQQQ")  # pad (psize in the free DB), flags, depth, branch, leaf, overflow, entries, root
_TAIL = struct.Struct("<QQ")  # last_pg, txnid
_MAX_DEPTH = 32


@dataclass(frozen=True)
class LmdbMeta:
    """The current meta page: page size, last page in use, the main database's tree."""

    psize: int
    last_pg: int
    txnid: int
    depth: int
    entries: int
    root: int
    flags: int

    @property
    def needed_bytes(self) -> int:
        """Bytes the data file must hold: every page up to the last one in use."""
        return (self.last_pg + 1) * self.psize


class LmdbFile:
    """An LMDB data file read by ``pread``: the meta page at open, value locations on first use.

    Args:
        path: The ``data.mdb`` file.
        name: How messages name it (the shard).

    Raises:
        CorruptRecordError: Not a regular file, not an LMDB 0.9 data file, a damaged meta page, or
            a file shorter than its meta page says (truncated).
    """

    def __init__(self, path: str, name: str | None = None) -> None:
        self.path = path
        self.name = name or path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise CorruptRecordError(f"cannot open the LMDB data file ({exc.strerror or exc})", shard=path) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CorruptRecordError("data.mdb is not a regular file", shard=path)
            self.size = st.st_size
            self._fd = fd
            self.meta = self._read_meta()
        except BaseException:
            os.close(fd)
            raise
        if self.size < self.meta.needed_bytes:
            os.close(fd)
            raise CorruptRecordError(
                f"data.mdb holds {self.size} bytes, its meta page says the database uses "
                f"{self.meta.needed_bytes} (pages 0..{self.meta.last_pg} of {self.meta.psize} bytes): truncated",
                shard=path,
            )
        self._lock = threading.Lock()
        self._walk_lock = threading.Lock()
        self._reading = 0
        self._closed = False
        self._offsets: NDArray[np.int64] | None = None
        self._lengths: NDArray[np.int64] | None = None
        self._walk_error: str | None = None

    # --- reading ------------------------------------------------------------------------------

    def _fail(self, message: str, page: int | None = None) -> CorruptRecordError:
        where = f" (page {page})" if page is not None else ""
        return CorruptRecordError(f"damaged LMDB data file: {message}{where}", shard=self.path)

    def _pread(self, length: int, offset: int, record: int | None) -> bytes:
        data = os.pread(self._fd, length, offset)
        if len(data) < length:
            raise self._short(offset + len(data), length, record, offset)
        return data

    def _short(self, end: int, length: int, record: int | None, offset: int) -> CorruptRecordError:
        return CorruptRecordError(
            f"data.mdb ends at byte {end}, inside a read of {length} bytes "
            f"(truncated or rewritten since it was opened at {self.size} bytes?)",
            shard=self.path,
            record=record,
            offset=offset,
        )

    def read(self, offset: int, length: int, record: int | None = None) -> bytes:
        """``length`` bytes at ``offset`` (thread-safe).

        Raises:
            CorruptRecordError: The file ends first, or the read fails.
            ValueError: Closed.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"LMDB shard {self.name} is closed")
            self._reading += 1
        try:
            return self._pread(length, offset, record)
        except OSError as exc:
            raise CorruptRecordError(f"read failed ({exc.strerror or exc})", shard=self.path, record=record) from None
        finally:
            with self._lock:
                self._reading -= 1
                if self._closed and not self._reading:
                    self._release()

    def reopen(self, flags: int) -> int:
        """A new descriptor of ``data.mdb``, opened with ``flags`` (``O_DIRECT``); the caller closes it.

        Raises:
            OSError: The open fails (``EINVAL``: the file system refuses the flags).
            ValueError: Closed.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"LMDB shard {self.name} is closed")
            return reopen(self._fd, self.path, flags)

    def read_into(self, offset: int, buf: memoryview, record: int | None = None) -> None:
        """:meth:`read` into ``buf`` (writable; its length is the length read; thread-safe).

        Raises:
            CorruptRecordError: The file ends first, or the read fails.
            ValueError: Closed.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"LMDB shard {self.name} is closed")
            self._reading += 1
        try:
            got = os.preadv(self._fd, [buf], offset)
        except OSError as exc:
            raise CorruptRecordError(f"read failed ({exc.strerror or exc})", shard=self.path, record=record) from None
        finally:
            with self._lock:
                self._reading -= 1
                if self._closed and not self._reading:
                    self._release()
        if got < len(buf):
            raise self._short(offset + got, len(buf), record, offset)

    def _read_meta(self) -> LmdbMeta:
        head = os.pread(self._fd, _PAGEHDRSZ + _META.size + 2 * _DB.size + _TAIL.size, 0)
        if len(head) < _PAGEHDRSZ + _META.size + 2 * _DB.size + _TAIL.size:
            raise CorruptRecordError(
                f"data.mdb of {len(head)} bytes is too short for an LMDB meta page", shard=self.path
            )
        metas = [self._parse_meta(head, 0)]
        psize = metas[0].psize
        second = os.pread(self._fd, len(head), psize)
        if len(second) == len(head):
            # A damaged second meta page: the first one still describes a complete database.
            with contextlib.suppress(CorruptRecordError):
                metas.append(self._parse_meta(second, 1))
        meta = max(metas, key=lambda m: m.txnid)
        if meta.psize != psize:
            raise self._fail("the two meta pages disagree on the page size")
        return meta

    def _parse_meta(self, data: bytes, page: int) -> LmdbMeta:
        pgno, _pad, flags, _lo, _up = _PAGE.unpack_from(data, 0)
        magic, version, _mapsize = _META.unpack_from(data, _PAGEHDRSZ)
        if magic != _MAGIC:
            raise CorruptRecordError("not an LMDB data file (bad magic number)", shard=self.path)
        if version != _DATA_VERSION:
            raise CorruptRecordError(
                f"LMDB data format version {version} is not supported (fastload reads {_DATA_VERSION}, LMDB 0.9's)",
                shard=self.path,
            )
        if pgno != page or not flags & _P_META:
            raise self._fail("meta page header", page)
        free = _DB.unpack_from(data, _PAGEHDRSZ + _META.size)
        main = _DB.unpack_from(data, _PAGEHDRSZ + _META.size + _DB.size)
        last_pg, txnid = _TAIL.unpack_from(data, _PAGEHDRSZ + _META.size + 2 * _DB.size)
        psize = free[0]
        if psize < 512 or psize > 1 << 16 or psize & (psize - 1):
            raise self._fail(f"page size {psize}", page)
        _pad, mflags, depth, _b, _l, _o, entries, root = main
        if last_pg < 1 or last_pg >= (1 << 48):
            raise self._fail(f"last page {last_pg}", page)
        return LmdbMeta(psize, last_pg, txnid, depth, entries, root, mflags)

    # --- the tree -----------------------------------------------------------------------------

    def _page(self, pgno: int, kinds: int) -> bytes:
        m = self.meta
        if not 2 <= pgno <= m.last_pg:
            raise self._fail(f"page number {pgno} outside 2..{m.last_pg}")
        page = self.read(pgno * m.psize, m.psize)
        own, _pad, flags, _lo, _up = _PAGE.unpack_from(page, 0)
        if own != pgno or not flags & kinds or flags & (_P_LEAF2 | _P_META):
            raise self._fail(f"page header (number {own}, flags 0x{flags:x})", pgno)
        return page

    def _nodes(self, page: bytes, pgno: int) -> NDArray[np.int64]:
        """Node offsets of a branch or leaf page, checked to leave room for a node header."""
        lower, upper = _PAGE.unpack_from(page, 0)[3:5]
        if lower < _PAGEHDRSZ or lower & 1 or lower > upper or upper > len(page):
            raise self._fail(f"free-space bounds {lower}..{upper}", pgno)
        ptrs = np.frombuffer(page, dtype="<u2", count=(lower - _PAGEHDRSZ) >> 1, offset=_PAGEHDRSZ).astype(np.int64)
        if ptrs.size and (ptrs.min() < upper or ptrs.max() + _NODESIZE > len(page) or np.any(ptrs & 1)):
            raise self._fail("node offset outside the page", pgno)
        return ptrs

    def _walk(self) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.int64]]:
        """Every entry of the main database in key order: ``(keys [N, 8] uint8, offsets, lengths)``."""
        m = self.meta
        keys: list[NDArray[np.uint8]] = []
        offs: list[NDArray[np.int64]] = []
        lens: list[NDArray[np.int64]] = []
        if m.root == _P_INVALID:
            empty = np.zeros(0, dtype=np.int64)
            return np.zeros((0, 8), dtype=np.uint8), empty, empty
        if m.depth < 1 or m.depth > _MAX_DEPTH:
            raise self._fail(f"tree depth {m.depth}")
        seen: set[int] = set()
        stack = [(m.root, 1)]
        while stack:
            pgno, level = stack.pop()
            if pgno in seen:
                raise self._fail("a page is reachable twice (a cycle in the tree)", pgno)
            seen.add(pgno)
            if len(seen) > m.last_pg:
                raise self._fail("more tree pages than the file holds")
            page = self._page(pgno, _P_BRANCH if level < m.depth else _P_LEAF)
            ptrs = self._nodes(page, pgno)
            if level < m.depth:
                # Branch: child page numbers from (lo, hi, flags); pushed in reverse so keys come out in order.
                children = []
                for p in ptrs.tolist():
                    lo, hi, fl = struct.unpack_from("<HHH", page, p)
                    children.append(lo | hi << 16 | fl << 32)
                stack.extend((c, level + 1) for c in reversed(children))
                continue
            k, o, n = self._leaf(page, pgno, ptrs)
            keys.append(k)
            offs.append(o)
            lens.append(n)
        if not keys:
            raise self._fail("a tree without leaf pages")
        return np.concatenate(keys), np.concatenate(offs), np.concatenate(lens)

    def _leaf(
        self, page: bytes, pgno: int, ptrs: NDArray[np.int64]
    ) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.int64]]:
        m = self.meta
        raw = np.frombuffer(page, dtype=np.uint8)
        u16 = np.frombuffer(page, dtype="<u2")
        h = ptrs >> 1
        dsize = u16[h].astype(np.int64) | (u16[h + 1].astype(np.int64) << 16)
        flags = u16[h + 2]
        ksize = u16[h + 3].astype(np.int64)
        if np.any(flags & (_F_SUBDATA | _F_DUPDATA)):
            raise CorruptRecordError("not a fastload LMDB shard (sub-databases or duplicate keys)", shard=self.path)
        if np.any(ksize != 8):
            raise CorruptRecordError("not a fastload LMDB shard (keys are not 8-byte record numbers)", shard=self.path)
        data_at = ptrs + _NODESIZE + 8
        big = (flags & _F_BIGDATA) != 0
        inline_end = np.where(big, data_at + 8, data_at + dsize)
        if np.any(inline_end > len(page)):
            raise self._fail("a node runs past the end of its page", pgno)
        keys = raw[(ptrs + _NODESIZE)[:, None] + np.arange(8)]
        offsets = pgno * m.psize + data_at
        if np.any(big):
            ov = raw[data_at[big][:, None] + np.arange(8)].copy().view("<u8").ravel()
            if np.any(ov < 2) or np.any(ov > m.last_pg):
                raise self._fail("an overflow page number outside the file", pgno)
            first = ov.astype(np.int64)
            pages = (_PAGEHDRSZ + dsize[big] + m.psize - 1) // m.psize
            if np.any(first + pages > m.last_pg + 1):
                raise self._fail("an overflow value runs past the last page", pgno)
            offsets = offsets.copy()
            offsets[big] = first * m.psize + _PAGEHDRSZ
        return keys, offsets, np.where(big, -dsize, dsize)

    def locations(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Where the values of records 0..N-1 are (keys must be exactly those numbers), walked once.

        Returns:
            ``(offsets, lengths)`` int64: a value's first byte in the file and its length, negative
            for a value on overflow pages (whose page header sits just before it).

        Raises:
            CorruptRecordError: A damaged tree, or keys that are not the record numbers in order.
        """
        with self._walk_lock:
            if self._walk_error is not None:  # walked once and found damaged: the same answer, at once
                raise CorruptRecordError(self._walk_error, shard=self.path)
            if self._offsets is None or self._lengths is None:
                try:
                    keys, offsets, lengths = self._walk()
                    numbers = keys.copy().view(">u8").ravel()
                    if numbers.size != self.meta.entries:
                        raise self._fail(
                            f"the tree holds {numbers.size} entries, the meta page says {self.meta.entries}"
                        )
                    if not np.array_equal(numbers, np.arange(numbers.size, dtype=np.uint64)):
                        raise self._fail("keys are not the record numbers 0..N-1 in order")
                except CorruptRecordError as exc:
                    self._walk_error = exc.message
                    raise
                self._offsets, self._lengths = offsets, lengths
            return self._offsets, self._lengths

    def value(self, record: int, nbytes: int = -1) -> bytes:
        """The value of record ``record`` (its first ``nbytes`` when given), one ``pread``.

        A value on overflow pages is read with its page header, which is checked (page number,
        kind, page count) before the bytes are handed out.

        Raises:
            CorruptRecordError: No such record, damaged page, or the file ends inside the value.
        """
        offsets, lengths = self.locations()
        if not 0 <= record < len(offsets):
            raise CorruptRecordError(
                f"record key missing (the shard holds {len(offsets)})", shard=self.path, record=record
            )
        offset, length = int(offsets[record]), int(lengths[record])
        if length >= 0:
            return self.read(offset, length if nbytes < 0 else min(nbytes, length), record)
        length = -length
        want = length if nbytes < 0 else min(nbytes, length)
        data = self.read(offset - _PAGEHDRSZ, _PAGEHDRSZ + want, record)
        return bytes(self._overflow_value(data, offset, length, record))

    def extents(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """The bytes to read for each record's value: ``(start, end)`` int64, by record number.

        A value on overflow pages starts with its page header (checked by :meth:`value_from`).

        Raises:
            CorruptRecordError: A damaged tree (see :meth:`locations`).
        """
        offsets, lengths = self.locations()
        big = lengths < 0
        start = offsets - np.where(big, _PAGEHDRSZ, 0)
        return start, offsets + np.abs(lengths)

    def value_from(self, data: bytes | bytearray | memoryview, record: int) -> memoryview:
        """Record ``record``'s value from the bytes of its extent as read (see :meth:`extents`).

        Raises:
            CorruptRecordError: A damaged overflow page header, or ``data`` of another length than
                the extent.
        """
        offsets, lengths = self.locations()
        offset, length = int(offsets[record]), int(lengths[record])
        view = memoryview(data)
        if length >= 0:
            if len(view) != length:
                raise CorruptRecordError(
                    f"value read as {len(view)} bytes, the page says {length}", shard=self.path, record=record
                )
            return view
        if len(view) != _PAGEHDRSZ - length:
            raise CorruptRecordError(
                f"value read as {len(view) - _PAGEHDRSZ} bytes, the page says {-length}", shard=self.path, record=record
            )
        return self._overflow_value(view, offset, -length, record)

    def _overflow_value(self, data: bytes | memoryview, offset: int, length: int, record: int) -> memoryview:
        """The value after its overflow page header, the header checked (number, kind, page count)."""
        pgno, _pad, flags, pages = struct.unpack_from("<QHHI", data, 0)
        psize = self.meta.psize
        if pgno * psize + _PAGEHDRSZ != offset or not flags & _P_OVERFLOW or pages * psize < _PAGEHDRSZ + length:
            raise CorruptRecordError(
                f"damaged LMDB overflow page header (number {pgno}, flags 0x{flags:x}, {pages} pages)",
                shard=self.path,
                record=record,
            )
        return memoryview(data)[_PAGEHDRSZ:]

    # --- lifetime -----------------------------------------------------------------------------

    def _release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        """Close the file (idempotent); a read in flight finishes first."""
        with self._lock:
            self._closed = True
            if not self._reading:
                self._release()
