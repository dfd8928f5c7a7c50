"""Read stage: dmlc-core RecordIO framing, MXNet's image-record header and the ``.idx`` side file.

Physical layout of one record (little-endian), as dmlc-core's ``RecordIOWriter`` writes it::

    uint32 magic = 0xced7230a
    uint32 lrec  = cflag << 29 | length        (length < 2**29)
    length bytes of payload, then zero padding to a 4-byte boundary

A payload that holds the magic word at a 4-byte-aligned offset is split there: the magic bytes are
dropped, the pieces go out as parts with ``cflag`` 1 (first), 2 (middle) and 3 (last), and only the
last part is padded. A reader re-inserts the magic word between parts. Records never split have
``cflag`` 0. :class:`RecordIOShard` reads records with ``pread`` (never through a memory map: see
its docstring for why), each in one call when an index gives its extent.

The payload of an image record is MXNet's ``IRHeader`` (struct ``IfQQ``: flag, label, id, id2), then
``flag`` float32 labels when ``flag > 0``, then the encoded image.
"""

from __future__ import annotations

import errno
import io
import itertools
import os
import stat
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from fastload.errors import CorruptDatasetError, CorruptRecordError
from fastload.records.containment import open_regular
from fastload.records.direct_reads import reopen

__all__ = [
    "IR_HEADER_SIZE",
    "MAGIC",
    "MAX_RECORD_LENGTH",
    "FramedRecord",
    "RecordHeader",
    "RecordIOShard",
    "RecordIOWriter",
    "format_idx",
    "frame_parts",
    "framed_size",
    "magic_positions",
    "pack_header",
    "read_idx",
    "record_span",
    "unpack_header",
]

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_MAGIC_U32 = np.uint32(MAGIC)
_LREC = struct.Struct("<II")
MAX_RECORD_LENGTH = (1 << 29) - 1
_IR = struct.Struct("<IfQQ")
IR_HEADER_SIZE = _IR.size  # 24
_PAD = (b"", b"\0\0\0", b"\0\0", b"\0")  # indexed by length % 4

Buffer = bytes | bytearray | memoryview


class Sink(Protocol):
    """Where :class:`RecordIOWriter` writes: a binary file, or anything with ``write``, ``writelines``, ``fileno``."""

    def write(self, data: Buffer, /) -> int | None: ...

    def writelines(self, chunks: Sequence[Buffer], /) -> None: ...

    def fileno(self) -> int: ...


@dataclass(frozen=True)
class RecordHeader:
    """A decoded ``IRHeader``.

    Attributes:
        flag: 0 for one label stored in the header, k > 0 for k float32 labels after it.
        labels: The record's labels (length 1 when ``flag == 0``).
        id: First id (im2rec: the ``.lst`` index).
        id2: Second id (0 in practice).
        image_offset: Where the encoded image starts inside the payload.
    """

    flag: int
    labels: tuple[float, ...]
    id: int
    id2: int
    image_offset: int


def pack_header(labels: float | Sequence[float], id: int, id2: int = 0) -> bytes:
    """Encode an image-record header exactly as ``mx.recordio.pack`` does.

    Args:
        labels: A number (stored in the header, ``flag = 0``) or a sequence of k labels
            (``flag = k``, the header's label 0, the labels appended as float32).
        id: The record id (uint64).
        id2: The second id (uint64).

    Returns:
        The header bytes to prepend to the image bytes.
    """
    if isinstance(labels, (int, float, np.number)):
        return _IR.pack(0, float(labels), int(id), int(id2))
    arr = np.asarray(labels, dtype="<f4").ravel()
    return _IR.pack(arr.size, 0.0, int(id), int(id2)) + arr.tobytes()


