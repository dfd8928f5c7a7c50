"""Geometry ops handed to the decode engine: the crop / resize / flip each sample gets.

A transform here is data, not code: a small frozen dataclass that the engine (C++ or the Pillow
fallback) interprets while decoding. Every random choice (crop box, flip) is a pure function of
``(seed, epoch, sample index)`` through a counter-based generator, so a sample gets the same crop
whatever the thread count, the batch it lands in, or the point an epoch was resumed from. The C++
engine implements the very same arithmetic (``csrc/decode/crop_sampler.h``); :func:`sample_params` is the
reference both are tested against.

Geometry contract shared by every backend: each op yields a *source box* ``(x0, y0, x1, y1)`` in
float pixel coordinates of the full-size decoded image; the box is resampled to the output size
and then mirrored left-right when the flip was drawn, top-bottom when the vertical flip was
(``vflip``, torchvision's ``RandomVerticalFlip``). :class:`RandomCrop` takes an unscaled window of
the padded image instead (its box may reach into the padding). Counters: RandomResizedCrop's
attempts use 0..39, RandomCrop's window 0 (top) and 1 (left), the flip 40, the vertical flip 41, the
choice of filter 42. :func:`resample` is the reference:

* ``interpolation`` ``"bilinear"`` (default), ``"bicubic"`` or ``"nearest"``, or a pair of them: one
  of the two per image, each with probability 1/2 (timm's ``interpolation='random'``, bilinear or
  bicubic; :attr:`SampleParams.interpolation` says which);
* ``antialias=True`` (default): torchvision's PIL backend, whose filters follow Pillow's
  ``Image.resize`` (the triangle or a = -0.5 cubic filter with its support scaled by the
  downscale factor; torchvision's tensor resize with ``antialias=True`` follows the same filters),
  and for ``"nearest"`` PIL's ``NEAREST`` (the pixel under each output pixel's centre);
* ``antialias=False``: torchvision's tensor backend without antialiasing (torch's
  ``interpolate(align_corners=False)``: 2 taps, or 4 with A = -0.75, and for ``"nearest"`` the
  pixel at ``floor(x * scale)``);
* RandomResizedCrop resizes its crop (its filters stop at the crop's edges), Resize + CenterCrop
  resize the whole image (the filters stop at the image's edges), as torchvision's ops do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from fastload.engine_abi import GeometryKind
from fastload.transforms.rng import sample_key, uniform

__all__ = [
    "INTERPOLATIONS",
    "PADDING_MODES",
    "CenterCrop",
    "CropWindow",
    "ImageTooSmall",
    "OpKind",
    "RandomCrop",
    "RandomResizedCrop",
    "Resize",
    "SampleParams",
    "Transform",
    "eval_transform",
    "random_crop_window",
    "resample",
    "sample_interpolation",
    "sample_params",
    "train",
]
# Which counter value feeds which decision. Fixed so the C++ engine and this module agree.
_DRAWS_PER_ATTEMPT = 4  # area, log-aspect, y, x
_MAX_ATTEMPTS = 10
_FLIP_DRAW = _DRAWS_PER_ATTEMPT * _MAX_ATTEMPTS  # 40
_VFLIP_DRAW = _FLIP_DRAW + 1  # 41
_INTERPOLATION_DRAW = _VFLIP_DRAW + 1  # 42: which filter of an interpolation pair
# RandomCrop draws its window's top from counter 0 and its left from counter 1 (torchvision draws i,
# then j).
_CROP_TOP_DRAW, _CROP_LEFT_DRAW = 0, 1


#: The geometric op fused into the decode (values shared with the C++ engine through
#: :mod:`fastload.engine_abi`, their one definition).
OpKind = GeometryKind


def _pair(size: int | tuple[int, int], name: str) -> tuple[int, int]:
    if isinstance(size, int):
        size = (size, size)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise ValueError(f"{name}={size!r} must be a positive int or a (height, width) pair")
    return (int(size[0]), int(size[1]))


class _Sized(Protocol):
    @property
    def size(self) -> int | tuple[int, int]: ...


def output_size(op: _Sized) -> tuple[int, int]:
    """A geometry op's output ``(height, width)``: the pair its ``size`` holds once constructed."""
    return _pair(op.size, "size")


def _check_range(value: tuple[float, float], name: str, lower: float) -> tuple[float, float]:
    lo, hi = float(value[0]), float(value[1])
    if not (lower < lo <= hi) or not math.isfinite(hi):
        raise ValueError(f"{name}={value!r} must satisfy {lower} < low <= high")
    return (lo, hi)


