"""Write stage, tar bytes to members: a tar archive read once, front to back, in big chunks.

Why not :mod:`tarfile`: its headers are parsed field by field in Python, and its stream mode
copies member data through 10 KB reads. A WebDataset shard written by ``webdataset.TarWriter``
has two headers per member (a PAX header carries the float mtime), two members per sample: on
2,000 ImageNet-like samples ``tarfile.open(mode="r|")`` took 0.25 ms per member, four times what a
whole pass-through pack spends per image (and the pack's converter threads share that interpreter).
This reader hands member data out as zero-copy slices of the multi-megabyte chunks it reads (a
member that straddles two chunks is joined; one bigger than a chunk is read on its own). The
headers of a chunk's whole members are walked by the C++ engine in one call (``walk_tar``: ~1 us per
member where Python spends ~12); the engine takes the common forms only and stops at anything else,
which this module then reads itself, header by header: each header unpacked with one ``struct``
call, its checksum checked. Both read every archive the same (``FASTLOAD_PACK_FRAMING=python``
turns the engine's walk off, as it does the engine's framing).

What it reads (what ``tarfile`` writes and GNU / BSD tar produce): ustar (with its name prefix),
GNU long names and links (``L`` / ``K``), PAX extended headers (``x``, and global ``g``: ``path``,
``size``, ``linkpath``), base-256 numbers. Members other than regular files are handed out without
data (the caller skips them, as ``webdataset`` does); sparse members (GNU ``S`` or PAX
``GNU.sparse.*``) are handed out with a :attr:`TarMember.problem`. A damaged header (bad checksum,
a number that does not parse) raises :class:`TarError` naming its byte offset; an archive that ends
inside a member hands that member out with its problem (truncated).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fastload.engine import native

__all__ = ["BLOCK", "CHUNK", "ChunkPool", "TarError", "TarMember", "TarReader"]

BLOCK = 512
# name, size, checksum, type, magic, prefix (the fields a reader needs; the rest skipped)
_HEADER = struct.Struct("100s24x12s12x8sc100x6s82x155s12x")
_SIGNED = struct.Struct("148b8x356b")
_ADLER_MOD = 65521
_ZERO = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")
# Bytes read at a time. Each read gives up the GIL and must win it back from the converter threads,
# so not tiny reads; but a chunk stays mapped until the last sample in it is written, so the memory
# in flight is the batches in flight rounded up to whole chunks. 8,000 ImageNet-like images in four
# tars, 2 workers, 12 alternated runs: 8 MB chunks faulted 19.1k pages per pack, 4 MB 16.3k, 2 MB
# 16.0k, with the same user time (0.52-0.54 s); 1 MB faulted more again (16.9k: more members cut by
# a chunk's end, copied whole).
CHUNK = 2 << 20
_WALK_MAX = 4096  # members per engine walk (a chunk of small members is walked in a few calls)
_REGULAR_KINDS = frozenset(k[0] for k in _REGULAR)
_EXTENDED = frozenset({b"x"[0], b"g"[0], b"L"[0], b"K"[0]})


def engine_walk() -> Callable[..., Any] | None:
    """The engine's ``walk_tar`` when the C++ extension is built, else None (``FASTLOAD_PACK_FRAMING=python``: None)."""
    if os.environ.get("FASTLOAD_PACK_FRAMING", "").lower() == "python":
        return None
    engine = native()
    return None if engine is None else engine.walk_tar


class ChunkPool:
    """Read buffers reused once no member's bytes refer to them any more (one pool for all the tars of a pack).

    Members are handed out as views of the chunk they were read into, and those views live on
    until their records are written. A fresh multi-megabyte chunk per read is mapped anew by malloc
    and every page of it faults on first touch: a third of a tar reader's CPU time. A chunk is free
    again when no view of it is alive, which a ``bytearray`` tells exactly: it refuses to be resized
    while its buffer is exported (any memoryview of it, any engine call holding it).

    The pool grows only while every chunk it holds is in use, so it holds at most the chunks the
    samples in flight need at their peak (a few hundred samples: tens of megabytes).

    Args:
        keep: Chunks held at most (more are allocated, and freed, when all are in use).
    """

    def __init__(self, keep: int = 32) -> None:
        self._keep = keep
        self._chunks: list[bytearray] = []

    def take(self, size: int) -> bytearray:
        """A chunk of at least ``size`` bytes nobody else reads (its content is the last read's)."""
        for chunk in self._chunks:
            if len(chunk) >= size and _unexported(chunk):
                return chunk
        chunk = bytearray(size)
        if len(self._chunks) < self._keep:
            self._chunks.append(chunk)
        return chunk


