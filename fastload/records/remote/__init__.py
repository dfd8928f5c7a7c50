"""Read stage, remote: datasets in object storage and node-local copies, for training on many nodes.

- :mod:`~fastload.records.remote.storage`: the storage client (obstore), settings from
  ``storage_options``, the standard environment variables and the ``~/.aws`` files;
- :mod:`~fastload.records.remote.spawned`: storage calls of a forked process, run by a spawned helper;
- :mod:`~fastload.records.remote.fetch`: checksum-verified, retried downloads into a local file;
- :mod:`~fastload.records.remote.cache`: the per-node cache folder the ranks share (locks, eviction);
- :mod:`~fastload.records.remote.dataset`: the dataset that reads through them
  (``fastload.open_dataset("s3://...")``);
- :mod:`~fastload.records.remote.node_copy`: ``fastload copy``, a dataset or one node's share of
  its shards copied to node-local storage.

The pack's side of object storage (an ``s3://`` SRC or OUT) is :mod:`fastload.pack.remote_io`. The
dataset's and the copy's names load on first use: the transport (what a spawned helper process
imports) stays free of the readers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastload.records.remote.storage import RemoteError, RemoteNotFound, RemoteStore, is_remote_url

if TYPE_CHECKING:
    from fastload.records.remote.dataset import RemoteDataset, open_remote_dataset
    from fastload.records.remote.node_copy import CopyOptions, CopyResult, copy_dataset, node_from_env

__all__ = [
    "CopyOptions",
    "CopyResult",
    "RemoteDataset",
    "RemoteError",
    "RemoteNotFound",
    "RemoteStore",
    "copy_dataset",
    "is_remote_url",
    "node_from_env",
    "open_remote_dataset",
]


def __getattr__(name: str) -> Any:
    if name in ("RemoteDataset", "open_remote_dataset"):
        from fastload.records.remote import dataset

        return getattr(dataset, name)
    if name in ("CopyOptions", "CopyResult", "copy_dataset", "node_from_env"):
        from fastload.records.remote import node_copy

        return getattr(node_copy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
