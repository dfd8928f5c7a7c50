"""Read stage, packed records: RecordIO and LMDB shards addressed through a binary index.

:class:`ShardedDataset` serves a fastload folder (``fastload.json`` + ``fastload-index.npy`` +
shards: opening reads the manifest and the index only), a bare ``.rec`` with its ``.idx`` beside it,
as MXNet's tools write it (record headers read with ``pread``, vectorized; without an ``.idx`` the
file is scanned), and one fastload LMDB shard directory.

What a read checks, so that damage is a bad record (the loader's ``on_error`` policy: skipped and
counted, or raised naming the shard and record) rather than wrong data or a dead process:

- framing and lengths against the index (every format), with reads that cannot crash the process
  when a shard shrinks under them (``pread``, see :class:`~fastload.records.recordio.RecordIOShard`);
- the record's XXH3-64 checksum, when the index has the per-record ``checksum`` column (datasets
  packed by fastload with format version 3 or later; older indexes are read without it). Cost: the
  hash runs at ~25 GB/s, about 4 us per 100 KB image, against milliseconds to decode it;
- its labels against what the dataset declares: finite numbers, and for a classification dataset
  (a manifest with ``classes``) integers in ``[0, number of classes)``; for a bare ``.rec`` every
  record must carry the same number of labels as most records do (the dataset's label width).
  Such records are refused by :meth:`ShardedDataset.image`, like unreadable ones.

Metadata (manifest, index, ``.idx``) is checked when the dataset is opened; damage there is one
:class:`~fastload.errors.CorruptDatasetError` naming the file and the field. An ``.idx`` must describe
its ``.rec`` exactly (offsets increasing from 0, each where the record before it ends, the last
record ending at the end of the file): one that does not (a short ``.idx``, repeated or shuffled
offsets, a ``.rec`` grown or replaced since) is refused with that error rather than used for part
of the file; remove or regenerate it, and the ``.rec`` is scanned.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import xxhash
from numpy.typing import NDArray

from fastload.errors import CorruptDatasetError, CorruptRecordError, UserError
from fastload.records import recordio
from fastload.records.base import Dataset
from fastload.records.containment import contained_path
from fastload.records.lmdb_shard import LmdbShard, LmdbValueHeader
from fastload.records.manifest import (
    INDEX_NAME,
    MANIFEST_NAME,
    MAX_LABEL_WIDTH,
    RECORD_CHECKSUM,
    empty_index,
    load_index,
    read_manifest,
)

__all__ = [
    "Shard",
    "ShardedDataset",
    "label_problems",
    "open_bare_rec",
    "open_fastload_folder",
    "open_lmdb_shard",
    "record_checksum",
]

Shard = recordio.RecordIOShard | LmdbShard

_HEAD = 8 + recordio.IR_HEADER_SIZE  # framing words + IRHeader: what indexing a bare .rec reads per record


def record_checksum(payload: Any) -> int:
    """The per-record checksum the index stores: XXH3-64 of the payload (RecordIO) or value (LMDB)."""
    return int(xxhash.xxh3_64_intdigest(payload))


def label_problems(labels: NDArray[np.float32], num_classes: int | None) -> NDArray[np.bool_]:
    """Which rows of ``labels`` are outside what the dataset declares (see the module docstring).

    Args:
        labels: float32 ``[N, label_width]``.
        num_classes: The number of classes of a classification dataset (labels must then be
            integers in ``[0, num_classes)``), or None (labels must be finite).

    Returns:
        bool ``[N]``.
    """
    bad: NDArray[np.bool_] = ~np.isfinite(labels).all(axis=1)
    if num_classes is not None:
        with np.errstate(invalid="ignore"):
            bad |= ((labels < 0) | (labels >= num_classes) | (labels != np.floor(labels))).any(axis=1)
    return bad


class ShardedDataset(Dataset):
    """Records in RecordIO or LMDB shards, addressed through a binary index.

    Args:
        path: What was opened (for messages).
        kind: See :class:`Dataset`.
        shards: The opened shards, in index order.
        index: Structured array (:func:`fastload.records.manifest.index_dtype`), already checked
            against the shards.
        manifest: The manifest, when there is one.
        num_classes: Classes of a classification dataset (labels are checked against it).
        broken: Records known to be unreadable when the index was built (bare shards), with the reason.
        label_notes: Records whose labels were found wrong when the index was built (a bare shard's
            record with another number of labels than the rest), with the reason.
    """

    def __init__(
        self,
        *,
        path: str,
        kind: str,
        shards: Sequence[Shard],
        index: NDArray[np.void],
        manifest: dict[str, Any] | None = None,
        num_classes: int | None = None,
        broken: dict[int, str] | None = None,
        label_notes: dict[int, str] | None = None,
    ) -> None:
        self.path = path
        self.kind = kind
        self.shards = list(shards)
        self.manifest = manifest
        self.restart_indexed = bool(manifest and manifest.get("restart_index"))
        self.label_width = int(index.dtype["labels"].shape[0]) if index.dtype["labels"].shape else 1
        self.labels = np.ascontiguousarray(index["labels"], dtype=np.float32).reshape(len(index), self.label_width)
        self.ids = np.ascontiguousarray(index["id"], dtype=np.uint64)
        self.num_classes = num_classes
        self._offset = np.ascontiguousarray(index["offset"])
        self._length = np.ascontiguousarray(index["length"])
        self._data_offset = np.ascontiguousarray(index["data_offset"])
        self._parts = np.ascontiguousarray(index["parts"])
        self._shard = np.ascontiguousarray(index["shard"])
        names = index.dtype.names or ()
        self._checksum = np.ascontiguousarray(index["checksum"]) if "checksum" in names else None
        if len(index) and int(self._shard.max()) >= len(self.shards):
            raise CorruptDatasetError(
                f"refers to shard {int(self._shard.max())} but only {len(self.shards)} shards exist",
                file=path,
                field="shard",
            )
        # First global index of every shard: record numbers inside a shard for error messages.
        self._shard_start = np.searchsorted(self._shard, np.arange(len(self.shards)), side="left")
        self._lmdb = bool(self.shards) and isinstance(self.shards[0], LmdbShard)
        self._bad_label = label_problems(self.labels, num_classes)
        self._broken = dict(broken or {})
        self._label_notes = dict(label_notes or {})
        for extra in (self._broken, self._label_notes):
            if extra:
                self._bad_label[list(extra)] = True
        self._extent_start: NDArray[np.int64] | None = None
        self._extent_end: NDArray[np.int64] | None = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def checksummed(self) -> bool:
        """Whether every record read is checked against its checksum from the index."""
        return self._checksum is not None

    def _where(self, i: int) -> tuple[int, int, Shard, int]:
        if self._closed:
            raise ValueError(f"dataset {self.path} is closed")
        i = self._check_index(i)
        s = int(self._shard[i])
        return i, s, self.shards[s], i - int(self._shard_start[s])

    def _raw(self, i: int) -> tuple[int, memoryview | bytes]:
        i, _s, shard, record = self._where(i)
        if i in self._broken:
            raise CorruptRecordError(self._broken[i], shard=shard.path, record=record)
        if isinstance(shard, LmdbShard):
            value: memoryview | bytes = shard.value(int(self._offset[i]))
        else:
            value = shard.payload(int(self._offset[i]), int(self._length[i]), int(self._parts[i]), record)
        return i, self._checked(i, shard, record, value)

    def _checked(self, i: int, shard: Shard, record: int, value: memoryview | bytes) -> memoryview | bytes:
        """A record's raw value against the index: its length (LMDB; RecordIO's framing checks it) and checksum."""
        if isinstance(shard, LmdbShard) and len(value) != int(self._length[i]):
            raise CorruptRecordError(
                f"value of {len(value)} bytes, the index says {int(self._length[i])}", shard=shard.path, record=record
            )
        if self._checksum is not None and record_checksum(value) != int(self._checksum[i]):
            raise CorruptRecordError(
                "checksum mismatch: the record's bytes changed since it was packed", shard=shard.path, record=record
            )
        return value

    # --- reads planned by the caller (fastload.records.readahead) --------------------------------

    def extents(
        self, indices: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]] | None:
        """Where records ``indices`` lie: ``(shard, start, end)`` int64 arrays, byte ranges in the shard files.

        A record's extent is every byte :meth:`image_from` needs (framing and header included), so
        neighbouring records can be read together and handed over one by one. An empty extent
        (``start == end``) means "read it with :meth:`image`" (an LMDB shard whose tree is damaged:
        that read names the damage). None for shards that are not local files (remote shards fetch
        whole shards themselves).
        """
        if self._closed:
            raise ValueError(f"dataset {self.path} is closed")
        if self._extent_start is None or self._extent_end is None:
            if not all(isinstance(sh, (recordio.RecordIOShard, LmdbShard)) for sh in self.shards):
                return None
            if self._lmdb:
                start = np.zeros(len(self), dtype=np.int64)
                end = np.zeros(len(self), dtype=np.int64)
                for s, shard in enumerate(self.shards):
                    assert isinstance(shard, LmdbShard)
                    lo, hi = (
                        int(self._shard_start[s]),
                        int(self._shard_start[s + 1]) if s + 1 < len(self.shards) else len(self),
                    )
                    if hi <= lo:
                        continue
                    try:
                        st, en = shard.extents()
                    except CorruptRecordError:
                        continue  # a damaged tree: empty extents, each record's own read reports it
                    rec = self._offset[lo:hi].astype(np.int64)
                    ok = rec < len(st)  # a record the tree lacks: an empty extent too
                    start[lo:hi][ok], end[lo:hi][ok] = st[rec[ok]], en[rec[ok]]
            else:
                start = self._offset.astype(np.int64)
                length = self._length.astype(np.int64)
                parts = self._parts.astype(np.int64)
                end = start + 8 * np.maximum(parts, 1) + length - 4 * np.maximum(parts - 1, 0)
            self._extent_start, self._extent_end = start, end
        idx = np.asarray(indices, dtype=np.int64)
        return self._shard[idx].astype(np.int64), self._extent_start[idx], self._extent_end[idx]

    def read_extent(self, shard: int, start: int, end: int) -> bytes:
        """The bytes ``[start, end)`` of shard number ``shard`` (one ``pread``; thread-safe).

        Raises:
            CorruptRecordError: The shard ends first (truncated?) or the read fails.
            ValueError: The dataset is closed.
        """
        if self._closed:
            raise ValueError(f"dataset {self.path} is closed")
        sh = self.shards[shard]
        assert isinstance(sh, (recordio.RecordIOShard, LmdbShard))
        return sh.read(start, end - start)

    def read_extent_into(self, shard: int, start: int, buf: memoryview) -> None:
        """:meth:`read_extent` of ``len(buf)`` bytes from ``start`` into ``buf`` (writable; thread-safe).

        Raises:
            CorruptRecordError: The shard ends first (truncated?) or the read fails.
            ValueError: The dataset is closed.
        """
        if self._closed:
            raise ValueError(f"dataset {self.path} is closed")
        sh = self.shards[shard]
        assert isinstance(sh, (recordio.RecordIOShard, LmdbShard))
        sh.read_into(start, buf)

    def open_direct(self, shard: int, flags: int) -> tuple[int, str]:
        """A new descriptor of the file :meth:`read_extent` reads for ``shard``, and that file's path.

        Opened with ``flags`` added (``O_DIRECT``: :mod:`fastload.records.direct_reads`); the caller closes it.

        Raises:
            OSError: The open fails (``EINVAL``: the file system refuses the flags).
            ValueError: The dataset is closed.
        """
        if self._closed:
            raise ValueError(f"dataset {self.path} is closed")
        sh = self.shards[shard]
        assert isinstance(sh, (recordio.RecordIOShard, LmdbShard))
        path = sh.file_path if isinstance(sh, LmdbShard) else sh.path
        try:
            return sh.reopen(flags), path
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None  # named by the shard, not /proc/self/fd

    def image_from(self, i: int, data: bytes | bytearray | memoryview) -> memoryview:
        """Record ``i``'s image from the bytes of its extent as read: every check :meth:`image` makes.

        Args:
            i: The record.
            data: The bytes of its extent (see :meth:`extents`), e.g. a view into a longer read.

        Raises:
            CorruptRecordError: As :meth:`image`.
        """
        i, _s, shard, record = self._where(i)
        if self._bad_label[i] and i not in self._broken:
            raise CorruptRecordError(f"bad record: {self.label_problem(i)}", shard=shard.path, record=record)
        if i in self._broken:
            raise CorruptRecordError(self._broken[i], shard=shard.path, record=record)
        if isinstance(shard, LmdbShard):
            value: memoryview | bytes = shard.value_from(data, int(self._offset[i]))
        else:
            value = shard.parse(data, int(self._offset[i]), int(self._length[i]), int(self._parts[i]), record)
        value = self._checked(i, shard, record, value)
        return memoryview(value)[int(self._data_offset[i]) :]

    def label_problem(self, i: int) -> str | None:
        """Why record ``i``'s labels are outside what the dataset declares, or None."""
        i = self._check_index(i)
        if not self._bad_label[i] or i in self._broken:
            return None
        if i in self._label_notes:
            return self._label_notes[i]
        labels = self.labels[i]
        if not np.isfinite(labels).all():
            return f"label {labels.tolist()} is not finite"
        return f"label {labels.tolist()} is not a class number in [0, {self.num_classes})"

    def image(self, i: int) -> memoryview:
        """The encoded image bytes of record ``i`` (memory owned by the caller from then on).

        Raises:
            CorruptRecordError: Bad framing, a truncated shard, a length that disagrees with the index,
                a checksum mismatch, or labels outside what the dataset declares.
        """
        i = self._check_index(i)
        if self._bad_label[i] and i not in self._broken:
            _i, _s, shard, record = self._where(i)
            raise CorruptRecordError(f"bad record: {self.label_problem(i)}", shard=shard.path, record=record)
        i, raw = self._raw(i)
        return memoryview(raw)[int(self._data_offset[i]) :]

    def payload(self, i: int) -> memoryview | bytes:
        """Record ``i`` as a RecordIO payload (for LMDB shards it is rebuilt, a copy)."""
        i, raw = self._raw(i)
        if not self._lmdb:
            return raw
        labels = self.labels[i]
        header = recordio.pack_header(float(labels[0]) if self.label_width == 1 else labels, int(self.ids[i]))
        return header + bytes(memoryview(raw)[int(self._data_offset[i]) :])

    def locate(self, i: int) -> str:
        i, _s, shard, record = self._where(i)
        return f"shard {shard.name} record {record}"

    @property
    def shard_starts(self) -> NDArray[np.int64]:
        """First record of each shard, then the record count (int64): the shard-aware order's input."""
        return np.append(self._shard_start, len(self)).astype(np.int64)

    def will_need(self, indices: Iterable[int]) -> None:
        """``POSIX_FADV_WILLNEED`` over the records' byte ranges (merged per shard); LMDB: no-op."""
        if self._closed or self._lmdb:
            return
        idx = np.unique(np.asarray(list(indices) if not isinstance(indices, np.ndarray) else indices, dtype=np.int64))
        idx = idx[(idx >= 0) & (idx < len(self))]
        if idx.size == 0:
            return
        order = np.lexsort((self._offset[idx], self._shard[idx]))
        idx = idx[order]
        # A split record's parts add 8 bytes each; overshooting by a little is harmless for a hint.
        ends = self._offset[idx] + 8 + self._length[idx].astype(np.uint64) + 8 * self._parts[idx].astype(np.uint64) + 3
        cur_shard, start, end = -1, 0, 0
        for s, o, e in zip(self._shard[idx].tolist(), self._offset[idx].tolist(), ends.tolist(), strict=True):
            if s == cur_shard and o <= end + 65536:
                end = max(end, e)
                continue
            if cur_shard >= 0:
                self._will_need(cur_shard, start, end)
            cur_shard, start, end = s, o, e
        self._will_need(cur_shard, start, end)

    def _will_need(self, s: int, start: int, end: int) -> None:
        shard = self.shards[s]
        if isinstance(shard, recordio.RecordIOShard):
            shard.will_need(start, end - start)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for shard in self.shards:
            shard.close()


