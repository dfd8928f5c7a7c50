"""Read stage, the contract: :class:`Dataset`, the API every reader of records implements.

A reader hands out the encoded image bytes of a record by global index, in memory the caller owns
(read with ``pread``, never a view of a memory map a shrinking file could turn into SIGBUS), and
refuses bad records with :class:`~fastload.errors.CorruptRecordError` (see docs/ARCHITECTURE.md,
"Records"). :mod:`fastload.records.sharded` reads RecordIO and LMDB
shards, :mod:`fastload.records.imagefolder` an unpacked folder tree; :func:`fastload.records.open_dataset`
picks the reader for a path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from fastload.records.lmdb_shard import LmdbShard
    from fastload.records.recordio import RecordIOShard

__all__ = ["Dataset"]


def _reopen(opener: Callable[..., Dataset], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Dataset:
    """Unpickling a dataset: open it again (what a spawned DataLoader worker receives)."""
    return opener(*args, **kwargs)


class Dataset:
    """Records addressed by global index ``0 <= i < len(ds)``; the API every reader implements.

    Attributes:
        labels: float32 ``[N, label_width]``.
        ids: uint64 ``[N]``.
        label_width: Labels per record.
        manifest: The parsed ``fastload.json`` (None for bare inputs).
        restart_indexed: Whether images carry restart markers for sliced decoding.
        kind: ``"fastload-recordio"``, ``"fastload-lmdb"``, ``"recordio"``, ``"lmdb"`` or ``"imagefolder"``.
        path: What was opened.
    """

    labels: NDArray[np.float32]
    ids: NDArray[np.uint64]
    label_width: int
    manifest: dict[str, Any] | None = None
    restart_indexed: bool = False
    kind: str = ""
    path: str = ""
    shards: Sequence[RecordIOShard | LmdbShard] = ()
    # How it was opened: (function, args, kwargs), set by the openers; pickling reopens it.
    _opened_by: tuple[Callable[..., Dataset], tuple[Any, ...], dict[str, Any]] | None = None

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def image(self, i: int) -> memoryview:
        """The encoded image bytes of record ``i`` (header and labels stripped).

        Raises:
            CorruptRecordError: A bad record (unreadable, damaged, or with labels outside what the
                dataset declares).
        """
        raise NotImplementedError

    def payload(self, i: int) -> memoryview | bytes:
        """Record ``i`` as a RecordIO image payload (IRHeader + labels + image)."""
        raise NotImplementedError

    def locate(self, i: int) -> str:
        """Where record ``i`` lives, for messages."""
        raise NotImplementedError

    def will_need(self, indices: Iterable[int]) -> None:
        """Hint the OS to read those records ahead."""

    def done_with(self, indices: Iterable[int]) -> None:
        """Hint that those records were consumed (their mapped pages may leave this process's RSS)."""

    def close(self) -> None:
        """Release files and mappings. Idempotent."""

    def images(self, indices: Iterable[int]) -> list[memoryview]:
        """``[self.image(i) for i in indices]``."""
        return [self.image(int(i)) for i in indices]

    def _check_index(self, i: int) -> int:
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record {i} out of range for a dataset of {n} records")
        return i

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """A dataset pickles as the way to open it again (files, mappings and threads stay here).

        A spawned or forkserver DataLoader worker (``multiprocessing_context="spawn"``) unpickles
        its own dataset: it opens the same path, or the same URL with the same options and cache
        folder. Raises TypeError for a dataset built otherwise than by ``open_dataset`` /
        ``open_remote_dataset``.
        """
        if self._opened_by is None:
            raise TypeError(
                f"{self!r} cannot be pickled: only datasets from fastload.open_dataset can (they reopen "
                "in the process that unpickles them)"
            )
        return _reopen, self._opened_by

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.path!r}: {len(self)} records>"
