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
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from fastload.pack.convert import Converted
from fastload.pack.sources import SourceItem
from fastload.records import recordio

__all__ = ["Prepared", "FramedBatch", "engine_framing", "frame_batch"]


class Prepared(NamedTuple):
    """A record ready to write: built on a worker thread so the writing thread only writes."""

    record: Any  # recordio.FramedRecord or the LMDB value bytes
    length: int  # payload / value length
    data_offset: int  # where the image starts inside it


def engine_framing() -> Optional[Any]:
    """The engine's ``frame_files`` when the C++ extension is built, else None.

    ``FASTLOAD_PACK_FRAMING=python`` turns it off (the pure-Python path packs the same bytes).
    """
    if os.environ.get("FASTLOAD_PACK_FRAMING", "").lower() == "python":
        return None
    try:
        from fastload import _engine  # type: ignore[attr-defined]
    except ImportError:
        return None
    return getattr(_engine, "frame_files", None)


class FramedBatch:
    """A batch of files framed by the engine: the records back to back in one buffer.

    Attributes:
        data: The framed records that were written to the buffer, back to back.
        framed: Per file, its framed record's size (> 0) or the engine's refusal (< 0).
        lengths: Per file, the payload length (head + image bytes).
        head_lens: Per file, where the image starts inside the payload.
        sizes: Per file, the bytes read (the stat size).
    """

    __slots__ = ("data", "framed", "lengths", "head_lens", "sizes")

    def __init__(self, data: memoryview, framed: List[int], lengths: List[int], head_lens: List[int],
                 sizes: List[int]) -> None:
        self.data, self.framed, self.lengths, self.head_lens, self.sizes = data, framed, lengths, head_lens, sizes

    @property
    def complete(self) -> bool:
        """Whether every file of the batch was framed (the writer can take the batch whole)."""
        return all(n > 0 for n in self.framed)

    def entries(self) -> List[Optional[Tuple[Converted, int, Prepared]]]:
        """Per file, ``(converted, bytes read, prepared record)``, or None where the Python path must act."""
        out: List[Optional[Tuple[Converted, int, Prepared]]] = []
        pos = 0
        for n, length, head_len, size in zip(self.framed, self.lengths, self.head_lens, self.sizes):
            if n < 0:
                out.append(None)
                continue
            record = self.data[pos:pos + n]
            pos += n
            start = 8 + head_len
            out.append((Converted(record[start:start + size], "pass"), size,
                        Prepared(recordio.FramedRecord.whole(record), length, head_len)))
        return out


def frame_batch(batch: Sequence[Tuple[SourceItem, int]], label_width: int, frame_files: Any) -> FramedBatch:
    """Frame a batch of ``(item, stat size)`` pass-through files with the engine.

    Args:
        batch: The files, in record order, with the sizes ``stat`` gave.
        label_width: Labels per record (1: the IRHeader's label field; more: ``flag`` float32 labels).
        frame_files: :func:`engine_framing`'s function.

    Returns:
        The :class:`FramedBatch`; files it refused are for the Python path.
    """
    heads = [recordio.pack_header(item.labels[0] if label_width == 1 else item.labels, item.id)
             for item, _ in batch]
    sizes = [size for _, size in batch]
    buffer, framed, used = frame_files([os.fsencode(item.path) for item, _ in batch], sizes, heads)
    head_lens = [len(h) for h in heads]
    return FramedBatch(memoryview(buffer)[:used], framed.tolist(), [h + s for h, s in zip(head_lens, sizes)],
                       head_lens, sizes)
