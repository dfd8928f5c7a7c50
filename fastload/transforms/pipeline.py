"""The whole per-sample transform a Loader or ``decode_batch`` runs: geometry -> pixel ops -> output.

A :class:`Pipeline` is data, like its parts; both backends run it in this order, with every random
draw taken from the sample's counter-based stream (:mod:`fastload.transforms.rng`):

1. ``geometry`` (exactly one): maps the decoded image to the output size (:mod:`.geometry`,
   or MXNet's augmenter :mod:`.mxnet_augment`), with ``affine`` (torchvision's ``RandomAffine``,
   :mod:`.affine`) composed after it into the same resampling pass (:mod:`.warp`). Counters
   ``[0, 64)`` (the affine draws 48..53).
2. ``ops``: pixel ops on the output-sized RGB image, in order. Op ``k`` draws from counters
   ``[64 * (k + 2), 64 * (k + 3))`` (:func:`op_counter_base`). The engine runs them on a per-thread
   HWC scratch image between the resampler and the output write; the Pillow path calls each op's
   Python reference ``op.apply(image_hwc_uint8, key, base=op_counter_base(k))``.
3. ``normalize``: the output stage (:class:`~.output.Normalize`): the batch is written in its dtype
   (float32 / float16) and layout, normalized; without it the batch is uint8 pixels.
4. ``erase``: RandomErasing on the final output (counters from ``1 << 20``); the Pillow path calls
   ``erase.sample(key, h, w)`` then ``erase.apply_params(sample, params, key, channels_first=...)``.

A bare geometry op is accepted wherever a Pipeline is (:func:`as_pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.transforms.affine import RandomAffine
from fastload.transforms.geometry import OpKind, Transform, output_size
from fastload.transforms.mxnet_augment import MXNetDefaultAugment
from fastload.transforms.output import Normalize

__all__ = ["ERASE_COUNTER_BASE", "OP_COUNTER_STRIDE", "Pipeline", "as_pipeline", "op_counter_base"]

#: Counters each pixel op owns; op ``k`` starts at ``OP_COUNTER_STRIDE * (k + 2)``.
OP_COUNTER_STRIDE = 64
#: First counter of the output-stage ops (RandomErasing).
ERASE_COUNTER_BASE = 1 << 20


def op_counter_base(position: int) -> int:
    """First counter of pixel op number ``position`` of a Pipeline's ``ops``."""
    if position < 0 or OP_COUNTER_STRIDE * (position + 3) > ERASE_COUNTER_BASE:
        raise ValueError(f"pixel op position {position} is out of range")
    return OP_COUNTER_STRIDE * (position + 2)


#: The geometries a RandomAffine can follow (a resized box and a horizontal flip: affine_plan's input).
_AFFINE_AFTER = (OpKind.RANDOM_RESIZED_CROP, OpKind.RESIZE_CENTER_CROP, OpKind.RESIZE)


#: A geometry op: what a Pipeline's ``geometry`` holds.
GeometryOp = Transform | MXNetDefaultAugment


def _is_geometry(op: Any) -> bool:
    return hasattr(op, "size") and hasattr(op, "kind") and not isinstance(op, Pipeline)


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """Geometry, pixel ops, output stage and erasing: what a Loader or ``decode_batch`` runs per sample.

    Args:
        geometry: The geometry op (``RandomResizedCrop``, ``CenterCrop``, ``Resize``, ``RandomCrop``,
            ``MXNetDefaultAugment``).
        affine: A ``RandomAffine`` on the geometry's output (after its flip), sampled in the same
            resampling pass; only after ``RandomResizedCrop``, ``CenterCrop`` or ``Resize`` without a
            vertical flip. ``None``: no affine warp.
        ops: Pixel ops on the output-sized image, applied in order (colour, policies, ...).
        normalize: The output stage; ``None`` writes uint8 pixels.
        erase: RandomErasing on the final output, or ``None``.

    Example:
        >>> from fastload.transforms import Normalize, Pipeline, RandomResizedCrop
        >>> p = Pipeline(geometry=RandomResizedCrop(size=224),
        ...              normalize=Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
        >>> p.size, p.output_dtype
        ((224, 224), dtype('float32'))
    """

    geometry: GeometryOp
    ops: tuple[Any, ...] = ()
    normalize: Normalize | None = None
    erase: Any | None = None
    affine: RandomAffine | None = None

    def __post_init__(self) -> None:
        if not _is_geometry(self.geometry):
            raise ValueError(
                f"geometry={self.geometry!r} must be a geometry op of fastload.transforms "
                "(RandomResizedCrop, CenterCrop, Resize, RandomCrop, MXNetDefaultAugment)"
            )
        if self.affine is not None:
            if not isinstance(self.affine, RandomAffine):
                raise ValueError(f"affine={self.affine!r} must be a fastload.transforms.RandomAffine or None")
            if self.geometry.kind not in _AFFINE_AFTER or getattr(self.geometry, "vflip", 0.0) != 0.0:
                raise ValueError(
                    f"affine=RandomAffine(...) follows RandomResizedCrop, CenterCrop or Resize without a "
                    f"vertical flip, not {self.geometry!r}"
                )
        if isinstance(self.ops, (str, bytes)) or not hasattr(self.ops, "__iter__"):
            raise ValueError(f"ops={self.ops!r} must be a sequence of pixel ops")
        ops = tuple(self.ops)
        for i, op in enumerate(ops):
            if _is_geometry(op) or not callable(getattr(op, "apply", None)):
                raise ValueError(
                    f"ops[{i}]={op!r} is not a pixel op (an op spec with an apply(image, key, base=) "
                    "reference); the geometry goes in geometry="
                )
        op_counter_base(len(ops))  # the counter layout has room for them
        object.__setattr__(self, "ops", ops)
        if self.normalize is not None and not isinstance(self.normalize, Normalize):
            raise ValueError(f"normalize={self.normalize!r} must be a fastload.transforms.Normalize or None")
        if self.erase is not None and not (
            callable(getattr(self.erase, "sample", None)) and callable(getattr(self.erase, "apply_params", None))
        ):
            raise ValueError(f"erase={self.erase!r} must be a RandomErasing or None")

    @property
    def size(self) -> tuple[int, int]:
        """Output ``(height, width)``."""
        h, w = output_size(self.geometry)
        return (int(h), int(w))

    @property
    def kind(self) -> Any:
        """The geometry's kind."""
        return self.geometry.kind

    @property
    def output_dtype(self) -> np.dtype[Any]:
        """Element type of the batch: the Normalize's dtype, or uint8."""
        return self.normalize.numpy_dtype if self.normalize is not None else np.dtype(np.uint8)


def as_pipeline(transform: Pipeline | GeometryOp) -> Pipeline:
    """``transform`` as a Pipeline (a bare geometry op becomes ``Pipeline(geometry=op)``)."""
    if isinstance(transform, Pipeline):
        return transform
    if _is_geometry(transform):
        return Pipeline(geometry=transform)
    raise ValueError(
        f"transform={transform!r} must be a fastload.transforms Pipeline or geometry op "
        "(RandomResizedCrop, CenterCrop, Resize, RandomCrop, ...)"
    )
