"""Write stage, input side: a parquet image column read page by page, its values handed out where they were read.

``datasets`` writes an ``Image`` column (and any column it embeds bytes in) uncompressed and
PLAIN-encoded, without a dictionary: each data page is the definition levels, then every image as
a 4-byte length and its bytes. Such a column chunk is read here a page at a time into reused
buffers, and each image is handed out as a view of the page it lies in, as the tar reader hands
out its members (:mod:`fastload.pack.tar_stream`): the writer's ``writev`` reads it from there.
Arrow's reader would first decode the page into a binary column, a copy of every image into
freshly grown memory (2,000 ImageNet-like images: a fifth of the whole pack's CPU time).

Only the common forms are read here: a local file, a ``BYTE_ARRAY`` column outside any list,
uncompressed, no dictionary page, PLAIN values, RLE-encoded definition levels, data pages v1 or
v2. :func:`plain_column` says from the footer whether a row group's column chunk is one; anything
else on the way (a page of another kind or encoding, a page header that does not parse) raises
:class:`NotPlain` naming the first row not handed out, and the caller reads on from there with
Arrow, which reads every form and reports damage in its own words.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from fastload.pack.tar_stream import ChunkPool

__all__ = ["NotPlain", "PageSpan", "PlainPages", "plain_column"]

# Thrift compact protocol type codes (the parquet footer's and page headers' encoding).
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3  # PageType
_PLAIN, _RLE = 0, 3  # Encoding
_HEAD = 1024  # page header bytes read ahead with the page before it (a header is ~30 bytes)
_MAX_HEAD = 1 << 20  # a page header longer than this is damage
_MAX_DEPTH = 16  # nested structs in a page header (statistics: 2)
_ROUND = 256 << 10  # page buffer sizes are rounded up to this, so that one fits pages of other sizes
_LENGTH = struct.Struct("<I")


class NotPlain(Exception):
    """The column chunk cannot be read on here; Arrow reads on from :attr:`row` (rows from the chunk's first)."""

    def __init__(self, row: int, why: str) -> None:
        super().__init__(why)
        self.row = row


class _Short(Exception):
    """A page header runs past the bytes at hand (more are read and it is parsed again)."""


class PageSpan(NamedTuple):
    """Where a row group's image column chunk lies: byte range and levels (from the footer)."""

    start: int
    end: int
    max_def: int
    rows: int


def plain_column(chunk: Any, descr: Any, file_size: int) -> PageSpan | None:
    """The chunk's :class:`PageSpan` when it is in the form read here (see the module docstring), else None.

    Args:
        chunk: The row group's ``ColumnChunkMetaData`` of the image leaf.
        descr: Its ``ColumnSchema`` (levels).
        file_size: The file's size (a footer pointing past it is left to Arrow to report).
    """
    if (
        chunk.physical_type != "BYTE_ARRAY"
        or chunk.compression != "UNCOMPRESSED"
        or chunk.has_dictionary_page
        or descr.max_repetition_level != 0
        or not set(chunk.encodings) <= {"PLAIN", "RLE"}
    ):
        return None
    start, size = chunk.data_page_offset, chunk.total_compressed_size
    if start < 4 or size <= 0 or start + size > file_size:
        return None
    return PageSpan(start, start + size, descr.max_definition_level, chunk.num_values)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]  # IndexError: the header goes on past the bytes at hand
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 70:
            raise ValueError("a varint longer than 10 bytes")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(buf: bytes, pos: int, kind: int, depth: int) -> tuple[Any, int]:
    """A compact-protocol value of type ``kind`` at ``pos``: ints and structs kept, the rest skipped (None)."""
    if kind in (_TRUE, _FALSE):  # a struct field's boolean is in its type code
        return kind == _TRUE, pos
    if kind == _BYTE:
        return buf[pos], pos + 1
    if kind in (_I16, _I32, _I64):
        n, pos = _varint(buf, pos)
        return _zigzag(n), pos
    if kind == _DOUBLE:
        return None, pos + 8
    if kind == _BINARY:
        n, pos = _varint(buf, pos)
        if pos + n > len(buf):
            raise IndexError
        return None, pos + n
    if kind in (_LIST, _SET):
        head = buf[pos]
        pos += 1
        size, elem = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        for _ in range(size):
            # A list's booleans take a byte each.
            pos = pos + 1 if elem in (_TRUE, _FALSE) else _value(buf, pos, elem, depth)[1]
        return None, pos
    if kind == _MAP:
        size, pos = _varint(buf, pos)
        if size:
            types = buf[pos]
            pos += 1
            for _ in range(size):
                for t in (types >> 4, types & 0x0F):
                    pos = pos + 1 if t in (_TRUE, _FALSE) else _value(buf, pos, t, depth)[1]
        return None, pos
    if kind == _STRUCT:
        return _struct(buf, pos, depth + 1)
    raise ValueError(f"unknown compact-protocol type {kind}")


