"""Read stage, the dataset's layout: the manifest (``fastload.json``) and the compact binary record index.

``OUT/fastload.json`` describes a packed dataset (written by :mod:`fastload.pack.manifest_writer`); it is written last,
atomically, so its presence means every shard it lists is complete.

``OUT/fastload-index.npy`` is one numpy structured array with a row per record, in record order::

    offset       uint64   byte offset of the record in its .rec (LMDB: record number in the shard)
    id           uint64   record id (.idx key; im2rec: the .lst index)
    shard        uint32   position of the shard in ``manifest["shards"]``
    length       uint32   payload length (RecordIO: IRHeader + labels + image; LMDB: value length)
    data_offset  uint32   where the image bytes start inside the payload
    parts        uint32   0: stored whole (zero-copy); k > 1: split into k RecordIO parts
    labels       float32[label_width]
    checksum     uint64   XXH3-64 of the record's payload (format version 3; absent in older indexes)

Opening a dataset reads this one file and the manifest; it never touches the shards.

Both are untrusted input when read: :func:`read_manifest` checks every field a reader uses (types,
ranges, paths) and :func:`load_index` parses the ``.npy`` header itself, checks the layout, size and
every column against the manifest before use; anything wrong is one
:class:`~fastload.errors.CorruptDatasetError` naming the file and the field, never a parser's
traceback and never the file's bytes.

Format versions: 1 recorded SHA-256 checksums of whole files; 2 XXH3-128; 3 adds the per-record
``checksum`` column, declared in the manifest as ``index.record_checksum = "xxh3_64"``. Indexes
without the column (versions 1 and 2, or written by other tools) still open: their records are then
checked by framing and lengths only, not by content.

A pack builds the dataset in its work folder, ``OUT/.fastload-staging/`` (:data:`WORK_DIR`), and
moves it into place when complete.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from fastload.errors import CorruptDatasetError, UserError
from fastload.folder import INDEX_NAME, MANIFEST_NAME, WORK_DIR
from fastload.records.containment import open_regular, show_name
from fastload.records.durable import atomic_write

__all__ = [
    "FORMAT_VERSION",
    "INDEX_NAME",
    "MANIFEST_NAME",
    "MAX_LABEL_WIDTH",
    "RECORD_CHECKSUM",
    "WORK_DIR",
    "empty_index",
    "index_dtype",
    "load_index",
    "read_json_manifest",
    "read_manifest",
    "validate_manifest",
    "write_index",
]

# 3: per-record XXH3-64 checksums in the index; 2: XXH3-128 file checksums; 1: SHA-256 (all still read)
FORMAT_VERSION = 3
RECORD_CHECKSUM = "xxh3_64"  # what the index's ``checksum`` column holds (manifest: index.record_checksum)
MAX_LABEL_WIDTH = 1 << 16  # labels per record a reader accepts (a damaged width must not size an allocation)
_MAX_RECORDS = 1 << 40
_MAX_BYTES = (1 << 63) - 1
_MAX_MANIFEST_BYTES = 1 << 30  # a manifest is kilobytes to a few megabytes; a bigger one is not read whole
_MAX_NPY_HEADER = 1 << 16


def index_dtype(label_width: int, checksums: bool = False) -> np.dtype:
    """The structured dtype of the binary index for ``label_width`` labels per record.

    Args:
        label_width: Labels per record.
        checksums: With the per-record ``checksum`` column (format version 3).
    """
    if label_width < 1:
        raise ValueError(f"label_width={label_width} must be >= 1")
    fields: list[Any] = [
        ("offset", "<u8"),
        ("id", "<u8"),
        ("shard", "<u4"),
        ("length", "<u4"),
        ("data_offset", "<u4"),
        ("parts", "<u4"),
        ("labels", "<f4", (label_width,)),
    ]
    if checksums:
        fields.append(("checksum", "<u8"))
    return np.dtype(fields)


def empty_index(n: int, label_width: int, checksums: bool = False) -> np.ndarray:
    """A zeroed index of ``n`` rows (``checksums``: with the per-record checksum column)."""
    return np.zeros(n, dtype=index_dtype(label_width, checksums))


def write_index(path: str, index: np.ndarray) -> None:
    """Write the binary index atomically (``.npy``; deterministic bytes for equal contents)."""
    atomic_write(path, lambda f: np.save(f, index, allow_pickle=False))


def _npy_header(f: Any, path: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` from a ``.npy`` header, any damage as one error."""
    fmt: Any = np.lib.format  # untyped in numpy 1.23
    try:
        major, minor = fmt.read_magic(f)
        if (major, minor) == (1, 0):
            return fmt.read_array_header_1_0(f, max_header_size=_MAX_NPY_HEADER)
        if (major, minor) == (2, 0):
            return fmt.read_array_header_2_0(f, max_header_size=_MAX_NPY_HEADER)
        raise ValueError(f"unknown .npy version {major}.{minor}")
    except Exception:
        # numpy's own messages quote the header's text (the file's bytes): not repeated here. Any
        # exception (ValueError, SyntaxError, tokenize.TokenError, TypeError, OverflowError,
        # RecursionError, UnicodeDecodeError, ...) means the same thing: the header is damaged.
        raise CorruptDatasetError(
            "damaged .npy header (not a record index numpy can describe)", file=path, field="header"
        ) from None