def unpack_header(payload: Buffer) -> RecordHeader:
    """Decode the ``IRHeader`` (and trailing labels) at the start of a payload.

    Raises:
        ValueError: When the payload is too short for the header it announces.
    """
    if len(payload) < IR_HEADER_SIZE:
        raise ValueError(f"payload of {len(payload)} bytes is shorter than the {IR_HEADER_SIZE}-byte header")
    flag, label, rid, rid2 = _IR.unpack_from(payload, 0)
    if flag == 0:
        return RecordHeader(0, (label,), rid, rid2, IR_HEADER_SIZE)
    end = IR_HEADER_SIZE + 4 * flag
    if len(payload) < end:
        raise ValueError(f"header announces {flag} labels but the payload has only {len(payload)} bytes")
    labels = tuple(float(x) for x in np.frombuffer(payload, dtype="<f4", count=flag, offset=IR_HEADER_SIZE))
    return RecordHeader(flag, labels, rid, rid2, end)


def magic_positions(payload: Buffer) -> list[int]:
    """Aligned offsets of the magic word inside a payload (only whole words before the tail)."""
    words = len(payload) >> 2
    if words == 0:
        return []
    if words <= 16:
        # Headers: a bytes search is cheaper than numpy's per-call overhead on a few words.
        small = bytes(payload)
        if _MAGIC_BYTES not in small:
            return []
        return [4 * i for i in range(words) if small[4 * i : 4 * i + 4] == _MAGIC_BYTES]
    # One vectorized compare over the aligned words: several GB/s, against <1 GB/s for bytes.find.
    # Against a uint32 scalar: a Python int above int32's range makes numpy compare in int64
    # (2.5x the time on a 90 KB payload).
    aligned = np.frombuffer(payload, dtype="<u4", count=words)
    hits = aligned == _MAGIC_U32
    if not hits.any():  # the usual answer
        return []
    starts: list[int] = (np.flatnonzero(hits) * 4).tolist()
    return starts


def frame_parts(payload: Buffer) -> list[Buffer]:
    """The byte chunks dmlc-core writes for one payload (framing words, data, padding).

    Args:
        payload: The record payload, at most ``MAX_RECORD_LENGTH`` bytes.

    Returns:
        Chunks whose concatenation is the framed record.
    """
    return _frame(payload)[0]


def _frame(payload: Buffer, head: Buffer = b"") -> tuple[list[Buffer], int]:
    """``(chunks, parts)`` for the payload ``head + payload``; ``parts`` is 0 for a record written whole.

    ``head`` (a multiple of 4 bytes long, e.g. the IRHeader) is framed as if concatenated in front of
    ``payload`` without copying either: aligned words never straddle the two.
    """
    hlen = len(head)
    if hlen & 3:
        head, payload, hlen = b"", bytes(head) + bytes(payload), 0
    length = hlen + len(payload)
    if length > MAX_RECORD_LENGTH:
        raise ValueError(f"record of {length} bytes exceeds the RecordIO limit of {MAX_RECORD_LENGTH}")
    splits = magic_positions(head) + [hlen + p for p in magic_positions(payload)] if hlen else magic_positions(payload)
    if not splits:  # almost every record: one framing word (merged with the header), data, padding
        first = _LREC.pack(MAGIC, length) + bytes(head) if hlen else _LREC.pack(MAGIC, length)
        pad = _PAD[length & 3]
        return ([first, payload, pad] if pad else [first, payload]) if len(payload) else [first], 0
    hview, pview = memoryview(head), memoryview(payload)

    def piece(a: int, b: int) -> list[Buffer]:
        out: list[Buffer] = []
        if a < hlen:
            out.append(hview[a : min(b, hlen)])
        if b > hlen:
            out.append(pview[max(a, hlen) - hlen : b - hlen])
        return [c for c in out if len(c)]

    chunks: list[Buffer] = []
    start = 0
    for pos in splits:
        chunks.append(_LREC.pack(MAGIC, ((1 if start == 0 else 2) << 29) | (pos - start)))
        chunks.extend(piece(start, pos))
        start = pos + 4
    chunks.append(_LREC.pack(MAGIC, ((3 if start else 0) << 29) | (length - start)))
    chunks.extend(piece(start, length))
    pad = _PAD[length & 3]
    if pad:
        chunks.append(pad)
    return chunks, (len(splits) + 1 if splits else 0)


