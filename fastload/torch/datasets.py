"""Device stage (torch): the datasets the fast path reads, and a torch view of fastload's own datasets.

Two directions:

- :class:`ImageDataset` is a map-style ``torch.utils.data.Dataset`` over a fastload dataset (a packed
  folder, a ``.rec``, an LMDB shard or an unpacked ImageFolder tree): ``ds[i]`` returns what
  ``torchvision.datasets.ImageFolder`` would (``(transform(PIL RGB image), target)``), so the same
  object works with ``torch.utils.data.DataLoader``; ``ds.__getitems__`` decodes a whole batch in one
  engine call when its transform compiles, which torch's own DataLoader (and wrappers that rebuild
  it, such as HF Accelerate's ``prepare``) then use.
- :func:`resolve_source` looks at the dataset a :class:`fastload.torch.DataLoader` was given and, when
  it can be read by the engine, returns a :class:`Source`: the records (file bytes or shard
  records, with labels, in the dataset's index order), the index map of a ``Subset`` and where the
  transform lives. torchvision's ``DatasetFolder`` / ``ImageFolder`` qualify when they load with
  torchvision's own PIL loader and do not override ``__getitem__``, timm's ``ImageDataset`` when
  it reads RGB images through ``ReaderImageFolder`` or ``ReaderImageInTar``
  (:mod:`fastload.torch.datasets_timm`); anything else gets a reason.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, SupportsIndex

import numpy as np
import torch
from numpy.typing import NDArray

from fastload.records.file_records import FileRecords
from fastload.torch.compile import is_fastload_transform
from fastload.torch.datasets_timm import is_timm_dataset, timm_records
from fastload.transforms.geometry import output_size

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

    from fastload.loader.pipeline import Records
    from fastload.transforms.pipeline import GeometryOp, Pipeline

__all__ = ["FileRecords", "ImageDataset", "Source", "resolve_source"]


@dataclass
class Source:
    """What the fast path reads for a dataset.

    Attributes:
        records: Records in the base dataset's index order (``image(i)``, ``labels``, ``locate``).
        index_map: int64 map from the loader's dataset indices to ``records`` indices (a ``Subset``),
            or None for the identity.
        holder: The object whose ``transform`` / ``target_transform`` apply (read at each iteration).
        multi_label: Targets are float vectors (fastload datasets with several labels per record).
    """

    records: Any
    index_map: NDArray[np.int64] | None
    holder: Any
    multi_label: bool = False

    @property
    def transform(self) -> Any:
        return getattr(self.holder, "transform", None)

    @property
    def target_transform(self) -> Any:
        return getattr(self.holder, "target_transform", None)


def _torchvision_folder_reason(dataset: Any) -> str | None:
    """None when ``dataset`` is a torchvision DatasetFolder the engine can read, else why not."""
    try:
        from torchvision import get_image_backend
        from torchvision.datasets.folder import DatasetFolder, default_loader, pil_loader
    except ImportError:
        return "torchvision is not installed"
    if not isinstance(dataset, DatasetFolder):
        return "not a DatasetFolder"
    if type(dataset).__getitem__ is not DatasetFolder.__getitem__:
        return f"{type(dataset).__name__} overrides __getitem__"
    loader = getattr(dataset, "loader", None)
    if loader is pil_loader or (loader is default_loader and get_image_backend() == "PIL"):
        return None
    return f"{type(dataset).__name__} loads its files with {getattr(loader, '__name__', loader)!r}, not PIL"


def resolve_source(dataset: Any) -> Source | str:
    """The engine's view of ``dataset``, or a sentence saying why the engine cannot read it."""
    from torch.utils.data import Subset

    if isinstance(dataset, ImageDataset):
        return Source(dataset.records, None, dataset, multi_label=dataset.multi_label)
    if isinstance(dataset, Subset):
        inner = resolve_source(dataset.dataset)
        if isinstance(inner, str):
            return f"a Subset of a dataset the engine cannot read ({inner})"
        idx = np.asarray(list(dataset.indices), dtype=np.int64)
        n = len(inner.records) if inner.index_map is None else len(inner.index_map)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            return "a Subset whose indices fall outside its dataset"
        mapped = idx if inner.index_map is None else inner.index_map[idx]
        return Source(inner.records, mapped, inner.holder, inner.multi_label)
    if is_timm_dataset(dataset):
        records = timm_records(dataset)
        return records if isinstance(records, str) else Source(records, None, dataset)
    reason = _torchvision_folder_reason(dataset)
    if reason is None:
        samples = dataset.samples
        try:
            targets = [int(t) for _, t in samples]
        except (TypeError, ValueError):
            return f"{type(dataset).__name__} has non-integer targets"
        return Source(FileRecords([p for p, _ in samples], targets), None, dataset)
    if reason != "not a DatasetFolder":
        return reason
    return (
        f"{type(dataset).__name__} is neither a torchvision ImageFolder/DatasetFolder, a timm ImageDataset nor a "
        "fastload dataset"
    )