def _check_index(index: NDArray[np.void], manifest: dict[str, Any], index_path: str) -> None:
    """The index against the manifest: shard numbers, per-shard counts, extents inside each shard."""
    entries = manifest["shards"]
    n = len(index)
    shard = index["shard"].astype(np.int64)
    if n and (shard.max() >= len(entries) or np.any(np.diff(shard) < 0)):
        raise CorruptDatasetError(
            f"shard numbers must be non-decreasing and below {len(entries)}", file=index_path, field="shard"
        )
    counts = np.bincount(shard, minlength=len(entries)) if n else np.zeros(len(entries), dtype=np.int64)
    for k, entry in enumerate(entries):
        if int(counts[k]) != entry["records"]:
            raise CorruptDatasetError(
                f"holds {int(counts[k])} records of shard {k}, the manifest says {entry['records']}",
                file=index_path,
                field="shard",
            )
    length = index["length"].astype(np.int64)
    parts = index["parts"].astype(np.int64)
    if np.any(index["data_offset"].astype(np.int64) > length):
        raise CorruptDatasetError("an image starts past the end of its record", file=index_path, field="data_offset")
    offset = index["offset"]
    if manifest["format"] == "lmdb":
        # The offset column is the record's number inside its shard: 0, 1, 2, ... per shard.
        starts = np.searchsorted(shard, np.arange(len(entries)), side="left")
        expected = np.arange(n, dtype=np.int64) - (starts[shard] if n else 0)
        if np.any(parts != 0) or not np.array_equal(offset.astype(np.int64), expected):
            raise CorruptDatasetError(
                "LMDB records must be numbered 0, 1, 2, ... per shard", file=index_path, field="offset"
            )
        return
    if np.any(parts == 1):
        raise CorruptDatasetError("a record split into one part", file=index_path, field="parts")
    span = 8 * np.maximum(parts, 1) + length - 4 * np.maximum(parts - 1, 0)
    limit = np.asarray([e["bytes"] for e in entries], dtype=np.uint64)[shard] if n else np.zeros(0, np.uint64)
    # uint64 throughout: an offset of 2**64 - 1 must not wrap around to a small number.
    if np.any(offset > limit) or np.any(span.astype(np.uint64) > limit - np.minimum(offset, limit)):
        raise CorruptDatasetError(
            "a record extends past the end of its shard (as the manifest sizes it)", file=index_path, field="offset"
        )


