"""Exceptions shared by every stage; each names the file, shard and record it is about."""

from __future__ import annotations

from typing import Optional

__all__ = ["FastloadError", "UserError", "CorruptRecordError", "DecodeError", "LoaderClosed", "LoaderBusy",
           "KeptBatchesWarning"]


class FastloadError(Exception):
    """Base class of fastload's own errors."""


class UserError(FastloadError):
    """A mistake in how fastload was called (bad path, bad option, refused overwrite).

    The CLI prints it as one line and exits non-zero, without a traceback.
    """


class CorruptRecordError(FastloadError):
    """A record whose framing or bytes are damaged.

    Args:
        message: What is wrong.
        shard: Path of the shard file holding the record.
        record: Index of the record inside the shard (or the global index when ``shard`` is None).
        offset: Byte offset in the shard, when known.
    """

    def __init__(self, message: str, *, shard: Optional[str] = None, record: Optional[int] = None,
                 offset: Optional[int] = None) -> None:
        where = []
        if shard is not None:
            where.append(f"shard {shard}")
        if record is not None:
            where.append(f"record {record}")
        if offset is not None:
            where.append(f"byte offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.shard, self.record, self.offset = shard, record, offset


class DecodeError(FastloadError):
    """An image that could not be decoded; carries the dataset location of the sample.

    Args:
        message: The decoder's reason.
        index: Global sample index.
        source: Human-readable location (file path, or shard and record).
    """

    def __init__(self, message: str, *, index: Optional[int] = None, source: Optional[str] = None) -> None:
        where = ", ".join(x for x in (f"sample {index}" if index is not None else None, source) if x)
        super().__init__(f"{message} ({where})" if where else message)
        self.index, self.source = index, source


class LoaderClosed(FastloadError, ValueError):
    """The loader was closed: raised by ``next()`` in a consumer waiting for a batch when ``close()`` is
    called from another thread, and by ``next()`` / ``iter()`` after ``close()``.

    Also a ``ValueError``, as Python's own operations on a closed file are.
    """


class LoaderBusy(FastloadError, RuntimeError):
    """Another thread is iterating this loader.

    A pass over a loader belongs to the thread that started it (``iter(loader)``) until it is
    exhausted, closed (``iterator.close()``), or dropped; meanwhile ``next()`` on it from another
    thread, and ``iter()``, ``set_epoch()`` or ``load_state_dict()`` from another thread, raise this.
    """


class KeptBatchesWarning(UserWarning):
    """The consumer keeps more batches than the ring may grow for: further batches get fresh memory.

    Issued once per loader. Batches stay intact either way; the cost is one allocation per batch
    (and the memory the kept batches hold).
    """
