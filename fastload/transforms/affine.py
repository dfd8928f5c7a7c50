"""torchvision's ``RandomAffine`` after the crop, fused with it into one resampling pass.

``RandomAffine(degrees, translate, scale, shear, interpolation, fill, center)`` takes torchvision's
parameter forms and draws torchvision's parameters (angle, translation, scale, shear) for the image
the geometry op produces (the output size). torchvision runs two resamplings: the crop is resized to
the output (antialiased), then ``F.affine`` maps the result (PIL backend: inverse matrix about the
output's centre, hard edge, ``fill`` outside). fastload composes both maps and samples the decoded
image once (:mod:`fastload.transforms.warp`):

- ``interpolation="nearest"`` (torchvision's default) picks, for each output pixel, the resized
  pixel torchvision would pick, and evaluates the crop's antialiased filter at that pixel: the
  two-pass result, without the intermediate image.
- ``"bilinear"`` / ``"bicubic"`` evaluate the crop's filter (triangle / Keys a = -0.5, widened by the
  crop's downscale factor as Pillow's resize does) at the exact warped position instead of
  interpolating between resized pixels. This is the deliberate difference from torchvision: one
  interpolation instead of two, so the result is slightly sharper (mean absolute difference to
  torchvision's PIL two-pass result: see the README's augmentation section and
  ``tests/test_warp.py``).
- Output pixels whose warped position falls outside the resized crop get ``fill``, as in torchvision
  (the crop's surroundings are not revealed by a rotation).

Randomness: counters 48..53 of the sample's stream (inside the geometry's 0..63): angle, x and y
translation, scale, x shear, y shear; each drawn whether or not it is used, so a parameter's value
does not depend on the others being set.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from fastload.transforms.rng import uniform
from fastload.transforms.warp import Affine2, Border, Kernel, WarpPlan

__all__ = [
    "AFFINE_COUNTER",
    "AFFINE_PARAM_NAMES",
    "AffineParams",
    "RandomAffine",
    "affine_plan",
    "inverse_affine_matrix",
    "sample_affine",
]

#: Names of the values ``want_params`` reports per sample for a RandomAffine (``AffineParams.as_tuple``).
AFFINE_PARAM_NAMES = ("angle", "translate_x", "translate_y", "scale", "shear_x", "shear_y")

#: First counter of RandomAffine's draws (angle; then translate x, y, scale, shear x, shear y).
AFFINE_COUNTER = 48

_INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
_KERNELS = {"nearest": Kernel.NEAREST, "bilinear": Kernel.LINEAR, "bicubic": Kernel.CUBIC}


def _interpolation_name(value, name: str = "interpolation") -> str:
    raw = getattr(value, "value", value)  # torchvision's InterpolationMode is a str enum
    if isinstance(raw, str) and raw.lower() in _INTERPOLATIONS:
        return raw.lower()
    raise ValueError(f"{name}={value!r} must be one of {', '.join(map(repr, _INTERPOLATIONS))}")


def _angle_range(value, name: str, sizes: tuple[int, ...]) -> tuple[float, ...]:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name}={value!r}: a single number must be >= 0 (the range is (-{name}, +{name}))")
        return (-float(value), float(value))
    if not isinstance(value, Sequence) or len(value) not in sizes:
        raise ValueError(f"{name}={value!r} must be a number or a sequence of length {' or '.join(map(str, sizes))}")
    out = tuple(float(v) for v in value)
    for lo, hi in zip(out[::2], out[1::2], strict=False):
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"{name}={value!r}: each (min, max) pair must be finite with min <= max")
    return out


def _fill_rgb(fill) -> tuple[int, int, int]:
    values = [fill] if isinstance(fill, numbers.Real) else list(fill) if isinstance(fill, Sequence) else None
    if (
        values is None
        or len(values) not in (1, 3)
        or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values)
    ):
        raise ValueError(f"fill={fill!r} must be a number or a sequence of 1 or 3 numbers")
    numbers_ = [float(v) for v in values]
    if not all(0 <= v <= 255 for v in numbers_):
        raise ValueError(f"fill={fill!r}: values must be in 0..255 (pixel values, before normalization)")
    ints = [int(v) for v in numbers_]  # torchvision's PIL backend truncates to int
    return tuple(ints * 3) if len(ints) == 1 else tuple(ints)  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class RandomAffine:
    """torchvision ``RandomAffine`` on the geometry op's output, fused into its resampling.

    Args:
        degrees: Rotation range in degrees: a number ``d`` (``(-d, d)``) or ``(min, max)``;
            positive angles rotate counter-clockwise, as torchvision.
        translate: Maximum absolute translation as fractions ``(a, b)`` of the output width and
            height; the shift is drawn in ``(-a * width, a * width)`` and rounded. None: no shift.
        scale: Scale range ``(min, max)``; None keeps the scale.
        shear: Shear in degrees: a number ``s`` (x shear in ``(-s, s)``), ``(min, max)`` (x shear)
            or ``(x_min, x_max, y_min, y_max)``; None: no shear.
        interpolation: ``"nearest"`` (torchvision's default), ``"bilinear"`` or ``"bicubic"``
            (a torchvision ``InterpolationMode`` works too).
        fill: Value of the pixels outside the transformed image: a number or an RGB triple, in
            0..255 (truncated to ints, as torchvision does for PIL images).
        center: Centre of rotation ``(x, y)`` in output pixels (origin at the top-left corner);
            None: the output's centre.
    """

    degrees: float | tuple[float, float]
    translate: tuple[float, float] | None = None
    scale: tuple[float, float] | None = None
    shear: float | tuple[float, float] | tuple[float, float, float, float] | None = None
    interpolation: str = "nearest"
    fill: float | tuple[float, ...] = 0
    center: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", _angle_range(self.degrees, "degrees", (2,)))
        if self.translate is not None:
            if (
                not isinstance(self.translate, Sequence)
                or len(self.translate) != 2
                or not all(isinstance(t, numbers.Real) and 0.0 <= t <= 1.0 for t in self.translate)
            ):
                raise ValueError(f"translate={self.translate!r} must be None or two fractions in [0, 1]")
            object.__setattr__(self, "translate", tuple(float(t) for t in self.translate))
        if self.scale is not None:
            if (
                not isinstance(self.scale, Sequence)
                or len(self.scale) != 2
                or not all(isinstance(s, numbers.Real) and math.isfinite(s) and s > 0 for s in self.scale)
            ):
                raise ValueError(f"scale={self.scale!r} must be None or two positive numbers (min, max)")
            if self.scale[0] > self.scale[1]:
                raise ValueError(f"scale={self.scale!r}: min must be <= max")
            object.__setattr__(self, "scale", tuple(float(s) for s in self.scale))
        if self.shear is not None:
            object.__setattr__(self, "shear", _angle_range(self.shear, "shear", (2, 4)))
        object.__setattr__(self, "interpolation", _interpolation_name(self.interpolation))
        object.__setattr__(self, "fill", _fill_rgb(self.fill))
        if self.center is not None:
            if (
                not isinstance(self.center, Sequence)
                or len(self.center) != 2
                or not all(isinstance(c, numbers.Real) and math.isfinite(c) for c in self.center)
            ):
                raise ValueError(f"center={self.center!r} must be None or an (x, y) pair")
            object.__setattr__(self, "center", (float(self.center[0]), float(self.center[1])))

    def engine_fields(self) -> dict[str, Any]:
        """The spec as the engine's ``AffineSpec`` fields (fastload/engine_abi.py)."""
        # __post_init__ normalised every range to a tuple of floats and the fill to three ints.
        degrees = cast(tuple[float, float], self.degrees)
        shear = cast("tuple[float, ...]", self.shear or ())
        fields: dict[str, Any] = {
            "degrees_lo": degrees[0],
            "degrees_hi": degrees[1],
            "shear_count": len(shear),
            "shear": (*shear, *(0.0,) * (4 - len(shear))),
            "kernel": _KERNELS[self.interpolation],
            "fill": self.fill,
        }
        if self.translate is not None:
            fields.update(has_translate=True, translate_x=self.translate[0], translate_y=self.translate[1])
        if self.scale is not None:
            fields.update(has_scale=True, scale_lo=self.scale[0], scale_hi=self.scale[1])
        if self.center is not None:
            fields.update(has_center=True, center_x=self.center[0], center_y=self.center[1])
        return fields


@dataclass(frozen=True)
class AffineParams:
    """One sample's drawn affine parameters (torchvision's ``RandomAffine.get_params`` result)."""

    angle: float
    translate: tuple[int, int]
    scale: float
    shear: tuple[float, float]

    def as_tuple(self) -> tuple[float, float, float, float, float, float]:
        """``(angle, tx, ty, scale, shear_x, shear_y)``, the order ``want_params`` reports."""
        return (self.angle, float(self.translate[0]), float(self.translate[1]), self.scale, *self.shear)


def _between(lo: float, hi: float, u: float) -> float:
    return lo + (hi - lo) * u


def sample_affine(t: RandomAffine, width: int, height: int, key: int) -> AffineParams:
    """Torchvision's ``RandomAffine.get_params`` for a ``width`` x ``height`` image, from the stream ``key``."""
    c = AFFINE_COUNTER
    # __post_init__ normalised every range to a tuple.
    degrees = cast(tuple[float, float], t.degrees)
    shear = cast("tuple[float, ...] | None", t.shear)
    angle = _between(degrees[0], degrees[1], uniform(key, c))
    tx = ty = 0
    if t.translate is not None:
        max_dx, max_dy = t.translate[0] * width, t.translate[1] * height
        tx = round(_between(-max_dx, max_dx, uniform(key, c + 1)))
        ty = round(_between(-max_dy, max_dy, uniform(key, c + 2)))
    scale = 1.0 if t.scale is None else _between(t.scale[0], t.scale[1], uniform(key, c + 3))
    shear_x = shear_y = 0.0
    if shear is not None:
        shear_x = _between(shear[0], shear[1], uniform(key, c + 4))
        if len(shear) == 4:
            shear_y = _between(shear[2], shear[3], uniform(key, c + 5))
    return AffineParams(angle=angle, translate=(tx, ty), scale=scale, shear=(shear_x, shear_y))


def inverse_affine_matrix(params: AffineParams, center: tuple[float, float]) -> Affine2:
    """Output pixel centre -> input position: torchvision's ``_get_inverse_affine_matrix``.

    Same arithmetic as torchvision (and as ``csrc/warp/random_affine.h``), so the engine, this reference
    and torchvision's PIL backend agree to the last bit on where each output pixel comes from.
    """
    rot = math.radians(params.angle)
    sx = math.radians(params.shear[0])
    sy = math.radians(params.shear[1])
    cx, cy = center
    tx, ty = float(params.translate[0]), float(params.translate[1])
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d / params.scale, -b / params.scale, 0.0, -c / params.scale, a / params.scale, 0.0]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return tuple(m)  # type: ignore[return-value]


