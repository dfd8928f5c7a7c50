"""Read stage: how records are read ahead of the decode (:class:`ReadOptions`), and what was read.

The options a user sets (``LoaderConfig.read_options``, ``fastload.torch.DataLoader(read_options=)``)
and the counters :class:`~fastload.records.readahead.ReadAhead` reports; the read-ahead itself is
:mod:`fastload.records.readahead`, which re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ReadCounters", "ReadOptions"]

_MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How records are read ahead of the decode.

    Args:
        queue_depth: Reads in flight at once (threads). Enough to keep a device's queue full:
            SSDs and cloud volumes serve many requests in parallel.
        budget: Bytes read ahead and not yet handed to the decode, at most (the memory the
            read-ahead holds; two groups of half of it). For block and shard order, at least twice
            a shuffle window's bytes lets every window be read as a few long runs. None: automatic
            (:attr:`ReadAhead.budget`): four batches' bytes, or one per two decode threads where
            that is more (at least 8 MiB), doubled each time
            the decode waits for reads issued two batches ahead or more, up to twice the largest
            shuffle window's bytes (at least 64 MiB, at most 512 MiB; 256 MiB for orders without
            windows: global, none). From the page cache it stays at four batches.
        gap: Neighbouring records at most this many bytes apart are read together, the bytes
            between them read and dropped. The break-even on a disk is its bandwidth over its
            IOPS (an HDD's 160 MB/s at 150 IOPS: about 1 MB; an SSD: tens of KB).
        max_read: A run of neighbouring records is cut into reads of about this many bytes (at
            record boundaries), so that long runs are read in parallel too.
        direct: Read runs of 1 MiB and more with ``O_DIRECT`` (:mod:`fastload.records.direct_reads`):
            for a dataset larger than the RAM on a local disk. Long reads reach the device as its
            largest requests whatever the page cache holds, and evict no other file's pages; but
            nothing is cached, so a dataset that fits in the RAM is read from the disk every epoch.
            A file system that refuses ``O_DIRECT`` (tmpfs) warns once and is read buffered.
    """

    queue_depth: int = 16
    budget: int | None = None
    gap: int = 64 << 10
    max_read: int = 16 * _MIB
    direct: bool = False

    def __post_init__(self) -> None:
        for name, minimum in (("queue_depth", 1), ("budget", 1), ("gap", 0), ("max_read", 1)):
            value = getattr(self, name)
            if name == "budget" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
                raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
        if not isinstance(self.direct, bool):
            raise ValueError(f"direct={self.direct!r} must be a bool")


@dataclass(frozen=True)
class ReadCounters:
    """What the read-ahead did (cumulative).

    Attributes:
        bytes: Bytes read from the files (gaps included).
        reads: ``pread`` calls.
        records: Records handed out from those reads.
        direct: Records read one by one on the caller's thread (outside the plan, or redone after
            a failed read).
        wait_seconds: Time :meth:`ReadAhead.wait` blocked for reads not yet done.
        budget: The byte budget in force now (:attr:`ReadAhead.budget`).
        grown: Times the automatic budget grew (reads fell behind the decode).
    """

    bytes: int = 0
    reads: int = 0
    records: int = 0
    direct: int = 0
    wait_seconds: float = 0.0
    budget: int = 0
    grown: int = 0
