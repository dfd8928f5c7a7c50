"""Write stage, what SRC is: the input formats ``fastload pack`` reads, and how one is detected.

``folder`` and ``lst`` are listed up front (every image is a file); ``csv`` and ``jsonl`` listings
too (:mod:`fastload.pack.listing_source`). ``wds`` (WebDataset tar shards), ``parquet`` and
``hf-disk`` (a folder written by ``datasets.Dataset.save_to_disk``) hold the image bytes
themselves and are streamed (:mod:`fastload.pack.stream_pack`).

Detection, when ``--input-format`` is not given:

- a brace pattern (``train-{000000..000146}.tar``), or a path or URL ending in ``.tar``
  (``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``): ``wds``; ending in ``.parquet``: ``parquet``;
  ``.csv``: ``csv``; ``.jsonl`` / ``.ndjson``: ``jsonl``; any other file: ``lst``;
- a folder (or URL prefix) holding ``dataset_dict.json`` or ``state.json``: ``hf-disk``; ``.tar``
  files at its top: ``wds``; ``.parquet`` files (at any depth): ``parquet``; otherwise ``folder``.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from typing import Any

from fastload.errors import UserError

__all__ = [
    "LISTED",
    "STREAMED",
    "TAR_SUFFIXES",
    "InputFormat",
    "detect_format",
    "has_braces",
    "is_tar_name",
]

#: Names of WebDataset shards (plain or compressed tars).
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


class InputFormat(str, enum.Enum):
    """What ``fastload pack`` reads from SRC (``--input-format``)."""

    FOLDER = "folder"
    LST = "lst"
    WDS = "wds"
    PARQUET = "parquet"
    HF_DISK = "hf-disk"
    CSV = "csv"
    JSONL = "jsonl"


#: Formats whose images are files named by a listing or a folder walk (known up front).
LISTED = frozenset({InputFormat.FOLDER, InputFormat.LST, InputFormat.CSV, InputFormat.JSONL})
#: Formats that hold the image bytes and are read front to back (:mod:`fastload.pack.stream_pack`).
STREAMED = frozenset({InputFormat.WDS, InputFormat.PARQUET, InputFormat.HF_DISK})

_HF_MARKERS = ("dataset_dict.json", "state.json")


def is_tar_name(name: str) -> bool:
    """Whether ``name`` ends like a (possibly compressed) tar file."""
    return name.lower().endswith(TAR_SUFFIXES)


def has_braces(src: str) -> bool:
    """Whether ``src`` is a brace pattern such as ``train-{000..099}.tar``."""
    return "{" in src and "}" in src.split("{", 1)[1]


def _by_name(name: str) -> InputFormat | None:
    low = name.lower().rstrip("/")
    if is_tar_name(low):
        return InputFormat.WDS
    if low.endswith(".parquet"):
        return InputFormat.PARQUET
    if low.endswith(".csv"):
        return InputFormat.CSV
    if low.endswith((".jsonl", ".ndjson")):
        return InputFormat.JSONL
    return None


def _local_folder(path: str) -> InputFormat:
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot list the folder ({exc.strerror or exc})") from None
    if any(n in names for n in _HF_MARKERS):
        return InputFormat.HF_DISK
    if any(is_tar_name(n) and os.path.isfile(os.path.join(path, n)) for n in names):
        return InputFormat.WDS
    for _dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if any(f.lower().endswith(".parquet") for f in filenames):
            return InputFormat.PARQUET
    return InputFormat.FOLDER


def _remote_prefix(url: str, storage_options: Mapping[str, Any] | None) -> InputFormat:
    from fastload.records.remote.storage import RemoteStore

    keys = [obj.key for obj in RemoteStore(url, storage_options).list()]
    if any(k in _HF_MARKERS or k.endswith("/dataset_dict.json") for k in keys):
        return InputFormat.HF_DISK
    if any("/" not in k and is_tar_name(k) for k in keys):
        return InputFormat.WDS
    if any(k.lower().endswith(".parquet") for k in keys):
        return InputFormat.PARQUET
    return InputFormat.FOLDER


def detect_format(src: str, storage_options: Mapping[str, Any] | None = None) -> InputFormat:
    """The input format of ``src`` (see the module docstring for the rules).

    Raises:
        UserError: A local path that does not exist.
    """
    from fastload.records.remote.storage import is_remote_url

    src = os.fspath(src)
    by_name = _by_name(src)
    if has_braces(src):
        return by_name or InputFormat.WDS
    if is_remote_url(src):
        return by_name or _remote_prefix(src, storage_options)
    if not os.path.exists(src):
        raise UserError(f"{src}: no such file or directory")
    if os.path.isdir(src):
        return _local_folder(src)
    return by_name or InputFormat.LST
