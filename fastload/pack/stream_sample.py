"""Write stage, streamed input: one sample read from a tar or parquet file, and what every streamed source offers.

Streamed sources (:mod:`fastload.pack.wds_source`, :mod:`fastload.pack.arrow_source`) hand out
:class:`Sample` objects in input order; the stream pack (:mod:`fastload.pack.stream_pack`) converts
and writes them like files of a folder. A sample carries its image bytes (a zero-copy slice of
what was read, when possible), its labels, or the reason it is a bad entry, and where a resumed
pack can start reading again after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastload.pack.sample_labels import Labels

__all__ = ["Sample", "StreamSource"]


@dataclass(slots=True)
class Sample:
    """One entry of a streamed input.

    Attributes:
        name: Where it is, for messages and the manifest (``shard.tar:key.jpg``,
            ``file.parquet: row 17``).
        data: The image bytes (None for a bad entry).
        labels: Its labels (None for a bad entry, or one whose label is bad).
        reason: Why it is a bad entry, else None.
        after: Where reading may start again to go on with the next sample (a source-specific
            JSON-able dict), when the source can resume there; None otherwise.
        names: Class names numbered once the sample's label was read (the stream pack's note, for
            the label state at a resume point).
    """

    name: str
    data: Any = None
    labels: tuple[float, ...] | None = None
    reason: str | None = None
    after: dict[str, Any] | None = field(default=None)
    names: int = 0


class StreamSource(Protocol):
    """What :func:`fastload.pack.stream_pack.pack_stream` needs from a streamed input.

    Attributes:
        kind: The input format's name (``wds``, ``parquet``, ``hf-disk``).
        path: SRC as given (absolute for a local path).
        name: The default shard name (file-safe).
        total: Samples in the input when known up front (parquet), else None (tars).
        labels: The label state, updated as samples are read in order.
    """

    kind: str
    path: str
    name: str
    total: int | None
    labels: Labels

    def identity(self) -> list[str]:
        """One line per input file (path or URL, size, mtime or etag): what a resumable pack depends on."""
        ...

    def describe(self) -> dict[str, Any]:
        """The manifest's ``source`` entry (beyond ``kind`` / ``path``): files, keys, columns, split."""
        ...

    def samples(self, position: int, cursor: dict[str, Any] | None) -> Iterator[Sample]:
        """Samples from ``position`` on (``cursor``: the ``after`` of the sample before it, if any)."""
        ...
