"""Pixel op primitives, Python reference: torchvision's PIL-backend arithmetic on HWC uint8 images.

Each function takes and returns an HWC uint8 RGB numpy array and does what
``torchvision.transforms.functional`` does to a PIL image (the backend a typical pipeline uses:
these ops run on the PIL image before ``ToTensor``), by calling Pillow the same way. The C++ engine
(``csrc/pixel/pixel_ops.cpp``, ``csrc/pixel/pixel_warp.cpp``) reproduces Pillow's integer and floating-point
steps; the tests compare the two byte for byte.

The geometric primitives (the policies' ShearX/Y, TranslateX/Y and Rotate) take a
:class:`WarpPlan`: the inverse affine matrix Pillow's ``Image.transform`` receives, or one of the
exact transposes ``Image.rotate`` uses for multiples of 90 degrees. :func:`warp_plan` computes it
from the op and its signed magnitude, with torchvision's formulas; the plans are handed to the
engine as numbers, so both backends use the very same matrices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastload.engine_abi import PixelPrim, WarpMode

__all__ = [
    "GEOMETRIC_PRIMS",
    "Prim",
    "WarpMode",
    "WarpPlan",
    "apply_prim",
    "autocontrast",
    "brightness",
    "contrast",
    "equalize",
    "grayscale",
    "hue",
    "invert",
    "posterize",
    "saturation",
    "sharpness",
    "solarize",
    "warp",
    "warp_plan",
]


#: The primitives; one definition with the engine (fastload/engine_abi.py).
Prim = PixelPrim

GEOMETRIC_PRIMS = frozenset({Prim.SHEAR_X, Prim.SHEAR_Y, Prim.TRANSLATE_X, Prim.TRANSLATE_Y, Prim.ROTATE})


def _pil(image: np.ndarray):
    # Pillow is imported on first use: importing fastload.transforms stays cheap.
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(image), "RGB")


def _np(img) -> np.ndarray:
    return np.asarray(img, dtype=np.uint8).copy()


def brightness(image: np.ndarray, factor: float) -> np.ndarray:
    """``adjust_brightness``: blend with black (Pillow ``ImageEnhance.Brightness``)."""
    from PIL import ImageEnhance

    return _np(ImageEnhance.Brightness(_pil(image)).enhance(factor))


def contrast(image: np.ndarray, factor: float) -> np.ndarray:
    """``adjust_contrast``: blend with the rounded mean of the grayscale image."""
    from PIL import ImageEnhance

    return _np(ImageEnhance.Contrast(_pil(image)).enhance(factor))


def saturation(image: np.ndarray, factor: float) -> np.ndarray:
    """``adjust_saturation``: blend with the grayscale image (``ImageEnhance.Color``)."""
    from PIL import ImageEnhance

    return _np(ImageEnhance.Color(_pil(image)).enhance(factor))


def sharpness(image: np.ndarray, factor: float) -> np.ndarray:
    """``adjust_sharpness``: blend with the 3x3 SMOOTH-filtered image (borders kept)."""
    from PIL import ImageEnhance

    return _np(ImageEnhance.Sharpness(_pil(image)).enhance(factor))


def hue_shift(factor: float) -> int:
    """The byte added to Pillow's 8-bit hue for ``hue_factor`` (truncated, wrapping, as torchvision)."""
    return int(np.int32(factor * 255).astype(np.uint8))


def hue(image: np.ndarray, factor: float) -> np.ndarray:
    """``adjust_hue``: Pillow's 8-bit HSV, hue shifted by ``hue_shift(factor)`` modulo 256."""
    if not -0.5 <= factor <= 0.5:
        raise ValueError(f"hue factor {factor} is not in [-0.5, 0.5]")
    from PIL import Image

    h, s, v = _pil(image).convert("HSV").split()
    np_h = np.asarray(h, dtype=np.uint8) + np.uint8(hue_shift(factor))
    merged = Image.merge("HSV", (Image.fromarray(np_h.astype(np.uint8), "L"), s, v))
    return _np(merged.convert("RGB"))


def grayscale(image: np.ndarray) -> np.ndarray:
    """``rgb_to_grayscale(num_output_channels=3)``: Pillow's ``convert("L")`` in all three channels."""
    gray = np.asarray(_pil(image).convert("L"), dtype=np.uint8)
    return np.repeat(gray[:, :, None], 3, axis=2)


def posterize(image: np.ndarray, bits: int) -> np.ndarray:
    """Keeps the ``bits`` high bits of every channel."""
    from PIL import ImageOps

    return _np(ImageOps.posterize(_pil(image), int(bits)))


def solarize(image: np.ndarray, threshold: float) -> np.ndarray:
    """Inverts the values at or above ``threshold``."""
    from PIL import ImageOps

    return _np(ImageOps.solarize(_pil(image), threshold))  # type: ignore[arg-type]  # Pillow's stub says int; floats work


def autocontrast(image: np.ndarray) -> np.ndarray:
    """Stretches each channel's [min, max] to [0, 255] (Pillow's lookup table, no cutoff)."""
    from PIL import ImageOps

    return _np(ImageOps.autocontrast(_pil(image)))


def equalize(image: np.ndarray) -> np.ndarray:
    """Histogram equalization per channel (Pillow's lookup table)."""
    from PIL import ImageOps

    return _np(ImageOps.equalize(_pil(image)))


def invert(image: np.ndarray) -> np.ndarray:
    """255 - value."""
    return (255 - image).astype(np.uint8)