def _unexported(chunk: bytearray) -> bool:
    """Whether no view of ``chunk`` is alive: resizing (one byte less, then back) raises BufferError if one is."""
    try:
        chunk.pop()
    except BufferError:
        return False
    chunk.append(0)  # within the allocation: no copy either way
    return True


class TarError(ValueError):
    """The archive cannot be read on from here (damaged header); the message says where."""


class TarMember(NamedTuple):
    """One member of the archive.

    Attributes:
        name: Its path inside the archive.
        offset: Byte offset of its first header block (PAX / long-name headers included) in the
            archive's (uncompressed) bytes: where a reader may start again to read it.
        size: Its size.
        regular: Whether it is a regular file (directories, links, devices are not).
        data: Its bytes (a regular file's, when usable), else None.
        problem: Why a regular file's bytes are not usable (sparse, truncated), else None.
    """

    name: str
    offset: int
    size: int
    regular: bool
    data: memoryview | bytes | None
    problem: str | None = None


def _number(raw: bytes, what: str, offset: int) -> int:
    try:
        return int(raw.strip(b" \0") or b"0", 8)  # the usual octal field: "0000644\0", "  644 \0"
    except ValueError:
        pass
    if raw[:1] in (b"\x80", b"\xff"):  # base-256 (GNU): big numbers, negative ones
        value = int.from_bytes(raw[1:], "big")
        return value - (1 << (8 * len(raw) - 8)) if raw[0] == 0xFF else value
    text = raw.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarError(f"damaged tar header at byte {offset} (its {what} is not a number)") from None


