"""Write stage, the work folder: the lock, the resume protocol and the final move of a pack into OUT.

How a pack survives being killed at any moment:

1. Everything is built in the pack's work folder, ``OUT/.fastload-staging/``
   (:data:`fastload.folder.WORK_DIR`). ``plan.json`` there holds a fingerprint of the input (paths,
   sizes, mtimes, labels) and of the options that change the bytes.
2. Each shard is written under a ``.partial`` name, fsynced, renamed, and only then gets its sidecar
   ``<shard>.done.json`` (sizes, checksums, its index rows, skipped files). A rerun with the same
   fingerprint keeps every shard whose sidecar matches the files on disk and rewrites the rest.
3. When all shards are done, the index and ``fastload.json`` are written into the work folder, then moved
   into OUT: shards first, the manifest last (an older dataset's manifest is set aside first, so OUT
   never looks complete while it mixes two datasets), and the work folder is removed.

Two packs never write the same OUT: :func:`exclusive` holds an ``flock`` on the folder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastload.checksum import file_matches, recorded_checksum
from fastload.errors import CorruptDatasetError, UserError
from fastload.records.containment import contained_path, show_name
from fastload.records.durable import fsync_dir, write_json_atomic
from fastload.records.manifest import INDEX_NAME, MANIFEST_NAME, WORK_DIR, read_manifest
from fastload.version import __version__

__all__ = [
    "PARTIAL",
    "USER_WRITE_ERRNOS",
    "ShardDone",
    "discard_from",
    "exclusive",
    "finalize",
    "fsync_file",
    "load_done",
    "prepare_out",
    "remove",
    "write_done",
    "write_error",
]

log = logging.getLogger("fastload.pack")

PLAN = "plan.json"
DONE = ".done.json"
PARTIAL = ".partial"
OLD_MANIFEST = "old-" + MANIFEST_NAME
USER_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
_ROW_KEYS = {"offset", "id", "length", "data_offset", "parts", "labels", "checksum"}


@dataclass
class ShardDone:
    """A shard that is complete in the work folder: its manifest entry, index rows, skips and counts.

    Attributes:
        work_dir: The work folder holding it.
        number: Its position among the shards.
        start: First source item (in pack order) it covers.
        end: One past the last source item it covers (skipped files included).
        entry: Its entry in the manifest's ``shards`` list.
        rows: Index columns of its records (``offset``, ``id``, ``length``, ``data_offset``, ``parts``, ``labels``).
        skipped: ``(path, reason)`` of the files left out.
        kinds: Stored images per conversion kind.
        bytes_in: Source bytes read.
        cursor: For a streamed input (tars, parquet), where reading goes on after ``end``, and the
            label state there (:mod:`fastload.pack.stream_pack`); None for listed input.
    """

    work_dir: str
    number: int
    start: int
    end: int
    entry: dict[str, Any]
    rows: dict[str, list[Any]]
    skipped: list[tuple[str, str]]
    kinds: dict[str, int]
    bytes_in: int
    cursor: dict[str, Any] | None = None


def write_error(exc: OSError, path: str) -> UserError:
    """The one-line :class:`UserError` for an output write that failed for a reason the user can fix."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UserError(f"no space left on device while writing {path}")
    return UserError(f"cannot write {path}: {exc.strerror or exc}")


def fsync_file(path: str) -> None:
    """Make a file's contents durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: str) -> None:
    """Remove a file, a symlink or a folder tree, if there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _shard_files(entry: dict[str, Any]) -> list[str]:
    return [entry["file"]] + ([entry["index_file"]] if entry.get("index_file") else [])


def _data_file(folder: str, entry: dict[str, Any]) -> str:
    path = os.path.join(folder, entry["file"])
    return os.path.join(path, "data.mdb") if entry["file"].endswith(".lmdb") else path


