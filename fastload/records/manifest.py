"""Read stage: the dataset manifest (``fastload.json``), the compact binary record index, and ``fastload info``.

``OUT/fastload.json`` describes a packed dataset (see :func:`build_manifest`); it is written last,
atomically, so its presence means every shard it lists is complete.

``OUT/fastload-index.npy`` is one numpy structured array with a row per record, in record order::

    offset       uint64   byte offset of the record in its .rec (LMDB: record number in the shard)
    id           uint64   record id (.idx key; im2rec: the .lst index)
    shard        uint32   position of the shard in ``manifest["shards"]``
    length       uint32   payload length (RecordIO: IRHeader + labels + image; LMDB: value length)
    data_offset  uint32   where the image bytes start inside the payload
    parts        uint32   0: stored whole (zero-copy); k > 1: split into k RecordIO parts
    labels       float32[label_width]

Opening a dataset reads this one file and the manifest; it never touches the shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from typing import Any, Dict, Optional

import numpy as np
import xxhash

from fastload.errors import UserError

__all__ = [
    "MANIFEST_NAME",
    "INDEX_NAME",
    "FORMAT_VERSION",
    "index_dtype",
    "empty_index",
    "write_index",
    "load_index",
    "write_json_atomic",
    "read_json_manifest",
    "read_manifest",
    "CHECKSUM",
    "Checksum",
    "checksum_bytes",
    "checksum_file",
    "recorded_checksum",
    "file_matches",
    "fsync_dir",
    "summarize",
    "info_main",
]

_UMASK = os.umask(0o022)
os.umask(_UMASK)

MANIFEST_NAME = "fastload.json"
INDEX_NAME = "fastload-index.npy"
FORMAT_VERSION = 2  # 2: XXH3-128 checksums (1: SHA-256, still read and verified)


def index_dtype(label_width: int) -> np.dtype:
    """The structured dtype of the binary index for ``label_width`` labels per record."""
    if label_width < 1:
        raise ValueError(f"label_width={label_width} must be >= 1")
    return np.dtype([("offset", "<u8"), ("id", "<u8"), ("shard", "<u4"), ("length", "<u4"),
                     ("data_offset", "<u4"), ("parts", "<u4"), ("labels", "<f4", (label_width,))])


def empty_index(n: int, label_width: int) -> np.ndarray:
    """A zeroed index of ``n`` rows."""
    return np.zeros(n, dtype=index_dtype(label_width))


def fsync_dir(path: str) -> None:
    """Make a rename or file creation inside ``path`` durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories
    finally:
        os.close(fd)


def _atomic_write(path: str, write) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; a dataset is meant to be shared
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def write_json_atomic(path: str, obj: Any, *, indent: Optional[int] = 2) -> None:
    """Write JSON to ``path`` through a fsynced temporary file and a rename.

    ``indent=None`` writes compact JSON with the C encoder (machine-read files with large lists).
    """
    data = (json.dumps(obj, indent=indent, sort_keys=False, separators=None if indent else (",", ":"))
            + "\n").encode("utf-8")
    _atomic_write(path, lambda f: f.write(data))


def write_index(path: str, index: np.ndarray) -> None:
    """Write the binary index atomically (``.npy``; deterministic bytes for equal contents)."""
    _atomic_write(path, lambda f: np.save(f, index, allow_pickle=False))


def load_index(path: str, label_width: int, records: int) -> np.ndarray:
    """Load and check the binary index.

    Raises:
        UserError: When the file is missing or does not match the manifest.
    """
    try:
        index = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{path}: the dataset's record index is missing") from None
    except ValueError as exc:
        raise UserError(f"{path}: unreadable record index ({exc})") from None
    if index.dtype != index_dtype(label_width) or index.shape != (records,):
        raise UserError(f"{path}: index holds {index.shape} {index.dtype}, manifest says {records} records "
                        f"with {label_width} labels")
    return index


CHECKSUM = "xxh3_128"  # what new manifests record for shards, .idx files and the record index


def _hasher(algo: str):
    if algo == "xxh3_128":
        return xxhash.xxh3_128()
    if algo == "sha256":  # format_version 1 manifests
        return hashlib.sha256()
    raise ValueError(f"unknown checksum algorithm {algo!r}")


class Checksum:
    """An incremental checksum whose ``value()`` is what manifests record: ``"<algo>:<hex>"``.

    XXH3-128 for new datasets: a 128-bit non-cryptographic hash, ample to catch corrupted or
    truncated shards, and ~25 GB/s against SHA-256's ~1.7 GB/s (with SHA instructions), which was
    a third of pass-through packing's time and most of ``fastload verify``'s.
    """

    __slots__ = ("algo", "_h")

    def __init__(self, algo: str = CHECKSUM) -> None:
        self.algo, self._h = algo, _hasher(algo)

    def update(self, data) -> None:
        self._h.update(data)

    def value(self) -> str:
        return f"{self.algo}:{self._h.hexdigest()}"


def checksum_bytes(data, algo: str = CHECKSUM) -> str:
    """``"<algo>:<hex>"`` of a bytes-like object."""
    c = Checksum(algo)
    c.update(data)
    return c.value()