def _checksum_ok(header: bytes, stored: int) -> bool:
    """Whether ``stored`` is the header's checksum (its bytes summed, the checksum field as spaces).

    The byte sum comes from Adler-32's low half (``(1 + sum) mod 65521``, computed in C, a tenth
    of ``sum()``'s time): a block sums to at most 130,560, so the sum is one of two candidates
    and ``stored`` must match one. Old archives summed signed bytes; those are checked the slow way.
    """
    base = ((zlib.adler32(header) & 0xFFFF) - 1) % _ADLER_MOD - sum(header[148:156]) + 256
    return stored in (base, base + _ADLER_MOD) or stored == sum(_SIGNED.unpack(header)) + 256


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(data: bytes, offset: int) -> dict[str, str]:
    r"""``key=value`` records of a PAX header (``"%d %s=%s\\n"``, the length counting itself)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise TarError(f"damaged PAX header at byte {offset}") from None
        record = data[space + 1 : pos + length]
        if length <= 0 or space < 0 or not record.endswith(b"\n") or b"=" not in record:
            raise TarError(f"damaged PAX header at byte {offset}")
        key, value = record[:-1].split(b"=", 1)
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


@dataclass
class TarReader:
    """Members of a tar archive whose bytes ``read(n)`` hands out in order (short reads allowed, ``b""`` at the end).

    Args:
        read: The archive's bytes, from ``start`` on (a file's ``read``, a decompressor's, a
            remote object's stream).
        readinto: The same stream's ``readinto``; with ``chunks``, chunks are read into reused
            buffers instead of fresh ``bytes`` (None: ``read``).
        chunks: Where reused chunk buffers come from (shared by the readers of one pack).
        start: Byte offset of the first byte ``read`` returns (a reader resumed at a member's
            :attr:`TarMember.offset`); offsets reported are absolute.
        pax_global: PAX global headers in force at ``start`` (:attr:`pax_global` of the reader that
            stopped there).
        chunk: Bytes read at a time.
        max_size: Regular members larger than this are passed over unread and handed out with
            their problem (a record could not hold them; memory stays bounded). None: no limit.
        walk: The engine's header walk (:func:`engine_walk`'s, the default), or None to read every
            header in Python.
    """

    read: Callable[[int], bytes]
    start: int = 0
    pax_global: dict[str, str] = field(default_factory=dict)
    chunk: int = CHUNK
    max_size: int | None = None
    walk: Callable[..., Any] | None = field(default_factory=engine_walk)
    readinto: Callable[[memoryview], int | None] | None = None
    chunks: ChunkPool | None = None

    def __post_init__(self) -> None:
        self._buf: bytes | memoryview = b""  # the chunk being read (the filled part)
        self._view = memoryview(self._buf)
        self._pos = 0
        self.offset = self.start  # absolute offset of the next byte not yet taken
        self._ended = False

    # --- bytes --------------------------------------------------------------------------------

    def _fill(self, want: int) -> bytes:
        """Up to ``want`` bytes straight from ``read`` (fewer only at the end)."""
        parts = []
        got = 0
        while got < want and not self._ended:
            piece = self.read(want - got)
            if not piece:
                self._ended = True
                break
            parts.append(piece)
            got += len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _refill(self, want: int) -> None:
        """Make the next chunk (up to ``want`` bytes, fewer only at the end) the buffer read from."""
        self._buf, self._view, self._pos = b"", memoryview(b""), 0  # this reader's own view of the last one goes
        if self.readinto is None or self.chunks is None or want != self.chunk:
            self._buf = self._fill(want)
            self._view = memoryview(self._buf)
            return
        view = memoryview(self.chunks.take(want))[:want]
        got = 0
        while got < want and not self._ended:
            n = self.readinto(view[got:])
            if not n:
                self._ended = True
                break
            got += n
        self._buf = self._view = view[:got]

    def _block(self) -> bytes:
        """The next 512 bytes as ``bytes`` (fewer at the end of the archive)."""
        end = self._pos + BLOCK
        if end <= len(self._buf):
            block = bytes(self._view[self._pos : end])
            self._pos = end
            self.offset += BLOCK
            return block
        return bytes(self._take(BLOCK))

    def _take(self, n: int) -> memoryview | bytes:
        """The next ``n`` bytes (fewer at the end of the archive): a slice of the chunk when it holds them."""
        end = self._pos + n
        if end <= len(self._buf):
            view = self._view[self._pos : end]
            self._pos = end
            self.offset += n
            return view
        head = self._view[self._pos :]
        need = n - len(head)
        rest: bytes | memoryview
        if need >= self.chunk:
            rest = self._fill(need)
            self._buf, self._view, self._pos = b"", memoryview(b""), 0
        else:
            self._refill(self.chunk)
            rest = self._view[:need]
            self._pos = len(rest)
        data = bytes(head) + bytes(rest) if len(head) else rest
        self.offset += len(data)
        return data

    def _skip(self, n: int) -> int:
        """Pass over ``n`` bytes (read, not kept); returns how many there were."""
        skipped = 0
        while n > 0:
            avail = len(self._buf) - self._pos
            if avail == 0:
                self._refill(self.chunk)
                if not self._buf:
                    break
                continue
            step = min(n, avail)
            self._pos += step
            self.offset += step
            skipped += step
            n -= step
        return skipped

    # --- members ------------------------------------------------------------------------------

    def _walkable(self) -> bool:
        """Whether the engine may walk from here: global PAX records in force change no name, size or data."""
        return not self.pax_global or not any(
            k in ("path", "size") or k.startswith("GNU.sparse.") for k in self.pax_global
        )

    def _walked(self) -> Iterator[TarMember]:
        """The chunk's whole members from here that the engine walks (none: the next one is Python's to read)."""
        assert self.walk is not None
        names, rows, _stop = self.walk(self._buf, self._pos, _WALK_MAX)
        if not names:
            return
        base = self.offset - self._pos  # absolute offset of the chunk's first byte
        view, max_size = self._view, self.max_size
        for name, (start, data, size, kind) in zip(names, rows.tolist(), strict=True):
            end = data + size + (-size % BLOCK)
            self._pos, self.offset = end, base + end
            if kind not in _REGULAR_KINDS:
                yield TarMember(name, base + start, size, False, None)
            elif max_size is not None and size > max_size:
                yield TarMember(
                    name,
                    base + start,
                    size,
                    True,
                    None,
                    f"member of {size} bytes is larger than the {max_size}-byte record limit",
                )
            else:
                yield TarMember(name, base + start, size, True, view[data : data + size])

    def __iter__(self) -> Iterator[TarMember]:
        long_name: str | None = None
        pax: dict[str, str] = {}
        first: int | None = None  # where the current member's header sequence began
        while True:
            if (
                self.walk is not None
                and first is None
                and long_name is None
                and not pax
                and self._pos < len(self._buf)
                and self._walkable()
            ):
                walked = False
                for member in self._walked():
                    walked = True
                    yield member
                if walked:
                    continue  # the chunk may hold more; else the next member is read below
            at = self.offset
            header = self._block()
            if len(header) < BLOCK:
                if header or first is not None:
                    raise TarError(f"truncated tar: it ends inside the header at byte {at}")
                return
            if header == _ZERO:
                return  # end-of-archive marker (what follows is padding)
            raw_name, raw_size, raw_checksum, kind, magic, prefix = _HEADER.unpack(header)
            if not _checksum_ok(header, _number(raw_checksum, "checksum", at)):
                raise TarError(f"damaged tar header at byte {at} (checksum mismatch)")
            size = _number(raw_size, "size", at)
            if first is None:
                first = at
            if kind in (b"x", b"g", b"L", b"K"):
                pos = self._pos
                end = pos + size + (-size % BLOCK)
                if end <= len(self._buf):  # the usual case: inside the chunk
                    blob = bytes(self._view[pos : pos + size])
                    self._pos = end
                    self.offset += end - pos
                else:
                    blob = bytes(self._take(size))
                    self._skip(-size % BLOCK)
                if len(blob) < size:
                    raise TarError(f"truncated tar: it ends inside the extended header at byte {at}")
                if kind == b"x":
                    # Most PAX headers carry only times (webdataset's: a float mtime): nothing to
                    # parse unless a key this reader uses can be there.
                    if b"path=" in blob or b"size=" in blob or b"GNU.sparse" in blob:
                        pax.update(_pax_records(blob, at))
                elif kind == b"g":
                    self.pax_global.update(_pax_records(blob, at))
                    first = None  # a global header belongs to no member
                elif kind == b"L":
                    long_name = blob.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                continue
            info = {**self.pax_global, **pax} if self.pax_global else pax
            if info and "path" in info:
                name = info["path"]
            elif long_name is not None:
                name = long_name
            else:
                name = raw_name.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                if magic == b"ustar\0" and prefix[:1] not in (b"\0", b""):
                    name = _text(prefix) + "/" + name
            if info and "size" in info:
                try:
                    size = int(info["size"])
                except ValueError:
                    raise TarError(f"damaged PAX header before byte {at} (size is not a number)") from None
            if kind == b"\0" and name.endswith("/"):
                kind = b"5"  # an old-style directory entry
            if kind == b"5":
                name = name.rstrip("/")
            problem = None
            if kind == b"S" or (info and any(k.startswith("GNU.sparse.") for k in info)):
                problem = "sparse tar member: not supported"
                if kind == b"S" and header[482]:  # old GNU sparse: extension blocks follow the header
                    while True:
                        ext = bytes(self._take(BLOCK))
                        if len(ext) < BLOCK or not ext[504]:
                            break
            start, long_name, pax = first, None, {}
            first = None
            if kind in _REGULAR and problem is None and self.max_size is not None and size > self.max_size:
                problem = f"member of {size} bytes is larger than the {self.max_size}-byte record limit"
            if kind in _REGULAR and problem is None:
                pos = self._pos
                padded = pos + size + (-size % BLOCK)
                if padded <= len(self._buf):  # the usual case: data and padding inside the chunk
                    self._pos = padded
                    self.offset += padded - pos
                    yield TarMember(name, start, size, True, self._view[pos : pos + size])
                    continue
                data = self._take(size)
                if len(data) < size:
                    yield TarMember(
                        name, start, size, True, None, f"truncated tar: {len(data)} of {size} bytes present"
                    )
                    return
                self._skip(-size % BLOCK)
                yield TarMember(name, start, size, True, data)
                continue
            skipped = self._skip(size + (-size % BLOCK))
            if skipped < size:
                problem = f"truncated tar: {skipped} of {size} bytes present"
            regular = kind in _REGULAR or kind == b"S"
            yield TarMember(name, start, size, regular, None, problem if regular else None)
            if skipped < size:
                return
