"""Dataset files, durability: atomic, fsynced writes of the small files that describe a dataset.

A file is written under a temporary name in its destination folder, fsynced, renamed over the
destination and the folder fsynced, so a reader sees the old file or the new one, never a mix, and
a crash never leaves a half-written manifest. Temporary files and folders are created with the
process's umask applied by the kernel (as ``open`` does), not the private 0600/0700 of ``tempfile``:
a dataset is meant to be shared.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import IO, Any

__all__ = ["atomic_write", "fsync_dir", "make_temp_dir", "write_json_atomic"]

_ATTEMPTS = 100


def fsync_dir(path: str) -> None:
    """Make a rename or file creation inside ``path`` durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories
    finally:
        os.close(fd)


def _temp_name(folder: str, base: str, suffix: str) -> str:
    return os.path.join(folder, f".{base}.{os.urandom(6).hex()}{suffix}")


def atomic_write(path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """Write ``path`` through ``write(file)`` on a fsynced temporary file and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    for _ in range(_ATTEMPTS):
        tmp = _temp_name(folder, os.path.basename(path), ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{folder}: no free temporary name for {os.path.basename(path)}")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def write_json_atomic(path: str, obj: Any, *, indent: int | None = 2) -> None:
    """Write JSON to ``path`` through a fsynced temporary file and a rename.

    ``indent=None`` writes compact JSON with the C encoder (machine-read files with large lists).
    """
    data = (json.dumps(obj, indent=indent, sort_keys=False, separators=None if indent else (",", ":")) + "\n").encode(
        "utf-8"
    )
    atomic_write(path, lambda f: f.write(data))


def make_temp_dir(parent: str, base: str) -> str:
    """A new, empty folder ``parent/.<base>.<random>.tmp`` (to be renamed into place when complete)."""
    for _ in range(_ATTEMPTS):
        path = _temp_name(parent, base, ".tmp")
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{parent}: no free temporary name for {base}")