def open_fastload_folder(path: str) -> ShardedDataset:
    """Open a folder written by ``fastload pack``: manifest and index checked, shards opened (not read).

    Raises:
        CorruptDatasetError: A damaged manifest or index, or a path in the manifest that leaves the folder.
        CorruptRecordError: A shard that is missing or cannot be opened.
    """
    manifest = read_manifest(path)
    manifest_path = os.path.join(path, MANIFEST_NAME)
    fmt = manifest["format"]
    records = int(manifest["records"])
    index_path = contained_path(
        path, manifest.get("index", {}).get("file", INDEX_NAME), source=manifest_path, field="index.file"
    )
    index = load_index(index_path, int(manifest["label_width"]), records)
    has_checksums = "checksum" in (index.dtype.names or ())
    if manifest.get("index", {}).get("record_checksum") == RECORD_CHECKSUM and not has_checksums:
        raise CorruptDatasetError(
            "the manifest declares per-record checksums, the index has none", file=index_path, field="checksum"
        )
    _check_index(index, manifest, index_path)
    classes = manifest.get("classes")
    num_classes = len(classes) if classes and int(manifest["label_width"]) == 1 else None
    shards: list[Shard] = []
    try:
        for k, entry in enumerate(manifest["shards"]):
            shard_path = contained_path(path, entry["file"], source=manifest_path, field=f"shards[{k}].file")
            if not os.path.exists(shard_path):
                raise CorruptRecordError("shard listed in the manifest is missing", shard=shard_path)
            shards.append(recordio.RecordIOShard(shard_path) if fmt == "recordio" else LmdbShard(shard_path))
    except BaseException:
        for shard in shards:
            shard.close()
        raise
    return ShardedDataset(
        path=path, kind=f"fastload-{fmt}", shards=shards, index=index, manifest=manifest, num_classes=num_classes
    )