def record_span(length: int, parts: int = 0) -> int:
    """Bytes a record of payload ``length`` in ``parts`` parts occupies (0: whole), padding excluded.

    8 framing bytes per part; the magic words between parts are dropped from the payload.
    """
    return 8 * max(parts, 1) + length - 4 * max(parts - 1, 0)


def framed_size(payload_length: int) -> int:
    """Bytes a payload occupies on disk when it is not split (8 framing bytes + padded payload)."""
    return 8 + ((payload_length + 3) & ~3)


def format_idx(keys: Sequence[int], offsets: Sequence[int]) -> bytes:
    """The ``.idx`` text MXNet's ``MXIndexedRecordIO`` writes: ``key<TAB>offset<LF>`` per record."""
    return "".join(f"{int(k)}\t{int(o)}\n" for k, o in zip(keys, offsets, strict=True)).encode("ascii")


def _decimal(text: bytes, *, signed: bool) -> int | None:
    """The value of a plain decimal integer that fits int64 (not negative unless ``signed``), or None."""
    digits = text[1:] if signed and text[:1] == b"-" else text
    if not digits or len(digits) > 19 or not digits.isdigit():
        return None
    value = int(text)
    return value if -(1 << 63) <= value < (1 << 63) else None


def read_idx(path: str) -> tuple[NDArray[np.int64], NDArray[np.uint64]]:
    """Parse a ``.idx`` file: ``key<TAB>offset`` per line.

    Only the syntax is checked here (keys and offsets plain decimal integers that fit int64, offsets
    not negative); whether the offsets match the ``.rec`` is the reader's check.

    Returns:
        ``(keys int64 [N], offsets uint64 [N])`` in file order.

    Raises:
        CorruptDatasetError: Unreadable, or an entry that is not ``int<TAB>int`` in range (named by
            line number; the line's bytes are not quoted).
    """
    keys: list[int] = []
    offsets: list[int] = []
    try:
        with open_regular(path) as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.strip()
                if not line:
                    continue
                parts = line.split(b"\t")
                if len(parts) != 2:
                    raise CorruptDatasetError(
                        f"expected key<TAB>offset, found {len(parts)} tab-separated field(s)",
                        file=path,
                        field=f"line {lineno}",
                    )
                key = _decimal(parts[0].strip(), signed=True)
                if key is None:
                    raise CorruptDatasetError(
                        f"key is not a decimal integer that fits 64 bits ({len(parts[0])} characters)",
                        file=path,
                        field=f"line {lineno}",
                    )
                offset = _decimal(parts[1].strip(), signed=False)
                if offset is None:
                    raise CorruptDatasetError(
                        f"offset is not a decimal integer in [0, 2**63) ({len(parts[1])} characters)",
                        file=path,
                        field=f"line {lineno}",
                    )
                keys.append(key)
                offsets.append(offset)
    except OSError as exc:
        raise CorruptDatasetError(f"cannot read ({exc.strerror or exc})", file=path) from None
    return np.asarray(keys, dtype=np.int64), np.asarray(offsets, dtype=np.uint64)


class FramedRecord:
    """A payload (``head + payload``, not copied) split into the chunks dmlc-core writes.

    Framing can run on worker threads; the writer then only writes.

    Attributes:
        chunks: Framing words, data and padding, in write order.
        parts: 0 for a record written whole, else the number of parts.
        size: Total bytes of the chunks.
    """

    __slots__ = ("chunks", "parts", "size")

    def __init__(self, payload: Buffer, head: Buffer = b"") -> None:
        self.chunks, self.parts = _frame(payload, head)
        self.size = sum(len(c) for c in self.chunks)

    @classmethod
    def whole(cls, framed: Buffer) -> FramedRecord:
        """A record already framed whole (``cflag`` 0, padded), e.g. by the engine's ``frame_files``."""
        return cls.of_chunks([framed])

    @classmethod
    def of_chunks(cls, chunks: list[Buffer]) -> FramedRecord:
        """A record framed whole (``cflag`` 0, padded) whose bytes are ``chunks`` in order.

        E.g. framing words and header, image, padding: a record the engine's ``frame_buffers`` gathered.
        """
        record = cls.__new__(cls)
        record.chunks, record.parts, record.size = chunks, 0, sum(len(c) for c in chunks)
        return record


