"""Write stage: pack image folders and im2rec lists into RecordIO or LMDB shards (``fastload pack``)."""

from fastload.pack.packer import PackOptions, PackResult, pack_folder

__all__ = ["pack_folder", "PackOptions", "PackResult"]
