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

__all__ = ["Prepared", "engine_framing", "frame_batch"]


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


def frame_batch(batch: Sequence[Tuple[SourceItem, int]], label_width: int,
                frame_files: Any) -> List[Optional[Tuple[Converted, int, Prepared]]]:
    """Frame a batch of ``(item, stat size)`` pass-through files with the engine.

    Args:
        batch: The files, in record order, with the sizes ``stat`` gave.
        label_width: Labels per record (1: the IRHeader's label field; more: ``flag`` float32 labels).
        frame_files: :func:`engine_framing`'s function.

    Returns:
        Per file, ``(converted, bytes read, prepared record)`` or None when the Python path must
        handle it.
    """
    heads = [recordio.pack_header(item.labels[0] if label_width == 1 else item.labels, item.id)
             for item, _ in batch]
    buffer, framed, _ = frame_files([os.fsencode(item.path) for item, _ in batch],
                                    [size for _, size in batch], heads)
    view = memoryview(buffer)
    out: List[Optional[Tuple[Converted, int, Prepared]]] = []
    pos = 0
    for (_, size), head, n in zip(batch, heads, framed.tolist()):
        if n < 0:
            out.append(None)
            continue
        record = view[pos:pos + n]
        pos += n
        start = 8 + len(head)
        out.append((Converted(record[start:start + size], "pass"), size,
                    Prepared(recordio.FramedRecord.whole(record), len(head) + size, len(head))))
    return out