def _check_flip(flip: float, name: str = "flip") -> float:
    if isinstance(flip, bool) or not isinstance(flip, (int, float)) or not 0.0 <= flip <= 1.0:
        raise ValueError(f"{name}={flip!r} must be a probability in [0, 1]")
    return float(flip)


#: The resampling filters the engine implements.
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


def _check_interpolation(value: Any) -> str:
    """``"bilinear"`` / ``"bicubic"`` / ``"nearest"`` from a string or torchvision's ``InterpolationMode``."""
    name = getattr(value, "value", value)
    if not isinstance(name, str) or name.lower() not in INTERPOLATIONS:
        raise ValueError(f"interpolation={value!r} must be one of {INTERPOLATIONS}")
    return name.lower()


def _check_filter(op: Any) -> None:
    value = op.interpolation
    if isinstance(value, (tuple, list)):
        names = tuple(_check_interpolation(v) for v in value)
        if len(names) != 2 or names[0] == names[1]:
            raise ValueError(f"interpolation={value!r}: a random choice takes two different filters")
        object.__setattr__(op, "interpolation", names)
    else:
        object.__setattr__(op, "interpolation", _check_interpolation(value))
    if not isinstance(op.antialias, bool):
        raise ValueError(f"antialias={op.antialias!r} must be a bool")


