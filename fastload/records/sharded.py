"""Read stage, packed records: RecordIO and LMDB shards addressed through a binary index.

:class:`ShardedDataset` serves a fastload folder (``fastload.json`` + ``fastload-index.npy`` +
shards: opening reads the manifest and the index only), a bare ``.rec`` with its ``.idx`` beside it,
as MXNet's tools write it (headers read through the mapping, vectorized; without an ``.idx`` the file
is scanned), and one fastload LMDB shard directory.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from fastload.errors import CorruptRecordError, UserError
from fastload.records import recordio
from fastload.records.base import Dataset
from fastload.records.lmdb_shard import LmdbShard, unpack_value_header
from fastload.records.manifest import INDEX_NAME, MANIFEST_NAME, empty_index, load_index, read_manifest

__all__ = ["Shard", "ShardedDataset", "open_bare_rec", "open_fastload_folder", "open_lmdb_shard"]

Shard = recordio.RecordIOShard | LmdbShard


class ShardedDataset(Dataset):
    """Records in RecordIO or LMDB shards, addressed through a binary index.

    Args:
        path: What was opened (for messages).
        kind: See :class:`Dataset`.
        shards: The opened shards, in index order.
        index: Structured array (:func:`fastload.records.manifest.index_dtype`).
        manifest: The manifest, when there is one.
    """

    #: Consumed bytes between two releases of the shards' mapped pages (see :meth:`done_with`).
    RELEASE_EVERY_BYTES = 64 << 20

    def __init__(
        self,
        *,
        path: str,
        kind: str,
        shards: Sequence[Shard],
        index: np.ndarray,
        manifest: dict[str, Any] | None = None,
    ) -> None:
        self.path = path
        self.kind = kind
        self.shards = list(shards)
        self.manifest = manifest
        self.restart_indexed = bool(manifest and manifest.get("restart_index"))
        self.label_width = int(index.dtype["labels"].shape[0]) if index.dtype["labels"].shape else 1
        self.labels = np.ascontiguousarray(index["labels"], dtype=np.float32).reshape(len(index), self.label_width)
        self.ids = np.ascontiguousarray(index["id"], dtype=np.uint64)
        self._offset = np.ascontiguousarray(index["offset"])
        self._length = np.ascontiguousarray(index["length"])
        self._data_offset = np.ascontiguousarray(index["data_offset"])
        self._parts = np.ascontiguousarray(index["parts"])
        self._shard = np.ascontiguousarray(index["shard"])
        if len(index) and int(self._shard.max()) >= len(self.shards):
            raise UserError(
                f"{path}: the index refers to shard {int(self._shard.max())} but only {len(self.shards)} shards exist"
            )
        # First global index of every shard: record numbers inside a shard for error messages.
        self._shard_start = np.searchsorted(self._shard, np.arange(len(self.shards)), side="left")
        self._lmdb = bool(self.shards) and isinstance(self.shards[0], LmdbShard)
        self._closed = False
        self._lock = threading.Lock()
        self._consumed = 0  # bytes of records consumed since the mappings were last released

    def _where(self, i: int) -> tuple[int, int, Shard, int]:
        if self._closed:
            raise ValueError(f"dataset {self.path} is closed")
        i = self._check_index(i)
        s = int(self._shard[i])
        return i, s, self.shards[s], i - int(self._shard_start[s])

    def _raw(self, i: int) -> tuple[int, memoryview | bytes]:
        i, _s, shard, record = self._where(i)
        if isinstance(shard, LmdbShard):
            value = shard.value(int(self._offset[i]))
            if len(value) != int(self._length[i]):
                raise CorruptRecordError(
                    f"value of {len(value)} bytes, the index says {int(self._length[i])}",
                    shard=shard.path,
                    record=record,
                )
            return i, value
        return i, shard.payload(int(self._offset[i]), int(self._length[i]), int(self._parts[i]), record)

    def image(self, i: int) -> memoryview:
        """The encoded image bytes of record ``i``: a view into the shard's mapping when stored whole.

        Raises:
            CorruptRecordError: Bad framing, a truncated shard or a length that disagrees with the index.
        """
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
    def shard_starts(self) -> np.ndarray:
        """First record of each shard, then the record count (int64): the shard-aware order's input."""
        return np.append(self._shard_start, len(self)).astype(np.int64)

    def will_need(self, indices: Iterable[int]) -> None:
        """``MADV_WILLNEED`` over the records' byte ranges (merged per shard); LMDB: no-op."""
        self._advise(indices, "will_need")

    def done_with(self, indices: Iterable[int]) -> None:
        """Consumed records leave this process's RSS, in bulk.

        Every ``RELEASE_EVERY_BYTES`` of consumed records, each shard's whole mapping gets one
        ``MADV_DONTNEED``: the pages stay in the page cache, views stay valid (a later access faults
        the page back in from the cache), and the process's resident size stays bounded by what a
        few batches touch instead of growing to the dataset's size. One call per shard rather than
        one per record: per-record calls (each a TLB shootdown across the decode threads) cost ~7%
        of the decode time when measured. LMDB: no-op.
        """
        if self._closed or self._lmdb:
            return
        idx = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices), dtype=np.int64)
        consumed = int(self._length[idx].sum()) if idx.size else 0
        with self._lock:
            self._consumed += consumed
            if self._consumed < self.RELEASE_EVERY_BYTES:
                return
            self._consumed = 0
        for shard in self.shards:
            if isinstance(shard, recordio.RecordIOShard):
                shard.done_with(0, shard.size)

    def _advise(self, indices: Iterable[int], method: str) -> None:
        if self._closed or self._lmdb:
            return
        idx = np.unique(np.asarray(list(indices) if not isinstance(indices, np.ndarray) else indices, dtype=np.int64))
        if idx.size == 0:
            return
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
                getattr(self.shards[cur_shard], method)(start, end - start)
            cur_shard, start, end = s, o, e
        getattr(self.shards[cur_shard], method)(start, end - start)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for shard in self.shards:
            shard.close()


