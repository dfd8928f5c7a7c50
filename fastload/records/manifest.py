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

Opening a dataset reads this one file and the manifest; it never touches the shards.

A pack builds the dataset in ``OUT/.fastload-staging/`` (:data:`STAGING_DIR`) and moves it into
place when complete.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from fastload.errors import UserError
from fastload.records.durable import atomic_write

__all__ = [
    "FORMAT_VERSION",
    "INDEX_NAME",
    "MANIFEST_NAME",
    "STAGING_DIR",
    "empty_index",
    "index_dtype",
    "load_index",
    "read_json_manifest",
    "read_manifest",
    "write_index",
]

MANIFEST_NAME = "fastload.json"
INDEX_NAME = "fastload-index.npy"
STAGING_DIR = ".fastload-staging"  # where `fastload pack` builds a dataset before moving it into place
FORMAT_VERSION = 2  # 2: XXH3-128 checksums (1: SHA-256, still read and verified)


def index_dtype(label_width: int) -> np.dtype:
    """The structured dtype of the binary index for ``label_width`` labels per record."""
    if label_width < 1:
        raise ValueError(f"label_width={label_width} must be >= 1")
    return np.dtype(
        [
            ("offset", "<u8"),
            ("id", "<u8"),
            ("shard", "<u4"),
            ("length", "<u4"),
            ("data_offset", "<u4"),
            ("parts", "<u4"),
            ("labels", "<f4", (label_width,)),
        ]
    )


def empty_index(n: int, label_width: int) -> np.ndarray:
    """A zeroed index of ``n`` rows."""
    return np.zeros(n, dtype=index_dtype(label_width))


def write_index(path: str, index: np.ndarray) -> None:
    """Write the binary index atomically (``.npy``; deterministic bytes for equal contents)."""
    atomic_write(path, lambda f: np.save(f, index, allow_pickle=False))


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
        raise UserError(
            f"{path}: index holds {index.shape} {index.dtype}, manifest says {records} records "
            f"with {label_width} labels"
        )
    return index


def read_json_manifest(folder: str, name: str, *, what: str, max_version: int) -> dict[str, Any]:
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
        raise UserError(
            f"{path}: manifest format_version {version!r} is not supported (this fastload reads up to {max_version})"
        )
    return manifest


def read_manifest(folder: str) -> dict[str, Any]:
    """Load and sanity-check ``folder/fastload.json``.

    Raises:
        UserError: Missing, unreadable, or from a newer format version.
    """
    return read_json_manifest(folder, MANIFEST_NAME, what="a fastload dataset", max_version=FORMAT_VERSION)