class RecordIOWriter:
    """Appends framed records to a binary file and remembers their ``.idx`` entries.

    Args:
        fileobj: A binary file opened for writing, positioned at offset 0. An unbuffered file
            (``buffering=0``) gets each record in one ``writev`` call, without an extra copy.
        on_bytes: Called with every chunk written (checksums, byte counters).
    """

    def __init__(self, fileobj: Sink, on_bytes: Callable[[Buffer], None] | None = None) -> None:
        self._file = fileobj
        self._on_bytes = on_bytes
        self._writev = isinstance(fileobj, io.FileIO) and hasattr(os, "writev")
        self.offset = 0
        self.keys: list[int] = []
        self.offsets: list[int] = []

    def _write(self, chunks: Sequence[Buffer]) -> None:
        if self._writev:
            fd = self._file.fileno()
            views = [memoryview(c).cast("B") for c in chunks]
            while views:
                n = os.writev(fd, views)
                if n == 0:
                    raise OSError(errno.EIO, "writev wrote nothing")
                while views and n >= len(views[0]):  # a short write: resume where it stopped
                    n -= len(views[0])
                    views.pop(0)
                if views and n:
                    views[0] = views[0][n:]
        else:
            self._file.writelines(chunks)
        if self._on_bytes is not None:
            for chunk in chunks:
                self._on_bytes(chunk)

    def write_framed(self, record: FramedRecord, key: int) -> tuple[int, int]:
        """Append a record framed by :class:`FramedRecord`; returns ``(offset, parts)``."""
        start = self.offset
        self._write(record.chunks)
        self.offset += record.size
        self.keys.append(int(key))
        self.offsets.append(start)
        return start, record.parts

    def write_records(self, chunks: Sequence[Buffer], keys: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """Append records already framed whole, back to back in ``chunks`` (``sizes`` bytes each).

        Returns:
            Their offsets.
        """
        if not sizes:
            return []
        offsets = list(itertools.accumulate(sizes[:-1], initial=self.offset))
        self._write(chunks)
        self.offset += sum(sizes)
        self.keys.extend(int(k) for k in keys)
        self.offsets.extend(offsets)
        return offsets

    def write(self, payload: Buffer, key: int) -> tuple[int, int]:
        """Frame and append one payload.

        Returns:
            ``(offset, parts)``: the record's byte offset and how many parts it was split into
            (0 when it went out whole).
        """
        return self.write_framed(FramedRecord(payload), key)

    def idx_bytes(self) -> bytes:
        """The ``.idx`` text for everything written so far."""
        return format_idx(self.keys, self.offsets)


class RecordIOShard:
    """A read-only ``.rec`` file, read with ``pread`` into memory each read allocates.

    Why not a memory map (as before): a mapped file that shrinks under its reader (truncated,
    rewritten in place) turns the next access to a page past its new end into ``SIGBUS``, which
    kills the process wherever the access happens (in the decode engine, for a loader); only a
    process-wide signal handler could catch it, and library code installs none. ``pread`` into
    memory the caller then owns turns the same event into a short read, reported as a
    :class:`~fastload.errors.CorruptRecordError` naming the shard, record and offset. A shard
    replaced by a rename or removed keeps being read from the file that was opened (the kernel keeps
    it while the descriptor is open), so a reader sees either the old bytes or an error, never a crash.

    What it costs: one copy of each record, which the engine reads at once, from cache. Measured
    in the loader (decode included) it is within the run-to-run noise; see the README's Packing
    section for the figures.

    Reads are thread-safe (``pread`` has no shared file position); :meth:`close` waits for no one:
    the descriptor is closed when the last read in flight finishes.

    Args:
        path: The ``.rec`` file.

    Raises:
        CorruptRecordError: The file cannot be opened or is not a regular file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = os.path.basename(path)
        try:
            # O_NONBLOCK: a FIFO or device named like a shard must not block the open; regular files ignore it.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise CorruptRecordError(f"cannot open shard ({exc.strerror or exc})", shard=path) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise CorruptRecordError("not a regular file (a FIFO, device, socket or folder)", shard=path)
        self.size = st.st_size
        self._fd = fd
        self._lock = threading.Lock()
        self._reading = 0
        self._closed = False

    def _fail(self, message: str, record: int | None, offset: int) -> CorruptRecordError:
        return CorruptRecordError(message, shard=self.path, record=record, offset=offset)

    def read(self, offset: int, length: int, record: int | None = None) -> bytes:
        """``length`` bytes at ``offset``.

        Raises:
            CorruptRecordError: The file ends first (truncated since it was opened?) or the read fails.
            ValueError: The shard is closed.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"shard {self.path} is closed")
            self._reading += 1
        try:
            data = os.pread(self._fd, length, offset)
            if len(data) < length:  # regular files read short only at the end; make sure
                more = os.pread(self._fd, length - len(data), offset + len(data))
                data += more
        except OSError as exc:
            raise self._fail(f"read failed ({exc.strerror or exc})", record, offset) from None
        finally:
            with self._lock:
                self._reading -= 1
                if self._closed and not self._reading:
                    self._release()
        if len(data) < length:
            raise self._short(offset + len(data), length, record, offset)
        return data

    def reopen(self, flags: int) -> int:
        """A new descriptor of the file this shard reads, opened with ``flags`` (``O_DIRECT``); the caller closes it.

        Raises:
            OSError: The open fails (``EINVAL``: the file system refuses the flags).
            ValueError: The shard is closed.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"shard {self.path} is closed")
            return reopen(self._fd, self.path, flags)

    def read_into(self, offset: int, buf: memoryview, record: int | None = None) -> None:
        """:meth:`read` into ``buf`` (writable; its length is the length read): memory the caller chose.

        Raises:
            CorruptRecordError: The file ends first (truncated since it was opened?) or the read fails.
            ValueError: The shard is closed.
        """
        length = len(buf)
        with self._lock:
            if self._closed:
                raise ValueError(f"shard {self.path} is closed")
            self._reading += 1
        try:
            got = os.preadv(self._fd, [buf], offset)
            if 0 < got < length:  # regular files read short only at the end; make sure
                got += os.preadv(self._fd, [buf[got:]], offset + got)
        except OSError as exc:
            raise self._fail(f"read failed ({exc.strerror or exc})", record, offset) from None
        finally:
            with self._lock:
                self._reading -= 1
                if self._closed and not self._reading:
                    self._release()
        if got < length:
            raise self._short(offset + got, length, record, offset)

    def _short(self, end: int, length: int, record: int | None, offset: int) -> CorruptRecordError:
        return self._fail(
            f"the shard ends at byte {end}, inside this record's {length} bytes "
            f"(truncated or rewritten since it was opened at {self.size} bytes?)",
            record,
            offset,
        )

    def _header(self, data: Buffer, pos: int, offset: int, record: int | None) -> tuple[int, int]:
        magic, lrec = _LREC.unpack_from(data, pos)
        if magic != MAGIC:
            raise self._fail(f"bad magic word 0x{magic:08x}", record, offset + pos)
        return lrec >> 29, lrec & MAX_RECORD_LENGTH

    def _part(self, offset: int, record: int | None) -> tuple[int, int]:
        """``(cflag, length)`` of the physical part at ``offset``, checked against the file size."""
        if offset + 8 > self.size:
            raise self._fail(f"record header past the end of the shard ({self.size} bytes; truncated?)", record, offset)
        cflag, length = self._header(self.read(offset, 8, record), 0, offset, record)
        if offset + 8 + length > self.size:
            raise self._fail(
                f"record of {length} bytes runs past the end of the shard ({self.size} bytes; truncated?)",
                record,
                offset,
            )
        return cflag, length

    def extent(self, offset: int, record: int | None = None) -> tuple[int, int, int]:
        """Walk the parts of the record at ``offset``.

        Returns:
            ``(payload_length, parts, next_offset)``: ``parts`` is 0 for a record written whole.
        """
        cflag, length = self._part(offset, record)
        if cflag == 0:
            return length, 0, offset + 8 + ((length + 3) & ~3)
        if cflag != 1:
            raise self._fail(f"record starts with a continuation part (cflag {cflag})", record, offset)
        total, parts, pos = length, 1, offset + 8 + length  # only the last part is padded
        while True:
            cflag, length = self._part(pos, record)
            if cflag not in (2, 3):
                raise self._fail(f"multi-part record interrupted by cflag {cflag}", record, pos)
            total += 4 + length
            parts += 1
            if cflag == 3:
                return total, parts, pos + 8 + ((length + 3) & ~3)
            pos += 8 + length

    def payload(self, offset: int, length: int = -1, parts: int = 0, record: int | None = None) -> memoryview | bytes:
        """The payload of the record at ``offset``, read in one ``pread`` when the index gives its size.

        Args:
            offset: Byte offset of the record's first part.
            length: Payload length from an index; checked against the framing. -1: read it.
            parts: 0 when the index says the record is whole, else its number of parts.
            record: Record number inside the shard, for error messages.

        Returns:
            A memoryview of a whole record's payload (over the bytes read); reassembled ``bytes``
            for a record split into parts.

        Raises:
            CorruptRecordError: Damaged framing, a length that disagrees with the index, or a
                shard that ends inside the record.
        """
        if length < 0:
            length, parts, _ = self.extent(offset, record)
        span = self.span(offset, length, parts, record)
        return self.parse(self.read(offset, span, record), offset, length, parts, record)

    def span(self, offset: int, length: int, parts: int = 0, record: int | None = None) -> int:
        """Bytes the record at ``offset`` occupies in the file, from its index entry (checked).

        Raises:
            CorruptRecordError: An impossible extent, or one that runs past the end of the shard.
        """
        if parts < 0 or parts == 1 or length < 0 or length > MAX_RECORD_LENGTH * max(parts, 1):
            raise self._fail(f"impossible record extent ({length} bytes in {parts} parts)", record, offset)
        span = record_span(length, parts)
        if offset + span > self.size:
            raise self._fail(
                f"record of {length} bytes runs past the end of the shard ({self.size} bytes; truncated?)",
                record,
                offset,
            )
        return span

    def parse(
        self, data: Buffer, offset: int, length: int, parts: int = 0, record: int | None = None
    ) -> memoryview | bytes:
        """The payload of a record from its bytes as read (``span`` bytes at ``offset``), framing checked.

        What :meth:`payload` does after its read, for bytes read otherwise (several records in one
        read, see :mod:`fastload.records.readahead`).

        Args:
            data: The record's bytes: exactly ``record_span(length, parts)`` of them.
            offset: Where they start in the shard (for messages).
            length: The payload length from the index.
            parts: 0 for a whole record, else its number of parts.
            record: Record number inside the shard, for messages.

        Returns:
            A memoryview over ``data`` for a whole record; reassembled ``bytes`` for a split one.

        Raises:
            CorruptRecordError: Damaged framing or a length that disagrees with the index.
        """
        span = len(data)
        if span < 8:
            raise self._fail(f"record of {span} bytes is shorter than its framing", record, offset)
        cflag, plen = self._header(data, 0, offset, record)
        if parts == 0:
            if cflag != 0:
                raise self._fail(
                    f"the index says a whole record, the framing says part (cflag {cflag})", record, offset
                )
            if plen != length or 8 + plen > span:
                raise self._fail(f"record length {plen} differs from the index ({length})", record, offset)
            return memoryview(data)[8 : 8 + plen]
        chunks: list[Buffer] = []
        pos = 0
        view = memoryview(data)
        for k in range(parts):
            if k:
                if pos + 8 > span:
                    raise self._fail(f"part {k} of {parts} starts past the record's extent", record, offset + pos)
                cflag, plen = self._header(data, pos, offset, record)
            want = 1 if k == 0 else (3 if k == parts - 1 else 2)
            if cflag != want or pos + 8 + plen > span:
                raise self._fail(f"part {k} of {parts} has cflag {cflag} and {plen} bytes", record, offset + pos)
            if k:
                chunks.append(_MAGIC_BYTES)
            chunks.append(view[pos + 8 : pos + 8 + plen])
            pos += 8 + plen
        out = b"".join(chunks)
        if len(out) != length or pos != span:
            raise self._fail(f"record length {len(out)} differs from the index ({length})", record, offset)
        return out

    def heads(self, offsets: NDArray[np.uint64], nbytes: int) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
        """The first ``nbytes`` at each offset (framing and record header), for indexing without scanning.

        Offsets close together are read by one ``pread`` (small records); others one each. About
        2 us per record (the ``pread`` and a copy of the bytes wanted), against a few tens of
        nanoseconds through a memory map that a shrinking file would turn into SIGBUS.

        Returns:
            ``(heads uint8 [N, nbytes], got int64 [N])``: ``got`` is how many of the bytes exist
            (fewer near the end of the file; the rest is zeros).
        """
        n = len(offsets)
        out = bytearray(n * nbytes)
        got = [0] * n
        if n:
            offs = np.asarray(offsets, dtype=np.uint64)
            order = np.argsort(offs, kind="stable")
            srt = offs[order]
            # A new read where the next head is more than a page away, or at every 1 MiB of the file.
            new = np.ones(n, dtype=bool)
            new[1:] = (np.diff(srt) > 4096) | (srt[1:] >> np.uint64(20) != srt[:-1] >> np.uint64(20))
            starts = np.flatnonzero(new).tolist()
            bounds = [*starts[1:], n]
            rows, at = order.tolist(), srt.tolist()
            with self._lock:
                if self._closed:
                    raise ValueError(f"shard {self.path} is closed")
                self._reading += 1
            try:
                fd, size = self._fd, self.size
                for a, b in zip(starts, bounds, strict=True):
                    lo = at[a]
                    hi = min(at[b - 1] + nbytes, size)
                    if hi <= lo:
                        continue
                    block = os.pread(fd, hi - lo, lo)
                    for k in range(a, b):
                        rel = at[k] - lo
                        m = max(0, min(nbytes, len(block) - rel))
                        row = rows[k] * nbytes
                        out[row : row + m] = block[rel : rel + m]
                        got[rows[k]] = m
            except OSError as exc:
                raise self._fail(f"read failed ({exc.strerror or exc})", None, 0) from None
            finally:
                with self._lock:
                    self._reading -= 1
                    if self._closed and not self._reading:
                        self._release()
        return np.frombuffer(out, dtype=np.uint8).reshape(n, nbytes), np.asarray(got, dtype=np.int64)

    def scan(self) -> Iterator[tuple[int, int, int]]:
        """Walk the whole file record by record.

        Yields:
            ``(offset, payload_length, parts)`` for every logical record.
        """
        pos, record = 0, 0
        while pos < self.size:
            length, parts, nxt = self.extent(pos, record)
            yield pos, length, parts
            pos, record = nxt, record + 1

    def will_need(self, offset: int, length: int) -> None:
        """Ask the kernel to read ``[offset, offset + length)`` ahead (``POSIX_FADV_WILLNEED``)."""
        with self._lock:
            if self._closed or length <= 0 or not hasattr(os, "posix_fadvise"):
                return
            # Under the lock: close() cannot release the descriptor meanwhile (fadvise does not block).
            os.posix_fadvise(self._fd, offset, length, os.POSIX_FADV_WILLNEED)

    def done_with(self, offset: int, length: int) -> None:
        """Nothing to release: records are read into memory their users own, and freed with it."""

    def _release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        """Close the file (idempotent); a read in flight finishes first, later reads raise ``ValueError``."""
        with self._lock:
            self._closed = True
            if not self._reading:
                self._release()