def open_fastload_folder(path: str) -> ShardedDataset:
    manifest = read_manifest(path)
    fmt = manifest.get("format")
    records = int(manifest["records"])
    index = load_index(
        os.path.join(path, manifest.get("index", {}).get("file", INDEX_NAME)), int(manifest["label_width"]), records
    )
    shards: list[Shard] = []
    try:
        for entry in manifest["shards"]:
            shard_path = os.path.join(path, entry["file"])
            if not os.path.exists(shard_path):
                raise CorruptRecordError("shard listed in the manifest is missing", shard=shard_path)
            if fmt == "recordio":
                shards.append(recordio.RecordIOShard(shard_path))
            elif fmt == "lmdb":
                shards.append(LmdbShard(shard_path))
            else:
                raise UserError(f"{path}: unknown dataset format {fmt!r} in {MANIFEST_NAME}")
    except BaseException:
        for shard in shards:
            shard.close()
        raise
    return ShardedDataset(path=path, kind=f"fastload-{fmt}", shards=shards, index=index, manifest=manifest)


def _index_bare_rec(shard: recordio.RecordIOShard, keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Build an index for a bare .rec by reading each record's framing and IRHeader through the mapping."""
    n = len(offsets)
    offsets = offsets.astype(np.uint64)
    words = np.frombuffer(shard.view[: shard.size & ~3], dtype="<u4") if shard.size >= 4 else np.zeros(0, "<u4")
    w = (offsets // 4).astype(np.int64)
    # Whole records whose fixed header words are all inside the file take the vectorized path.
    fast = (offsets % 4 == 0) & (w + 6 <= words.size)
    fw = w[fast]
    magic_ok = words[fw] == recordio.MAGIC
    lrec = words[fw + 1]
    whole = magic_ok & ((lrec >> 29) == 0) & ((lrec & recordio.MAX_RECORD_LENGTH) >= recordio.IR_HEADER_SIZE)
    fast_idx = np.flatnonzero(fast)[whole]
    fw = fw[whole]
    length = (lrec[whole] & recordio.MAX_RECORD_LENGTH).astype(np.uint64)
    flag = words[fw + 2]
    # Check framing before trusting `flag` (a damaged one could ask for billions of labels).
    too_short = length < recordio.IR_HEADER_SIZE + 4 * flag.astype(np.uint64)
    if np.any(too_short):
        bad = int(fast_idx[np.flatnonzero(too_short)[0]])
        raise CorruptRecordError(
            "header announces more labels than the record holds", shard=shard.path, record=bad, offset=int(offsets[bad])
        )
    past_end = offsets[fast_idx] + 8 + length > shard.size
    if np.any(past_end):
        bad = int(fast_idx[np.flatnonzero(past_end)[0]])
        raise CorruptRecordError(
            "record runs past the end of the shard (truncated?)", shard=shard.path, record=bad, offset=int(offsets[bad])
        )
    label_width = int(max(1, flag.max() if flag.size else 1))
    slow = np.setdiff1d(np.arange(n), fast_idx)
    slow_headers = {}
    for i in slow.tolist():
        payload = shard.payload(int(offsets[i]), -1, 0, i)  # raises CorruptRecordError naming the record
        plen, parts, _ = shard.extent(int(offsets[i]), i)
        try:
            head = recordio.unpack_header(payload)
        except ValueError as exc:
            raise CorruptRecordError(str(exc), shard=shard.path, record=i, offset=int(offsets[i])) from None
        slow_headers[i] = (head, plen, parts)
        label_width = max(label_width, len(head.labels))
    index = empty_index(n, label_width)
    index["offset"] = offsets
    index["id"] = keys.astype(np.uint64)  # replaced by the IRHeader ids below (im2rec: the same numbers)
    index["labels"] = np.nan
    if fast_idx.size:
        index["length"][fast_idx] = length
        index["data_offset"][fast_idx] = recordio.IR_HEADER_SIZE + 4 * flag
        index["id"][fast_idx] = words[fw + 4].astype(np.uint64) | (words[fw + 5].astype(np.uint64) << np.uint64(32))
        single = flag == 0
        index["labels"][fast_idx[single], 0] = words[fw[single] + 3].view("<f4")
        for k in np.unique(flag[~single]).tolist():
            sel = flag == k
            cols = fw[sel][:, None] + 8 + np.arange(k)[None, :]  # payload starts at word 2; labels after 24 bytes
            index["labels"][fast_idx[sel], :k] = words[cols].view("<f4")
    for i, (head, plen, parts) in slow_headers.items():
        index["length"][i] = plen
        index["parts"][i] = parts
        index["id"][i] = head.id
        index["data_offset"][i] = head.image_offset
        index["labels"][i, : len(head.labels)] = head.labels
    return index


def open_bare_rec(rec_path: str, idx_path: str | None = None) -> ShardedDataset:
    explicit = idx_path is not None
    idx_path = idx_path if idx_path is not None else os.path.splitext(rec_path)[0] + ".idx"
    if explicit and not os.path.isfile(idx_path):
        raise UserError(f"{idx_path}: no such index file (given for {rec_path})")
    shard = recordio.RecordIOShard(rec_path)
    try:
        if os.path.exists(idx_path):
            keys, offsets = recordio.read_idx(idx_path)
        else:
            offsets = np.asarray([o for o, _, _ in shard.scan()], dtype=np.uint64)
            keys = np.arange(len(offsets), dtype=np.int64)
        index = _index_bare_rec(shard, keys, offsets)
    except BaseException:
        shard.close()
        raise
    return ShardedDataset(path=rec_path, kind="recordio", shards=[shard], index=index)


def open_lmdb_shard(path: str) -> ShardedDataset:
    shard = LmdbShard(path)
    try:
        rows = []
        width = 1
        for record, value in shard.items():
            try:
                head = unpack_value_header(value)
            except ValueError as exc:
                raise CorruptRecordError(str(exc), shard=path, record=record) from None
            rows.append((record, head, len(value)))
            width = max(width, len(head.labels))
        index = empty_index(len(rows), width)
        index["labels"] = np.nan
        for i, (record, head, length) in enumerate(rows):
            index["offset"][i], index["id"][i], index["length"][i] = record, head.id, length
            index["data_offset"][i] = head.image_offset
            index["labels"][i, : len(head.labels)] = head.labels
    except BaseException:
        shard.close()
        raise
    return ShardedDataset(path=path, kind="lmdb", shards=[shard], index=index)
