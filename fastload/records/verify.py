"""Read stage, checking (``fastload verify``): checksums, framing and headers of every record, optionally decoded.

Every problem names its shard and record. A fastload folder is checked against its manifest
(file sizes, checksums of shards and ``.idx`` files, paths inside the folder) and its index
(framing, lengths, per-record checksums, labels and ids of each record); a bare ``.rec``, LMDB shard
or image folder is checked record by record. Damage is reported, never raised: a damaged manifest or
index is one problem line, a shard that cannot be read makes every record of it a problem.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload.checksum import file_matches, recorded_checksum
from fastload.errors import CorruptDatasetError, CorruptRecordError
from fastload.records import recordio
from fastload.records.base import Dataset
from fastload.records.containment import contained_path
from fastload.records.dataset import open_dataset
from fastload.records.lmdb_shard import LmdbValueHeader, unpack_value_header
from fastload.records.manifest import INDEX_NAME, MANIFEST_NAME, read_manifest
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
        notes: What was not checked and why (e.g. an index without per-record checksums).
    """

    path: str
    records: int = 0
    shards: int = 0
    decoded: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

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


def _regular_size(path: str) -> tuple[int | None, str | None]:
    """``(size, None)`` for a regular file, else ``(None, what is wrong)``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    return st.st_size, None


def _check_files(folder: str, manifest: dict[str, Any], report: VerifyReport) -> None:
    """Sizes and checksums of every shard file, ``.idx`` file and the record index.

    Every path is checked to stay inside the folder first: a shard elsewhere is a problem, never
    read and never reported as checked.
    """
    source = os.path.join(folder, MANIFEST_NAME)
    for k, entry in enumerate(manifest["shards"]):
        name = entry["file"]
        try:
            path = contained_path(folder, name, source=source, field=f"shards[{k}].file")
        except CorruptDatasetError as exc:
            report.problems.append(str(exc))
            continue
        data = os.path.join(path, "data.mdb") if manifest["format"] == "lmdb" else path
        size, problem = _regular_size(data)
        if problem is not None:
            report.problems.append(f"shard {name}: {problem}")
            continue
        if size != entry["bytes"]:
            report.problems.append(
                f"shard {name}: {size} bytes, the manifest says {entry['bytes']}"
                + (" (truncated)" if size is not None and size < entry["bytes"] else "")
            )
        elif not file_matches(data, recorded_checksum(entry)):
            report.problems.append(f"shard {name}: checksum differs from the manifest (corrupted)")
        if entry.get("index_file"):
            try:
                idx = contained_path(folder, entry["index_file"], source=source, field=f"shards[{k}].index_file")
            except CorruptDatasetError as exc:
                report.problems.append(str(exc))
                continue
            _size, problem = _regular_size(idx)
            if problem is not None:
                report.problems.append(f"shard {name}: index file {entry['index_file']} {problem}")
            elif not file_matches(idx, recorded_checksum(entry, "index_")):
                report.problems.append(f"shard {name}: {entry['index_file']} differs from the manifest")
    index_meta = manifest.get("index", {})
    recorded = recorded_checksum(index_meta)
    if recorded:
        try:
            index_path = contained_path(folder, index_meta.get("file", INDEX_NAME), source=source, field="index.file")
        except CorruptDatasetError as exc:
            report.problems.append(str(exc))
            return
        if _regular_size(index_path)[1] is None and not file_matches(index_path, recorded):
            report.problems.append(
                f"record index {index_meta.get('file', INDEX_NAME)}: checksum differs from the manifest"
            )


def _check_record(ds: ShardedDataset, i: int) -> str | None:
    """Framing, checksum, header and labels of record ``i`` against the index; None when fine."""
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
    if not np.array_equal(np.asarray(head.labels, dtype=np.float32), want, equal_nan=True):
        return f"labels {list(head.labels)} differ from the index ({want.tolist()})"
    return ds.label_problem(i)


def verify_dataset(path: str, *, decode: bool = False, on_record: Callable[[int], None] | None = None) -> VerifyReport:
    """Check a dataset; never raises for damaged data (problems are listed in the report).

    Damage it finds and reports: missing, truncated, corrupted or foreign shards (sizes and
    checksums against the manifest, paths that leave the folder), a damaged manifest, index or
    ``.idx`` (reported as the one problem that stops the check), truncated LMDB data files, and per
    record: framing, per-record checksum, header against the index, labels outside what the dataset
    declares, and (with ``decode``) images that do not decode.

    Args:
        path: Anything :func:`fastload.records.dataset.open_dataset` accepts.
        decode: Also decode every image.
        on_record: Called after each record (progress).

    Raises:
        UserError: The path does not exist or is not a dataset.
    """
    report = VerifyReport(path=path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        try:
            manifest = read_manifest(path)
        except CorruptDatasetError as exc:
            report.problems.append(str(exc))
            return report
        _check_files(path, manifest, report)
    try:
        ds: Dataset = open_dataset(path)
    except (CorruptRecordError, CorruptDatasetError) as exc:
        report.problems.append(str(exc))
        return report
    except OSError as exc:
        report.problems.append(f"{path}: cannot be read ({exc.strerror or exc})")
        return report
    decode_fn = _decoder() if decode else None
    with ds:
        report.shards = len(ds.shards) or 1
        if isinstance(ds, ShardedDataset) and not ds.checksummed:
            report.notes.append("the index has no per-record checksums (packed before format version 3)")
        for i in range(len(ds)):
            where = ds.locate(i)
            problem: str | None = None
            try:
                problem = _check_record(ds, i) if isinstance(ds, ShardedDataset) else None
                if problem is None:
                    image = ds.image(i)
            except CorruptRecordError as exc:
                problem = exc.message  # the location is already in front of the line
            except ValueError as exc:
                problem = str(exc)
            except Exception as exc:  # verify reports damage, whatever shape it takes
                problem = f"unreadable ({type(exc).__name__}: {exc})"
            if problem is None and decode_fn is not None:
                try:
                    decode_fn(image)
                    report.decoded += 1
                except Exception as exc:  # any decoder failure is this record's problem
                    problem = f"does not decode: {exc}"
            if problem is not None:
                report.problems.append(f"{where}: {problem}")
            report.records += 1
            if on_record is not None:
                on_record(i)
    return report