def load_index(path: str, label_width: int, records: int) -> np.ndarray:
    """Load the binary index and check its layout and size against the manifest.

    The ``.npy`` header is parsed on its own first, so a damaged one is reported instead of
    reaching numpy's loader; the data must then be exactly ``records`` rows of the expected
    layout (with or without the per-record ``checksum`` column).

    Args:
        path: The index file.
        label_width: Labels per record, from the manifest.
        records: Records, from the manifest.

    Raises:
        CorruptDatasetError: Missing, damaged header, another layout or shape, or a size that does
            not match its header.
    """
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise CorruptDatasetError("the dataset's record index is missing", file=path) from None
    except OSError as exc:
        raise CorruptDatasetError(f"cannot read the record index ({exc.strerror or exc})", file=path) from None
    with f:
        shape, fortran, dtype = _npy_header(f, path)
        if dtype not in (index_dtype(label_width), index_dtype(label_width, checksums=True)):
            raise CorruptDatasetError(
                f"record layout differs from the index layout for {label_width} label(s) per record",
                file=path,
                field="dtype",
            )
        if fortran or shape != (records,):
            raise CorruptDatasetError(
                f"shape {show_name(shape)} differs from the manifest's {records} records", file=path, field="shape"
            )
        start = f.tell()
        size = os.fstat(f.fileno()).st_size
        if size - start != records * dtype.itemsize:
            raise CorruptDatasetError(
                f"holds {size - start} bytes of rows, {records} records need {records * dtype.itemsize} (truncated?)",
                file=path,
                field="data",
            )
        index = np.fromfile(f, dtype=dtype, count=records)
    if index.shape != (records,):
        raise CorruptDatasetError("changed while being read", file=path, field="data")
    return index


def read_json_manifest(folder: str, name: str, *, what: str, max_version: int) -> dict[str, Any]:
    """Load ``folder/name`` (a JSON object with an int ``format_version``) for a reader.

    Args:
        folder: The dataset folder.
        name: The manifest's file name.
        what: What such a folder is, for the message when the manifest is missing.
        max_version: The newest ``format_version`` this fastload reads.

    Raises:
        UserError: Missing.
        CorruptDatasetError: Unreadable, not JSON, not an object, or without a supported
            ``format_version`` (a newer one: upgrade fastload).
    """
    path = os.path.join(folder, name)
    try:
        with open_regular(path) as f:
            if os.fstat(f.fileno()).st_size > _MAX_MANIFEST_BYTES:
                raise CorruptDatasetError(f"larger than {_MAX_MANIFEST_BYTES} bytes: not a manifest", file=path)
            manifest = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{folder}: no {name} (not {what}, or an unfinished pack)") from None
    except OSError as exc:
        raise CorruptDatasetError(f"cannot read the manifest ({exc.strerror or exc})", file=path) from None
    except json.JSONDecodeError as exc:  # its message gives a line and column, never the document's text
        raise CorruptDatasetError(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", file=path
        ) from None
    except ValueError:
        raise CorruptDatasetError("not valid JSON (a number too long to convert)", file=path) from None
    except RecursionError:
        raise CorruptDatasetError("not valid JSON (nested too deeply)", file=path) from None
    if not isinstance(manifest, dict):
        raise CorruptDatasetError(f"a JSON {type(manifest).__name__}, not an object", file=path)
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptDatasetError(
            f"must be an integer >= 1, not {show_name(version)}", file=path, field="format_version"
        )
    if version > max_version:
        raise CorruptDatasetError(
            f"version {version} is newer than this fastload reads (up to {max_version}): upgrade fastload",
            file=path,
            field="format_version",
        )
    return manifest


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(
    obj: dict[str, Any], key: str, path: str, where: str, kind: type | tuple[type, ...], *, required: bool = True
) -> Any:
    value = obj.get(key)
    if value is None and not required:
        return None
    ok = _is_int(value) if kind is int else isinstance(value, kind) and not isinstance(value, bool)
    if not ok:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise CorruptDatasetError(f"must be {names}, not {show_name(value)}", file=path, field=where + key)
    return value