def _check_idx_order(offsets: NDArray[np.uint64], size: int, idx_path: str) -> None:
    """Offsets of an ``.idx``: from 0, strictly increasing, inside the ``.rec``."""
    fix = "; regenerate the .idx, or remove it (the .rec is then scanned)"
    if not len(offsets):
        if size:
            raise CorruptDatasetError(f"lists no record of a {size}-byte .rec{fix}", file=idx_path)
        return
    if int(offsets[0]) != 0:
        raise CorruptDatasetError(
            f"the first record is at byte {int(offsets[0])}, not 0{fix}", file=idx_path, field="entry 1"
        )
    step = np.diff(offsets.astype(np.int64))
    if np.any(step <= 0):
        k = int(np.flatnonzero(step <= 0)[0]) + 2
        what = "repeats the offset before it" if step[k - 2] == 0 else "is before the offset before it"
        raise CorruptDatasetError(f"offset {int(offsets[k - 1])} {what}{fix}", file=idx_path, field=f"entry {k}")
    if int(offsets[-1]) >= size:
        raise CorruptDatasetError(
            f"offset {int(offsets[-1])} is past the end of the {size}-byte .rec{fix}",
            file=idx_path,
            field=f"entry {len(offsets)}",
        )


def _index_bare_rec(
    shard: recordio.RecordIOShard, keys: NDArray[np.int64], offsets: NDArray[np.uint64], idx_path: str | None
) -> tuple[NDArray[np.void], dict[int, str], dict[int, str]]:
    """An index for a bare .rec from each record's framing and IRHeader (read with ``pread``).

    The label width is the number of labels most records carry; records with another number are bad.

    Returns:
        ``(index, broken, label_notes)``: records whose framing or header is damaged are kept as bad
        records (NaN labels, their reason in ``broken``), so the rest of the shard stays readable;
        ``label_notes`` names the records with another number of labels.

    Raises:
        CorruptDatasetError: An ``.idx`` that does not describe the ``.rec`` exactly.
    """
    n = len(offsets)
    offsets = offsets.astype(np.uint64)
    broken: dict[int, str] = {}
    heads, got = shard.heads(offsets, _HEAD)
    words = heads.view("<u4")
    magic, lrec = words[:, 0], words[:, 1]
    cflag = lrec >> 29
    length = (lrec & recordio.MAX_RECORD_LENGTH).astype(np.int64)
    framed = (got >= 8) & (magic == recordio.MAGIC)
    whole = framed & (cflag == 0) & (got >= _HEAD) & (length >= recordio.IR_HEADER_SIZE)
    flag = words[:, 2].astype(np.int64)
    # Check the framing before trusting `flag` (a damaged one could ask for billions of labels).
    too_many = whole & ((length < recordio.IR_HEADER_SIZE + 4 * flag) | (flag > MAX_LABEL_WIDTH))
    past_end = whole & (offsets.astype(np.int64) + 8 + length > shard.size)
    ends = np.full(n, -1, dtype=np.int64)
    ends[whole] = offsets[whole].astype(np.int64) + 8 + ((length[whole] + 3) & ~3)
    for i in np.flatnonzero(too_many).tolist():
        broken[i] = f"header announces more labels than the record holds ({int(flag[i])})"
    for i in np.flatnonzero(past_end & ~too_many).tolist():
        broken[i] = f"record of {int(length[i])} bytes runs past the end of the shard ({shard.size} bytes; truncated?)"
    good = whole & ~too_many & ~past_end
    slow: dict[int, tuple[recordio.RecordHeader, int, int]] = {}
    for i in np.flatnonzero(~whole).tolist():
        try:
            plen, parts, nxt = shard.extent(int(offsets[i]), i)
            ends[i] = nxt
            slow[i] = (recordio.unpack_header(shard.payload(int(offsets[i]), plen, parts, i)), plen, parts)
        except (CorruptRecordError, ValueError) as exc:
            broken[i] = exc.message if isinstance(exc, CorruptRecordError) else str(exc)
    widths = np.where(flag == 0, 1, flag)
    counted = np.concatenate([widths[good], [len(h.labels) for h, _, _ in slow.values()]]).astype(np.int64)
    label_width = int(np.bincount(counted).argmax()) if counted.size else 1
    if idx_path is not None:
        fix = "; regenerate the .idx, or remove it (the .rec is then scanned)"
        known = ends >= 0
        following = np.append(offsets[1:].astype(np.int64), shard.size)
        gap = known & (ends != following) & ~past_end
        if np.any(gap):
            k = int(np.flatnonzero(gap)[0])
            if k == n - 1:
                raise CorruptDatasetError(
                    f"lists records up to byte {int(ends[k])} of the {shard.size}-byte .rec: "
                    f"it does not cover the whole file{fix}",
                    file=idx_path,
                )
            raise CorruptDatasetError(
                f"offset {int(following[k])} is not where the record before it ends (byte {int(ends[k])}): "
                f"the .idx skips records or does not match this .rec{fix}",
                file=idx_path,
                field=f"entry {k + 2}",
            )
    index = empty_index(n, label_width)
    index["offset"] = offsets
    index["id"] = keys.astype(np.uint64)  # replaced by the IRHeader ids below (im2rec: the same numbers)
    index["labels"] = np.nan
    sel = np.flatnonzero(good)
    if sel.size:
        index["length"][sel] = length[sel]
        index["data_offset"][sel] = recordio.IR_HEADER_SIZE + 4 * flag[sel]
        index["id"][sel] = words[sel, 4].astype(np.uint64) | (words[sel, 5].astype(np.uint64) << np.uint64(32))
        single = sel[flag[sel] == 0]
        if label_width == 1:
            index["labels"][single, 0] = words[single, 3].view("<f4")
        many = sel[(flag[sel] == label_width) & (flag[sel] > 0)]
        if many.size:
            labels, lgot = shard.heads(offsets[many] + np.uint64(_HEAD), 4 * label_width)
            index["labels"][many] = labels.view("<f4").reshape(len(many), label_width)
            for i in many[lgot < 4 * label_width].tolist():
                broken[i] = "the shard ends inside the record's labels (truncated?)"
    label_notes: dict[int, str] = {}
    for i, (head, plen, parts) in slow.items():
        index["length"][i] = plen
        index["parts"][i] = parts
        index["id"][i] = head.id
        index["data_offset"][i] = head.image_offset
        if len(head.labels) == label_width:
            index["labels"][i] = head.labels
        else:
            label_notes[i] = f"carries {len(head.labels)} label(s), the shard's records carry {label_width}"
    for i in sel[widths[sel] != label_width].tolist():
        label_notes[i] = f"carries {int(widths[i])} label(s), the shard's records carry {label_width}"
    return index, broken, label_notes


