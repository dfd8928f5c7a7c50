"""Device stage (torch): timm's ``ImageDataset`` as records the engine reads.

timm's training script builds ``timm.data.ImageDataset(root)`` (``create_dataset``), whose reader is
``ReaderImageFolder`` (class folders, timm's natural sort) or, for a ``.tar`` root, ``ReaderImageInTar``
(images in uncompressed tars: one tar, a folder of tars, tars inside a tar). ``dataset[i]`` opens the
reader's file object with PIL and converts it to ``input_img_mode``, then applies ``transform`` and
``target_transform``: the same as torchvision's ``pil_loader`` when the mode is ``"RGB"``. Such a
dataset is read here through :class:`~fastload.records.file_records.FileRecords` (the reader's file
list) or :class:`~fastload.records.file_records.TarMemberRecords` (each member's data offset in its
tar file on disk), in the reader's index order with its targets. Anything else gets a reason.
"""

from __future__ import annotations

import numbers
import os
import sys
from typing import Any

from fastload.records.file_records import FileRecords, TarMember, TarMemberRecords

__all__ = ["is_timm_dataset", "timm_records"]


def is_timm_dataset(dataset: Any) -> bool:
    """``dataset`` is a timm ``ImageDataset`` (or a subclass); False when timm is not imported."""
    module = sys.modules.get("timm.data.dataset")
    cls = getattr(module, "ImageDataset", None)
    return cls is not None and isinstance(dataset, cls)


def timm_records(dataset: Any) -> FileRecords | TarMemberRecords | str:
    """The records of a timm ``ImageDataset``, or a sentence saying why the engine cannot read it."""
    from timm.data.dataset import ImageDataset as TimmImageDataset

    name = type(dataset).__name__
    if type(dataset).__getitem__ is not TimmImageDataset.__getitem__:
        return f"{name} overrides __getitem__"
    if getattr(dataset, "load_bytes", False):
        return f"{name} has load_bytes=True (its samples are encoded bytes, not images)"
    mode = getattr(dataset, "input_img_mode", None)
    if mode != "RGB":
        return f"{name} loads images with input_img_mode={mode!r}; the engine decodes to RGB"
    if getattr(dataset, "additional_features", None) is not None:
        return f"{name} returns additional features"
    reader = getattr(dataset, "reader", None)
    from timm.data.readers.reader_image_folder import ReaderImageFolder
    from timm.data.readers.reader_image_in_tar import ReaderImageInTar

    if type(reader) is ReaderImageFolder:
        samples = reader.samples
        targets = [t for _, t in samples]
        if not all(isinstance(t, numbers.Integral) for t in targets):
            return f"{name}'s reader has non-integer targets"
        return FileRecords([p for p, _ in samples], [int(t) for t in targets])
    if type(reader) is ReaderImageInTar:
        return _tar_records(reader, name)
    return f"{name} reads with {type(reader).__name__}, which is neither ReaderImageFolder nor ReaderImageInTar"


def _tar_records(reader: Any, name: str) -> TarMemberRecords | str:
    """Each sample's data offset: the member's own, plus its child tar's when it sits in a tar in a tar."""
    members = []
    for sample_ti, parent_fn, child_ti in reader.samples:
        tar = os.path.join(reader.root, parent_fn) if parent_fn else reader.root
        if not sample_ti.isreg() or sample_ti.issparse():
            return f"{name}: tar member {sample_ti.name} is not stored as one contiguous regular file"
        offset, label = int(sample_ti.offset_data), sample_ti.name
        if child_ti is not None:
            # timm scans a child tar as an uncompressed stream, so its offsets count from the child's
            # first byte, which sits at the child member's data offset in the outer file.
            offset += int(child_ti.offset_data)
            label = f"{child_ti.name}/{sample_ti.name}"
        members.append(TarMember(tar=os.fspath(tar), offset=offset, size=int(sample_ti.size), name=label))
    return TarMemberRecords(members, [int(t) for t in reader.targets])
