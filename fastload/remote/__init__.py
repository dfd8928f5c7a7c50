"""Remote storage stage: object stores (S3, GCS, Azure, HTTP) and the per-node cache of their shards.

- :mod:`~fastload.remote.storage`: the storage client (obstore), settings from ``storage_options``,
  the standard environment variables and the ``~/.aws`` files;
- :mod:`~fastload.remote.fetch`: checksum-verified, retried downloads into a local file;
- :mod:`~fastload.remote.cache`: the per-node cache folder the ranks share (locks, eviction).

The dataset that reads through them is :mod:`fastload.records.remote_dataset`
(``fastload.open_dataset("s3://...")``).
"""

from fastload.remote.storage import RemoteError, RemoteNotFound, RemoteStore, is_remote_url

__all__ = ["RemoteError", "RemoteNotFound", "RemoteStore", "is_remote_url"]