def open_bare_rec(rec_path: str, idx_path: str | None = None) -> ShardedDataset:
    """Open a ``.rec`` on its own, through its ``.idx`` when there is one (checked), else by scanning it.

    Args:
        rec_path: The ``.rec`` file.
        idx_path: Its ``.idx`` when it is not the one beside it (MXNet's ``path_imgidx``).

    Raises:
        UserError: ``idx_path`` was given and does not exist.
        CorruptDatasetError: An ``.idx`` that is damaged or does not describe the ``.rec`` exactly.
        CorruptRecordError: Without an ``.idx``, framing that breaks before the end of the file.
    """
    explicit = idx_path is not None
    idx_path = idx_path if idx_path is not None else os.path.splitext(rec_path)[0] + ".idx"
    if explicit and not os.path.isfile(idx_path):
        raise UserError(f"{idx_path}: no such index file (given for {rec_path})")
    shard = recordio.RecordIOShard(rec_path)
    try:
        if os.path.exists(idx_path):
            keys, offsets = recordio.read_idx(idx_path)
            _check_idx_order(offsets, shard.size, idx_path)
            index, broken, notes = _index_bare_rec(shard, keys, offsets, idx_path)
        else:
            found: list[int] = []
            stop: CorruptRecordError | None = None
            pos = 0
            while pos < shard.size:
                found.append(pos)
                try:
                    pos = shard.extent(pos, len(found) - 1)[2]
                except CorruptRecordError as exc:
                    stop = exc
                    break
            offsets = np.asarray(found, dtype=np.uint64)
            index, broken, notes = _index_bare_rec(shard, np.arange(len(offsets), dtype=np.int64), offsets, None)
            if stop is not None and not broken.get(len(found) - 1, "").startswith("record of"):
                raise stop  # damage mid-file: the records after it cannot be found without an .idx
    except BaseException:
        shard.close()
        raise
    return ShardedDataset(path=rec_path, kind="recordio", shards=[shard], index=index, broken=broken, label_notes=notes)