def affine_plan(
    t: RandomAffine,
    box: tuple[float, float, float, float],
    flip: bool,
    out_size: tuple[int, int],
    key: int,
    *,
    crop_interpolation: str = "bilinear",
    crop_antialias: bool = True,
) -> tuple[WarpPlan, AffineParams]:
    """The one-pass plan of ``crop -> resize to out_size -> flip -> RandomAffine`` for one sample.

    Args:
        t: The affine spec.
        box: The geometry op's source box ``(x0, y0, x1, y1)`` in full-size source pixels.
        flip: Whether the geometry op mirrored the resized crop.
        out_size: Output ``(height, width)``.
        key: The sample's stream (:func:`fastload.transforms.sample_key`).
        crop_interpolation: The geometry op's interpolation (its filter is evaluated at the snapped
            positions of ``interpolation="nearest"``).
        crop_antialias: Whether the geometry op's filter widens with its downscale factor.

    Returns:
        The plan and the drawn parameters.
    """
    out_h, out_w = out_size
    params = sample_affine(t, out_w, out_h, key)
    center = t.center if t.center is not None else (out_w * 0.5, out_h * 0.5)
    to_frame = inverse_affine_matrix(params, center)
    x0, y0, x1, y1 = box
    sx, sy = (x1 - x0) / out_w, (y1 - y0) / out_h
    # Frame point (resized-crop pixels, mirrored when flipped) -> source position.
    to_source = (-sx, 0.0, x0 + out_w * sx, 0.0, sy, y0) if flip else (sx, 0.0, x0, 0.0, sy, y0)
    snap = t.interpolation == "nearest"
    if snap:
        kernel, antialias = _KERNELS[_interpolation_name(crop_interpolation, "crop interpolation")], crop_antialias
    else:
        kernel, antialias = _KERNELS[t.interpolation], crop_antialias
    plan = WarpPlan(
        out_h=out_h,
        out_w=out_w,
        to_frame=to_frame,
        frame=(0.0, 0.0, float(out_w), float(out_h)),
        snap=snap,
        to_source=to_source,
        scale=(sx, sy),
        kernel=kernel,
        antialias=antialias,
        nearest_shift=(0.0, 0.0),
        border=Border.DROP,
        fill=cast(tuple[int, int, int], t.fill),
        dct_scaling=antialias and kernel != Kernel.NEAREST,
    )
    return plan, params
