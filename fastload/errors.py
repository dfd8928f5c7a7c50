"""Exceptions shared by every stage, and the :class:`OnError` policy every stage applies to bad inputs.

Each exception names the file, shard and record it is about.
"""

from __future__ import annotations

import enum

__all__ = [
    "CorruptDatasetError",
    "CorruptRecordError",
    "DecodeError",
    "FastloadError",
    "KeptBatchesWarning",
    "LoaderBusy",
    "LoaderClosed",
    "OnError",
    "ResumeStateError",
    "UserError",
]


class OnError(str, enum.Enum):
    """What a stage does with an input it cannot read or decode.

    The input is a file in ``fastload pack``, a record in the loader.

    ``"fail"`` (the spelling of ``fastload pack --on-error fail``) is accepted for :attr:`RAISE`.
    """

    SKIP = "skip"
    RAISE = "raise"

    @classmethod
    def _missing_(cls, value: object) -> OnError | None:
        if isinstance(value, str) and value.lower() == "fail":
            return cls.RAISE
        return None


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

    def __init__(
        self, message: str, *, shard: str | None = None, record: int | None = None, offset: int | None = None
    ) -> None:
        where = []
        if shard is not None:
            where.append(f"shard {shard}")
        if record is not None:
            where.append(f"record {record}")
        if offset is not None:
            where.append(f"byte offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.message, self.shard, self.record, self.offset = message, shard, record, offset


class CorruptDatasetError(FastloadError, ValueError):
    """A dataset's metadata is damaged or unsafe: manifest, record index, ``.idx`` file or sidecar.

    Raised instead of whatever the parser underneath would throw (``json``, ``numpy``, ``int``), with
    one message that names the file and the field; never quotes the file's bytes. Also a
    ``ValueError``, so code that guards reads with ``except ValueError`` keeps working.

    Args:
        message: What is wrong.
        file: The damaged file (or the dataset folder, for a path that escapes it).
        field: The field, line or entry at fault, when there is one.
    """

    def __init__(self, message: str, *, file: str, field: str | None = None) -> None:
        where = f"{file}: {field}" if field else file
        super().__init__(f"{where}: {message}")
        self.file, self.field = file, field


class DecodeError(FastloadError):
    """An image that could not be decoded; carries the dataset location of the sample.

    Args:
        message: The decoder's reason.
        index: Global sample index.
        source: Human-readable location (file path, or shard and record).
    """

    def __init__(self, message: str, *, index: int | None = None, source: str | None = None) -> None:
        where = ", ".join(x for x in (f"sample {index}" if index is not None else None, source) if x)
        super().__init__(f"{message} ({where})" if where else message)
        self.index, self.source = index, source


class LoaderClosed(FastloadError, ValueError):
    """The loader was closed.

    Raised by ``next()`` in a consumer waiting for a batch when ``close()`` is called from another
    thread, and by ``next()`` / ``iter()`` after ``close()``.

    Also a ``ValueError``, as Python's own operations on a closed file are.
    """


class LoaderBusy(FastloadError, RuntimeError):
    """Another thread is iterating this loader.

    A pass over a loader belongs to the thread that started it (``iter(loader)``) until it is
    exhausted, closed (``iterator.close()``), or dropped; meanwhile ``next()`` on it from another
    thread, and ``iter()``, ``set_epoch()`` or ``load_state_dict()`` from another thread, raise this.
    """


class ResumeStateError(FastloadError, ValueError):
    """A saved loader state that this loader cannot resume from.

    It comes from another dataset, seed or order mode, from a newer fastload, or it is damaged (a
    missing or mistyped field, numbers that do not fit the order, contents that do not match the
    state's own checksum). The message names every field that differs or is wrong. Also a
    ``ValueError``, as the framework loaders raise for a state they cannot load.
    """


class KeptBatchesWarning(UserWarning):
    """The consumer keeps more batches than the ring may grow for: further batches get fresh memory.

    Issued once per loader. Batches stay intact either way; the cost is one allocation per batch
    (and the memory the kept batches hold).
    """