def checksum_file(path: str, algo: str = CHECKSUM, chunk: int = 4 << 20) -> str:
    """``"<algo>:<hex>"`` of a file's contents."""
    c = Checksum(algo)
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return c.value()
            c.update(block)


def recorded_checksum(meta: Dict[str, Any], prefix: str = "") -> Optional[str]:
    """The checksum a manifest entry records under ``<prefix>checksum`` (``<prefix>sha256`` in v1)."""
    value = meta.get(prefix + "checksum")
    if value:
        return value
    legacy = meta.get(prefix + "sha256")
    return f"sha256:{legacy}" if legacy else None


def file_matches(path: str, recorded: Optional[str]) -> bool:
    """Whether a file's contents have the recorded ``"<algo>:<hex>"`` checksum (False when none is)."""
    if not recorded or ":" not in recorded:
        return False
    algo = recorded.split(":", 1)[0]
    try:
        return checksum_file(path, algo) == recorded
    except ValueError:  # an algorithm this fastload does not know
        return False


def read_json_manifest(folder: str, name: str, *, what: str, max_version: int) -> Dict[str, Any]:
    """Load ``folder/name`` (a JSON object with an int ``format_version``) for a reader.

    Args:
        folder: The dataset folder.
        name: The manifest's file name.
        what: What such a folder is, for the message when the manifest is missing.
        max_version: The newest ``format_version`` this fastload reads.

    Raises:
        UserError: Missing, unreadable, not an object, or from a newer format version.
    """
    path = os.path.join(folder, name)
    try:
        with open(path, "rb") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{folder}: no {name} (not {what}, or an unfinished pack)") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable manifest ({exc})") from None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int) or version > max_version:
        raise UserError(f"{path}: manifest format_version {version!r} is not supported "
                        f"(this fastload reads up to {max_version})")
    return manifest


def read_manifest(folder: str) -> Dict[str, Any]:
    """Load and sanity-check ``folder/fastload.json``.

    Raises:
        UserError: Missing, unreadable, or from a newer format version.
    """
    return read_json_manifest(folder, MANIFEST_NAME, what="a fastload dataset", max_version=FORMAT_VERSION)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def summarize(manifest: Dict[str, Any]) -> str:
    """A human-readable multi-line summary of a manifest."""
    shards = manifest.get("shards", [])
    total = sum(s.get("bytes", 0) for s in shards)
    counts = manifest.get("counts", {})
    lines = [
        f"name:          {manifest.get('name')}",
        f"format:        {manifest.get('format')} (manifest v{manifest.get('format_version')}, "
        f"fastload {manifest.get('fastload_version')})",
        f"records:       {manifest.get('records')}",
        f"shards:        {len(shards)} ({_human_bytes(total)})",
        f"label width:   {manifest.get('label_width')}",
    ]
    classes = manifest.get("classes")
    if classes:
        names = list(classes)
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} classes)" if len(names) > 8 else "")
        lines.append(f"classes:       {shown}")
    source = manifest.get("source", {})
    lines.append(f"source:        {source.get('kind')} {source.get('path')}")
    converted = counts.get("converted", {})
    lines.append(f"skipped:       {counts.get('skipped', 0)}")
    if converted:
        lines.append("converted:     " + ", ".join(f"{k} {v}" for k, v in sorted(converted.items())))
    lines.append(f"restart index: {'yes' if manifest.get('restart_index') else 'no'}")
    for s in shards[:20]:
        checksum = (recorded_checksum(s) or "no checksum")[:21]
        lines.append(f"  {s['file']}: {s['records']} records, {_human_bytes(s['bytes'])}, {checksum}")
    if len(shards) > 20:
        lines.append(f"  ... {len(shards) - 20} more shards")
    return "\n".join(lines)


def _engine_summary() -> Dict[str, Any]:
    try:
        from fastload.decode import engine_info
    except ImportError as exc:
        return {"backend": None, "error": f"the decode module is missing ({exc})"}
    return dict(engine_info())


def info_main(args) -> int:
    """``fastload info [PATH] [--json]``: the live decoder, or a dataset's manifest summary."""
    path: Optional[str] = getattr(args, "path", None)
    as_json = bool(getattr(args, "json", False))
    if path is None:
        info = _engine_summary()
        if as_json:
            print(json.dumps(info, indent=2, default=str))
        elif info.get("backend") is None:
            print(f"decoder: none: {info['error']}")
        else:
            print("decoder: " + ", ".join(f"{k}={v}" for k, v in info.items()))
        return 0
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file or directory")
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        manifest = read_manifest(path)
        if as_json:
            print(json.dumps(manifest, indent=2))
        else:
            print(summarize(manifest))
        return 0
    # A bare .rec, an LMDB shard or an image folder: describe what open_dataset sees.
    from fastload.records.dataset import open_dataset
    with open_dataset(path) as ds:
        desc = {"path": path, "kind": ds.kind, "records": len(ds), "label_width": ds.label_width,
                "shards": [s.name for s in ds.shards] if ds.shards else []}
    if as_json:
        print(json.dumps(desc, indent=2))
    else:
        sys.stdout.write("".join(f"{k + ':':<14} {v}\n" for k, v in desc.items()))
    return 0