def _bounded(value: int, low: int, high: int, path: str, where: str) -> int:
    if not low <= value <= high:
        raise CorruptDatasetError(f"{value} is outside [{low}, {high}]", file=path, field=where)
    return value


def validate_manifest(manifest: dict[str, Any], path: str) -> dict[str, Any]:
    """Check every field a reader uses: types, ranges, counts that must agree.

    Paths are checked for containment where they are opened
    (:func:`fastload.records.containment.contained_path`).

    Args:
        manifest: The parsed ``fastload.json``.
        path: Its file (for messages).

    Returns:
        ``manifest``, unchanged.

    Raises:
        CorruptDatasetError: The first field at fault.
    """
    fmt = manifest.get("format")
    if fmt not in ("recordio", "lmdb"):
        raise CorruptDatasetError(f"unknown dataset format {show_name(fmt)}", file=path, field="format")
    records = _bounded(_field(manifest, "records", path, "", int), 0, _MAX_RECORDS, path, "records")
    _bounded(_field(manifest, "label_width", path, "", int), 1, MAX_LABEL_WIDTH, path, "label_width")
    classes = _field(manifest, "classes", path, "", dict, required=False)
    if classes is not None:
        for name, label in classes.items():
            if not _is_int(label) or not 0 <= label < len(classes):
                raise CorruptDatasetError(
                    f"class label {show_name(label)} is not an integer in [0, {len(classes)})",
                    file=path,
                    field=f"classes[{show_name(name)}]",
                )
    shards = _field(manifest, "shards", path, "", list)
    total = 0
    for k, entry in enumerate(shards):
        where = f"shards[{k}]."
        if not isinstance(entry, dict):
            raise CorruptDatasetError(f"must be an object, not {show_name(entry)}", file=path, field=f"shards[{k}]")
        _field(entry, "file", path, where, str)
        total += _bounded(_field(entry, "records", path, where, int), 0, _MAX_RECORDS, path, where + "records")
        _bounded(_field(entry, "bytes", path, where, int), 0, _MAX_BYTES, path, where + "bytes")
        for key in ("checksum", "sha256", "index_file", "index_checksum", "index_sha256"):
            _field(entry, key, path, where, str, required=False)
        if entry.get("index_bytes") is not None:
            _bounded(_field(entry, "index_bytes", path, where, int), 0, _MAX_BYTES, path, where + "index_bytes")
    if total != records:
        raise CorruptDatasetError(
            f"the shards hold {total} records in all, the manifest says {records}", file=path, field="records"
        )
    index = manifest.get("index", {})
    if not isinstance(index, dict):
        raise CorruptDatasetError(f"must be an object, not {show_name(index)}", file=path, field="index")
    for key in ("file", "checksum", "sha256"):
        _field(index, key, path, "index.", str, required=False)
    declared = index.get("record_checksum")
    if declared is not None and declared != RECORD_CHECKSUM:
        raise CorruptDatasetError(
            f"unknown per-record checksum {show_name(declared)} (this fastload knows {RECORD_CHECKSUM!r})",
            file=path,
            field="index.record_checksum",
        )
    return manifest


def read_manifest(folder: str) -> dict[str, Any]:
    """Load and check ``folder/fastload.json`` (:func:`validate_manifest`).

    Raises:
        UserError: Missing.
        CorruptDatasetError: Unreadable, damaged, or from a newer format version.
    """
    manifest = read_json_manifest(folder, MANIFEST_NAME, what="a fastload dataset", max_version=FORMAT_VERSION)
    return validate_manifest(manifest, os.path.join(folder, MANIFEST_NAME))