class ImageDataset(torch.utils.data.Dataset[tuple[Any, Any]]):
    """A map-style torch ``Dataset`` over a fastload dataset, returning what ImageFolder would.

    ``ds[i]`` is ``(transform(image), target_transform(target))`` where ``image`` is the record's
    image decoded to an RGB ``PIL.Image`` and ``target`` the record's class (an ``int``; a float32
    tensor for multi-label records). Works with ``torch.utils.data.DataLoader`` as it is, and
    :class:`fastload.torch.DataLoader` decodes it in batches in the engine.

    Args:
        root: A fastload dataset (``fastload.open_dataset(...)``), a path ``open_dataset`` accepts (a
            packed folder, a ``.rec``, an LMDB shard folder, an unpacked ImageFolder tree), or a
            ``torchvision.datasets.ImageFolder`` / ``DatasetFolder`` the engine can read (its files,
            classes and, unless given here, its transforms): a view whose ``__getitems__`` keeps
            batched decoding when a wrapper rebuilds the loader as torch's own DataLoader.
        transform: A torchvision transform (``transforms.Compose([...])``, v1 or v2), a fastload
            transform op (``fastload.train(224)``), or None (PIL images).
        target_transform: Applied to each target.

    Attributes:
        records: The fastload dataset.
        classes: Class names in label order (when the dataset records them).
        class_to_idx: Class name -> label.
        targets: Every record's label (ints; lists of floats for multi-label datasets).
    """

    def __init__(
        self,
        root: Any,
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[..., Any] | None = None,
    ) -> None:
        self._owns = isinstance(root, (str, os.PathLike))
        classes = None
        if self._owns:
            from fastload.records.dataset import open_dataset

            records = open_dataset(root)
            name = os.fspath(root)
        elif hasattr(root, "image") and hasattr(root, "labels") and hasattr(root, "__len__"):
            records = root
            name = str(getattr(records, "path", "") or "")
        elif _torchvision_folder_reason(root) is None:
            source = resolve_source(root)
            if isinstance(source, str):
                raise ValueError(f"root={type(root).__name__}: {source}")
            records, classes = source.records, dict(root.class_to_idx)
            transform = root.transform if transform is None else transform
            target_transform = root.target_transform if target_transform is None else target_transform
            name = os.fspath(getattr(root, "root", "") or "")
        else:
            raise ValueError(
                f"root={root!r} must be a fastload dataset (fastload.open_dataset), a path to one, or a "
                "torchvision ImageFolder / DatasetFolder the engine can read"
            )
        self.root = name
        self.records = records
        self.transform = transform
        self.target_transform = target_transform
        labels = np.asarray(records.labels, dtype=np.float32)
        self.multi_label = labels.ndim == 2 and labels.shape[1] > 1
        if classes is None:
            classes = getattr(records, "classes", None)
        manifest = getattr(records, "manifest", None)
        if classes is None and manifest:
            classes = manifest.get("classes")
        if isinstance(classes, dict):
            self.class_to_idx = {str(k): int(v) for k, v in classes.items()}
            self.classes = [k for k, _ in sorted(self.class_to_idx.items(), key=lambda kv: kv[1])]
        else:
            self.class_to_idx, self.classes = {}, []
        self._labels = labels.reshape(len(records), -1)
        # An opened dataset is closed with the last reference to this view (loaders re-instantiated by
        # Lightning share the view, so no loader may close it).
        self._finalizer = weakref.finalize(self, records.close) if self._owns else None

    @property
    def targets(self) -> list[Any]:
        if self.multi_label:
            rows: list[list[float]] = self._labels.tolist()
            return rows
        classes: list[int] = self._labels[:, 0].astype(np.int64).tolist()
        return classes

    def __len__(self) -> int:
        return len(self.records)

    def _target(self, i: int) -> Any:
        if self.multi_label:
            target: Any = torch.from_numpy(self._labels[i].copy())
        else:
            target = int(self._labels[i, 0])
        return self.target_transform(target) if self.target_transform is not None else target

    def _check(self, index: SupportsIndex) -> int:
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} records")
        return i

    def load_image(self, index: SupportsIndex) -> PILImage:
        """The record's image, decoded to RGB: a ``PIL.Image`` (as torchvision's ``pil_loader``)."""
        from fastload.decode import DecodeOptions
        from fastload.decode.pillow import _Failure, _pillow_open_rgb
        from fastload.errors import DecodeError

        i = self._check(index)
        try:
            return _pillow_open_rgb(self.records.image(i), DecodeOptions())
        except _Failure as exc:
            raise DecodeError(f"{exc.status.name.lower()}: {exc}", index=i, source=self.records.locate(i)) from None

    def __getitem__(self, index: SupportsIndex) -> tuple[Any, Any]:
        i = self._check(index)
        transform = self.transform
        image: torch.Tensor | PILImage
        if transform is not None and is_fastload_transform(transform):
            image = _decode_fastload(self.records, [i], transform)[0]
        else:
            image = self.load_image(i)
            if transform is not None:
                image = transform(image)
        return image, self._target(i)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        """Samples for a whole batch; the engine decodes them in one call when the transform compiles.

        torch's DataLoader calls this instead of ``__getitem__`` per sample. Random draws come from
        torch's RNG (one per call), so worker processes differ as they do with torchvision.
        """
        from fastload.torch.compile import compile_transform

        idx = [self._check(i) for i in indices]
        transform = self.transform
        if transform is not None and is_fastload_transform(transform):
            images = _decode_fastload(self.records, idx, transform)
            return [(img, self._target(i)) for img, i in zip(images, idx, strict=False)]
        plan = compile_transform(transform) if transform is not None else None
        if plan is None or plan.geometry is None or plan.rest or not plan.is_tensor:
            return [self[i] for i in idx]
        spec, convert = plan.engine_transform()
        images = _decode_fastload(self.records, idx, spec, output=convert)
        if plan.tv_image:
            from torchvision import tv_tensors

            images = [tv_tensors.Image(img) for img in images]
        return [(img, self._target(i)) for img, i in zip(images, idx, strict=False)]

    def close(self) -> None:
        """Close the fastload dataset when this view opened it (from a path). Idempotent."""
        if self._finalizer is not None:
            self._finalizer()

    def __getstate__(self) -> dict[str, Any]:
        # A spawned DataLoader worker gets the records reopened (fastload datasets pickle that
        # way) and owns them: they close with its copy of this view.
        state = dict(self.__dict__)
        state["_finalizer"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._owns = True
        self._finalizer = weakref.finalize(self, self.records.close)

    def __repr__(self) -> str:
        return f"ImageDataset({self.root!r}, {len(self)} records, transform={self.transform!r})"


def _decode_fastload(
    records: Records,
    indices: Sequence[int],
    op: Pipeline | GeometryOp,
    output: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Decode ``indices`` with the fastload geometry ``op`` in one call; per-sample CHW tensors."""
    from fastload.decode import decode_batch
    from fastload.errors import DecodeError

    geometry = getattr(op, "geometry", op)  # a Pipeline's output size is its geometry's
    h, w = output_size(geometry)
    from fastload.loader import transform_image_dtype

    out = np.empty((len(indices), 3, h, w), dtype=transform_image_dtype(op) or np.uint8)
    seed = int(torch.randint(0, 2**62, ()).item())
    views = [records.image(i) for i in indices]
    result = decode_batch(
        views, out, op, seed=seed, epoch=0, indices=np.asarray(indices, dtype=np.int64), threads=1, layout="NCHW"
    )
    if result.errors:
        pos = min(result.errors)
        i = int(indices[pos])
        raise DecodeError(result.errors[pos], index=i, source=records.locate(i))
    images = torch.from_numpy(out)
    if output is not None:
        images = output(images)
    return list(images.unbind(0))
