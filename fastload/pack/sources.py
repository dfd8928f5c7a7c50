"""Write stage, input side: walk a class-folder tree or parse an im2rec ``.lst`` into ordered, labelled items.

Class folders follow torchvision's ``ImageFolder``: every sub-folder of SRC is a class (hidden ones,
starting with ".", excepted), label = position of its name in the sorted list, images found
recursively (symlinks followed) in sorted order with an image extension (case-insensitive).

``.lst`` lines follow MXNet's im2rec: ``index<TAB>label[<TAB>label...]<TAB>relative/path``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from fastload.errors import UserError

__all__ = ["IMG_EXTENSIONS", "SourceItem", "Source", "scan_folder", "read_lst", "open_source"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class SourceItem:
    """One input image.

    Attributes:
        id: Record id (folder: position in the sorted walk; ``.lst``: its index column).
        path: Absolute path of the file.
        labels: The record's labels.
    """

    id: int
    path: str
    labels: Tuple[float, ...]


@dataclass(frozen=True)
class Source:
    """Everything a pack needs to know about its input.

    Attributes:
        kind: ``"folder"`` or ``"lst"``.
        path: The folder or ``.lst`` file (absolute).
        root: Folder the item paths are relative to.
        items: Items in source order.
        classes: Class name -> label (folders only).
        label_width: Labels per item.
        ignored: Files inside class folders without an image extension (relative paths).
    """

    kind: str
    path: str
    root: str
    items: List[SourceItem]
    classes: Optional[Dict[str, int]]
    label_width: int
    ignored: List[str] = field(default_factory=list)


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def scan_folder(path: str) -> Source:
    """Walk a folder with one sub-folder per class.

    Raises:
        UserError: When the folder holds no class sub-folder or no image.
    """
    root = os.path.abspath(path)
    try:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as exc:
        raise UserError(f"{path}: cannot list the folder ({exc.strerror or exc})") from None
    if not classes:
        raise UserError(f"{path}: no class sub-folders (expected SRC/<class>/<image> files)")
    items: List[SourceItem] = []
    ignored: List[str] = []
    for label, name in enumerate(classes):
        for folder, dirs, files in os.walk(os.path.join(root, name), followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for fname in sorted(files):
                full = os.path.join(folder, fname)
                if _is_image_name(fname):
                    items.append(SourceItem(len(items), full, (float(label),)))
                else:
                    ignored.append(os.path.relpath(full, root))
    if not items:
        raise UserError(f"{path}: no images found in its {len(classes)} class folders "
                        f"(extensions: {', '.join(IMG_EXTENSIONS)})")
    return Source(kind="folder", path=root, root=root, items=items,
                  classes={name: i for i, name in enumerate(classes)}, label_width=1, ignored=ignored)


def read_lst(path: str, root: Optional[str] = None) -> Source:
    """Parse an im2rec ``.lst`` file.

    Args:
        path: The ``.lst`` file.
        root: Folder the image paths are relative to (default: the ``.lst``'s folder).

    Raises:
        UserError: Unreadable file, a malformed line (named by number), inconsistent label counts,
            or no entries.
    """
    lst = os.path.abspath(path)
    base = os.path.abspath(root) if root else os.path.dirname(lst)
    if root and not os.path.isdir(base):
        raise UserError(f"--root {root}: no such folder")
    items: List[SourceItem] = []
    width: Optional[int] = None
    try:
        with open(lst, "r", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                parts = [p.strip() for p in line.split("\t")]
                if len(parts) < 3:
                    raise UserError(f"{path}:{lineno}: expected index<TAB>label[<TAB>label...]<TAB>path, "
                                    f"got {line[:80]!r}")
                try:
                    index = int(parts[0])
                    labels = tuple(float(x) for x in parts[1:-1])
                except ValueError:
                    raise UserError(f"{path}:{lineno}: index must be an integer and labels numbers, "
                                    f"got {line[:80]!r}") from None
                if index < 0:
                    raise UserError(f"{path}:{lineno}: negative index {index}")
                if width is None:
                    width = len(labels)
                elif len(labels) != width:
                    raise UserError(f"{path}:{lineno}: {len(labels)} labels, earlier lines have {width}")
                items.append(SourceItem(index, os.path.join(base, parts[-1]), labels))
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text .lst file") from None
    if not items:
        raise UserError(f"{path}: the list is empty")
    return Source(kind="lst", path=lst, root=base, items=items, classes=None, label_width=width or 1)


def open_source(src: str, root: Optional[str] = None) -> Source:
    """A folder or ``.lst`` file as a :class:`Source`.

    Raises:
        UserError: Missing path or unusable content.
    """
    if not os.path.exists(src):
        raise UserError(f"{src}: no such file or directory")
    if os.path.isdir(src):
        if root:
            raise UserError("--root only applies to a .lst source")
        return scan_folder(src)
    return read_lst(src, root)
