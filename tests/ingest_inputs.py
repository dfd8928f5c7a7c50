"""Inputs for the ``fastload pack`` ingest tests, made the way users make them.

A generated class-folder tree is turned into WebDataset tars (``webdataset.TarWriter``), parquet
(``datasets.Dataset.to_parquet``) and ``save_to_disk`` folders, with the same image bytes and labels
in the same order as the folder pack reads them, so the packs can be compared record for record.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from fastload.records.dataset import open_dataset
from fastload.records.folder_tree import scan_folder

__all__ = [
    "Entry",
    "folder_entries",
    "hf_dataset",
    "records",
    "suffix_of",
    "write_parquet",
    "write_tars",
]

Entry = tuple[str, int, bytes]  # (file name, class index, bytes)


def folder_entries(folder: Path | str) -> tuple[list[Entry], list[str]]:
    """The folder's images in the folder pack's order, with the class names."""
    source = scan_folder(str(folder))
    entries = [(os.path.basename(it.path), int(it.labels[0]), Path(it.path).read_bytes()) for it in source.items]
    classes = sorted(source.classes or {}, key=lambda n: (source.classes or {})[n])
    return entries, classes


def suffix_of(data: bytes) -> str:
    """The WebDataset member suffix a writer would use for these bytes."""
    if data.startswith(b"\x89PNG"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "jpg"


def write_tars(
    entries: list[Entry],
    folder: Path,
    *,
    per_tar: int = 8,
    prefix: str = "train",
    label: str = "cls",
    classes: list[str] | None = None,
) -> list[Path]:
    """``entries`` as WebDataset shards ``prefix-000000.tar, ...`` written by ``webdataset.TarWriter``.

    ``label``: ``"cls"`` (the class index), ``"json"`` (``{"label": index, "class_name": name}``),
    ``"name"`` (``cls`` holding the class name) or ``"none"``.
    """
    wds = pytest.importorskip("webdataset")
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for t, start in enumerate(range(0, len(entries), per_tar)):
        path = folder / f"{prefix}-{t:06d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for i, (_name, cls, data) in enumerate(entries[start : start + per_tar], start):
                sample: dict[str, Any] = {"__key__": f"{i:06d}", suffix_of(data): data}
                if label == "cls":
                    sample["cls"] = cls
                elif label == "name":
                    sample["cls"] = (classes or [])[cls].encode()
                elif label == "json":
                    sample["json"] = {"label": cls, "class_name": (classes or [str(cls)])[cls]}
                sink.write(sample)
        paths.append(path)
    return paths


def hf_dataset(entries: list[Entry], classes: list[str], *, label_names: bool = False) -> Any:
    """``entries`` as a ``datasets.Dataset`` with an ``Image`` column and a ``ClassLabel`` (or string) label."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    label_feature = datasets.Value("string") if label_names else datasets.ClassLabel(names=classes)
    features = datasets.Features({"image": datasets.Image(), "label": label_feature})
    # Paths that are not files here: datasets then keeps the bytes given (an existing file's path
    # would be stored instead of its bytes).
    images = [{"bytes": data, "path": f"in-memory/{name}"} for name, _, data in entries]
    labels = [classes[c] if label_names else c for _, c, _ in entries]
    return datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)


def write_parquet(entries: list[Entry], path: Path, classes: list[str], *, rows_per_group: int = 5, **kw: Any) -> Path:
    """``entries`` as a parquet file written by ``datasets`` (row groups of ``rows_per_group`` rows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    hf_dataset(entries, classes, **kw).to_parquet(str(path), batch_size=rows_per_group)
    return path


def records(out: Path | str) -> list[tuple[tuple[float, ...], bytes]]:
    """``(labels, image bytes)`` of every record of a packed dataset, in order."""
    with open_dataset(str(out)) as ds:
        return [(tuple(float(x) for x in ds.labels[i]), bytes(ds.image(i))) for i in range(len(ds))]


def manifest(out: Path | str) -> dict[str, Any]:
    """The packed dataset's ``fastload.json``."""
    return json.loads((Path(out) / "fastload.json").read_text())


def image_bytes(mode: str = "RGB", fmt: str = "PNG", size: tuple[int, int] = (40, 30)) -> bytes:
    """A small image of ``mode`` encoded as ``fmt`` (Pillow)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size, 120 if mode == "L" else (10, 130, 220)[: len(mode)] if mode != "CMYK" else (1, 2, 3, 4)).save(
        buf, fmt
    )
    return buf.getvalue()
