"""Write stage, input side: a class-folder tree, an im2rec ``.lst`` or a CSV / JSONL listing as ordered, labelled items.

Folders are walked by :func:`fastload.records.folder_tree.scan_folder` (torchvision's ``ImageFolder``
rules; the same walk serves unpacked folders to readers). ``.lst`` lines follow MXNet's im2rec:
``index<TAB>label[<TAB>label...]<TAB>relative/path``. CSV and JSONL listings:
:mod:`fastload.pack.listing_source`. Inputs that hold the image bytes themselves (tars, parquet)
are streamed instead (:mod:`fastload.pack.stream_pack`).
"""

from __future__ import annotations

import math
import os

from fastload.errors import UserError
from fastload.pack.input_format import STREAMED, InputFormat, detect_format
from fastload.pack.listing_source import read_csv, read_jsonl
from fastload.records.folder_tree import Source, SourceItem, scan_folder

__all__ = ["open_source", "read_lst"]

_MAX_LABEL = 3.4028234663852886e38  # float32's largest finite value: labels are stored as float32


def read_lst(path: str, root: str | None = None) -> Source:
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
    items: list[SourceItem] = []
    width: int | None = None
    try:
        with open(lst, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                parts = [p.strip() for p in line.split("\t")]
                if len(parts) < 3:
                    raise UserError(
                        f"{path}:{lineno}: expected index<TAB>label[<TAB>label...]<TAB>path, "
                        f"got {len(parts)} tab-separated field(s)"
                    )
                try:
                    index = int(parts[0])
                    labels = tuple(float(x) for x in parts[1:-1])
                except ValueError:
                    raise UserError(
                        f"{path}:{lineno}: index must be an integer and labels numbers "
                        f"(fields of {[len(p) for p in parts[:-1]]} characters)"
                    ) from None
                if not 0 <= index < 1 << 64:
                    raise UserError(f"{path}:{lineno}: index {index} is outside [0, 2**64)")
                if not all(math.isfinite(x) for x in labels) or any(abs(x) > _MAX_LABEL for x in labels):
                    raise UserError(f"{path}:{lineno}: labels must be finite numbers that fit float32")
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


def open_source(src: str, root: str | None = None, input_format: InputFormat | None = None) -> Source:
    """A folder, ``.lst``, CSV or JSONL listing as a :class:`Source`.

    Args:
        src: The folder or listing.
        root: Folder the listing's paths are relative to (default: the listing's folder).
        input_format: What ``src`` is (default: detected, :func:`fastload.pack.input_format.detect_format`).

    Raises:
        UserError: Missing path, unusable content, or a format that is streamed, not listed.
    """
    if not os.path.exists(src):
        raise UserError(f"{src}: no such file or directory")
    fmt = input_format or detect_format(src)
    if fmt in STREAMED:
        raise UserError(f"{src}: {fmt.value} input is streamed, not listed (fastload.pack.stream_pack packs it)")
    if fmt is InputFormat.FOLDER:
        if not os.path.isdir(src):
            raise UserError(f"{src}: --input-format folder needs a folder")
        if root:
            raise UserError("--root only applies to a .lst, CSV or JSONL listing")
        return scan_folder(src)
    if os.path.isdir(src):
        raise UserError(f"{src}: --input-format {fmt.value} needs a listing file, not a folder")
    if fmt is InputFormat.CSV:
        return read_csv(src, root)
    if fmt is InputFormat.JSONL:
        return read_jsonl(src, root)
    return read_lst(src, root)
