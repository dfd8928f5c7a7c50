"""Augmentation policies on the output-sized image: AutoAugment, RandAugment, TrivialAugmentWide.

torchvision's op lists, magnitude bins (the same float32 ``linspace`` values, computed here without
torch) and signed magnitudes; every op is torchvision's ``_apply_op`` on a PIL image
(:mod:`fastload.transforms.primitives`), including the geometric ones (ShearX/Y, TranslateX/Y,
Rotate) on the output-sized image with nearest or bilinear sampling and ``fill``, as torchvision
runs them after the crop. The engine receives the magnitude tables and the warp matrices from
:meth:`engine_spec`, so both backends use the same numbers. Draw counters:
:mod:`fastload.transforms.pixel`.
"""

from __future__ import annotations

import enum
import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from fastload.transforms import primitives as P
from fastload.transforms.pixel import PixelOp
from fastload.transforms.rng import randint, uniform

__all__ = [
    "AutoAugment",
    "AutoAugmentPolicy",
    "RandAugment",
    "TrivialAugmentWide",
    "torch_linspace",
]

Prim = P.Prim
_NAN = float("nan")
FillArg = None | int | float | Sequence[int | float]


def _float32_nearest(value: Fraction) -> np.float32:
    """The float32 nearest to an exact rational (ties to even)."""
    guess = np.float32(float(value))
    candidates = [guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(-np.inf))]

    def rank(c):
        return (abs(Fraction(float(c)) - value), int(np.float32(c).view(np.uint32)) & 1)

    return min(candidates, key=rank)


