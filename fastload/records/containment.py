"""Read stage, containment: every file a dataset's metadata names resolves inside the dataset folder.

A manifest (``fastload.json``, ``fastload-arrays.json``, or one in a pack's work folder) or a resume
sidecar names its shards, ``.idx`` files and index by path relative to its folder. Those names are untrusted
input: :func:`contained_path` refuses, with a :class:`~fastload.errors.CorruptDatasetError` naming
the file and the field, an absolute path (``/proc/self/mem``), any ``..`` component, an empty
name or one with a NUL byte, and a name that leaves the folder once symlinks are resolved.

Symlinks: the dataset folder itself may be a symlink (containment is checked against its resolved
path), and so may a shard inside it, as long as its target is inside the folder too. A shard that
is a symlink to a file *outside* the folder is refused like an absolute path in the manifest:
otherwise whoever can write one symlink into a dataset folder could make every reader (and
``fastload verify``, which would report the foreign file as checked) read any file the user can.
To assemble a dataset from several disks, link or mount the whole dataset folder instead.

:func:`open_regular` opens such a file for reading without ever blocking: a FIFO or device named
like a manifest, index or ``.idx`` is refused, not waited on.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from fastload.errors import CorruptDatasetError

__all__ = ["contained_path", "open_regular", "show_name"]

_SHOWN = 120  # characters of an untrusted name quoted in a message


def show_name(name: object) -> str:
    """An untrusted name for an error message: its ``repr``, cut to a readable length."""
    text = repr(name)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def contained_path(folder: str, name: object, *, source: str, field: str) -> str:
    """The path of ``name`` inside ``folder``, after checking it cannot lead out of it.

    Args:
        folder: The dataset folder.
        name: The relative path the metadata gives (untrusted: any JSON value).
        source: The file that named it (for the message).
        field: Where in that file (e.g. ``"shards[3].file"``).

    Returns:
        ``folder/name`` with symlinks resolved (the path that was checked, so the one to open).

    Raises:
        CorruptDatasetError: ``name`` is not a non-empty string, is absolute, has a ``..`` component
            or a NUL byte, or resolves (through symlinks) outside ``folder``.
    """
    if not isinstance(name, str) or not name:
        raise CorruptDatasetError(f"must be a non-empty relative path, not {show_name(name)}", file=source, field=field)
    if "\0" in name:
        raise CorruptDatasetError("path contains a NUL byte", file=source, field=field)
    if os.path.isabs(name):
        raise CorruptDatasetError(
            f"absolute path {show_name(name)} refused: dataset files must be inside the dataset folder",
            file=source,
            field=field,
        )
    if ".." in name.replace("\\", "/").split("/"):
        raise CorruptDatasetError(
            f"path {show_name(name)} refused: '..' would leave the dataset folder", file=source, field=field
        )
    root = os.path.realpath(folder)
    resolved = os.path.realpath(os.path.join(root, name))
    if resolved != root and not resolved.startswith(root.rstrip(os.sep) + os.sep):
        raise CorruptDatasetError(
            f"{show_name(name)} resolves outside the dataset folder (a symlink to {show_name(resolved)}); "
            "dataset files must be inside it",
            file=source,
            field=field,
        )
    if resolved == root:
        raise CorruptDatasetError(f"{show_name(name)} names the dataset folder itself", file=source, field=field)
    return resolved


def open_regular(path: str) -> BinaryIO:
    """Open ``path`` for binary reading, only if it is a regular file, without blocking.

    ``O_NONBLOCK`` makes the open of a FIFO return at once; ``fstat`` on the descriptor then
    refuses anything but a regular file.

    Raises:
        OSError: The file cannot be opened (``FileNotFoundError`` when missing), or ``EINVAL`` when
            it is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return open(fd, "rb", buffering=1 << 16)
    except BaseException:
        os.close(fd)
        raise
