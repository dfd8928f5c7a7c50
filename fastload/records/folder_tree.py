"""Read stage, unpacked input: walk a class-folder tree into ordered, labelled image files.

Class folders follow torchvision's ``ImageFolder``: every sub-folder of the root is a class (hidden
ones, starting with ".", excepted), label = position of its name in the sorted list, images found
recursively (symlinks followed, each directory once) in sorted order with an image extension
(case-insensitive); only regular files are listed (see :func:`scan_folder`).
:class:`fastload.records.imagefolder.ImageFolderDataset` serves such a tree as records;
``fastload pack`` (:mod:`fastload.pack.sources`) packs it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fastload.errors import UserError

__all__ = ["IMG_EXTENSIONS", "Source", "SourceItem", "read_regular_file", "scan_folder"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class SourceItem:
    """One input image.

    Attributes:
        id: Record id (folder: position in the sorted walk; ``.lst``: its index column).
        path: Absolute path of the file (for an entry of a tar or parquet file: where it is in it).
        labels: The record's labels.
        origin: Where the item was listed, when that is not the path itself (a CSV / JSONL
            listing's ``list.csv line 7``), for messages.
    """

    id: int
    path: str
    labels: tuple[float, ...]
    origin: str = ""

    @property
    def shown(self) -> str:
        """How messages and the manifest's ``skipped`` list name the item: its path, and its origin."""
        return f"{self.path} ({self.origin})" if self.origin else self.path


@dataclass(frozen=True)
class Source:
    """Everything a pack needs to know about its input.

    Attributes:
        kind: The input format (``"folder"``, ``"lst"``, ``"csv"``, ``"jsonl"``, ...).
        path: The folder or ``.lst`` file (absolute).
        root: Folder the item paths are relative to.
        items: Items in source order.
        classes: Class name -> label (folders only).
        label_width: Labels per item.
        ignored: Files inside class folders without an image extension (relative paths).
        skipped: ``(path, reason)`` of what the walk refused: image-named files that are not
            regular files (never opened), broken symlinks, directory symlink loops.
    """

    kind: str
    path: str
    root: str
    items: list[SourceItem]
    classes: dict[str, int] | None
    label_width: int
    ignored: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str:
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"not a regular file ({kind}): never opened" if kind != "not a regular file" else kind


def advise_will_need(paths: Iterable[str]) -> None:
    """``posix_fadvise(WILLNEED)`` on each file, so the kernel reads them ahead while we decode.

    Opened with ``O_NONBLOCK`` (a FIFO put in place of a file never blocks the hint); files that
    cannot be opened are left to the read, which reports them.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # a hint only (ESPIPE on a FIFO): the read that follows reports such a file
        finally:
            os.close(fd)


def read_regular_file(path: str, max_bytes: int | None = None) -> bytes:
    """A file's bytes, opened without blocking and read only if it is a regular file.

    The open uses ``O_NONBLOCK`` and the check is ``fstat`` on the opened descriptor, so a FIFO,
    device or socket put in place of a file after it was listed never blocks the reader.

    Args:
        path: The file.
        max_bytes: Refuse a file larger than this (checked before reading, and while reading a
            file that grows).

    Raises:
        OSError: The file cannot be opened or read; ``EINVAL`` when it is not a regular file,
            ``EFBIG`` when it is larger than ``max_bytes`` (``strerror`` says which, for messages).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, _not_regular(st.st_mode), path)
        size = st.st_size
        if max_bytes is not None and size > max_bytes:
            raise OSError(errno.EFBIG, f"file of {size} bytes is larger than the {max_bytes}-byte limit", path)
        data = os.read(fd, size + 1)  # one read of the stat size, plus one byte to notice growth
        if len(data) == size:
            return data
        parts, total = [data], len(data)
        while True:  # the file changed since the stat (or a short read): read to EOF
            chunk = os.read(fd, max(size, 1 << 16))
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise OSError(errno.EFBIG, f"file grew past the {max_bytes}-byte limit while read", path)
    finally:
        os.close(fd)


