"""Write stage, pass-through fast path: a batch of files becomes framed RecordIO records in one engine call.

Packing valid colour JPEGs untouched is mostly per-file overhead when done in Python: a read into a
new ``bytes``, the marker walk, the magic-word scan, the framing chunks, ~100 us per file in all.
``fastload._engine.frame_files`` does all of it for a batch with the GIL released once, reading
each file straight into its place in one buffer: its records are written from views of that
buffer, never copied again. The verdicts are the Python path's (the same marker walk, the same
magic-word rule); whatever the engine does not vouch for (non-JPEGs, grayscale or CMYK, damaged
files, files that changed size since their ``stat``, unreadable files, payloads that dmlc-core
would split) is returned as ``None`` and takes the Python path, which converts or reports it.
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

__all__ = ["BufferPool", "FramedBatch", "Prepared", "engine_framing", "frame_batch", "frame_buffers"]


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


class FramedBatch:
    """A batch of files framed by the engine: the records back to back in one buffer.

    Attributes:
        data: The framed records that were written to the buffer, back to back.
        framed: Per file, its framed record's size (> 0) or the engine's refusal (< 0).
        lengths: Per file, the payload length (head + image bytes).
        head_lens: Per file, where the image starts inside the payload.
        sizes: Per file, the bytes read (the stat size).
        checksums: Per file framed, the XXH3-64 of its payload (the others: 0).
        refused: Files framed but refused after (a header above ``max_pixels``): position -> reason.
    """

    __slots__ = ("buffer", "checksums", "data", "framed", "head_lens", "lengths", "refused", "sizes")

    def __init__(
        self,
        data: memoryview,
        framed: list[int],
        lengths: list[int],
        head_lens: list[int],
        sizes: list[int],
        buffer: np.ndarray,
        max_pixels: int | None = None,
    ) -> None:
        self.data, self.framed, self.lengths, self.head_lens, self.sizes = data, framed, lengths, head_lens, sizes
        self.buffer = buffer  # what ``data`` views: back to the pool once the records are written
        self.refused: dict[int, str] = {}
        # Hashed here, on the worker thread that framed the batch (XXH3 releases no GIL, but at
        # ~25 GB/s it is microseconds per image).
        self.checksums = []
        pos = 0
        for k, (n, length, head_len) in enumerate(zip(framed, lengths, head_lens, strict=True)):
            if n < 0:
                self.checksums.append(0)
                continue
            self.checksums.append(xxhash.xxh3_64_intdigest(data[pos + 8 : pos + 8 + length]))
            if max_pixels is not None:
                # The engine vouched for the markers, not for the size they declare: a header-only
                # 60000x60000 JPEG would pass and fail only when a loader decodes it.
                size = jpeg_frame_size(data[pos + 8 + head_len : pos + 8 + length])
                bomb = too_many_pixels(*size, max_pixels) if size is not None else None
                if bomb is not None:
                    self.refused[k] = bomb
            pos += n

    @property
    def complete(self) -> bool:
        """Whether every file of the batch was framed and kept (the writer can take the batch whole)."""
        return not self.refused and all(n > 0 for n in self.framed)

    def whole_entries(self) -> list[tuple[Converted, int, Prepared | None]]:
        """:meth:`entries` of a batch framed whole (:attr:`complete`)."""
        entries: list[tuple[Converted, int, Prepared | None]] = [e for e in self.entries() if e is not None]
        if len(entries) != len(self.framed):
            raise ValueError("the batch was not framed whole")
        return entries

    def entries(self) -> list[tuple[Converted, int, Prepared | None] | None]:
        """Per file, ``(converted, bytes read, prepared record)``, or None where the Python path must act.

        A refused file's entry has no data and its reason (the writer applies the ``on_error`` policy).
        """
        out: list[tuple[Converted, int, Prepared | None] | None] = []
        pos = 0
        for k, (n, length, head_len, size, checksum) in enumerate(
            zip(self.framed, self.lengths, self.head_lens, self.sizes, self.checksums, strict=True)
        ):
            if n < 0:
                out.append(None)
                continue
            record = self.data[pos : pos + n]
            pos += n
            if k in self.refused:
                out.append((Converted(None, None, self.refused[k]), size, None))
                continue
            start = 8 + head_len
            out.append(
                (
                    Converted(record[start : start + size], "pass"),
                    size,
                    Prepared(recordio.FramedRecord.whole(record), length, head_len, checksum),
                )
            )
        return out


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
