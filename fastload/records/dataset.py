"""Read stage, entry point: :func:`open_dataset` picks the reader for a path.

Accepted inputs (see docs/ARCHITECTURE.md, "Records"):

- a fastload folder (``fastload.json`` + ``fastload-index.npy`` + RecordIO or LMDB shards);
- a bare ``.rec`` with its ``.idx`` beside it (or the ``.idx``), as MXNet's tools write it;
- one fastload LMDB shard directory (or its ``data.mdb``);
- an ImageFolder tree of class sub-folders (unpacked; see :mod:`fastload.records.imagefolder`).
"""

from __future__ import annotations

import os

from fastload.errors import UserError
from fastload.records.base import Dataset
from fastload.records.imagefolder import ImageFolderDataset
from fastload.records.lmdb_shard import is_lmdb_shard
from fastload.records.manifest import MANIFEST_NAME, STAGING_DIR
from fastload.records.sharded import open_bare_rec, open_fastload_folder, open_lmdb_shard

__all__ = ["open_dataset"]


def open_dataset(path: str | os.PathLike) -> Dataset:
    """Open packed or unpacked records for reading.

    Args:
        path: A fastload dataset folder, a ``.rec`` (or its ``.idx``), a fastload LMDB shard
            directory, or an ImageFolder tree.

    Returns:
        A :class:`Dataset`; use it as a context manager or call ``close()``.

    Raises:
        UserError: The path does not exist or holds nothing fastload can read.
        CorruptDatasetError: Damaged or unsafe metadata (manifest, index, ``.idx``, a path that
            leaves the dataset folder), naming the file and the field.
        CorruptRecordError: A shard that cannot be opened (missing, not a regular file, an LMDB
            file shorter than its meta page says), or a bare ``.rec`` whose framing breaks
            mid-file without an ``.idx``.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file or directory")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
            return open_fastload_folder(path)
        if os.path.isdir(os.path.join(path, STAGING_DIR)):
            raise UserError(
                f"{path}: unfinished pack (no {MANIFEST_NAME}); rerun the same `fastload pack` command to finish it"
            )
        if is_lmdb_shard(path):
            return open_lmdb_shard(path)
        return ImageFolderDataset(path)
    root, ext = os.path.splitext(path)
    if ext == ".idx" and os.path.exists(root + ".rec"):
        return open_bare_rec(root + ".rec")
    if ext == ".rec":
        return open_bare_rec(path)
    if os.path.basename(path) == "data.mdb":
        return open_lmdb_shard(os.path.dirname(path) or ".")
    raise UserError(f"{path}: not a dataset folder, .rec/.idx, LMDB shard or image folder")
