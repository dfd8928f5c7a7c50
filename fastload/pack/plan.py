"""Write stage, what a pack will do, decided before any file is opened.

The dataset's name, the files refused from their ``stat``, the fixed shard edges and the
fingerprint that tells a resumable work folder from a stale one.

Shared by the local pack (:mod:`fastload.pack.packer`) and the Ray pack
(:mod:`fastload.pack.ray_engine`), so both plan the same pack for the same inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fastload.errors import OnError, UserError
from fastload.pack.convert_batch import max_file_bytes
from fastload.pack.options import PackOptions
from fastload.pack.restart import manifest_settings
from fastload.records.folder_tree import Source
from fastload.records.manifest import FORMAT_VERSION

__all__ = ["dataset_name", "fingerprint", "fixed_edges", "refuse_walk_skips", "stat_sources"]


def dataset_name(source: Source, options: PackOptions) -> str:
    """The shards' base name: ``--name``, else the source folder's (or ``.lst``'s) name made file-safe."""
    base = os.path.splitext(os.path.basename(os.path.normpath(source.path)))[0]
    return options.name or re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".") or "data"


def stat_sources(source: Source) -> tuple[list[tuple[int, int]], dict[str, str]]:
    """Every item's ``(size, mtime_ns)`` (``(0, 0)`` when it cannot be stat'ed) and the refused files.

    Files that must not be opened (not regular: a FIFO would block the open) or cannot be stored
    (larger than a record) are refused from their ``stat``, without an open: path -> reason, reported
    like any other bad file.
    """
    stats: list[tuple[int, int]] = []
    refused: dict[str, str] = {}
    limit = max_file_bytes(source.label_width)
    for item in source.items:
        try:
            st = os.stat(item.path)
            stats.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((0, 0))
            continue
        if not stat.S_ISREG(st.st_mode):
            refused[item.path] = "not a regular file (a FIFO, device, socket or folder): never opened"
        elif st.st_size > limit:
            refused[item.path] = f"file of {st.st_size} bytes is larger than the {limit}-byte record limit"
    return stats, refused


def refuse_walk_skips(source: Source, options: PackOptions) -> None:
    """With ``on_error="raise"``, the first file the folder walk skipped fails the pack.

    Raises:
        UserError: A skipped file under ``on_error="raise"``.
    """
    if source.skipped and options.on_error is OnError.RAISE:
        path, reason = source.skipped[0]
        raise UserError(f"{path}: {reason} (on_error='raise', --on-error fail)")


def fixed_edges(n: int, shards: int | None) -> list[int] | None:
    """Item boundaries for ``--shards N`` (None: cut by size while writing)."""
    if shards is None:
        return None
    k = min(shards, n)
    return [i * n // k for i in range(k + 1)]


def output_settings(options: PackOptions, name: str, source: str) -> dict[str, Any]:
    """The settings every pack's output depends on, whatever its input: part of its fingerprint."""
    return {
        "v": FORMAT_VERSION,
        "format": options.format.value,
        "resize": options.resize,
        "quality": options.quality,
        "name": name,
        "restart_index": options.restart_index,
        # The transcode settings change the bytes: shards from other settings are not reused.
        "restart": manifest_settings(options.restart_config()) if options.restart_index else None,
        "on_error": options.on_error.value,
        "source": source,
        "shards": options.shards,
        "shard_size": None if options.shards else options.shard_size,
        "max_pixels": options.max_pixels,
    }


def fingerprint(
    source: Source, order: NDArray[np.int64], stats: list[tuple[int, int]], options: PackOptions, name: str
) -> str:
    """What the pack's output depends on: settings, and every item's id, path, labels, size and mtime."""
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                **output_settings(options, name, source.path),
                "root": source.root,
                "walk_skipped": source.skipped,
            },
            sort_keys=True,
        ).encode()
    )
    for i in order.tolist():
        item = source.items[i]
        h.update(f"{item.id}\t{item.path}\t{item.labels}\t{stats[i][0]}\t{stats[i][1]}\n".encode("utf-8", "replace"))
    return h.hexdigest()
