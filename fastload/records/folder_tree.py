"""Read stage, unpacked input: walk a class-folder tree into ordered, labelled image files.

Class folders follow torchvision's ``ImageFolder``: every sub-folder of the root is a class (hidden
ones, starting with ".", excepted), label = position of its name in the sorted list, images found
recursively (symlinks followed) in sorted order with an image extension (case-insensitive).
:class:`fastload.records.imagefolder.ImageFolderDataset` serves such a tree as records;
``fastload pack`` (:mod:`fastload.pack.sources`) packs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fastload.errors import UserError

__all__ = ["IMG_EXTENSIONS", "Source", "SourceItem", "scan_folder"]

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
    labels: tuple[float, ...]


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
    items: list[SourceItem]
    classes: dict[str, int] | None
    label_width: int
    ignored: list[str] = field(default_factory=list)


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
    items: list[SourceItem] = []
    ignored: list[str] = []
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
        ignored=ignored,
    )