@dataclass(frozen=True, kw_only=True)
class RandomResizedCrop:
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` followed by ``RandomHorizontalFlip(flip)``.

    Args:
        size: Output ``(height, width)`` or one int for a square.
        scale: Range of the crop's area as a fraction of the image area.
        ratio: Range of the crop's aspect ratio (width / height).
        flip: Probability of a horizontal flip.
        interpolation: ``"bilinear"``, ``"bicubic"`` or ``"nearest"`` (torchvision's
            ``InterpolationMode`` members are accepted), or a pair of them: one drawn per image
            (timm's ``interpolation='random'`` is ``("bilinear", "bicubic")``).
        antialias: torchvision's ``antialias``: True follows the PIL backend's filters (the
            default), False the tensor resize without antialiasing (see the module docstring).
        vflip: Probability of a vertical flip (torchvision's ``RandomVerticalFlip(p)``).
    """

    size: int | tuple[int, int] = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip: float = 0.5
    interpolation: str | tuple[str, str] = "bilinear"
    antialias: bool = True
    vflip: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        object.__setattr__(self, "vflip", _check_flip(self.vflip, "vflip"))
        scale = _check_range(self.scale, "scale", 0.0)
        if scale[1] > 1.0:
            raise ValueError(f"scale={self.scale!r}: the area fraction cannot exceed 1.0")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", _check_range(self.ratio, "ratio", 0.0))
        object.__setattr__(self, "flip", _check_flip(self.flip))
        _check_filter(self)

    kind: ClassVar[Literal[OpKind.RANDOM_RESIZED_CROP]] = OpKind.RANDOM_RESIZED_CROP


@dataclass(frozen=True, kw_only=True)
class CenterCrop:
    """Evaluation transform: ``Resize(resize)`` (shorter side) then ``CenterCrop(size)``, as torchvision.

    Args:
        size: Output ``(height, width)`` or one int for a square.
        resize: Length the shorter side is scaled to before the center crop; ``None`` crops the
            largest centered box of the output's aspect ratio without a prior resize step.
        flip: Probability of a horizontal flip (0 for evaluation).
        interpolation: ``"bilinear"``, ``"bicubic"`` or ``"nearest"`` (of the ``Resize``), or a pair
            of them drawn per image.
        antialias: As for :class:`RandomResizedCrop`.
        vflip: Probability of a vertical flip.
    """

    size: int | tuple[int, int] = 224
    resize: int | None = 256
    flip: float = 0.0
    interpolation: str | tuple[str, str] = "bilinear"
    antialias: bool = True
    vflip: float = 0.0

    def __post_init__(self) -> None:
        size = _pair(self.size, "size")
        object.__setattr__(self, "size", size)
        if self.resize is not None and (not isinstance(self.resize, int) or self.resize <= 0):
            raise ValueError(f"resize={self.resize!r} must be a positive int or None")
        if self.resize is not None and self.resize < min(size):
            raise ValueError(f"resize={self.resize} must be >= the crop size {size}")
        object.__setattr__(self, "flip", _check_flip(self.flip))
        object.__setattr__(self, "vflip", _check_flip(self.vflip, "vflip"))
        _check_filter(self)

    kind: ClassVar[Literal[OpKind.RESIZE_CENTER_CROP]] = OpKind.RESIZE_CENTER_CROP


@dataclass(frozen=True, kw_only=True)
class Resize:
    """Resize the whole image to exactly ``size`` (aspect ratio not kept), optional flip.

    Args:
        size: Output ``(height, width)`` or one int for a square.
        flip: Probability of a horizontal flip.
        interpolation: ``"bilinear"``, ``"bicubic"`` or ``"nearest"``, or a pair of them drawn per image.
        antialias: As for :class:`RandomResizedCrop`.
        vflip: Probability of a vertical flip.
    """

    size: int | tuple[int, int] = 224
    flip: float = 0.0
    interpolation: str | tuple[str, str] = "bilinear"
    antialias: bool = True
    vflip: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        object.__setattr__(self, "flip", _check_flip(self.flip))
        object.__setattr__(self, "vflip", _check_flip(self.vflip, "vflip"))
        _check_filter(self)

    kind: ClassVar[Literal[OpKind.RESIZE]] = OpKind.RESIZE


class ImageTooSmall(ValueError):
    """An image smaller than an unscaled crop, even after its padding (RandomCrop)."""


#: torchvision's ``padding_mode`` values.
PADDING_MODES = ("constant", "edge", "reflect", "symmetric")
PaddingMode = Literal["constant", "edge", "reflect", "symmetric"]


def _padding(value: Any) -> tuple[int, int, int, int]:
    """Torchvision's padding: an int (all borders), (left/right, top/bottom) or (left, top, right, bottom)."""
    if value is None:
        return (0, 0, 0, 0)
    items = (
        (value,)
        if isinstance(value, int) and not isinstance(value, bool)
        else tuple(value)
        if isinstance(value, (tuple, list))
        else None
    )
    if (
        items is None
        or len(items) not in (1, 2, 4)
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items)
    ):
        raise ValueError(
            f"padding={value!r} must be a non-negative int, (left/right, top/bottom) or (left, top, right, bottom)"
        )
    if len(items) == 1:
        return (items[0],) * 4
    if len(items) == 2:
        return (items[0], items[1], items[0], items[1])
    return items


def _fill(value: Any) -> tuple[int, int, int]:
    items = (
        (value,) * 3
        if isinstance(value, int) and not isinstance(value, bool)
        else tuple(value)
        if isinstance(value, (tuple, list))
        else None
    )
    if (
        items is None
        or len(items) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in items)
    ):
        raise ValueError(f"fill={value!r} must be an int in 0..255 or 3 of them (one per channel)")
    return items


@dataclass(frozen=True, kw_only=True)
class RandomCrop:
    """torchvision's ``RandomCrop(size, padding, pad_if_needed, fill, padding_mode)``.

    Pad, then an unscaled random crop (the CIFAR recipes: ``RandomCrop(32, padding=4)`` + flip).

    Args:
        size: Output ``(height, width)`` or one int for a square.
        padding: Padding added to every image first: an int (all borders), ``(left/right,
            top/bottom)`` or ``(left, top, right, bottom)``; None for none.
        fill: The constant padding's value: an int for all channels or one per channel (0..255).
        pad_if_needed: Pad an image smaller than the crop (after ``padding``) by the difference on
            both sides, as torchvision does, instead of failing it.
        padding_mode: ``"constant"`` (``fill``), ``"edge"``, ``"reflect"`` or ``"symmetric"``
            (numpy's ``pad`` modes, as torchvision's PIL backend; with ``pad_if_needed`` the second
            padding reflects the padded image, as torchvision's two ``pad`` calls do).
        flip: Probability of a horizontal flip.
        vflip: Probability of a vertical flip.

    An image smaller than the crop after padding (without ``pad_if_needed``) gets the status
    ``TOO_SMALL`` (torchvision raises).
    """

    size: int | tuple[int, int] = 32
    padding: Any = None
    fill: Any = 0
    pad_if_needed: bool = False
    padding_mode: PaddingMode = "constant"
    flip: float = 0.0
    vflip: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        object.__setattr__(self, "padding", _padding(self.padding))
        object.__setattr__(self, "fill", _fill(self.fill))
        if not isinstance(self.pad_if_needed, bool):
            raise ValueError(f"pad_if_needed={self.pad_if_needed!r} must be a bool")
        if self.padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode={self.padding_mode!r} must be one of {PADDING_MODES}")
        object.__setattr__(self, "flip", _check_flip(self.flip))
        object.__setattr__(self, "vflip", _check_flip(self.vflip, "vflip"))

    kind: ClassVar[Literal[OpKind.RANDOM_CROP]] = OpKind.RANDOM_CROP
    interpolation = "nearest"  # an unscaled crop: every output pixel is one source pixel
    antialias = True


_CUBIC_A = -0.75  # the Keys cubic of PIL and torchvision


def _cubic_near(v: float) -> float:
    """Cubic convolution weight for a tap within one pixel of the sample point."""
    a = _CUBIC_A
    return ((a + 2.0) * v - (a + 3.0)) * v * v + 1.0


def _cubic_far(v: float) -> float:
    """Cubic convolution weight for a tap one to two pixels from the sample point."""
    a = _CUBIC_A
    return ((a * v - 5.0 * a) * v + 8.0 * a) * v - 4.0 * a


Transform = RandomResizedCrop | CenterCrop | Resize | RandomCrop


def train(
    size: int = 224,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
    flip: float = 0.5,
    interpolation: str = "bilinear",
    antialias: bool = True,
    vflip: float = 0.0,
) -> RandomResizedCrop:
    """The standard ImageNet training transform: RandomResizedCrop(size) + RandomHorizontalFlip."""
    return RandomResizedCrop(
        size=size, scale=scale, ratio=ratio, flip=flip, interpolation=interpolation, antialias=antialias, vflip=vflip
    )


def eval_transform(
    size: int = 224, *, resize: int = 256, interpolation: str = "bilinear", antialias: bool = True
) -> CenterCrop:
    """The standard ImageNet evaluation transform: Resize(resize) + CenterCrop(size)."""
    return CenterCrop(size=size, resize=resize, interpolation=interpolation, antialias=antialias)


def _round_half_even(x: float) -> int:
    # torchvision rounds with Python's round() (ties to even); the C++ engine uses std::nearbyint
    # under the default rounding mode, which is the same IEEE round-half-even.
    return round(x)


@dataclass(frozen=True)
class SampleParams:
    """What the engine did to one sample: the source box (float pixels), the flips and the filter.

    For RandomCrop the box is the crop window in the original image's coordinates; it may reach
    past the image (into the padding), e.g. ``(-4, -2, 28, 30)``. ``interpolation`` is the filter
    the box was resampled with (the drawn one when the op gives a pair).
    """

    x0: float
    y0: float
    x1: float
    y1: float
    flip: bool
    vflip: bool = False
    interpolation: str = "bilinear"

    @property
    def box(self) -> tuple[float, float, float, float]:
        return (self.x0, self.y0, self.x1, self.y1)


def _rrc_box(width: int, height: int, t: RandomResizedCrop, key: int) -> tuple[int, int, int, int]:
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


@dataclass(frozen=True)
class CropWindow:
    """Where a RandomCrop takes its window: the two paddings and the window in the padded image."""

    pad: tuple[int, int, int, int]  # the op's padding (left, top, right, bottom)
    pad_x: int  # pad_if_needed's padding on the left and on the right
    pad_y: int  # ... on the top and at the bottom
    top: int  # the window's origin in the twice-padded image
    left: int

    @property
    def x0(self) -> int:
        """The window's left edge in original-image coordinates."""
        return self.left - self.pad_x - self.pad[0]

    @property
    def y0(self) -> int:
        return self.top - self.pad_y - self.pad[1]


def random_crop_window(width: int, height: int, t: RandomCrop, key: int) -> CropWindow | None:
    """Torchvision's RandomCrop arithmetic for one sample; None when the padded image is too small."""
    out_h, out_w = output_size(t)
    left_pad, top_pad, right_pad, bottom_pad = t.padding
    w1, h1 = width + left_pad + right_pad, height + top_pad + bottom_pad
    pad_x = out_w - w1 if t.pad_if_needed and w1 < out_w else 0
    pad_y = out_h - h1 if t.pad_if_needed and h1 < out_h else 0
    w2, h2 = w1 + 2 * pad_x, h1 + 2 * pad_y
    if w2 < out_w or h2 < out_h:
        return None
    top = min(int(uniform(key, _CROP_TOP_DRAW) * (h2 - out_h + 1)), h2 - out_h)
    left = min(int(uniform(key, _CROP_LEFT_DRAW) * (w2 - out_w + 1)), w2 - out_w)
    return CropWindow(pad=t.padding, pad_x=pad_x, pad_y=pad_y, top=top, left=left)


def _center_crop_window(width: int, height: int, t: CenterCrop) -> tuple[int, int, int, int]:
    """Torchvision's Resize(int) + CenterCrop: the resized size and the crop's left, top in it."""
    out_h, out_w = output_size(t)
    assert t.resize is not None
    # Resize(int): shorter side -> resize, longer side truncated to int.
    if width <= height:
        new_w, new_h = t.resize, int(t.resize * height / width)
    else:
        new_w, new_h = int(t.resize * width / height), t.resize
    left = _round_half_even((new_w - out_w) / 2.0)
    top = _round_half_even((new_h - out_h) / 2.0)
    return new_w, new_h, left, top


def sample_interpolation(transform: Any, key: int) -> str:
    """The filter of one sample: the op's, or one of its pair (``uniform(key, 42) < 0.5``: the first)."""
    interpolation: str | tuple[str, str] = getattr(transform, "interpolation", "bilinear")
    if isinstance(interpolation, tuple):
        return interpolation[0] if uniform(key, _INTERPOLATION_DRAW) < 0.5 else interpolation[1]
    return interpolation


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
    out_h, out_w = output_size(transform)
    flips: dict[str, Any] = {
        "flip": uniform(key, _FLIP_DRAW) < transform.flip,
        "vflip": uniform(key, _VFLIP_DRAW) < getattr(transform, "vflip", 0.0),
        "interpolation": sample_interpolation(transform, key),
    }
    if transform.kind == OpKind.RANDOM_CROP:
        window = random_crop_window(width, height, transform, key)
        if window is None:
            raise ImageTooSmall(
                f"image {width}x{height} is smaller than the crop {out_w}x{out_h} after padding "
                f"{transform.padding} (pad_if_needed=False)"
            )
        x0, y0 = window.x0, window.y0
        return SampleParams(float(x0), float(y0), float(x0 + out_w), float(y0 + out_h), **flips)
    w: float
    h: float
    if transform.kind == OpKind.RANDOM_RESIZED_CROP:
        x, y, w, h = _rrc_box(width, height, transform, key)
        box = (float(x), float(y), float(x + w), float(y + h))
    elif transform.kind == OpKind.RESIZE_CENTER_CROP:
        if transform.resize is None:
            # Largest centered box with the output's aspect ratio.
            s = min(width / out_w, height / out_h)
        else:
            new_w, new_h, left, top = _center_crop_window(width, height, transform)
            s = width / new_w  # source pixels per resized pixel (x); y uses its own factor
            sy = height / new_h
            box = (left * s, top * sy, (left + out_w) * s, (top + out_h) * sy)
            return SampleParams(*box, **flips)
        w, h = out_w * s, out_h * s
        box = ((width - w) / 2.0, (height - h) / 2.0, (width + w) / 2.0, (height + h) / 2.0)
    else:
        box = (0.0, 0.0, float(width), float(height))
    return SampleParams(*box, **flips)


_PIL_FILTERS = {"bilinear": "BILINEAR", "bicubic": "BICUBIC", "nearest": "NEAREST"}


def _plain_weights(
    in0: float, in1: float, out_size: int, clip0: int, clip1: int, interpolation: str
) -> NDArray[np.float64]:
    """[out_size, clip1 - clip0] weights of torch's interpolate(align_corners=False) without antialiasing."""
    scale = (in1 - in0) / out_size
    w = np.zeros((out_size, clip1 - clip0), np.float64)

    def put(row: int, i: int, value: float) -> None:
        w[row, min(max(i, clip0), clip1 - 1) - clip0] += value

    # torch's "nearest" takes floorf(j * scale) in float32, j the pixel of the resized axis (a
    # window of it starts at j0 = (in0 - clip0) / scale).
    j0 = round((in0 - clip0) / scale)
    scale32 = np.float32(scale)
    for x in range(out_size):
        if interpolation == "nearest":
            put(x, clip0 + int(np.floor(np.float32(j0 + x) * scale32)), 1.0)
            continue
        src = in0 + (x + 0.5) * scale - 0.5
        if interpolation == "bilinear":
            src = max(src, float(clip0))
            i0 = min(clip1 - 1, math.floor(src))
            put(x, i0, 1.0 - (src - i0))
            put(x, i0 + 1, src - i0)
        else:
            i = math.floor(src)
            t = src - i
            for k, value in enumerate((_cubic_far(t + 1.0), _cubic_near(t), _cubic_near(1.0 - t), _cubic_far(2.0 - t))):
                put(x, i - 1 + k, value)
    return w


def resample(image: Any, params: SampleParams, transform: Transform) -> NDArray[np.uint8]:
    """The reference geometry: a decoded RGB image -> the output-sized HWC uint8 array.

    Args:
        image: The full-size decoded image (a PIL ``Image`` in RGB mode).
        params: What :func:`sample_params` drew for it.
        transform: The geometry op.

    Returns:
        ``[height, width, 3]`` uint8: the box resampled with the op's filter, then flipped.
    """
    from PIL import Image

    out_h, out_w = output_size(transform)
    if transform.kind == OpKind.RANDOM_CROP:
        arr = _random_crop_reference(np.asarray(image), params, transform)
        if params.flip:
            arr = arr[:, ::-1]
        if params.vflip:
            arr = arr[::-1]
        return np.ascontiguousarray(arr)
    interpolation = params.interpolation
    antialias = getattr(transform, "antialias", True)
    x0, y0, x1, y1 = params.box
    crop = transform.kind == OpKind.RANDOM_RESIZED_CROP
    if antialias:
        resample_filter = getattr(Image, _PIL_FILTERS[interpolation])
        if crop:  # torchvision: crop, then resize the crop
            image = image.crop((int(x0), int(y0), int(x1), int(y1)))
            out = image.resize((out_w, out_h), resample_filter)
        elif transform.kind == OpKind.RESIZE_CENTER_CROP and transform.resize is not None:
            # torchvision: resize the whole image, then crop the window (the same pixels as a resize
            # of the box, up to how Pillow's arithmetic rounds at exact ties).
            new_w, new_h, left, top = _center_crop_window(image.width, image.height, transform)
            out = image.resize((new_w, new_h), resample_filter).crop((left, top, left + out_w, top + out_h))
        else:
            out = image.resize((out_w, out_h), resample_filter, box=params.box)
        arr = np.asarray(out)
    else:
        width, height = image.size
        cx = (int(x0), int(x1)) if crop else (0, width)
        cy = (int(y0), int(y1)) if crop else (0, height)
        wx = _plain_weights(x0, x1, out_w, cx[0], cx[1], interpolation)
        wy = _plain_weights(y0, y1, out_h, cy[0], cy[1], interpolation)
        src = np.asarray(image, np.float64)[cy[0] : cy[1], cx[0] : cx[1]]
        # Separable, horizontal pass first, rounded to uint8 in between, as torch's uint8 kernels
        # (which torchvision uses for uint8 images on CPU) and Pillow do.
        rows = np.clip(np.floor(np.einsum("ijc,xj->ixc", src, wx, optimize=True) + 0.5), 0, 255)
        res = np.einsum("yi,ixc->yxc", wy, rows, optimize=True)
        arr = np.clip(np.floor(res + 0.5), 0, 255).astype(np.uint8)
    if params.flip:
        arr = arr[:, ::-1]
    if params.vflip:
        arr = arr[::-1]
    return np.ascontiguousarray(arr)


def _pad(arr: NDArray[np.uint8], top: int, bottom: int, left: int, right: int, t: RandomCrop) -> NDArray[np.uint8]:
    widths = ((top, bottom), (left, right), (0, 0))
    if t.padding_mode == "constant":
        out = np.empty((arr.shape[0] + top + bottom, arr.shape[1] + left + right, 3), np.uint8)
        out[...] = np.asarray(t.fill, np.uint8)
        out[top : top + arr.shape[0], left : left + arr.shape[1]] = arr
        return out
    return np.pad(arr, widths, mode=t.padding_mode)


def _random_crop_reference(arr: NDArray[np.uint8], params: SampleParams, t: RandomCrop) -> NDArray[np.uint8]:
    """Torchvision's RandomCrop (PIL backend): pad, pad again if needed, crop."""
    out_h, out_w = output_size(t)
    left, top, right, bottom = t.padding
    if any(t.padding):
        arr = _pad(arr, top, bottom, left, right, t)
    pad_x = out_w - arr.shape[1] if t.pad_if_needed and arr.shape[1] < out_w else 0
    if pad_x:
        arr = _pad(arr, 0, 0, pad_x, pad_x, t)
    pad_y = out_h - arr.shape[0] if t.pad_if_needed and arr.shape[0] < out_h else 0
    if pad_y:
        arr = _pad(arr, pad_y, pad_y, 0, 0, t)
    y = int(params.y0) + top + pad_y
    x = int(params.x0) + left + pad_x
    return arr[y : y + out_h, x : x + out_w]
