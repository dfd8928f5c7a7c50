"""Write stage, pass-through fast path: a batch of files becomes framed RecordIO records in one engine call.

Packing valid colour JPEGs untouched is mostly per-file overhead when done in Python: a read into a
new ``bytes``, the marker walk, the magic-word scan, the framing chunks, ~100 us per file in all.
``fastload._engine.frame_files`` does all of it for a batch with the GIL released once, reading
each file straight into its place in one buffer: its records are written from views of that
buffer, never copied again. The verdicts are the Python path's (the same marker walk, the same
magic-word rule); whatever the engine does not vouch for (non-JPEGs, grayscale or CMYK, damaged
files, files that changed size since their ``stat``, unreadable files, payloads that dmlc-core
would split) is returned as ``None`` and takes the Python path, which converts or reports it.

Images already in memory (a tar's members, a parquet column's cells: views of what was read) go
through ``fastload._engine.frame_buffers`` (:func:`frame_images`) the same way: the same checks, the
``max_pixels`` bound on the declared frame size, one copy into the batch buffer.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import xxhash

from fastload.engine import native
from fastload.pack.convert import Converted, jpeg_frame_size, too_many_pixels
from fastload.records import recordio
from fastload.records.folder_tree import SourceItem

__all__ = [
    "GATHER_MIN_BYTES",
    "BufferPool",
    "FramedBatch",
    "Prepared",
    "engine_buffer_framing",
    "engine_framing",
    "frame_batch",
    "frame_buffers",
    "frame_images",
]


class Prepared(NamedTuple):
    """A record ready to write: built on a worker thread so the writing thread only writes."""

    record: Any  # recordio.FramedRecord or the LMDB value bytes
    length: int  # payload / value length
    data_offset: int  # where the image starts inside it
    checksum: int  # XXH3-64 of the payload / value (the index's per-record checksum)


class BufferPool:
    """Batch buffers handed back by the writer once their records are written, for later batches.

    A fresh multi-megabyte allocation is mapped anew by malloc and every page then faults on first
    touch: a tenth of a pass-through pack's CPU time before buffers were reused.

    Args:
        keep: Buffers held at most (the rest are freed).
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A buffer of at least ``nbytes`` (uninitialized)."""
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.nbytes >= nbytes:
                    return self._free.pop(i)
        return np.empty(max(nbytes, _MIN_BUFFER), dtype=np.uint8)

    def give(self, buf: np.ndarray) -> None:
        """Return a buffer nobody reads any more."""
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buf)


_MIN_BUFFER = 4 << 20  # most pass-through batches of ImageNet-like files fit: fewer, reusable sizes


def engine_framing() -> Any | None:
    """The engine's ``frame_files`` when the C++ extension is built, else None.

    ``FASTLOAD_PACK_FRAMING=python`` turns it off (the pure-Python path packs the same bytes).
    """
    if os.environ.get("FASTLOAD_PACK_FRAMING", "").lower() == "python":
        return None
    engine = native()
    return None if engine is None else engine.frame_files


def engine_buffer_framing() -> Any | None:
    """The engine's ``frame_buffers`` (images in memory) when the C++ extension is built, else None.

    ``FASTLOAD_PACK_FRAMING=python`` turns it off, as it does ``frame_files``.
    """
    if os.environ.get("FASTLOAD_PACK_FRAMING", "").lower() == "python":
        return None
    engine = native()
    return None if engine is None else engine.frame_buffers


class FramedBatch:
    """A batch of images framed by the engine, which the writer takes in one piece.

    Two layouts: the records back to back in one buffer (files, small images), or, for large images
    already in memory, gathered: the buffer holds what goes between the images (each record's
    framing words and header, after the padding of the one before) and the images stay where they
    are, so they are never copied before the writer's ``writev``.

    Attributes:
        data: The buffer the engine wrote (the records, or what goes between the images).
        chunks: What the writer writes, in order: ``[data]``; gathered: prefix, image, prefix, image,
            ..., the last padding.
        nbytes: The bytes of the framed records (what the chunks hold).
        framed: Per image, its framed record's size (> 0) or the engine's refusal (< 0).
        lengths: Per image, the payload length (head + image bytes).
        head_lens: Per image, where the image starts inside the payload.
        sizes: Per image, the bytes read (a file's stat size, an image's length).
        checksums: Per image framed, the XXH3-64 of its payload (the others: 0).
        refused: Images framed but refused after (a header above ``max_pixels``): position -> reason.
    """

    __slots__ = (
        "_gathered",
        "_parts",
        "buffer",
        "checksums",
        "chunks",
        "data",
        "framed",
        "head_lens",
        "lengths",
        "nbytes",
        "refused",
        "sizes",
    )

    def __init__(
        self,
        data: memoryview,
        framed: list[int],
        lengths: list[int],
        head_lens: list[int],
        sizes: list[int],
        buffer: np.ndarray | None,
        max_pixels: int | None = None,
        *,
        images: Sequence[Any] | None = None,
    ) -> None:
        self.data, self.framed, self.lengths, self.head_lens, self.sizes = data, framed, lengths, head_lens, sizes
        # What ``data`` views, when it comes from the pool: back there once the records are written.
        self.buffer = buffer
        self.refused: dict[int, str] = {}
        self._parts: list[tuple[int, Any] | None] = []  # per image framed: where its record starts in data, its image
        self.chunks: list[Any] = [data] if images is None else []
        self.nbytes = len(data) if images is None else 0
        # Hashed here, on the worker thread that framed the batch (XXH3 releases no GIL, but at
        # ~25 GB/s it is microseconds per image).
        self.checksums = []
        self._gathered = images is not None
        pos = 0  # in data: where the next record (copied) or the next padding + prefix (gathered) starts
        pad = 0  # gathered: the zero padding owed after the last record framed
        for k, (n, length, head_len) in enumerate(zip(framed, lengths, head_lens, strict=True)):
            if n < 0:
                self.checksums.append(0)
                self._parts.append(None)
                continue
            if images is None:
                image = data[pos + 8 + head_len : pos + 8 + length]
                self.checksums.append(xxhash.xxh3_64_intdigest(data[pos + 8 : pos + 8 + length]))
                self._parts.append((pos, image))
                pos += n
            else:
                start = pos + pad  # this record's framing words, after the last one's padding
                image = images[k]
                digest = xxhash.xxh3_64(data[start + 8 : start + 8 + head_len])
                digest.update(image)
                self.checksums.append(digest.intdigest())
                self._parts.append((start, image))
                self.chunks += [data[pos : start + 8 + head_len], image]
                pos, pad = start + 8 + head_len, n - 8 - length
                self.nbytes += n
            if max_pixels is not None:
                # The engine vouched for the markers, not for the size they declare: a header-only
                # 60000x60000 JPEG would pass and fail only when a loader decodes it.
                frame = jpeg_frame_size(image)
                bomb = too_many_pixels(*frame, max_pixels) if frame is not None else None
                if bomb is not None:
                    self.refused[k] = bomb
        if pad:
            self.chunks.append(data[pos : pos + pad])  # the last record's padding

    @property
    def complete(self) -> bool:
        """Whether every image of the batch was framed and kept (the writer can take the batch whole)."""
        return not self.refused and all(n > 0 for n in self.framed)

    def whole_entries(self) -> list[tuple[Converted, int, Prepared | None]]:
        """:meth:`entries` of a batch framed whole (:attr:`complete`)."""
        entries: list[tuple[Converted, int, Prepared | None]] = [e for e in self.entries() if e is not None]
        if len(entries) != len(self.framed):
            raise ValueError("the batch was not framed whole")
        return entries

    def entries(self) -> list[tuple[Converted, int, Prepared | None] | None]:
        """Per image, ``(converted, bytes read, prepared record)``, or None where the Python path must act.

        A refused image's entry has no data and its reason (the writer applies the ``on_error`` policy).
        """
        out: list[tuple[Converted, int, Prepared | None] | None] = []
        for k, (n, length, head_len, size, checksum) in enumerate(
            zip(self.framed, self.lengths, self.head_lens, self.sizes, self.checksums, strict=True)
        ):
            parts = self._parts[k]
            if parts is None:
                out.append(None)
                continue
            if k in self.refused:
                out.append((Converted(None, None, self.refused[k]), size, None))
                continue
            start, image = parts
            if self._gathered:
                pad = n - 8 - length
                record = recordio.FramedRecord.of_chunks(
                    [self.data[start : start + 8 + head_len], image, *([_ZEROS[:pad]] if pad else [])]
                )
            else:
                record = recordio.FramedRecord.whole(self.data[start : start + n])
            out.append((Converted(image, "pass"), size, Prepared(record, length, head_len, checksum)))
        return out


_ZEROS = bytes(3)  # a record's padding: 0 to 3 zero bytes


def frame_batch(
    batch: Sequence[tuple[SourceItem, int]],
    label_width: int,
    frame_files: Any,
    pool: BufferPool,
    max_pixels: int | None = None,
) -> FramedBatch:
    """Frame a batch of ``(item, stat size)`` pass-through files with the engine.

    The engine opens each path without blocking (``O_NONBLOCK``) and reads it only if ``fstat``
    on the opened descriptor says it is a regular file: a FIFO or device put in place of a file
    after it was listed is refused, never waited on, and the Python path reports it.

    Args:
        batch: The files, in record order, with the sizes ``stat`` gave.
        label_width: Labels per record (1: the IRHeader's label field; more: ``flag`` float32 labels).
        frame_files: :func:`engine_framing`'s function.
        pool: Where the batch buffer comes from.
        max_pixels: Refuse framed images whose header declares more pixels (None: no check).

    Returns:
        The :class:`FramedBatch`; files it refused are for the Python path.
    """
    heads = [recordio.pack_header(item.labels[0] if label_width == 1 else item.labels, item.id) for item, _ in batch]
    sizes = [size for _, size in batch]
    head_lens = [len(h) for h in heads]
    lengths = [h + s for h, s in zip(head_lens, sizes, strict=True)]
    # Every record framed whole, plus the read-ahead byte that notices a file grown since its stat.
    buffer = pool.take(1 + sum(recordio.framed_size(n) for n in lengths))
    framed, used = frame_files([os.fsencode(item.path) for item, _ in batch], sizes, heads, buffer)
    return FramedBatch(buffer.data[:used], framed.tolist(), lengths, head_lens, sizes, buffer, max_pixels)


def frame_images(
    batch: Sequence[tuple[SourceItem, bytes | bytearray | memoryview]],
    label_width: int,
    frame_buffers: Any,
    pool: BufferPool,
    max_pixels: int,
) -> FramedBatch:
    """Frame in-memory images (tar members, parquet cells) with the engine, as :func:`frame_batch` frames files.

    Each image is checked where it lies (the marker walk, its declared size against ``max_pixels``,
    the magic word). Large images are then left where they are: the batch is gathered (the engine
    writes only what goes between them), so the writer's ``writev`` reads them straight from the
    chunk read from the tar or the Arrow column, and the pack copies no more than a folder pack
    does. Small ones are copied after their headers into a buffer from ``pool``, which costs less
    than two more pieces per record for the writer.

    Args:
        batch: The images, in record order.
        label_width: Labels per record.
        frame_buffers: :func:`engine_buffer_framing`'s function.
        pool: Where the batch buffer of copied records comes from.
        max_pixels: Images whose frame header declares more pixels are left to the Python path.

    Returns:
        The :class:`FramedBatch`; images it refused are for the Python path.
    """
    heads = [recordio.pack_header(item.labels[0] if label_width == 1 else item.labels, item.id) for item, _ in batch]
    images = [data for _, data in batch]
    sizes = [len(data) for data in images]
    head_lens = [len(h) for h in heads]
    lengths = [h + s for h, s in zip(head_lens, sizes, strict=True)]
    if sum(sizes) >= GATHER_MIN_BYTES * len(sizes):
        prefixes = np.empty(sum(head_lens) + 11 * len(heads), dtype=np.uint8)  # small: malloc's, not the pool's
        framed, used = frame_buffers(images, heads, max_pixels, True, prefixes)
        return FramedBatch(prefixes.data[:used], framed.tolist(), lengths, head_lens, sizes, None, images=images)
    buffer = pool.take(sum(recordio.framed_size(n) for n in lengths))
    framed, used = frame_buffers(images, heads, max_pixels, False, buffer)
    if not used:
        pool.give(buffer)  # nothing framed: no record views it
    return FramedBatch(buffer.data[:used], framed.tolist(), lengths, head_lens, sizes, buffer)


#: Images at least this large on average are framed where they lie (gathered), smaller ones copied.
GATHER_MIN_BYTES = 16 << 10

_LREC = struct.Struct("<II")


def frame_buffers(
    batch: Sequence[tuple[SourceItem, bytes | bytearray | memoryview]], label_width: int, pool: BufferPool
) -> FramedBatch | None:
    """Frame a batch of pass-through images already in memory (tar members, parquet cells) into one buffer.

    The records are what :func:`frame_batch` makes of files (framing word, header, image, padding,
    back to back), so the writer takes the batch in one piece, as it takes the engine's. The
    images must already be checked (:func:`fastload.pack.convert.convert_images` would pass them
    through untouched).

    Returns:
        The :class:`FramedBatch`, or None when a record must be split around RecordIO's magic
        word (the per-record path frames that batch).
    """
    heads = [recordio.pack_header(item.labels[0] if label_width == 1 else item.labels, item.id) for item, _ in batch]
    sizes = [len(data) for _, data in batch]
    head_lens = [len(h) for h in heads]
    lengths = [h + n for h, n in zip(head_lens, sizes, strict=True)]
    framed = [recordio.framed_size(n) for n in lengths]
    buffer = pool.take(sum(framed))
    pos = 0
    for (_, data), head, length, size in zip(batch, heads, lengths, framed, strict=True):
        if recordio.magic_positions(head) or recordio.magic_positions(data):
            pool.give(buffer)
            return None
        _LREC.pack_into(buffer.data, pos, recordio.MAGIC, length)
        start = pos + 8 + len(head)
        buffer[pos + 8 : start] = np.frombuffer(head, dtype=np.uint8)
        buffer[start : start + len(data)] = np.frombuffer(data, dtype=np.uint8)
        buffer[pos + 8 + length : pos + size] = 0
        pos += size
    return FramedBatch(buffer.data[:pos], framed, lengths, head_lens, sizes, buffer)