class _Walk:
    """The recursive part of :func:`scan_folder`: each directory walked once per (device, inode)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.walked: dict[tuple[int, int], str] = {}
        self.skipped: list[tuple[str, str]] = []
        self.ignored: list[str] = []

    def files(self, folder: str, st: os.stat_result, ancestors: frozenset[tuple[int, int]]) -> Iterator[str]:
        """Image files under ``folder`` in sorted order (hidden folders excepted)."""
        key = (st.st_dev, st.st_ino)
        if key in ancestors:
            self.skipped.append((folder, f"directory symlink loop (back to {self.walked.get(key, 'an ancestor')})"))
            return
        if key in self.walked:
            self.skipped.append((folder, f"directory already walked as {self.walked[key]} (reached through a symlink)"))
            return
        self.walked[key] = folder
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            self.skipped.append((folder, f"cannot list the folder ({exc.strerror or exc})"))
            return
        subdirs: list[tuple[str, os.stat_result]] = []
        inside = ancestors | {key}
        for entry in entries:
            # The entry's type from the directory listing (d_type): one stat only for symlinks,
            # folders (their device and inode) and what is neither a file nor a folder.
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                if entry.name.startswith("."):  # hidden folders are not walked (hidden files are listed)
                    continue
                try:
                    subdirs.append((entry.path, entry.stat()))
                except OSError as exc:
                    self.skipped.append((entry.path, f"cannot stat ({exc.strerror or exc})"))
                continue
            if not _is_image_name(entry.name):
                self.ignored.append(os.path.relpath(entry.path, self.root))
                continue
            try:
                is_file = entry.is_file()
            except OSError:
                is_file = False
            if is_file:
                yield entry.path
                continue
            try:
                target = entry.stat()  # follows a symlink once; a loop of symlinks is ELOOP
            except OSError as exc:
                why = "broken symlink" if entry.is_symlink() else f"cannot stat ({exc.strerror or exc})"
                self.skipped.append((entry.path, why))
                continue
            self.skipped.append((entry.path, _not_regular(target.st_mode)))
        # os.walk's order: a folder's files, then its sub-folders (sorted), depth first.
        for path, target in subdirs:
            yield from self.files(path, target, inside)


def scan_folder(path: str) -> Source:
    """Walk a folder with one sub-folder per class.

    Symlinks are followed, but every directory is walked at most once (by device and inode): a
    symlink back to one of its own ancestors (a loop) or to a directory already walked is reported
    in ``skipped`` and not followed again. Files with an image extension that are not regular files
    (FIFOs, devices, sockets) or are broken symlinks are reported in ``skipped`` and never opened.
    A file reached through two names (two file symlinks) is listed under each, as torchvision's
    ``ImageFolder`` lists it.

    Raises:
        UserError: When the folder holds no class sub-folder or no image.
    """
    root = os.path.abspath(path)
    walk = _Walk(root)
    try:
        tops = sorted(os.scandir(root), key=lambda e: e.name)
        classes = [e.name for e in tops if not e.name.startswith(".") and e.is_dir()]
    except OSError as exc:
        raise UserError(f"{path}: cannot list the folder ({exc.strerror or exc})") from None
    if not classes:
        raise UserError(f"{path}: no class sub-folders (expected SRC/<class>/<image> files)")
    items: list[SourceItem] = []
    top = os.stat(root)
    walk.walked[(top.st_dev, top.st_ino)] = root
    ancestors = frozenset({(top.st_dev, top.st_ino)})
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        try:
            st = os.stat(folder)
        except OSError as exc:
            walk.skipped.append((folder, f"cannot stat ({exc.strerror or exc})"))
            continue
        for full in walk.files(folder, st, ancestors):
            items.append(SourceItem(len(items), full, (float(label),)))
    if not items:
        raise UserError(
            f"{path}: no images found in its {len(classes)} class folders (extensions: {', '.join(IMG_EXTENSIONS)})"
        )
    return Source(
        kind="folder",
        path=root,
        root=root,
        items=items,
        classes={name: i for i, name in enumerate(classes)},
        label_width=1,
        ignored=walk.ignored,
        skipped=walk.skipped,
    )