def open_lmdb_shard(path: str) -> ShardedDataset:
    """Open one fastload LMDB shard directory on its own (its values' headers give labels and ids).

    Values whose header is damaged are kept as bad records; the label width is the number of labels
    most values carry.
    """
    shard = LmdbShard(path)
    try:
        lengths = shard.lengths()
        n = len(lengths)
        heads: dict[int, LmdbValueHeader] = {}
        broken: dict[int, str] = {}
        for record in range(n):
            try:
                heads[record] = shard.header(record)
            except (CorruptRecordError, ValueError) as exc:
                broken[record] = exc.message if isinstance(exc, CorruptRecordError) else str(exc)
        widths = np.asarray([len(h.labels) for h in heads.values()] or [1], dtype=np.int64)
        width = max(1, int(np.bincount(widths).argmax()))
        index = empty_index(n, width)
        index["offset"] = np.arange(n, dtype=np.uint64)
        index["length"] = lengths
        index["labels"] = np.nan
        notes: dict[int, str] = {}
        for record, head in heads.items():
            index["id"][record] = head.id
            index["data_offset"][record] = head.image_offset
            if len(head.labels) == width:
                index["labels"][record] = head.labels
            else:
                notes[record] = f"carries {len(head.labels)} label(s), the shard's records carry {width}"
    except BaseException:
        shard.close()
        raise
    return ShardedDataset(path=path, kind="lmdb", shards=[shard], index=index, broken=broken, label_notes=notes)