def _struct(buf: bytes, pos: int, depth: int = 0) -> tuple[dict[int, Any], int]:
    """A compact-protocol struct at ``pos``: ``{field id: value}`` (see :func:`_value`), and where it ends."""
    if depth > _MAX_DEPTH:
        raise ValueError("structs nested too deep")
    fields: dict[int, Any] = {}
    last = 0
    while True:
        byte = buf[pos]
        pos += 1
        kind = byte & 0x0F
        if kind == _STOP:
            return fields, pos
        if byte >> 4:
            last += byte >> 4
        else:
            n, pos = _varint(buf, pos)
            last = _zigzag(n)
        fields[last], pos = _value(buf, pos, kind, depth)


def _levels(buf: memoryview, count: int, width: int) -> list[int]:
    """``count`` definition levels of bit width ``width`` (parquet's RLE / bit-packed hybrid)."""
    out: list[int] = []
    pos = 0
    nbytes = (width + 7) // 8
    while len(out) < count:
        header, pos = _varint(buf, pos)  # type: ignore[arg-type]
        if header & 1:  # bit-packed: groups of 8 values, least significant bit first
            size = (header >> 1) * width
            if pos + size > len(buf):
                raise ValueError("definition levels run past the page")
            bits = np.unpackbits(np.frombuffer(buf[pos : pos + size], dtype=np.uint8), bitorder="little")
            values = bits.reshape(-1, width) @ (1 << np.arange(width))
            out += values[: count - len(out)].tolist()
            pos += size
        else:  # a run of one value
            if pos + nbytes > len(buf) or header >> 1 == 0:
                raise ValueError("damaged definition levels")
            out += [int.from_bytes(buf[pos : pos + nbytes], "little")] * min(header >> 1, count - len(out))
            pos += nbytes
    return out


def _all_defined(buf: memoryview, count: int, max_def: int) -> bool:
    """Whether the levels are one run of ``max_def`` covering the page (the usual page: no nulls)."""
    try:
        header, pos = _varint(buf, 0)  # type: ignore[arg-type]
    except (IndexError, ValueError):
        return False
    nbytes = (max_def.bit_length() + 7) // 8
    return not header & 1 and header >> 1 >= count and int.from_bytes(buf[pos : pos + nbytes], "little") == max_def


