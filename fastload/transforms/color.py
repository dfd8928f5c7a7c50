"""Colour ops on the output-sized image: torchvision's ColorJitter / RandomGrayscale / Grayscale, PCA lighting.

Specs are frozen, keyword-only dataclasses (pixel ops of a ``Pipeline``); the C++ engine runs them on
the output-sized HWC uint8 image between the resampler and the output write, the Pillow path runs
their references (:meth:`apply_params`). The torchvision ops follow the PIL backend (what a pipeline
gets when they run on the PIL image before ``ToTensor``): the engine reproduces Pillow's arithmetic
exactly (``ImageEnhance`` blends with float32 factors and truncation, ``convert("L")``'s fixed-point
weights, the 8-bit HSV round trip of ``adjust_hue``), so both backends give the same bytes as
``torchvision.transforms.functional`` on a PIL image. Draw counters: :mod:`fastload.transforms.pixel`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from fastload.transforms import primitives as P
from fastload.transforms.pixel import PixelOp
from fastload.transforms.rng import normal, permutation, uniform

__all__ = [
    "IMAGENET_EIGVAL",
    "IMAGENET_EIGVEC",
    "ColorJitter",
    "Grayscale",
    "Lighting",
    "RandomGrayscale",
]

Range = tuple[float, float] | None
_NAN = float("nan")


def _jitter_range(
    value: float | Sequence[float] | None,
    name: str,
    *,
    center: float,
    bound: tuple[float, float],
    clip_first_on_zero: bool,
) -> Range:
    # torchvision's ColorJitter._check_input: a number v means [center - v, center + v] (clipped at
    # 0 for the factors), a pair is taken as is; (center, center) means "off" (None).
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
        if v < 0:
            raise ValueError(f"{name}={value!r}: a single number must be non negative")
        lo, hi = center - v, center + v
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise TypeError(f"{name}={value!r} must be a single number or a (min, max) pair")
    if not (bound[0] <= lo <= hi <= bound[1]):
        raise ValueError(f"{name}={value!r}: values must satisfy {bound[0]} <= min <= max <= {bound[1]}")
    if lo == hi == center:
        return None
    return (lo, hi)


def _factor(key: int, counter: int, r: Range) -> float | None:
    if r is None:
        return None
    return r[0] + (r[1] - r[0]) * uniform(key, counter)


def _nan_or(v: float | None) -> float:
    return _NAN if v is None else float(v)


def _none_if_nan(v: float) -> float | None:
    return None if math.isnan(v) else float(v)


def _trace(values: Sequence[float]) -> np.ndarray:
    out = np.full(64, np.nan)
    out[: len(values)] = values
    return out


@dataclass(frozen=True, kw_only=True)
class ColorJitter(PixelOp):
    """torchvision's ``ColorJitter``: brightness, contrast, saturation and hue in a random order.

    Args:
        brightness: ``b`` (factor in ``[max(0, 1 - b), 1 + b]``) or a ``(min, max)`` factor range.
        contrast: Same form as ``brightness``.
        saturation: Same form as ``brightness``.
        hue: ``h`` in ``[0, 0.5]`` (shift in ``[-h, h]``) or a ``(min, max)`` range within ``[-0.5, 0.5]``.

    A zero (or the neutral range) switches that adjustment off, as torchvision's ``None``.
    """

    brightness: float | tuple[float, float] | None = 0
    contrast: float | tuple[float, float] | None = 0
    saturation: float | tuple[float, float] | None = 0
    hue: float | tuple[float, float] | None = 0

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "saturation"):
            object.__setattr__(
                self,
                name,
                _jitter_range(getattr(self, name), name, center=1.0, bound=(0.0, math.inf), clip_first_on_zero=True),
            )
        object.__setattr__(
            self, "hue", _jitter_range(self.hue, "hue", center=0.0, bound=(-0.5, 0.5), clip_first_on_zero=False)
        )

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        return {
            "order": permutation(key, base, 4),
            # __post_init__ turned every field into a range (or None).
            "brightness": _factor(key, base + 3, cast(Range, self.brightness)),
            "contrast": _factor(key, base + 4, cast(Range, self.contrast)),
            "saturation": _factor(key, base + 5, cast(Range, self.saturation)),
            "hue": _factor(key, base + 6, cast(Range, self.hue)),
        }

    def apply_params(self, image: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        steps = {
            0: ("brightness", P.brightness),
            1: ("contrast", P.contrast),
            2: ("saturation", P.saturation),
            3: ("hue", P.hue),
        }
        for fn in params["order"]:
            name, op = steps[fn]
            if params[name] is not None:
                image = op(image, params[name])
        return image

    def trace(self, params: dict[str, Any]) -> np.ndarray:
        return _trace(
            list(params["order"]) + [_nan_or(params[n]) for n in ("brightness", "contrast", "saturation", "hue")]
        )

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        return {
            "order": [int(v) for v in values[:4]],
            "brightness": _none_if_nan(values[4]),
            "contrast": _none_if_nan(values[5]),
            "saturation": _none_if_nan(values[6]),
            "hue": _none_if_nan(values[7]),
        }

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"kind": "COLOR_JITTER"}
        for name in ("brightness", "contrast", "saturation", "hue"):
            value = getattr(self, name)  # a range, or None (off)
            fields[f"has_{name}"] = value is not None
            if value is not None:
                fields[name] = value
        return fields


@dataclass(frozen=True, kw_only=True)
class RandomGrayscale(PixelOp):
    """torchvision's ``RandomGrayscale(p)`` on an RGB image: grayscale in all three channels with probability ``p``.

    Args:
        p: Probability of converting the image.
    """

    p: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, numbers.Real) or not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p={self.p!r} must be a probability in [0, 1]")
        object.__setattr__(self, "p", float(self.p))

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        return {"applied": uniform(key, base) < self.p}

    def apply_params(self, image: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        return P.grayscale(image) if params["applied"] else image

    def trace(self, params: dict[str, Any]) -> np.ndarray:
        return _trace([float(params["applied"])])

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        return {"applied": bool(values[0])}

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        return {"kind": "RANDOM_GRAYSCALE", "p": self.p}


@dataclass(frozen=True, kw_only=True)
class Grayscale(RandomGrayscale):
    """torchvision's ``Grayscale(num_output_channels=3)``: always converts (the output keeps 3 channels).

    Args:
        num_output_channels: Must be 3: fastload's outputs are RGB-shaped.
    """

    num_output_channels: int = 3
    p: float = field(default=1.0, init=False)

    def __post_init__(self) -> None:
        if self.num_output_channels != 3:
            raise ValueError(
                f"num_output_channels={self.num_output_channels!r}: fastload writes 3-channel outputs; "
                "use num_output_channels=3 (the gray value in every channel)"
            )
        super().__post_init__()

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        return {"applied": True}


#: ImageNet RGB eigenvalues in [0, 1] pixel units (AlexNet / fb.resnet.torch; MXNet's are 255 times these).
IMAGENET_EIGVAL = (0.2175, 0.0188, 0.0045)
#: ImageNet RGB eigenvectors, one row per channel (R, G, B), one column per component.
IMAGENET_EIGVEC = ((-0.5675, 0.7192, 0.4009), (-0.5808, -0.0045, -0.8140), (-0.5836, -0.6948, 0.4203))


@dataclass(frozen=True, kw_only=True)
class Lighting(PixelOp):
    """AlexNet-style PCA lighting noise (fb.resnet.torch's ``Lighting``, MXNet's ``LightingAug``).

    ``alpha ~ N(0, alphastd)`` per component; each channel ``c`` gets
    ``sum_j eigvec[c][j] * alpha_j * eigval_j`` added, in units of the [0, 1] pixel range. On the
    engine's uint8 image that is ``255 *`` the shift, rounded half to even and clipped to [0, 255]
    (fb.resnet adds it to the float tensor without clipping: the values differ by at most half a
    grey level, or where they leave [0, 255]).

    Args:
        alphastd: Standard deviation of the component weights (0.1 in fb.resnet and GluonCV).
        eigval: The three eigenvalues, [0, 1] units (MXNet's ``LightingAug`` takes 255 times these).
        eigvec: 3x3 eigenvectors, rows R, G, B.
    """

    alphastd: float = 0.1
    eigval: tuple[float, float, float] = IMAGENET_EIGVAL
    eigvec: tuple[tuple[float, float, float], ...] = IMAGENET_EIGVEC

    def __post_init__(self) -> None:
        if (
            isinstance(self.alphastd, bool)
            or not isinstance(self.alphastd, numbers.Real)
            or not (self.alphastd >= 0 and math.isfinite(self.alphastd))
        ):
            raise ValueError(f"alphastd={self.alphastd!r} must be a finite number >= 0")
        eigval = np.asarray(self.eigval, dtype=np.float64)
        eigvec = np.asarray(self.eigvec, dtype=np.float64)
        if eigval.shape != (3,) or not np.all(np.isfinite(eigval)):
            raise ValueError(f"eigval={self.eigval!r} must be three finite numbers")
        if eigvec.shape != (3, 3) or not np.all(np.isfinite(eigvec)):
            raise ValueError(f"eigvec={self.eigvec!r} must be a 3x3 matrix of finite numbers (rows R, G, B)")
        object.__setattr__(self, "alphastd", float(self.alphastd))
        object.__setattr__(self, "eigval", tuple(float(v) for v in eigval))
        object.__setattr__(self, "eigvec", tuple(tuple(float(v) for v in row) for row in eigvec))

    def shift(self, alpha: Sequence[float]) -> tuple[float, float, float]:
        """Per-channel shift in grey levels (0..255 units) for component weights ``alpha``."""
        out = []
        for c in range(3):
            s = 0.0
            for j in range(3):
                s += self.eigvec[c][j] * alpha[j] * self.eigval[j]
            out.append(255.0 * s)
        return (out[0], out[1], out[2])

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        return {"alpha": [self.alphastd * normal(key, base + 2 * j) for j in range(3)]}

    def apply_params(self, image: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        shift = self.shift(params["alpha"])
        levels = np.arange(256, dtype=np.float64)
        luts = [np.clip(np.rint(levels + s), 0, 255).astype(np.uint8) for s in shift]
        out = np.empty_like(image)
        for c in range(3):
            out[:, :, c] = luts[c][image[:, :, c]]
        return out

    def trace(self, params: dict[str, Any]) -> np.ndarray:
        return _trace(list(params["alpha"]))

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        return {"alpha": [float(v) for v in values[:3]]}

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        return {
            "kind": "LIGHTING",
            "alphastd": self.alphastd,
            "eigval": self.eigval,
            "eigvec": [v for row in self.eigvec for v in row],
        }
