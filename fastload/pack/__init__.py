"""Write stage: pack image folders and im2rec lists into RecordIO or LMDB shards (``fastload pack``)."""

__all__ = ["pack_folder", "PackOptions", "PackResult"]


def __getattr__(name):
    # Lazy, so importing a sibling (e.g. fastload.pack.arrays for the CLI) does not load the packer.
    if name in __all__:
        from fastload.pack import packer
        return getattr(packer, name)
    raise AttributeError(f"module 'fastload.pack' has no attribute {name!r}")
