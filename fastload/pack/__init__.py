"""Write stage: pack image folders, listings, WebDataset tars and parquet into RecordIO or LMDB shards.

The parts, from the top: ``packer`` (the driver, :func:`pack_folder`), ``options`` / ``result``,
``input_format`` (what SRC is), ``sources`` / ``listing_source`` (folder, ``.lst``, CSV, JSONL
input), ``stream_pack`` (tars and parquet, streamed: ``wds_source`` / ``tar_stream``,
``arrow_source``, ``read_ahead``, ``remote_read``, ``stream_sample``), ``sample_labels`` (label
rules), ``convert`` (check / convert one image), ``framing`` (the
engine's pass-through batches), ``restart`` (restart-marker transcoding), ``ordered_pool`` (the
converter threads), ``shard_writer`` (shard files), ``work_folder`` (lock, resume, final move),
``manifest_writer`` (index and manifest), ``progress``; ``arrays`` packs numpy arrays
(``fastload pack-arrays``).
"""

__all__ = ["PackOptions", "PackResult", "ShardFormat", "pack_folder"]


def __getattr__(name: str) -> object:
    # Lazy, so importing a sibling (e.g. fastload.pack.arrays) does not load the packer and numpy's
    # friends it needs.
    if name == "pack_folder":
        from fastload.pack.packer import pack_folder

        return pack_folder
    if name in ("PackOptions", "ShardFormat"):
        from fastload.pack import options

        return getattr(options, name)
    if name == "PackResult":
        from fastload.pack.result import PackResult

        return PackResult
    raise AttributeError(f"module 'fastload.pack' has no attribute {name!r}")
