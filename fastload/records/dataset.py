"""Read stage, entry point: :func:`open_dataset` picks the reader for a path.

Accepted inputs (see docs/ARCHITECTURE.md, "Records"):

- a fastload folder (``fastload.json`` + ``fastload-index.npy`` + RecordIO or LMDB shards);
- a bare ``.rec`` with its ``.idx`` beside it (or the ``.idx``), as MXNet's tools write it;
- one fastload LMDB shard directory (or its ``data.mdb``);
- an ImageFolder tree of class sub-folders (unpacked; see :mod:`fastload.records.imagefolder`);
- a packed dataset in object storage (``s3://``, ``gs://``, ``https://``, ...), read through the
  node's shard cache (:mod:`fastload.records.remote.dataset`); a cache folder or ``fastload copy``
  output whose shards are not all there yet opens the same way, from the URL it records.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastload.errors import UserError
from fastload.records.base import Dataset
from fastload.records.imagefolder import ImageFolderDataset
from fastload.records.lmdb_shard import is_lmdb_shard
from fastload.records.manifest import MANIFEST_NAME, WORK_DIR
from fastload.records.remote.dataset import CACHE_MARKER, is_remote_url, open_remote_dataset
from fastload.records.sharded import open_bare_rec, open_fastload_folder, open_lmdb_shard

__all__ = ["open_dataset"]


def _incomplete_cache(path: str) -> str | None:
    """The source URL of a cache folder (or a node-local copy) some of whose shards are missing, else None."""
    try:
        with open(os.path.join(path, CACHE_MARKER)) as f:
            source = json.load(f).get("source")
        with open(os.path.join(path, MANIFEST_NAME)) as f:
            shards = json.load(f).get("shards", [])
    except (OSError, ValueError, AttributeError):
        return None
    missing = any(not os.path.exists(os.path.join(path, str(s.get("file", "")))) for s in shards)
    return source if missing and isinstance(source, str) else None


def open_dataset(
    path: str | os.PathLike[str], *, idx_path: str | os.PathLike[str] | None = None, **remote: Any
) -> Dataset:
    """Open packed or unpacked records for reading.

    Args:
        path: A fastload dataset folder, a ``.rec`` (or its ``.idx``), a fastload LMDB shard
            directory, an ImageFolder tree, or the URL of a packed dataset in object storage.
        idx_path: For a ``.rec``: its ``.idx`` when it is not the one beside it (MXNet's
            ``path_imgidx`` may point anywhere).
        **remote: For URLs: ``storage_options``, ``cache_dir``, ``cache_limit``,
            ``prefetch_shards``, ``fetch_threads``, ``retry`` (see
            :func:`fastload.records.remote.dataset.open_remote_dataset`).

    Returns:
        A :class:`Dataset`; use it as a context manager or call ``close()``.

    Raises:
        UserError: The path does not exist or holds nothing fastload can read; remote options
            given for a local path.
        CorruptDatasetError: Damaged or unsafe metadata (manifest, index, ``.idx``, a path that
            leaves the dataset folder), naming the file and the field.
        CorruptRecordError: A shard that cannot be opened (missing, not a regular file, an LMDB
            file shorter than its meta page says), or a bare ``.rec`` whose framing breaks
            mid-file without an ``.idx``.
    """
    if is_remote_url(path):
        return open_remote_dataset(str(path), **remote)
    ds = _open_local(os.fspath(path), idx_path, remote)
    if ds._opened_by is None:  # (a partial cache, opened from its URL, has its own)
        ds._opened_by = (open_dataset, (_abs(path),), {"idx_path": _abs(idx_path)})
    return ds


def _abs(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else os.path.abspath(os.fspath(path))


def _open_local(path: str, idx_path: str | os.PathLike[str] | None, remote: dict[str, Any]) -> Dataset:
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file or directory")
    if idx_path is not None and os.path.isdir(path):
        raise UserError(f"{path}: an index file ({os.fspath(idx_path)}) can only be given for a .rec file")
    if os.path.isdir(path):
        source = _incomplete_cache(path)
        if source is not None:
            # A node's partial copy (`fastload copy --node-rank`, or a cache): the rest comes from the source.
            return open_remote_dataset(source, **{"cache_dir": path, **remote})
        if remote:
            raise UserError(
                f"{path}: {', '.join(sorted(remote))} only apply to remote datasets (s3://, gs://, https://...)"
            )
        if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
            return open_fastload_folder(path)
        if os.path.isdir(os.path.join(path, WORK_DIR)):
            raise UserError(
                f"{path}: unfinished pack (no {MANIFEST_NAME}); rerun the same `fastload pack` command to finish it"
            )
        if is_lmdb_shard(path):
            return open_lmdb_shard(path)
        return ImageFolderDataset(path)
    if remote:
        raise UserError(
            f"{path}: {', '.join(sorted(remote))} only apply to remote datasets (s3://, gs://, https://...)"
        )
    root, ext = os.path.splitext(path)
    if idx_path is not None:
        if ext != ".rec":
            raise UserError(f"{path}: an index file ({os.fspath(idx_path)}) can only be given for a .rec file")
        return open_bare_rec(path, os.fspath(idx_path))
    if ext == ".idx" and os.path.exists(root + ".rec"):
        return open_bare_rec(root + ".rec")
    if ext == ".rec":
        return open_bare_rec(path)
    if os.path.basename(path) == "data.mdb":
        return open_lmdb_shard(os.path.dirname(path) or ".")
    raise UserError(f"{path}: not a dataset folder, .rec/.idx, LMDB shard or image folder")