@dataclass(frozen=True)
class WarpPlan:
    """A geometric primitive as Pillow runs it: ``mode`` and, for AFFINE, the inverse matrix."""

    mode: WarpMode
    matrix: tuple[float, float, float, float, float, float] = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)

    def as_row(self) -> tuple[float, ...]:
        """``(mode, a0..a5)``: the seven numbers the engine receives."""
        return (float(int(self.mode)), *tuple(float(v) for v in self.matrix))


def _inverse_affine(
    center: Sequence[float], angle: float, translate: Sequence[float], scale: float, shear: Sequence[float]
) -> tuple[float, ...]:
    # torchvision's inverse of T * C * R(angle) S(scale) SHy SHx * C^-1, in its order of operations:
    # the nearest-neighbour sampler truncates coordinates, so the last bit of a coefficient matters.
    rot = math.radians(angle)
    sx = math.radians(shear[0])
    sy = math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d / scale, -b / scale, 0.0 / scale, -c / scale, a / scale, 0.0 / scale]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return tuple(m)


def _rotate_plan(angle: float, height: int, width: int) -> WarpPlan:
    # Pillow's Image.rotate(angle, expand=False, center=None, translate=None).
    angle = angle % 360.0
    if angle == 0:
        return WarpPlan(WarpMode.IDENTITY)
    if angle == 180:
        return WarpPlan(WarpMode.ROTATE_180)
    if angle in (90, 270) and width == height:
        return WarpPlan(WarpMode.ROTATE_90 if angle == 90 else WarpMode.ROTATE_270)
    cx, cy = width / 2, height / 2
    rad = -math.radians(angle)
    m = [
        round(math.cos(rad), 15),
        round(math.sin(rad), 15),
        0.0,
        round(-math.sin(rad), 15),
        round(math.cos(rad), 15),
        0.0,
    ]
    x, y = -cx, -cy
    m[2], m[5] = m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]
    m[2] += cx
    m[5] += cy
    return WarpPlan(WarpMode.AFFINE, (m[0], m[1], m[2], m[3], m[4], m[5]))


def warp_plan(prim: Prim, magnitude: float, height: int, width: int) -> WarpPlan:
    """What torchvision's ``_apply_op`` does for a geometric op on a ``height`` x ``width`` PIL image."""
    if prim == Prim.SHEAR_X:
        m = _inverse_affine((0.0, 0.0), 0.0, (0, 0), 1.0, (math.degrees(math.atan(magnitude)), 0.0))
    elif prim == Prim.SHEAR_Y:
        m = _inverse_affine((0.0, 0.0), 0.0, (0, 0), 1.0, (0.0, math.degrees(math.atan(magnitude))))
    elif prim == Prim.TRANSLATE_X:
        m = _inverse_affine((width * 0.5, height * 0.5), 0.0, (int(magnitude), 0), 1.0, (0.0, 0.0))
    elif prim == Prim.TRANSLATE_Y:
        m = _inverse_affine((width * 0.5, height * 0.5), 0.0, (0, int(magnitude)), 1.0, (0.0, 0.0))
    elif prim == Prim.ROTATE:
        return _rotate_plan(magnitude, height, width)
    else:
        raise ValueError(f"{prim!r} is not a geometric primitive")
    return WarpPlan(WarpMode.AFFINE, (m[0], m[1], m[2], m[3], m[4], m[5]))


def warp(image: np.ndarray, plan: WarpPlan, *, bilinear: bool, fill: tuple[int, int, int]) -> np.ndarray:
    """Runs a :class:`WarpPlan` as Pillow does (``Image.transform`` / ``Image.transpose``)."""
    from PIL import Image

    img = _pil(image)
    if plan.mode == WarpMode.IDENTITY:
        return _np(img)
    if plan.mode != WarpMode.AFFINE:
        op = {
            WarpMode.ROTATE_90: Image.Transpose.ROTATE_90,
            WarpMode.ROTATE_180: Image.Transpose.ROTATE_180,
            WarpMode.ROTATE_270: Image.Transpose.ROTATE_270,
        }[plan.mode]
        return _np(img.transpose(op))
    resample = Image.Resampling.BILINEAR if bilinear else Image.Resampling.NEAREST
    return _np(img.transform(img.size, Image.Transform.AFFINE, plan.matrix, resample, fillcolor=tuple(fill)))


def apply_prim(
    image: np.ndarray, prim: Prim, magnitude: float, *, bilinear: bool, fill: tuple[int, int, int]
) -> np.ndarray:
    """Torchvision's ``_apply_op(img, op_name, magnitude, interpolation, fill)`` on a PIL image."""
    prim = Prim(prim)
    if prim == Prim.IDENTITY:
        return image.copy()
    if prim in GEOMETRIC_PRIMS:
        h, w = image.shape[:2]
        return warp(image, warp_plan(prim, magnitude, h, w), bilinear=bilinear, fill=fill)
    if prim == Prim.BRIGHTNESS:
        return brightness(image, 1.0 + magnitude)
    if prim == Prim.COLOR:
        return saturation(image, 1.0 + magnitude)
    if prim == Prim.CONTRAST:
        return contrast(image, 1.0 + magnitude)
    if prim == Prim.SHARPNESS:
        return sharpness(image, 1.0 + magnitude)
    if prim == Prim.POSTERIZE:
        return posterize(image, int(magnitude))
    if prim == Prim.SOLARIZE:
        return solarize(image, magnitude)
    if prim == Prim.AUTOCONTRAST:
        return autocontrast(image)
    if prim == Prim.EQUALIZE:
        return equalize(image)
    if prim == Prim.INVERT:
        return invert(image)
    if prim == Prim.HUE:
        return hue(image, magnitude)
    if prim == Prim.GRAYSCALE:
        return grayscale(image)
    raise ValueError(f"unknown primitive {prim!r}")
