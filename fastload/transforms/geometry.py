"""Geometry ops handed to the decode engine: the crop / resize / flip each sample gets.

A transform here is data, not code: a small frozen dataclass that the engine (C++ or the Pillow
fallback) interprets while decoding. Every random choice (crop box, flip) is a pure function of
``(seed, epoch, sample index)`` through a counter-based generator, so a sample gets the same crop
whatever the thread count, the batch it lands in, or the point an epoch was resumed from. The C++
engine implements the very same arithmetic (``csrc/augment.h``); :func:`sample_params` is the
reference both are tested against.

Geometry contract shared by every backend: each op yields a *source box* ``(x0, y0, x1, y1)`` in
float pixel coordinates of the full-size decoded image; the box is resampled to the output size
with antialiased bilinear filtering (Pillow's ``Image.resize(size, BILINEAR, box=box)`` semantics)
and then mirrored left-right when the flip was drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple, Union

from fastload.engine_abi import GeometryKind
from fastload.transforms.rng import sample_key, uniform

__all__ = [
    "OpKind",
    "RandomResizedCrop",
    "CenterCrop",
    "Resize",
    "Transform",
    "SampleParams",
    "train",
    "eval_transform",
    "sample_params",
]
# Which counter value feeds which decision. Fixed so the C++ engine and this module agree.
_DRAWS_PER_ATTEMPT = 4  # area, log-aspect, y, x
_MAX_ATTEMPTS = 10
_FLIP_DRAW = _DRAWS_PER_ATTEMPT * _MAX_ATTEMPTS  # 40


#: The geometric op fused into the decode (values shared with the C++ engine through
#: :mod:`fastload.engine_abi`, their one definition).
OpKind = GeometryKind


def _pair(size: Union[int, Tuple[int, int]], name: str) -> Tuple[int, int]:
    if isinstance(size, int):
        size = (size, size)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise ValueError(f"{name}={size!r} must be a positive int or a (height, width) pair")
    return (int(size[0]), int(size[1]))


def _check_range(value: Tuple[float, float], name: str, lower: float) -> Tuple[float, float]:
    lo, hi = float(value[0]), float(value[1])
    if not (lower < lo <= hi) or not math.isfinite(hi):
        raise ValueError(f"{name}={value!r} must satisfy {lower} < low <= high")
    return (lo, hi)


def _check_flip(flip: float) -> float:
    if not 0.0 <= flip <= 1.0:
        raise ValueError(f"flip={flip!r} must be a probability in [0, 1]")
    return float(flip)


@dataclass(frozen=True, kw_only=True)
class RandomResizedCrop:
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` followed by ``RandomHorizontalFlip(flip)``.

    Args:
        size: Output ``(height, width)`` or one int for a square.
        scale: Range of the crop's area as a fraction of the image area.
        ratio: Range of the crop's aspect ratio (width / height).
        flip: Probability of a horizontal flip.
    """

    size: Union[int, Tuple[int, int]] = 224
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        scale = _check_range(self.scale, "scale", 0.0)
        if scale[1] > 1.0:
            raise ValueError(f"scale={self.scale!r}: the area fraction cannot exceed 1.0")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", _check_range(self.ratio, "ratio", 0.0))
        object.__setattr__(self, "flip", _check_flip(self.flip))

    kind = OpKind.RANDOM_RESIZED_CROP


@dataclass(frozen=True, kw_only=True)
class CenterCrop:
    """Evaluation transform: ``Resize(resize)`` (shorter side) then ``CenterCrop(size)``, as torchvision.

    Args:
        size: Output ``(height, width)`` or one int for a square.
        resize: Length the shorter side is scaled to before the center crop; ``None`` crops the
            largest centered box of the output's aspect ratio without a prior resize step.
        flip: Probability of a horizontal flip (0 for evaluation).
    """

    size: Union[int, Tuple[int, int]] = 224
    resize: Union[int, None] = 256
    flip: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        if self.resize is not None and (not isinstance(self.resize, int) or self.resize <= 0):
            raise ValueError(f"resize={self.resize!r} must be a positive int or None")
        if self.resize is not None and self.resize < min(self.size):
            raise ValueError(f"resize={self.resize} must be >= the crop size {self.size}")
        object.__setattr__(self, "flip", _check_flip(self.flip))

    kind = OpKind.RESIZE_CENTER_CROP


@dataclass(frozen=True, kw_only=True)
class Resize:
    """Resize the whole image to exactly ``size`` (aspect ratio not kept), optional flip.

    Args:
        size: Output ``(height, width)`` or one int for a square.
        flip: Probability of a horizontal flip.
    """

    size: Union[int, Tuple[int, int]] = 224
    flip: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        object.__setattr__(self, "flip", _check_flip(self.flip))

    kind = OpKind.RESIZE


