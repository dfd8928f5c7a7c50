"""Write stage, the dataset's description: the binary record index and ``fastload.json``.

Both are built from the completed shards and written into the work folder: the last files of a pack.
"""

from __future__ import annotations

import collections
import os
import time
from collections import Counter
from typing import Any

import numpy as np

from fastload.checksum import checksum_file
from fastload.errors import UserError
from fastload.pack.convert import NOT_INDEXED
from fastload.pack.options import PackOptions
from fastload.pack.restart import manifest_settings
from fastload.pack.work_folder import USER_WRITE_ERRNOS, ShardDone, write_error
from fastload.records.durable import write_json_atomic
from fastload.records.folder_tree import Source
from fastload.records.manifest import (
    FORMAT_VERSION,
    INDEX_NAME,
    MANIFEST_NAME,
    RECORD_CHECKSUM,
    empty_index,
    write_index,
)
from fastload.version import __version__

__all__ = ["write_dataset_files"]


def write_dataset_files(
    work_dir: str,
    source: Source,
    options: PackOptions,
    name: str,
    fingerprint: str,
    done: list[ShardDone],
    source_extra: dict[str, Any] | None = None,
) -> None:
    """The binary index, then the manifest, into the work folder.

    ``source_extra``: more about the input for the manifest's ``source`` entry (a streamed input's
    files, keys or columns).
    """
    width = source.label_width
    total = sum(len(d.rows["id"]) for d in done)
    found = (done[-1].end if done else 0) + len(source.skipped)
    index = empty_index(total, width, checksums=True)
    pos = 0
    shards: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = list(source.skipped)  # what the folder walk refused (never opened)
    kinds: Counter[str] = collections.Counter()
    for d in done:
        n = len(d.rows["id"])
        sl = slice(pos, pos + n)
        index["shard"][sl] = d.number
        for key in ("offset", "id", "length", "data_offset", "parts", "checksum"):
            index[key][sl] = np.asarray(d.rows[key], dtype=np.uint64)
        if n:
            index["labels"][sl] = np.asarray(d.rows["labels"], dtype=np.float32).reshape(n, width)
        pos += n
        entry = dict(d.entry.items())
        if options.restart_index:  # which of this shard's records carry restart markers
            entry["restart_index"] = {
                "images": n - d.kinds.get(NOT_INDEXED, 0),
                "verified": options.restart_config().verify.value,
            }
        shards.append(entry)
        skipped.extend(d.skipped)
        kinds.update(d.kinds)
    if total == 0:
        what = "files" if source.kind in ("folder", "lst", "csv", "jsonl") else "entries"
        raise UserError(f"{source.path}: none of the {found} {what} is a decodable image; nothing was written")
    written = total
    try:
        write_index(os.path.join(work_dir, INDEX_NAME), index)
        converted = {k: v for k, v in sorted(kinds.items()) if k not in ("pass", NOT_INDEXED)}
        manifest = {
            "format_version": FORMAT_VERSION,
            "fastload_version": __version__,
            "format": options.format.value,
            "name": name,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "records": written,
            "label_width": width,
            "classes": source.classes,
            "source": {"kind": source.kind, "path": source.path, "root": source.root, **(source_extra or {})},
            "options": {
                "format": options.format.value,
                "shards": options.shards,
                "shard_size": options.shard_size if options.shards is None else None,
                "resize": options.resize,
                "quality": options.quality,
                "shuffle": options.shuffle,
                "seed": options.seed,
                "on_error": options.on_error.value,
                "restart_index": options.restart_index,
            },
            "shards": shards,
            "index": {
                "file": INDEX_NAME,
                "checksum": checksum_file(os.path.join(work_dir, INDEX_NAME)),
                "record_checksum": RECORD_CHECKSUM,
            },
            "counts": {
                "found": found,
                "written": written,
                "skipped": len(skipped),
                "converted": converted,
                "passed_through": kinds.get("pass", 0),
                "ignored_non_image_files": len(source.ignored),
                "not_restart_indexed": kinds.get(NOT_INDEXED, 0),
            },
            "skipped": [{"path": p, "reason": r} for p, r in skipped],
            "ignored": source.ignored[:1000],
            # Set when the engine's lossless restart-marker transcoder ran over the images.
            "restart_index": dict(
                manifest_settings(options.restart_config()), images=written - kinds.get(NOT_INDEXED, 0)
            )
            if options.restart_index
            else None,
            "plan": fingerprint,
        }
        write_json_atomic(os.path.join(work_dir, MANIFEST_NAME), manifest)
    except OSError as exc:
        if exc.errno in USER_WRITE_ERRNOS:
            raise write_error(exc, work_dir) from None
        raise