def load_done(work_dir: str, number: int, file: str, start: int, edges: list[int] | None) -> ShardDone | None:
    """A completed shard's sidecar, if it exists, starts at ``start`` and matches the files on disk."""
    try:
        with open(os.path.join(work_dir, file + DONE), "rb") as f:
            meta = json.load(f)
        entry = meta["entry"]
        first, end = meta["range"]
        if entry["file"] != file or first != start or (edges is not None and end != edges[number + 1]):
            return None
        # Only the names this pack would give (never a path out of the work folder), and rows with the
        # per-record checksums of this format version.
        if entry.get("index_file") not in (None, os.path.splitext(file)[0] + ".idx"):
            return None
        if set(meta["rows"]) != _ROW_KEYS or len({len(v) for v in meta["rows"].values()}) != 1:
            return None
        data = _data_file(work_dir, entry)
        if os.path.getsize(data) != entry["bytes"] or not file_matches(data, recorded_checksum(entry)):
            return None
        if entry.get("index_file"):
            idx = os.path.join(work_dir, entry["index_file"])
            if os.path.getsize(idx) != entry["index_bytes"] or not file_matches(
                idx, recorded_checksum(entry, "index_")
            ):
                return None
        return ShardDone(
            work_dir,
            number,
            first,
            end,
            entry,
            meta["rows"],
            [tuple(x) for x in meta["skipped"]],
            meta["kinds"],
            meta["bytes_in"],
            meta.get("cursor"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def discard_from(work_dir: str, name: str, number: int) -> None:
    """Remove shards (and sidecars, partial files) numbered ``number`` and up: they will be rewritten."""
    pattern = re.compile(re.escape(name) + r"-(\d{5,})\.")
    for entry in os.listdir(work_dir):
        m = pattern.match(entry)
        if m and int(m.group(1)) >= number:
            remove(os.path.join(work_dir, entry))


def write_done(done: ShardDone) -> None:
    """Write the sidecar that marks ``done``'s shard complete (after the shard is durable in place)."""
    write_json_atomic(
        os.path.join(done.work_dir, done.entry["file"] + DONE),
        {
            "entry": done.entry,
            "range": [done.start, done.end],
            "rows": done.rows,
            "skipped": done.skipped,
            "kinds": done.kinds,
            "bytes_in": done.bytes_in,
            **({"cursor": done.cursor} if done.cursor is not None else {}),
        },
        indent=None,
    )  # rows: compact, C encoder


@contextlib.contextmanager
def exclusive(out: str) -> Iterator[None]:
    """Create OUT and hold an exclusive lock on it, so two packs never write the same folder.

    ``flock`` on the directory itself: nothing is left behind, and the kernel drops the lock when
    the process dies (kill -9 included).
    """
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"{out}: exists and is not a folder")
    try:
        os.makedirs(out, exist_ok=True)
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise UserError(f"{out}: cannot create the output folder ({exc.strerror or exc})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{out}: another fastload pack is writing to this folder") from None
        yield
    finally:
        os.close(fd)


def prepare_out(out: str, *, overwrite: bool, fingerprint: str) -> tuple[str, bool]:
    """Check OUT, set up the work folder. Returns ``(work_dir, up_to_date)``."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"{out}: exists and is not a folder")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create the output folder ({exc.strerror or exc})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"{out}: the output folder is not writable")
    work_dir = os.path.join(out, WORK_DIR)
    manifest_path = os.path.join(out, MANIFEST_NAME)
    plan_path = os.path.join(work_dir, PLAN)
    work_plan = None
    if os.path.isdir(work_dir):
        try:
            with open(plan_path, "rb") as f:
                work_plan = json.load(f).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            work_plan = None
    if work_plan not in (None, fingerprint) and os.path.isfile(os.path.join(work_dir, MANIFEST_NAME)):
        # A complete dataset from another command was being moved into place when that run died:
        # finish the move first, so it is never lost, then treat it as the dataset OUT holds.
        try:
            finalize(out, work_dir)
        except OSError as exc:
            raise write_error(exc, out) from None
        work_plan = None
    has_dataset = os.path.isfile(manifest_path)
    if has_dataset:
        try:
            current = read_manifest(out)
        except (UserError, CorruptDatasetError):  # a damaged dataset in OUT: replaced with --overwrite
            current = {}
        if (
            not overwrite
            and current.get("plan") == fingerprint
            and work_plan in (None, fingerprint)
            and not os.path.isfile(os.path.join(work_dir, MANIFEST_NAME))
        ):
            shutil.rmtree(work_dir, ignore_errors=True)  # leftovers of a run killed after its manifest landed
            return work_dir, True
        if not overwrite:
            raise UserError(
                f"{out} already holds a dataset ({current.get('records', '?')} records); pass --overwrite to replace it"
            )
    if (work_plan is not None and work_plan != fingerprint) or (os.path.isdir(work_dir) and work_plan is None):
        # An unfinished pack of other inputs or options: only partial work, no complete dataset, is lost.
        log.warning("discarding an unfinished pack in %s made from other inputs or options", work_dir)
        shutil.rmtree(work_dir)
        work_plan = None
    try:
        os.makedirs(work_dir, exist_ok=True)
        if work_plan is None:
            write_json_atomic(plan_path, {"fingerprint": fingerprint, "fastload_version": __version__})
    except OSError as exc:
        if exc.errno in USER_WRITE_ERRNOS:
            raise write_error(exc, work_dir) from None
        raise
    return work_dir, False


def finalize(out: str, work_dir: str) -> dict[str, Any]:
    """Move the complete dataset built in ``work_dir`` into OUT, replacing any older one; returns its manifest."""
    built = os.path.join(work_dir, MANIFEST_NAME)
    new_files = {INDEX_NAME}
    try:
        with open(built, "rb") as f:
            manifest = json.load(f)
        for entry in manifest["shards"]:
            new_files.update(_shard_files(entry))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise CorruptDatasetError(
            "damaged manifest in the work folder (its shard list cannot be read); remove the work folder or pack with "
            "--overwrite",
            file=built,
            field="shards",
        ) from None
    for name in new_files:  # a damaged manifest there must not move files from or to elsewhere
        contained_path(work_dir, name, source=built, field="shards")
        if os.path.basename(name) != name:
            raise CorruptDatasetError(f"{show_name(name)} is not a plain file name", file=built, field="shards")
    old_path = os.path.join(out, MANIFEST_NAME)
    set_aside = os.path.join(work_dir, OLD_MANIFEST)
    if os.path.isfile(old_path):
        os.replace(old_path, set_aside)  # from here on OUT does not look complete until the new manifest lands
        fsync_dir(out)
    for name in sorted(new_files):
        src = os.path.join(work_dir, name)
        if os.path.lexists(src):
            dst = os.path.join(out, name)
            if os.path.isdir(src):
                remove(dst)
            os.replace(src, dst)
    if os.path.isfile(set_aside):
        try:
            with open(set_aside, "rb") as f:
                old = json.load(f)
            stale = {n for e in old.get("shards", []) for n in _shard_files(e)}
            stale.add(old.get("index", {}).get("file", INDEX_NAME))
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            stale = set()  # a damaged old manifest: its files are left where they are
        for name in stale - new_files:
            if isinstance(name, str) and name not in ("", ".", "..") and os.path.basename(name) == name:  # inside OUT
                remove(os.path.join(out, name))
    fsync_dir(out)
    os.replace(os.path.join(work_dir, MANIFEST_NAME), os.path.join(out, MANIFEST_NAME))
    fsync_dir(out)
    shutil.rmtree(work_dir, ignore_errors=True)
    return manifest
