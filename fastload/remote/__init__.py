"""Remote storage stage: object-store datasets (S3, GCS, Azure, HTTP) read through a per-node shard cache.

- :mod:`~fastload.remote.storage`: the storage client (obstore), settings from storage_options,
  the standard environment variables and the ``~/.aws`` files;
- :mod:`~fastload.remote.fetch`: checksum-verified, retried downloads into a local file;
- :mod:`~fastload.remote.cache`: the per-node cache folder shared by the ranks (locks, eviction);
- :mod:`~fastload.remote.dataset`: :func:`open_remote_dataset`, the dataset that reads through it.
"""

from fastload.remote.storage import RemoteError, RemoteNotFound, RemoteStore, is_remote_url

__all__ = ["RemoteError", "RemoteNotFound", "RemoteStore", "is_remote_url", "open_remote_dataset"]


def open_remote_dataset(url, **kwargs):
    """See :func:`fastload.remote.dataset.open_remote_dataset` (imported on first use)."""
    from fastload.remote.dataset import open_remote_dataset as _open

    return _open(url, **kwargs)
