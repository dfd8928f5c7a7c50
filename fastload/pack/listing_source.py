"""Write stage, input side: CSV and JSONL listings of image paths and labels, as ordered, labelled items.

The semantics of an im2rec ``.lst`` with a header: image paths relative to the listing's folder
(or ``--root``) or absolute, one record per row, in the listing's order (record id = the row's
position among the listing's rows, from 0).

- **CSV**: a header row naming the columns: ``path`` and ``label``, or ``label_1, label_2, ...``
  for several labels per record (other columns are ignored). A label column whose every value is
  a number holds numbers; otherwise its values are class names, numbered in sorted order.
- **JSONL**: one JSON object per line with ``path`` and ``label``: an integer, a number, a class
  name (numbered in sorted order) or a list of numbers.

A row that cannot be used (no path, a label of another kind or width than the others, a line
that is not a JSON object) is a bad entry named by its line (``list.csv line 7``): it goes through
``--on-error`` without its file being opened. Files named by usable rows are read, checked and
converted as a folder's are; a bad one is named by its path and line.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from typing import Any

from fastload.errors import UserError
from fastload.pack.sample_labels import LabelError, Labels
from fastload.records.folder_tree import Source, SourceItem

__all__ = ["read_csv", "read_jsonl"]


def _base(listing: str, root: str | None) -> str:
    base = os.path.abspath(root) if root else os.path.dirname(listing)
    if root and not os.path.isdir(base):
        raise UserError(f"--root {root}: no such folder")
    return base


def _lines(path: str) -> Iterator[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            yield from enumerate(f, 1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text listing") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _finish(
    kind: str, path: str, base: str, rows: list[tuple[int, str, Any]], skipped: list[tuple[str, str]], labels: Labels
) -> Source:
    """Items from ``(line, image path, label value)`` rows; rows whose label is refused join ``skipped``."""
    items: list[SourceItem] = []
    where = os.path.basename(path)
    for rid, (line, image, value) in enumerate(rows):
        try:
            item_labels = labels.value(value)
        except LabelError as exc:
            skipped.append((f"{where} line {line}", str(exc)))
            continue
        items.append(SourceItem(rid, os.path.join(base, image), item_labels, origin=f"{where} line {line}"))
    if not items:
        raise UserError(f"{path}: no usable rows" + (f" ({skipped[0][0]}: {skipped[0][1]})" if skipped else ""))
    return Source(
        kind=kind,
        path=path,
        root=base,
        items=items,
        classes=labels.classes(),
        label_width=labels.width or 1,
        skipped=skipped,
    )


def read_csv(path: str, root: str | None = None) -> Source:
    """Parse a CSV listing (``path,label`` or ``path,label_1,label_2,...`` header).

    Raises:
        UserError: Unreadable file, no header with ``path`` and label columns, or no usable row.
    """
    listing = os.path.abspath(path)
    base = _base(listing, root)
    reader = csv.reader(line for _, line in _lines(listing))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise UserError(f"{path}: the listing is empty") from None
    except csv.Error as exc:
        raise UserError(f"{path}:1: not a CSV header ({exc})") from None
    if "path" not in header:
        raise UserError(f"{path}:1: the header must name a 'path' column (got {len(header)} columns)")
    if "label" in header:
        label_cols = [header.index("label")]
    else:
        label_cols = []
        while f"label_{len(label_cols) + 1}" in header:
            label_cols.append(header.index(f"label_{len(label_cols) + 1}"))
        if not label_cols:
            raise UserError(f"{path}:1: the header must name a 'label' column (or label_1, label_2, ...)")
    path_col = header.index("path")
    need = max(path_col, *label_cols) + 1
    raw: list[tuple[int, str, list[str]]] = []
    skipped: list[tuple[str, str]] = []
    where = os.path.basename(listing)
    try:
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) < need:
                skipped.append((f"{where} line {line}", f"{len(row)} column(s), the header has {len(header)}"))
            elif not row[path_col].strip():
                skipped.append((f"{where} line {line}", "empty path"))
            else:
                raw.append((line, row[path_col].strip(), [row[c].strip() for c in label_cols]))
    except csv.Error as exc:
        raise UserError(f"{path}:{reader.line_num}: malformed CSV ({exc})") from None
    numeric = all(_is_number(v) for _, _, values in raw for v in values)
    labels: Labels
    if numeric:
        labels = Labels()
        rows: list[tuple[int, str, Any]] = [
            (line, image, [_parse_number(v) for v in values] if len(values) > 1 else _parse_number(values[0]))
            for line, image, values in raw
        ]
    elif len(label_cols) > 1:
        raise UserError(f"{path}: several label columns must all hold numbers (class names take one 'label' column)")
    else:
        labels = Labels(sorted({values[0] for _, _, values in raw}))
        rows = [(line, image, values[0]) for line, image, values in raw]
    return _finish("csv", listing, base, rows, skipped, labels)


def _parse_number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def read_jsonl(path: str, root: str | None = None) -> Source:
    """Parse a JSONL listing (one ``{"path": ..., "label": ...}`` object per line).

    Raises:
        UserError: Unreadable file or no usable line.
    """
    listing = os.path.abspath(path)
    base = _base(listing, root)
    where = os.path.basename(listing)
    raw: list[tuple[int, str, Any]] = []
    skipped: list[tuple[str, str]] = []
    for line, text in _lines(listing):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            skipped.append((f"{where} line {line}", "not valid JSON"))
            continue
        if not isinstance(obj, dict):
            skipped.append((f"{where} line {line}", "not a JSON object"))
        elif not isinstance(obj.get("path"), str) or not obj["path"].strip():
            skipped.append((f"{where} line {line}", "no 'path' string"))
        elif "label" not in obj:
            skipped.append((f"{where} line {line}", "no 'label'"))
        else:
            raw.append((line, obj["path"].strip(), obj["label"]))
    names = sorted({v for _, _, v in raw if isinstance(v, str)})
    numbers = any(not isinstance(v, str) for _, _, v in raw)
    # All names known up front: sorted. A listing mixing names and numbers keeps the kind of its
    # first row; the others are bad entries.
    first_is_name = bool(raw) and isinstance(raw[0][2], str)
    labels = Labels(names) if names and (first_is_name or not numbers) else Labels()
    if labels.fixed:
        labels.kind = "name"
    return _finish("jsonl", listing, base, raw, skipped, labels)