class PlainPages:
    """Reads the pages of plain image column chunks of one local parquet file.

    Args:
        path: The file.
        pool: Where page buffers come from (reused once no image view of them is alive).
    """

    def __init__(self, path: str, pool: ChunkPool) -> None:
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._pool = pool

    def close(self) -> None:
        """Idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> PlainPages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, into: memoryview, offset: int) -> int:
        done = 0
        while done < len(into):
            n = os.preadv(self._fd, [into[done:]], offset + done)
            if n == 0:
                break
            done += n
        return done

    def pages(self, span: PageSpan, skip: int = 0) -> Iterator[tuple[int, list[memoryview | None]]]:
        """``(row of its first value, images)`` per data page of ``span`` from row ``skip`` on (None: a null cell).

        Raises:
            NotPlain: A page not in the form read here, or damage; its ``row`` is the first row
                not handed out.
            OSError: The file cannot be read.
        """
        pos, row = span.start, 0
        ahead = b""  # the next page header's first bytes, read with the page before it
        width = span.max_def.bit_length()
        while pos < span.end and row < span.rows:
            try:
                header, size = self._header(ahead, pos, span.end)
            except (ValueError, _Short) as exc:
                raise NotPlain(row, f"page header at byte {pos}: {str(exc) or 'runs past the column chunk'}") from None
            pos += size
            kind, length = header.get(1), header.get(3)
            if not isinstance(length, int) or length < 0 or pos + length > span.end or header.get(2) != length:
                raise NotPlain(row, f"page at byte {pos}: a size that does not fit the column chunk")
            if kind == _DATA_PAGE and isinstance(header.get(5), dict):
                info = header[5]
                count, encoding, levels_encoding, nulls = info.get(1), info.get(2), info.get(3), None
                plain = encoding == _PLAIN and (span.max_def == 0 or levels_encoding == _RLE)
            elif kind == _DATA_PAGE_V2 and isinstance(header.get(8), dict):
                info = header[8]
                count, encoding, nulls = info.get(1), info.get(4), info.get(2)
                plain = encoding == _PLAIN and info.get(6, 0) == 0
            else:
                raise NotPlain(row, f"page at byte {pos}: of type {kind}")
            if not plain:
                raise NotPlain(row, f"page at byte {pos}: encoded {encoding}")
            if not isinstance(count, int) or not 0 < count <= span.rows - row:
                raise NotPlain(row, f"page at byte {pos}: {count} values where {span.rows - row} rows are left")
            want = min(length + _HEAD, span.end - pos)
            if row + count <= skip:  # a page before the resume point: not read, its header is
                pos, row, ahead = pos + length, row + count, b""
                continue
            buf = self._pool.take(-(-want // _ROUND) * _ROUND)
            view = memoryview(buf)
            got = self._read(view[:want], pos)
            if got < length:
                raise NotPlain(row, f"page at byte {pos}: the file ends inside it")
            ahead = bytes(view[length:got])
            try:
                images = self._values(view[:length], kind, info, count, nulls, span.max_def, width)
            except (ValueError, IndexError, struct.error) as exc:
                raise NotPlain(row, f"page at byte {pos}: {str(exc) or 'damaged'}") from None
            first = max(0, skip - row)
            yield row + first, images[first:]
            pos, row = pos + length, row + count

    def _header(self, ahead: bytes, pos: int, end: int) -> tuple[dict[int, Any], int]:
        """The page header at ``pos`` (``ahead``: its first bytes if read already) and its size."""
        buf = ahead
        want = _HEAD
        ended = False
        while True:
            if len(buf) < min(want, end - pos):
                asked = min(want, end - pos)
                buf = os.pread(self._fd, asked, pos)
                ended = len(buf) < asked  # the file is shorter than its footer says
            try:
                return _struct(buf, 0)
            except IndexError:
                if ended or len(buf) >= end - pos or want >= _MAX_HEAD:
                    raise _Short() from None
                want *= 16

    @staticmethod
    def _values(
        page: memoryview, kind: int, info: dict[int, Any], count: int, nulls: Any, max_def: int, width: int
    ) -> list[memoryview | None]:
        """The page's ``count`` cells: views of their bytes, None where the levels say null."""
        if kind == _DATA_PAGE:
            if max_def:
                (size,) = _LENGTH.unpack_from(page, 0)
                levels, pos = page[4 : 4 + size], 4 + size
                if pos > len(page):
                    raise ValueError("definition levels run past the page")
            else:
                levels, pos = page[:0], 0
        else:
            size = info.get(5, 0)
            if not isinstance(size, int) or not 0 <= size <= len(page):
                raise ValueError("definition levels run past the page")
            levels, pos = page[:size], size
        defined: list[int] | None = None
        if max_def and not (nulls == 0 or _all_defined(levels, count, max_def)):
            defined = _levels(levels, count, width)
        out: list[memoryview | None] = []
        end = len(page)
        for i in range(count):
            if defined is not None and defined[i] != max_def:
                out.append(None)
                continue
            (n,) = _LENGTH.unpack_from(page, pos)
            pos += 4
            if pos + n > end:
                raise ValueError("a value runs past the page")
            out.append(page[pos : pos + n])
            pos += n
        return out