Transform = Union[RandomResizedCrop, CenterCrop, Resize]


def train(size: int = 224, *, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), flip: float = 0.5) -> RandomResizedCrop:
    """The standard ImageNet training transform: RandomResizedCrop(size) + RandomHorizontalFlip."""
    return RandomResizedCrop(size=size, scale=scale, ratio=ratio, flip=flip)


def eval_transform(size: int = 224, *, resize: int = 256) -> CenterCrop:
    """The standard ImageNet evaluation transform: Resize(resize) + CenterCrop(size)."""
    return CenterCrop(size=size, resize=resize)


def _round_half_even(x: float) -> int:
    # torchvision rounds with Python's round() (ties to even); the C++ engine uses std::nearbyint
    # under the default rounding mode, which is the same IEEE round-half-even.
    return int(round(x))


@dataclass(frozen=True)
class SampleParams:
    """What the engine did to one sample: the source box (float pixels) and the flip."""

    x0: float
    y0: float
    x1: float
    y1: float
    flip: bool

    @property
    def box(self) -> Tuple[float, float, float, float]:
        return (self.x0, self.y0, self.x1, self.y1)


def _rrc_box(width: int, height: int, t: RandomResizedCrop, key: int) -> Tuple[int, int, int, int]:
    area = float(width * height)
    log_lo, log_hi = math.log(t.ratio[0]), math.log(t.ratio[1])
    for attempt in range(_MAX_ATTEMPTS):
        c = attempt * _DRAWS_PER_ATTEMPT
        target_area = area * (t.scale[0] + (t.scale[1] - t.scale[0]) * uniform(key, c))
        aspect = math.exp(log_lo + (log_hi - log_lo) * uniform(key, c + 1))
        w = _round_half_even(math.sqrt(target_area * aspect))
        h = _round_half_even(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            y = min(int(uniform(key, c + 2) * (height - h + 1)), height - h)
            x = min(int(uniform(key, c + 3) * (width - w + 1)), width - w)
            return x, y, w, h
    # Fallback, as torchvision: the whole image clamped to the ratio range, centered.
    in_ratio = width / height
    if in_ratio < t.ratio[0]:
        w = width
        h = _round_half_even(w / t.ratio[0])
    elif in_ratio > t.ratio[1]:
        h = height
        w = _round_half_even(h * t.ratio[1])
    else:
        w, h = width, height
    w, h = max(1, min(w, width)), max(1, min(h, height))
    return (width - w) // 2, (height - h) // 2, w, h


def sample_params(width: int, height: int, transform: Transform, *, seed: int, epoch: int, index: int) -> SampleParams:
    """The source box and flip the engine uses for one sample (the reference implementation).

    Args:
        width: Width of the full-size image in pixels.
        height: Height of the full-size image in pixels.
        transform: The op spec.
        seed: Loader seed.
        epoch: Epoch number.
        index: Global sample index in the dataset (not its position in a batch).

    Returns:
        The box in full-size source coordinates and whether the output is mirrored.
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"image size {width}x{height} must be positive")
    key = sample_key(seed, epoch, index)
    out_h, out_w = transform.size
    if transform.kind == OpKind.RANDOM_RESIZED_CROP:
        x, y, w, h = _rrc_box(width, height, transform, key)
        box = (float(x), float(y), float(x + w), float(y + h))
    elif transform.kind == OpKind.RESIZE_CENTER_CROP:
        if transform.resize is None:
            # Largest centered box with the output's aspect ratio.
            s = min(width / out_w, height / out_h)
        else:
            # torchvision Resize(int): shorter side -> resize, longer side truncated to int.
            if width <= height:
                new_w, new_h = transform.resize, int(transform.resize * height / width)
            else:
                new_w, new_h = int(transform.resize * width / height), transform.resize
            s = width / new_w  # source pixels per resized pixel (x); y uses its own factor
            sy = height / new_h
            left = _round_half_even((new_w - out_w) / 2.0)
            top = _round_half_even((new_h - out_h) / 2.0)
            box = (left * s, top * sy, (left + out_w) * s, (top + out_h) * sy)
            return SampleParams(*box, flip=uniform(key, _FLIP_DRAW) < transform.flip)
        w, h = out_w * s, out_h * s
        box = ((width - w) / 2.0, (height - h) / 2.0, (width + w) / 2.0, (height + h) / 2.0)
    else:
        box = (0.0, 0.0, float(width), float(height))
    return SampleParams(*box, flip=uniform(key, _FLIP_DRAW) < transform.flip)
