"""Read stage, checking (``fastload verify``): checksums, framing and headers of every record, optionally decoded.

Every problem names its shard and record. A fastload folder is checked against its manifest
(file sizes, checksums of shards and ``.idx`` files, record counts) and its index (framing, lengths,
labels and ids of each record); a bare ``.rec``, LMDB shard or image folder is checked record by record.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fastload.errors import CorruptRecordError
from fastload.records import recordio
from fastload.records.base import Dataset
from fastload.records.checksum import file_matches, recorded_checksum
from fastload.records.dataset import open_dataset
from fastload.records.lmdb_shard import LmdbValueHeader, unpack_value_header
from fastload.records.manifest import MANIFEST_NAME, read_manifest
from fastload.records.recordio import RecordHeader
from fastload.records.sharded import ShardedDataset

__all__ = ["VerifyReport", "verify_dataset"]


@dataclass
class VerifyReport:
    """Outcome of :func:`verify_dataset`.

    Attributes:
        path: What was checked.
        records: Records checked.
        shards: Shards checked.
        decoded: Records decoded (with ``decode=True``).
        problems: One line per problem, naming shard and record.
    """

    path: str
    records: int = 0
    shards: int = 0
    decoded: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _decoder() -> Callable[[memoryview], object]:
    try:
        from fastload.decode import decode_image

        return decode_image
    except ImportError:
        from PIL import Image

        def pillow_decode(buf: memoryview) -> object:
            img = Image.open(io.BytesIO(bytes(buf)))
            img.load()
            if img.mode != "RGB":
                raise ValueError(f"decodes to mode {img.mode}, not RGB")
            return img

        return pillow_decode


def _check_files(folder: str, manifest: dict, report: VerifyReport) -> None:
    """Sizes and checksums of every shard file, ``.idx`` file and the record index."""
    for entry in manifest.get("shards", []):
        path = os.path.join(folder, entry["file"])
        data = os.path.join(path, "data.mdb") if manifest.get("format") == "lmdb" else path
        if not os.path.exists(data):
            report.problems.append(f"shard {entry['file']}: missing")
            continue
        size = os.path.getsize(data)
        if size != entry["bytes"]:
            report.problems.append(
                f"shard {entry['file']}: {size} bytes, the manifest says {entry['bytes']}"
                + (" (truncated)" if size < entry["bytes"] else "")
            )
        elif not file_matches(data, recorded_checksum(entry)):
            report.problems.append(f"shard {entry['file']}: checksum differs from the manifest (corrupted)")
        if entry.get("index_file"):
            idx = os.path.join(folder, entry["index_file"])
            if not os.path.exists(idx):
                report.problems.append(f"shard {entry['file']}: index file {entry['index_file']} missing")
            elif not file_matches(idx, recorded_checksum(entry, "index_")):
                report.problems.append(f"shard {entry['file']}: {entry['index_file']} differs from the manifest")
    index_meta = manifest.get("index", {})
    index_path = os.path.join(folder, index_meta.get("file", ""))
    recorded = recorded_checksum(index_meta)
    if recorded and os.path.exists(index_path) and not file_matches(index_path, recorded):
        report.problems.append(f"record index {index_meta['file']}: checksum differs from the manifest")


def _check_record(ds: ShardedDataset, i: int) -> str | None:
    """Framing and header of record ``i`` against the index; None when fine."""
    head: RecordHeader | LmdbValueHeader
    if ds.kind.endswith("lmdb"):
        head = unpack_value_header(ds._raw(i)[1])
    else:
        head = recordio.unpack_header(ds.payload(i))
        if head.flag == 0 and ds.label_width > 1:
            return "single-label header in a multi-label dataset"
    if head.image_offset != int(ds._data_offset[i]):
        return f"header length {head.image_offset} differs from the index ({int(ds._data_offset[i])})"
    if int(head.id) != int(ds.ids[i]):
        return f"id {head.id} differs from the index ({int(ds.ids[i])})"
    want = ds.labels[i][: len(head.labels)]
    if not np.array_equal(np.asarray(head.labels, dtype=np.float32), want):
        return f"labels {list(head.labels)} differ from the index ({want.tolist()})"
    return None


def verify_dataset(path: str, *, decode: bool = False, on_record: Callable[[int], None] | None = None) -> VerifyReport:
    """Check a dataset; never raises for damaged data (problems are listed in the report).

    Args:
        path: Anything :func:`fastload.records.dataset.open_dataset` accepts.
        decode: Also decode every image.
        on_record: Called after each record (progress).

    Raises:
        UserError: The path does not exist or is not a dataset.
    """
    report = VerifyReport(path=path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        _check_files(path, read_manifest(path), report)
    try:
        ds: Dataset = open_dataset(path)
    except CorruptRecordError as exc:
        report.problems.append(str(exc))
        return report
    decode_fn = _decoder() if decode else None
    with ds:
        report.shards = len(ds.shards) or 1
        if ds.manifest is not None and isinstance(ds, ShardedDataset):
            for k, entry in enumerate(ds.manifest["shards"]):
                have = int(np.count_nonzero(ds._shard == k))
                if have != entry["records"]:
                    report.problems.append(
                        f"shard {entry['file']}: index has {have} records, manifest says {entry['records']}"
                    )
        for i in range(len(ds)):
            where = ds.locate(i)
            try:
                problem = _check_record(ds, i) if isinstance(ds, ShardedDataset) else None
                image = ds.image(i)
            except (CorruptRecordError, ValueError) as exc:
                problem = str(exc)
            if problem is None and decode_fn is not None:
                try:
                    decode_fn(image)
                    report.decoded += 1
                except Exception as exc:
                    problem = f"does not decode: {exc}"
            if problem is not None:
                report.problems.append(f"{where}: {problem}")
            report.records += 1
            if on_record is not None:
                on_record(i)
    return report