def torch_linspace(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` (float32, CPU) bit for bit.

    torch's CPU kernel computes ``start + step * i`` for the first half and ``end - step *
    (steps - 1 - i)`` for the second, in float32, and its build contracts each into one fused
    multiply-add: a single rounding, reproduced here with exact rationals.
    """
    f = np.float32
    s, e = f(start), f(end)
    if steps == 1:
        return np.array([s], np.float32)
    step = f(f(e - s) / f(steps - 1))
    half = steps // 2
    out = []
    for i in range(steps):
        if i < half:
            out.append(_float32_nearest(Fraction(float(step)) * i + Fraction(float(s))))
        else:
            out.append(_float32_nearest(Fraction(float(e)) - Fraction(float(step)) * (steps - 1 - i)))
    return np.array(out, np.float32)


def _posterize_bits(num_bins: int, top: int, span: int) -> np.ndarray:
    # torchvision: top - (torch.arange(num_bins) / ((num_bins - 1) / span)).round().int(), float32
    # division, round half to even.
    div = np.float32((num_bins - 1) / span)
    q = np.arange(num_bins, dtype=np.float32) / div
    return (top - np.rint(q).astype(np.int64)).astype(np.float32)


# (op, magnitudes or None, signed): the magnitude tables of torchvision's _augmentation_space.
Space = list[tuple[Prim, np.ndarray | None, bool]]


@functools.lru_cache(maxsize=64)
def _autoaugment_space(num_bins: int, height: int, width: int) -> dict[str, tuple[Prim, np.ndarray | None, bool]]:
    return {
        "ShearX": (Prim.SHEAR_X, torch_linspace(0.0, 0.3, num_bins), True),
        "ShearY": (Prim.SHEAR_Y, torch_linspace(0.0, 0.3, num_bins), True),
        "TranslateX": (Prim.TRANSLATE_X, torch_linspace(0.0, 150.0 / 331.0 * width, num_bins), True),
        "TranslateY": (Prim.TRANSLATE_Y, torch_linspace(0.0, 150.0 / 331.0 * height, num_bins), True),
        "Rotate": (Prim.ROTATE, torch_linspace(0.0, 30.0, num_bins), True),
        "Brightness": (Prim.BRIGHTNESS, torch_linspace(0.0, 0.9, num_bins), True),
        "Color": (Prim.COLOR, torch_linspace(0.0, 0.9, num_bins), True),
        "Contrast": (Prim.CONTRAST, torch_linspace(0.0, 0.9, num_bins), True),
        "Sharpness": (Prim.SHARPNESS, torch_linspace(0.0, 0.9, num_bins), True),
        "Posterize": (Prim.POSTERIZE, _posterize_bits(num_bins, 8, 4), False),
        "Solarize": (Prim.SOLARIZE, torch_linspace(255.0, 0.0, num_bins), False),
        "AutoContrast": (Prim.AUTOCONTRAST, None, False),
        "Equalize": (Prim.EQUALIZE, None, False),
        "Invert": (Prim.INVERT, None, False),
    }


@functools.lru_cache(maxsize=64)
def _randaugment_space(num_bins: int, height: int, width: int) -> Space:
    # Order matters: torchvision picks list(op_meta.keys())[randint(len)].
    aa = _autoaugment_space(num_bins, height, width)
    names = [
        "ShearX",
        "ShearY",
        "TranslateX",
        "TranslateY",
        "Rotate",
        "Brightness",
        "Color",
        "Contrast",
        "Sharpness",
        "Posterize",
        "Solarize",
        "AutoContrast",
        "Equalize",
    ]
    return [(Prim.IDENTITY, None, False)] + [aa[n] for n in names]


@functools.lru_cache(maxsize=64)
def _trivialaugment_space(num_bins: int) -> Space:
    return [
        (Prim.IDENTITY, None, False),
        (Prim.SHEAR_X, torch_linspace(0.0, 0.99, num_bins), True),
        (Prim.SHEAR_Y, torch_linspace(0.0, 0.99, num_bins), True),
        (Prim.TRANSLATE_X, torch_linspace(0.0, 32.0, num_bins), True),
        (Prim.TRANSLATE_Y, torch_linspace(0.0, 32.0, num_bins), True),
        (Prim.ROTATE, torch_linspace(0.0, 135.0, num_bins), True),
        (Prim.BRIGHTNESS, torch_linspace(0.0, 0.99, num_bins), True),
        (Prim.COLOR, torch_linspace(0.0, 0.99, num_bins), True),
        (Prim.CONTRAST, torch_linspace(0.0, 0.99, num_bins), True),
        (Prim.SHARPNESS, torch_linspace(0.0, 0.99, num_bins), True),
        (Prim.POSTERIZE, _posterize_bits(num_bins, 8, 6), False),
        (Prim.SOLARIZE, torch_linspace(255.0, 0.0, num_bins), False),
        (Prim.AUTOCONTRAST, None, False),
        (Prim.EQUALIZE, None, False),
    ]


class AutoAugmentPolicy(str, enum.Enum):
    """The policies learned in the AutoAugment paper (torchvision's ``AutoAugmentPolicy``)."""

    IMAGENET = "imagenet"
    CIFAR10 = "cifar10"
    SVHN = "svhn"


# Sub-policies: two (op, probability, magnitude bin or None) steps each, in the published order.
_POLICIES = {
    AutoAugmentPolicy.IMAGENET: [
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ],
    AutoAugmentPolicy.CIFAR10: [
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ],
    AutoAugmentPolicy.SVHN: [
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
        (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
        (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
        (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
        (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
        (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
        (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
        (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ],
}


def _interpolation(value: Any) -> str:
    # Accepts "nearest" / "bilinear" or torchvision's InterpolationMode (whose .value is the name).
    name = getattr(value, "value", value)
    if not isinstance(name, str) or name.lower() not in ("nearest", "bilinear"):
        raise ValueError(f"interpolation={value!r} must be 'nearest' or 'bilinear' (torchvision's NEAREST / BILINEAR)")
    return name.lower()


def _fill(value: FillArg) -> tuple[int, int, int]:
    # torchvision's _parse_fill for an RGB PIL image: None -> 0, a number -> all bands, int().
    given: Any = 0 if value is None else value
    if isinstance(given, numbers.Real) and not isinstance(given, bool):
        given = [given] * 3
    if not isinstance(given, (list, tuple)) or len(given) not in (1, 3):
        raise ValueError(f"fill={value!r} must be None, a number or a sequence of 1 or 3 numbers")
    if len(given) == 1:
        given = list(given) * 3
    out = (int(given[0]), int(given[1]), int(given[2]))
    if not all(0 <= v <= 255 for v in out):
        raise ValueError(f"fill={value!r} must hold values in [0, 255]")
    return out


def _signed(key: int, counter: int) -> bool:
    """True when torchvision's ``torch.randint(2, (1,))`` would be 1."""
    return uniform(key, counter) >= 0.5


class _PolicyBase(PixelOp):
    """Shared by the policies: applying a list of (primitive, magnitude) steps and the engine tables."""

    interpolation: str
    fill: Any  # a FillArg as given; __post_init__ stores the (r, g, b) triple of _fill()

    def _run(self, image: np.ndarray, steps: Sequence[tuple[int, float]]) -> np.ndarray:
        for prim, magnitude in steps:
            image = P.apply_prim(
                image, Prim(prim), magnitude, bilinear=self.interpolation == "bilinear", fill=self.fill
            )
        return image

    @staticmethod
    def _warps(prim: Prim, magnitudes: np.ndarray | None, height: int, width: int) -> list[float]:
        # For each magnitude bin: the warp of +m then of -m, 7 numbers each (mode, matrix).
        if prim not in P.GEOMETRIC_PRIMS or magnitudes is None:
            return []
        rows: list[float] = []
        for m in magnitudes:
            for signed_m in (float(m), -float(m)):
                rows.extend(P.warp_plan(prim, signed_m, height, width).as_row())
        return rows


def _policy_common(obj) -> None:
    object.__setattr__(obj, "interpolation", _interpolation(obj.interpolation))
    object.__setattr__(obj, "fill", _fill(obj.fill))


@dataclass(frozen=True, kw_only=True)
class AutoAugment(_PolicyBase):
    """torchvision's ``AutoAugment(policy, interpolation, fill)``: one random sub-policy of two steps.

    Args:
        policy: ``"imagenet"`` (default), ``"cifar10"`` or ``"svhn"`` (or torchvision's AutoAugmentPolicy).
        interpolation: ``"nearest"`` (torchvision's default) or ``"bilinear"``, for the geometric ops.
        fill: Fill of the area the geometric ops uncover: None (0), a number or an RGB triple.
    """

    policy: str | AutoAugmentPolicy = AutoAugmentPolicy.IMAGENET
    interpolation: Any = "nearest"
    fill: FillArg = None

    def __post_init__(self) -> None:
        value = getattr(self.policy, "value", self.policy)
        try:
            policy = AutoAugmentPolicy(value)
        except ValueError:
            raise ValueError(f"policy={self.policy!r} must be 'imagenet', 'cifar10' or 'svhn'") from None
        object.__setattr__(self, "policy", policy)
        _policy_common(self)

    def _steps(self, height: int, width: int):
        space = _autoaugment_space(10, height, width)
        out = []
        for sub in _POLICIES[AutoAugmentPolicy(self.policy)]:
            row = []
            for name, prob, bin_ in sub:
                prim, mags, signed = space[name]
                magnitude = float(mags[bin_]) if bin_ is not None and mags is not None else 0.0
                row.append((prim, prob, magnitude, signed))
            out.append(row)
        return out

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        subs = self._steps(height, width)
        policy_id = randint(key, base, len(subs))
        ops = []
        applied = []
        for i, (prim, prob, magnitude, signed) in enumerate(subs[policy_id]):
            hit = uniform(key, base + 1 + i) <= prob
            applied.append(hit)
            if signed and uniform(key, base + 3 + i) < 0.5:
                magnitude = -magnitude
            ops.append((int(prim), magnitude))
        return {"policy": policy_id, "applied": applied, "ops": ops}

    def apply_params(self, image: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        return self._run(image, [op for op, hit in zip(params["ops"], params["applied"], strict=False) if hit])

    def trace(self, params: dict[str, Any]) -> np.ndarray:
        v = [params["policy"]] + [float(a) for a in params["applied"]]
        for prim, magnitude in params["ops"]:
            v += [prim, magnitude]
        out = np.full(64, np.nan)
        out[: len(v)] = v
        return out

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        return {
            "policy": int(values[0]),
            "applied": [bool(values[1]), bool(values[2])],
            "ops": [(int(values[3]), float(values[4])), (int(values[5]), float(values[6]))],
        }

    def engine_spec(self, height: int, width: int) -> dict[str, Any]:
        """Numbers for the engine: the sub-policies' steps (``PolicyStep`` fields of fastload/engine_abi.py)."""
        subs = []
        for row in self._steps(height, width):
            steps = []
            for prim, prob, magnitude, signed in row:
                step: dict[str, Any] = {
                    "prim": int(prim),
                    "prob": float(prob),
                    "magnitude": float(magnitude),
                    "is_signed": bool(signed),
                }
                warps = self._warps(prim, np.array([magnitude]), height, width)
                if warps:  # geometric primitives: the warps of +magnitude and -magnitude
                    step["warps"] = warps
                steps.append(step)
            subs.append(steps)
        return {"subpolicies": subs}

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        return {
            "kind": "AUTO_AUGMENT",
            "bilinear": self.interpolation == "bilinear",
            "fill": self.fill,
            **self.engine_spec(height, width),
        }


def _check_bins(num_bins: Any) -> int:
    if isinstance(num_bins, bool) or not isinstance(num_bins, numbers.Integral) or num_bins < 2:
        raise ValueError(f"num_magnitude_bins={num_bins!r} must be an int >= 2")
    return int(num_bins)


class _ListPolicy(_PolicyBase):
    """RandAugment and TrivialAugmentWide: a list of candidate ops with magnitude tables."""

    def _space(self, height: int, width: int) -> Space:
        raise NotImplementedError

    def engine_spec(self, height: int, width: int) -> dict[str, Any]:
        """Numbers for the engine: the candidate ops (``PolicyOp`` fields of fastload/engine_abi.py)."""
        cands = []
        for prim, mags, signed in self._space(height, width):
            cands.append(
                {
                    "prim": int(prim),
                    "is_signed": bool(signed),
                    "magnitudes": [] if mags is None else [float(m) for m in mags],
                    "warps": self._warps(prim, mags, height, width),  # per bin, those of +m and -m
                }
            )
        return {"candidates": cands}

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        fields = {
            "kind": "RAND_AUGMENT" if isinstance(self, RandAugment) else "TRIVIAL_AUGMENT_WIDE",
            "bilinear": self.interpolation == "bilinear",
            "fill": self.fill,
            **self.engine_spec(height, width),
        }
        if isinstance(self, RandAugment):
            fields.update(num_ops=self.num_ops, magnitude=self.magnitude)
        return fields

    def apply_params(self, image: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        return self._run(image, params["ops"])

    def trace(self, params: dict[str, Any]) -> np.ndarray:
        out = np.full(64, np.nan)
        for i, (prim, magnitude) in enumerate(params["ops"]):
            out[2 * i] = prim
            out[2 * i + 1] = magnitude
        return out

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        ops = []
        for i in range(0, len(values) - 1, 2):
            if math.isnan(values[i]):
                break
            ops.append((int(values[i]), float(values[i + 1])))
        return {"ops": ops}


@dataclass(frozen=True, kw_only=True)
class RandAugment(_ListPolicy):
    """torchvision's ``RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation, fill)``.

    Args:
        num_ops: Ops applied in sequence, each picked uniformly from the 14 (1..31).
        magnitude: Magnitude bin for every op, in ``[0, num_magnitude_bins)``.
        num_magnitude_bins: Number of magnitude bins.
        interpolation: ``"nearest"`` (torchvision's default) or ``"bilinear"``.
        fill: Fill of the area the geometric ops uncover.
    """

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    interpolation: Any = "nearest"
    fill: FillArg = None

    def __post_init__(self) -> None:
        bins = _check_bins(self.num_magnitude_bins)
        if (
            isinstance(self.num_ops, bool)
            or not isinstance(self.num_ops, numbers.Integral)
            or not 1 <= self.num_ops <= 31
        ):
            raise ValueError(f"num_ops={self.num_ops!r} must be an int in [1, 31]")
        if (
            isinstance(self.magnitude, bool)
            or not isinstance(self.magnitude, numbers.Integral)
            or not 0 <= self.magnitude < bins
        ):
            raise ValueError(f"magnitude={self.magnitude!r} must be an int in [0, num_magnitude_bins={bins})")
        object.__setattr__(self, "num_ops", int(self.num_ops))
        object.__setattr__(self, "magnitude", int(self.magnitude))
        object.__setattr__(self, "num_magnitude_bins", bins)
        _policy_common(self)

    def _space(self, height: int, width: int) -> Space:
        return _randaugment_space(self.num_magnitude_bins, height, width)

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        space = self._space(height, width)
        ops = []
        for i in range(self.num_ops):
            prim, mags, signed = space[randint(key, base + 2 * i, len(space))]
            magnitude = float(mags[self.magnitude]) if mags is not None else 0.0
            if signed and _signed(key, base + 2 * i + 1):
                magnitude = -magnitude
            ops.append((int(prim), magnitude))
        return {"ops": ops}


@dataclass(frozen=True, kw_only=True)
class TrivialAugmentWide(_ListPolicy):
    """torchvision's ``TrivialAugmentWide(num_magnitude_bins, interpolation, fill)``: one op, one random bin.

    Args:
        num_magnitude_bins: Number of magnitude bins.
        interpolation: ``"nearest"`` (torchvision's default) or ``"bilinear"``.
        fill: Fill of the area the geometric ops uncover.
    """

    num_magnitude_bins: int = 31
    interpolation: Any = "nearest"
    fill: FillArg = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_magnitude_bins", _check_bins(self.num_magnitude_bins))
        _policy_common(self)

    def _space(self, height: int, width: int) -> Space:
        return _trivialaugment_space(self.num_magnitude_bins)

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        space = self._space(height, width)
        prim, mags, signed = space[randint(key, base, len(space))]
        magnitude = float(mags[randint(key, base + 1, len(mags))]) if mags is not None else 0.0
        if signed and _signed(key, base + 2):
            magnitude = -magnitude
        return {"ops": [(int(prim), magnitude)]}
