"""timm's augmentation policies on the output-sized image: RandAugment, AutoAugment and AugMix.

``timm.data.auto_augment`` builds these from config strings (``rand-m9-mstd0.5-inc1``,
``original-mstd0.5``, ``augmix-m5-w4-d2``); each is a list of ``AugmentOp(name, prob, magnitude,
hparams)``. The specs here take those ops as ``(name, prob, magnitude)`` triples and the policy's
shared hparams, and do what timm does to a PIL image:

- an op applies when its draw is ``<= prob`` (timm skips it when ``random() > prob``; with
  ``prob >= 1`` always);
- its magnitude is the configured one, or with ``magnitude_std > 0`` drawn ``N(magnitude,
  magnitude_std)`` (``inf``: uniform in ``[0, magnitude]``), then clipped to ``[0, magnitude_max]``
  (timm's default bound 10);
- the level functions turn it into the op's argument (rotate ``level / 10 * 30`` degrees, shear
  ``level / 10 * 0.3``, translate ``level / 10 * translate_const`` pixels or ``level / 10 *
  translate_pct`` of the width / height, enhance factors ``level / 10 * 1.8 + 0.1`` or, increasing,
  ``max(0.1, 1 +- level / 10 * 0.9)``, posterize / solarize / solarize-add thresholds as timm's
  integer formulas), with a random sign where timm negates (``random() > 0.5``: negative);
- the geometric ops (ShearX/Y, TranslateX/Y(Rel), Rotate) run Pillow's ``Image.transform`` /
  ``Image.rotate`` with the policy's resample filter (nearest, bilinear or bicubic), or, without one
  (timm's ``interpolation='random'``), bilinear or bicubic drawn per op, and ``fillcolor`` the
  policy's ``img_mean``;
- ``Posterize`` with 0 bits blacks the image (what timm's op does with Pillow < 13; Pillow 13 refuses
  0 bits, which breaks timm's own ``rand-*`` policies: the engine keeps timm's semantics).

:class:`TimmRandAugment` picks ``num_layers`` ops uniformly with replacement, or with
``choice_weights`` proportionally without replacement (numpy's ``choice(replace=False, p=...)``);
:class:`TimmAutoAugment` picks one sub-policy and runs its steps; :class:`TimmAugMix` mixes
``width`` chains of 1-3 (or ``depth``) uniformly chosen ops with Dirichlet(alpha) weights in
float32, truncates to uint8 and blends with the original image by a Beta(alpha, alpha) weight
(Pillow's ``Image.blend``).

Draws: each policy draws from its own stream, ``uniform(policy_key(key, base), c)`` (so any number
of ops fits), in this layout: an op at offset ``o`` uses ``o`` (apply), ``o + 1`` and ``o + 2``
(magnitude: a normal pair, or ``o + 1`` alone for the uniform), ``o + 3`` (sign), ``o + 4``
(resample choice); RandAugment's layer ``i`` draws its op at ``16 i`` and the op at ``16 i + 8``;
AutoAugment draws the sub-policy at 0 and step ``j`` at ``8 + 8 j``; AugMix draws gamma variate
``g`` (``g < width``: the Dirichlet weights; ``width`` and ``width + 1``: the Beta) from
``64 g .. 64 g + 63`` and chain ``c`` from ``65536 + 1024 c``: its depth at ``+0``, op ``j``'s
choice at ``+16 + 16 j`` and the op at ``+24 + 16 j``.

The engine (``csrc/pixel/timm_ops.cpp``) runs the same arithmetic; :meth:`apply_params` is the Pillow
reference the tests replay the engine's draws through, and check against timm's own functions.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from fastload.engine_abi import TimmOpName
from fastload.transforms.pixel import PixelOp
from fastload.transforms.rng import normal, splitmix64, uniform

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = [
    "TIMM_OP_NAMES",
    "TimmAugMix",
    "TimmAutoAugment",
    "TimmRandAugment",
    "policy_key",
    "timm_op_arg",
]

_NAN = float("nan")
_MASK64 = (1 << 64) - 1
_LEVEL_DENOM = 10.0
#: PIL's resample codes (Image.Resampling): what the trace records for a geometric op.
NEAREST, BILINEAR, BICUBIC = 0, 2, 3
_RESAMPLE = {"nearest": NEAREST, "bilinear": BILINEAR, "bicubic": BICUBIC}

#: timm's op names (``timm.data.auto_augment.NAME_TO_OP`` keys) -> the engine's ids.
TIMM_OP_NAMES: dict[str, TimmOpName] = {
    "AutoContrast": TimmOpName.AUTO_CONTRAST,
    "Equalize": TimmOpName.EQUALIZE,
    "Invert": TimmOpName.INVERT,
    "Rotate": TimmOpName.ROTATE,
    "Posterize": TimmOpName.POSTERIZE,
    "PosterizeIncreasing": TimmOpName.POSTERIZE_INCREASING,
    "PosterizeOriginal": TimmOpName.POSTERIZE_ORIGINAL,
    "Solarize": TimmOpName.SOLARIZE,
    "SolarizeIncreasing": TimmOpName.SOLARIZE_INCREASING,
    "SolarizeAdd": TimmOpName.SOLARIZE_ADD,
    "Color": TimmOpName.COLOR,
    "ColorIncreasing": TimmOpName.COLOR_INCREASING,
    "Contrast": TimmOpName.CONTRAST,
    "ContrastIncreasing": TimmOpName.CONTRAST_INCREASING,
    "Brightness": TimmOpName.BRIGHTNESS,
    "BrightnessIncreasing": TimmOpName.BRIGHTNESS_INCREASING,
    "Sharpness": TimmOpName.SHARPNESS,
    "SharpnessIncreasing": TimmOpName.SHARPNESS_INCREASING,
    "ShearX": TimmOpName.SHEAR_X,
    "ShearY": TimmOpName.SHEAR_Y,
    "TranslateX": TimmOpName.TRANSLATE_X,
    "TranslateY": TimmOpName.TRANSLATE_Y,
    "TranslateXRel": TimmOpName.TRANSLATE_X_REL,
    "TranslateYRel": TimmOpName.TRANSLATE_Y_REL,
}
_GEOMETRIC = frozenset(
    {
        TimmOpName.ROTATE,
        TimmOpName.SHEAR_X,
        TimmOpName.SHEAR_Y,
        TimmOpName.TRANSLATE_X,
        TimmOpName.TRANSLATE_Y,
        TimmOpName.TRANSLATE_X_REL,
        TimmOpName.TRANSLATE_Y_REL,
    }
)
_NEGATED = _GEOMETRIC | {
    TimmOpName.COLOR_INCREASING,
    TimmOpName.CONTRAST_INCREASING,
    TimmOpName.BRIGHTNESS_INCREASING,
    TimmOpName.SHARPNESS_INCREASING,
}
_NO_ARG = frozenset({TimmOpName.AUTO_CONTRAST, TimmOpName.EQUALIZE, TimmOpName.INVERT})

# Counter layout of a policy's stream (module docstring).
_OP_APPLY, _OP_MAGNITUDE, _OP_SIGN, _OP_RESAMPLE = 0, 1, 3, 4
_RA_LAYER, _RA_OP = 16, 8
_AA_STEP = 8
_GAMMA_STRIDE = 64
_GAMMA_ATTEMPTS = 16
_CHAIN_BASE, _CHAIN_STRIDE, _CHAIN_OP = 1 << 16, 1 << 10, 16
#: Trace values per policy (module docstring of each policy's ``trace``).
_TRACE = 64


class Draw(NamedTuple):
    """What one AugmentOp drew.

    Whether it applied, its clipped magnitude (``level``), the sign, the argument timm's level
    function makes of them, and the PIL resample code of a geometric op.
    """

    applied: bool
    level: float | None = None
    negative: bool = False
    arg: Any = None
    resample: int | None = None


def policy_key(key: int, base: int) -> int:
    """The stream of the timm policy at counter base ``base`` of the sample ``key``."""
    return splitmix64((key ^ splitmix64(base)) & _MASK64)


def _randint(key: int, counter: int, n: int) -> int:
    return min(int(uniform(key, counter) * n), n - 1)


def _sign(level: float, key: int, counter: int) -> float:
    # timm's _randomly_negate: -v if random() > 0.5 else v.
    return -level if uniform(key, counter) > 0.5 else level


def timm_op_arg(
    name: TimmOpName, level: float, negative: bool, *, translate_const: float, translate_pct: float
) -> float | None:
    """The op's argument, as timm's ``LEVEL_TO_ARG[name](level, hparams)`` (None: AutoContrast / Equalize / Invert)."""
    d = _LEVEL_DENOM
    n = TimmOpName
    if name in _NO_ARG:
        return None
    if name == n.ROTATE:
        v = (level / d) * 30.0
    elif name in (n.POSTERIZE, n.POSTERIZE_INCREASING, n.POSTERIZE_ORIGINAL):
        bits = int((level / d) * 4)
        return 4 - bits if name == n.POSTERIZE_INCREASING else bits + 4 if name == n.POSTERIZE_ORIGINAL else bits
    elif name in (n.SOLARIZE, n.SOLARIZE_INCREASING):
        thresh = min(256, int((level / d) * 256))
        return 256 - thresh if name == n.SOLARIZE_INCREASING else thresh
    elif name == n.SOLARIZE_ADD:
        return min(128, int((level / d) * 110))
    elif name in (n.COLOR, n.CONTRAST, n.BRIGHTNESS, n.SHARPNESS):
        return (level / d) * 1.8 + 0.1
    elif name in (n.COLOR_INCREASING, n.CONTRAST_INCREASING, n.BRIGHTNESS_INCREASING, n.SHARPNESS_INCREASING):
        v = (level / d) * 0.9
        return max(0.1, 1.0 + (-v if negative else v))
    elif name in (n.SHEAR_X, n.SHEAR_Y):
        v = (level / d) * 0.3
    elif name in (n.TRANSLATE_X, n.TRANSLATE_Y):
        v = (level / d) * float(translate_const)
    else:  # TranslateX/YRel
        v = (level / d) * translate_pct
    return -v if negative else v


def _check_ops(ops: Any, what: str) -> tuple[tuple[str, float, float], ...]:
    out = []
    for item in ops:
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise ValueError(f"{what}: each op is a (name, prob, magnitude) triple, got {item!r}")
        name, prob, magnitude = item
        if name not in TIMM_OP_NAMES:
            raise ValueError(f"{what}: op {name!r} is not one of timm's {sorted(TIMM_OP_NAMES)}")
        prob, magnitude = float(prob), float(magnitude)
        if not (math.isfinite(prob) and math.isfinite(magnitude)) or magnitude < 0:
            raise ValueError(f"{what}: op {name!r} needs a finite prob and a magnitude >= 0")
        out.append((str(name), prob, magnitude))
    if not out:
        raise ValueError(f"{what}: no ops")
    return tuple(out)


def _fill(value: Any) -> tuple[int, int, int]:
    items = (value,) * 3 if isinstance(value, numbers.Integral) else tuple(value)
    if len(items) != 3 or not all(isinstance(v, numbers.Integral) and 0 <= int(v) <= 255 for v in items):
        raise ValueError(f"fill={value!r} must be an int in 0..255 or three of them")
    return (int(items[0]), int(items[1]), int(items[2]))


def _resample(value: Any) -> str | None:
    if value is None:
        return None
    name = getattr(value, "value", value)
    if not isinstance(name, str) or name.lower() not in _RESAMPLE:
        raise ValueError(f"interpolation={value!r} must be 'nearest', 'bilinear', 'bicubic' or None (random)")
    return name.lower()


class _TimmPolicy(PixelOp):
    """The hparams timm's ops share, one op's draws, and the Pillow reference of one op."""

    magnitude_std: float
    magnitude_max: float | None
    translate_const: float
    translate_pct: float
    fill: Any
    interpolation: Any

    def _check_common(self) -> None:
        std = float(self.magnitude_std)
        if not (std >= 0) or math.isnan(std):
            raise ValueError(f"magnitude_std={self.magnitude_std!r} must be >= 0 (inf: uniform)")
        object.__setattr__(self, "magnitude_std", std)
        if self.magnitude_max is not None:
            object.__setattr__(self, "magnitude_max", float(self.magnitude_max))
        object.__setattr__(self, "translate_const", float(self.translate_const))
        object.__setattr__(self, "translate_pct", float(self.translate_pct))
        object.__setattr__(self, "fill", _fill(self.fill))
        object.__setattr__(self, "interpolation", _resample(self.interpolation))

    @property
    def upper_bound(self) -> float:
        # timm: self.magnitude_max or _LEVEL_DENOM (0 or None means the default bound).
        return self.magnitude_max or _LEVEL_DENOM

    def _op(self, op: tuple[str, float, float], key: int, o: int, *, check_prob: bool = True) -> Draw:
        """One AugmentOp's draws at offset ``o`` of the stream."""
        name, prob, magnitude = op
        tid = TIMM_OP_NAMES[name]
        if check_prob and prob < 1.0 and uniform(key, o + _OP_APPLY) > prob:
            return Draw(False)
        level = magnitude
        if self.magnitude_std > 0:
            if math.isinf(self.magnitude_std):
                level = magnitude * uniform(key, o + _OP_MAGNITUDE)
            else:
                level = magnitude + self.magnitude_std * normal(key, o + _OP_MAGNITUDE)
        level = max(0.0, min(level, self.upper_bound))
        negative = tid in _NEGATED and uniform(key, o + _OP_SIGN) > 0.5
        arg = timm_op_arg(tid, level, negative, translate_const=self.translate_const, translate_pct=self.translate_pct)
        resample = None
        if tid in _GEOMETRIC:
            if self.interpolation is None:
                resample = (BILINEAR, BICUBIC)[_randint(key, o + _OP_RESAMPLE, 2)]
            else:
                resample = _RESAMPLE[self.interpolation]
        return Draw(True, level, negative, arg, resample)

    def _apply_op(self, image: NDArray[np.uint8], name: str, draw: Draw) -> NDArray[np.uint8]:
        if not draw.applied:
            return image
        return apply_timm_op(image, TIMM_OP_NAMES[name], draw.arg, draw.resample, self.fill)

    def _draw_values(self, draw: Draw) -> list[float]:
        return [float(draw.applied), _num(draw.level), float(draw.negative), _num(draw.resample)]

    def _draw_from(self, name: str, values: Sequence[float]) -> Draw:
        """A :class:`Draw` from its trace values ``(applied, level, negative, resample)``."""
        applied, level, negative, resample = (float(v) for v in values)
        if not applied:
            return Draw(False)
        arg = timm_op_arg(
            TIMM_OP_NAMES[name],
            level,
            bool(negative),
            translate_const=self.translate_const,
            translate_pct=self.translate_pct,
        )
        return Draw(True, level, bool(negative), arg, None if math.isnan(resample) else int(resample))

    def _policy_fields(self) -> dict[str, Any]:
        """The hparams every policy shares, as the engine's ``TimmPolicy`` fields."""
        return {
            "magnitude_std": float(self.magnitude_std),
            "upper_bound": float(self.upper_bound),
            "translate_const": float(self.translate_const),
            "translate_pct": float(self.translate_pct),
            "resample": -1 if self.interpolation is None else _RESAMPLE[self.interpolation],
        }


def _engine_ops(ops: Sequence[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """The engine's ``TimmOp`` fields of ``(name, prob, magnitude)`` ops."""
    return [
        {"name": TIMM_OP_NAMES[name], "prob": float(prob), "magnitude": float(magnitude)}
        for name, prob, magnitude in ops
    ]


def _num(value: Any) -> float:
    return _NAN if value is None else float(value)


def _opt(value: float) -> Any:
    return None if math.isnan(value) else value


def _trace(values: Sequence[float]) -> NDArray[np.float64]:
    out = np.full(_TRACE, _NAN)
    out[: len(values)] = values
    return out


@dataclass(frozen=True, kw_only=True)
class TimmRandAugment(_TimmPolicy):
    """timm's ``RandAugment(ops, num_layers, choice_weights)`` (``rand_augment_transform``).

    Args:
        ops: The candidate ops as ``(name, prob, magnitude)``, timm's names (``"Rotate"``,
            ``"PosterizeIncreasing"``, ...).
        num_layers: Ops applied per image (timm's ``n``; at most 12).
        choice_weights: Probabilities of the ops, picked without replacement (timm's ``t`` weights),
            or None: uniform with replacement.
        magnitude_std: timm's ``mstd``: 0 (fixed), > 0 (normal noise), ``inf`` (uniform).
        magnitude_max: timm's ``mmax`` (None: 10).
        translate_const: Pixels of TranslateX/Y at magnitude 10 (timm's ``translate_const``).
        translate_pct: Fraction of the size of TranslateX/YRel at magnitude 10.
        fill: ``fillcolor`` of the geometric ops (timm's ``img_mean``).
        interpolation: ``"nearest"``, ``"bilinear"``, ``"bicubic"``, or None: bilinear or bicubic per op.
    """

    ops: tuple[tuple[str, float, float], ...]
    num_layers: int = 2
    choice_weights: tuple[float, ...] | None = None
    magnitude_std: float = 0.0
    magnitude_max: float | None = None
    translate_const: float = 250.0
    translate_pct: float = 0.45
    fill: Any = (128, 128, 128)
    interpolation: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", _check_ops(self.ops, "TimmRandAugment"))
        n = self.num_layers
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 0 <= n <= 12:
            raise ValueError(f"num_layers={n!r} must be an int in [0, 12]")
        object.__setattr__(self, "num_layers", int(n))
        if self.choice_weights is not None:
            w = tuple(float(v) for v in self.choice_weights)
            if len(w) != len(self.ops) or not all(v >= 0 and math.isfinite(v) for v in w) or sum(w) <= 0:
                raise ValueError("choice_weights must hold one non-negative weight per op, not all zero")
            if sum(1 for v in w if v > 0) < self.num_layers:
                raise ValueError("choice_weights: fewer ops with a weight than num_layers (picked without replacement)")
            object.__setattr__(self, "choice_weights", w)
        self._check_common()

    def _pick(self, key: int) -> list[int]:
        if self.choice_weights is None:
            return [_randint(key, _RA_LAYER * i, len(self.ops)) for i in range(self.num_layers)]
        total = sum(self.choice_weights)
        weights = [w / total for w in self.choice_weights]  # numpy normalizes p, then cumsum / cdf[-1]
        picked: list[int] = []
        for i in range(self.num_layers):
            live = [0.0 if k in picked else w for k, w in enumerate(weights)]
            cdf = np.cumsum(live)
            u = uniform(key, _RA_LAYER * i) * cdf[-1]
            k = int(np.searchsorted(cdf, u, side="right"))
            while k >= len(live) or live[k] == 0.0:  # u at the very top: the last op with a weight
                k = (k - 1) % len(live)
            picked.append(k)
        return picked

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        pk = policy_key(key, base)
        ops = []
        for i, k in enumerate(self._pick(pk)):
            ops.append((k, self._op(self.ops[k], pk, _RA_LAYER * i + _RA_OP)))
        return {"ops": ops}

    def apply_params(self, image: NDArray[np.uint8], params: dict[str, Any]) -> NDArray[np.uint8]:
        for k, draw in params["ops"]:
            image = self._apply_op(image, self.ops[k][0], draw)
        return image

    def trace(self, params: dict[str, Any]) -> NDArray[np.float64]:
        """Layer ``i``: ``5 i`` the op's index, then its applied, level, negative, resample."""
        v: list[float] = []
        for k, draw in params["ops"]:
            v += [float(k), *self._draw_values(draw)]
        return _trace(v)

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        ops = []
        for i in range(self.num_layers):
            k = int(values[5 * i])
            ops.append((k, self._draw_from(self.ops[k][0], values[5 * i + 1 : 5 * i + 5])))
        return {"ops": ops}

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        return {
            "kind": "TIMM_RAND_AUGMENT",
            "fill": self.fill,
            "timm": {
                "ops": _engine_ops(self.ops),
                "weights": [float(w) for w in self.choice_weights or ()],
                "num_layers": int(self.num_layers),
                **self._policy_fields(),
            },
        }


@dataclass(frozen=True, kw_only=True)
class TimmAutoAugment(_TimmPolicy):
    """timm's ``AutoAugment(policy)`` (``auto_augment_transform``): one random sub-policy, its steps in order.

    Args:
        subpolicies: The sub-policies, each a sequence of ``(name, prob, magnitude)`` steps.
        magnitude_std, magnitude_max, translate_const, translate_pct, fill, interpolation: As for
            :class:`TimmRandAugment`.
    """

    subpolicies: tuple[tuple[tuple[str, float, float], ...], ...]
    magnitude_std: float = 0.0
    magnitude_max: float | None = None
    translate_const: float = 250.0
    translate_pct: float = 0.45
    fill: Any = (128, 128, 128)
    interpolation: Any = None

    def __post_init__(self) -> None:
        subs = tuple(_check_ops(sp, "TimmAutoAugment") for sp in self.subpolicies)
        if not subs or max(len(sp) for sp in subs) > 15:
            raise ValueError("TimmAutoAugment: between 1 and 15 steps per sub-policy, at least one sub-policy")
        object.__setattr__(self, "subpolicies", subs)
        self._check_common()

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        pk = policy_key(key, base)
        policy = _randint(pk, 0, len(self.subpolicies))
        steps = [self._op(op, pk, _AA_STEP + _AA_STEP * j) for j, op in enumerate(self.subpolicies[policy])]
        return {"policy": policy, "steps": steps}

    def apply_params(self, image: NDArray[np.uint8], params: dict[str, Any]) -> NDArray[np.uint8]:
        for (name, _, _), draw in zip(self.subpolicies[params["policy"]], params["steps"], strict=True):
            image = self._apply_op(image, name, draw)
        return image

    def trace(self, params: dict[str, Any]) -> NDArray[np.float64]:
        """0: the sub-policy; step ``j``: ``1 + 4 j`` applied, level, negative, resample."""
        v = [float(params["policy"])]
        for draw in params["steps"]:
            v += self._draw_values(draw)
        return _trace(v)

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        policy = int(values[0])
        steps = [
            self._draw_from(name, values[1 + 4 * j : 5 + 4 * j])
            for j, (name, _, _) in enumerate(self.subpolicies[policy])
        ]
        return {"policy": policy, "steps": steps}

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        groups, flat = [0], []
        for sp in self.subpolicies:
            flat += list(sp)
            groups.append(len(flat))
        return {
            "kind": "TIMM_AUTO_AUGMENT",
            "fill": self.fill,
            "timm": {"ops": _engine_ops(flat), "groups": groups, **self._policy_fields()},
        }


def _gamma(key: int, base: int, alpha: float) -> float:
    """A Gamma(alpha, 1) variate from counters ``base .. base + 63``.

    Exponential for alpha = 1, else Marsaglia-Tsang with up to 16 tries (boosted by ``U ** (1 /
    alpha)`` below 1).
    """
    if alpha == 1.0:
        return -math.log(1.0 - uniform(key, base))
    a = alpha + 1.0 if alpha < 1.0 else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    value = d
    for attempt in range(_GAMMA_ATTEMPTS):
        o = base + 3 * attempt
        x = normal(key, o)
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = uniform(key, o + 2)
        if math.log(1.0 - u) < 0.5 * x * x + d - d * v + d * math.log(v):
            value = d * v
            break
    if alpha < 1.0:
        value *= (1.0 - uniform(key, base + 3 * _GAMMA_ATTEMPTS)) ** (1.0 / alpha)
    return value


@dataclass(frozen=True, kw_only=True)
class TimmAugMix(_TimmPolicy):
    """timm's ``AugMixAugment(ops, alpha, width, depth)`` (``augment_and_mix_transform``, not ``blended``).

    Args:
        ops: The candidate ops (timm's AugMix ops apply with prob 1).
        alpha: Dirichlet / Beta concentration.
        width: Number of chains mixed (at most 16).
        depth: Ops per chain, or -1: 1 to 3 drawn per chain (at most 16).
        magnitude_std, magnitude_max, translate_const, translate_pct, fill, interpolation: As for
            :class:`TimmRandAugment` (timm's AugMix defaults to ``magnitude_std=inf``, ``translate_pct=0.3``).
    """

    ops: tuple[tuple[str, float, float], ...]
    alpha: float = 1.0
    width: int = 3
    depth: int = -1
    magnitude_std: float = math.inf
    magnitude_max: float | None = None
    translate_const: float = 250.0
    translate_pct: float = 0.3
    fill: Any = (128, 128, 128)
    interpolation: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", _check_ops(self.ops, "TimmAugMix"))
        alpha = float(self.alpha)
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha={self.alpha!r} must be > 0")
        object.__setattr__(self, "alpha", alpha)
        w, dp = self.width, self.depth
        if isinstance(w, bool) or not isinstance(w, numbers.Integral) or not 1 <= w <= 16:
            raise ValueError(f"width={w!r} must be an int in [1, 16]")
        if isinstance(dp, bool) or not isinstance(dp, numbers.Integral) or not (dp == -1 or 1 <= dp <= 16):
            raise ValueError(f"depth={dp!r} must be -1 or an int in [1, 16]")
        if 1 + w + w * (1 + 4 * self.max_depth) > _TRACE:
            raise ValueError(f"width={w} x depth {self.max_depth}: more ops than the engine traces (64 values)")
        object.__setattr__(self, "width", int(w))
        object.__setattr__(self, "depth", int(dp))
        self._check_common()

    @property
    def max_depth(self) -> int:
        return self.depth if self.depth > 0 else 3

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        pk = policy_key(key, base)
        gammas = [_gamma(pk, _GAMMA_STRIDE * g, self.alpha) for g in range(self.width)]
        total = sum(gammas)
        weights = [np.float32(g / total) if total > 0 else np.float32(1.0 / self.width) for g in gammas]
        x = _gamma(pk, _GAMMA_STRIDE * self.width, self.alpha)
        y = _gamma(pk, _GAMMA_STRIDE * (self.width + 1), self.alpha)
        m = np.float32(x / (x + y)) if x + y > 0 else np.float32(0.5)
        chains = []
        for c in range(self.width):
            cb = _CHAIN_BASE + _CHAIN_STRIDE * c
            depth = self.depth if self.depth > 0 else 1 + _randint(pk, cb, 3)
            chain = []
            for j in range(depth):
                k = _randint(pk, cb + _CHAIN_OP + _CHAIN_OP * j, len(self.ops))
                chain.append((k, self._op(self.ops[k], pk, cb + _CHAIN_OP + _CHAIN_OP * j + 8, check_prob=False)))
            chains.append(chain)
        return {"weights": [float(w) for w in weights], "m": float(m), "chains": chains}

    def apply_params(self, image: NDArray[np.uint8], params: dict[str, Any]) -> NDArray[np.uint8]:
        mixed = np.zeros(image.shape, np.float32)
        for mw, chain in zip(params["weights"], params["chains"], strict=True):
            aug = image
            for k, draw in chain:
                aug = self._apply_op(aug, self.ops[k][0], draw)
            mixed += np.float32(mw) * np.asarray(aug, dtype=np.float32)
        np.clip(mixed, 0, 255.0, out=mixed)
        return pil_blend(image, mixed.astype(np.uint8), params["m"])

    def trace(self, params: dict[str, Any]) -> NDArray[np.float64]:
        """0: m, then the ``width`` weights, then per chain its depth and per op: index, level, negative, resample."""
        v = [params["m"], *params["weights"]]
        for chain in params["chains"]:
            v.append(float(len(chain)))
            for k, draw in chain:
                v += [float(k), *self._draw_values(draw)[1:]]
        return _trace(v)

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        vals = [float(x) for x in values]
        m, weights = vals[0], vals[1 : 1 + self.width]
        chains, i = [], 1 + self.width
        for _ in range(self.width):
            depth = int(vals[i])
            i += 1
            chain = []
            for _ in range(depth):
                k = int(vals[i])
                chain.append((k, self._draw_from(self.ops[k][0], [1.0, *vals[i + 1 : i + 4]])))
                i += 4
            chains.append(chain)
        return {"weights": weights, "m": m, "chains": chains}

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        return {
            "kind": "TIMM_AUGMIX",
            "fill": self.fill,
            "timm": {
                "ops": _engine_ops(self.ops),
                "alpha": float(self.alpha),
                "width": int(self.width),
                "depth": int(self.depth),
                **self._policy_fields(),
            },
        }


# --- the Pillow reference of one op (timm.data.auto_augment's functions) --------------------


def _pil(image: NDArray[np.uint8]) -> PILImage:
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(image), "RGB")


def pil_blend(a: NDArray[np.uint8], b: NDArray[np.uint8], alpha: float) -> NDArray[np.uint8]:
    """Pillow's ``Image.blend(a, b, alpha)`` (float32 alpha, truncated)."""
    from PIL import Image

    return np.asarray(Image.blend(_pil(a), _pil(b), float(alpha)), dtype=np.uint8).copy()


def apply_timm_op(
    image: NDArray[np.uint8], name: TimmOpName, arg: Any, resample: int | None, fill: tuple[int, int, int]
) -> NDArray[np.uint8]:
    """What timm's ``NAME_TO_OP[name](img, arg, fillcolor=fill, resample=resample)`` does to an RGB image."""
    from PIL import Image, ImageEnhance, ImageOps

    n = TimmOpName
    img = _pil(image)
    kwargs: dict[str, Any] = {"resample": resample, "fillcolor": fill}
    if name == n.ROTATE:
        out = img.rotate(arg, **kwargs)
    elif name in (n.SHEAR_X, n.SHEAR_Y, n.TRANSLATE_X, n.TRANSLATE_Y, n.TRANSLATE_X_REL, n.TRANSLATE_Y_REL):
        if name == n.TRANSLATE_X_REL:
            arg = arg * img.size[0]
        elif name == n.TRANSLATE_Y_REL:
            arg = arg * img.size[1]
        matrix = {
            n.SHEAR_X: (1, arg, 0, 0, 1, 0),
            n.SHEAR_Y: (1, 0, 0, arg, 1, 0),
            n.TRANSLATE_X: (1, 0, arg, 0, 1, 0),
            n.TRANSLATE_X_REL: (1, 0, arg, 0, 1, 0),
            n.TRANSLATE_Y: (1, 0, 0, 0, 1, arg),
            n.TRANSLATE_Y_REL: (1, 0, 0, 0, 1, arg),
        }[name]
        out = img.transform(img.size, Image.Transform.AFFINE, matrix, **kwargs)
    elif name == n.AUTO_CONTRAST:
        out = ImageOps.autocontrast(img)
    elif name == n.EQUALIZE:
        out = ImageOps.equalize(img)
    elif name == n.INVERT:
        out = ImageOps.invert(img)
    elif name in (n.POSTERIZE, n.POSTERIZE_INCREASING, n.POSTERIZE_ORIGINAL):
        if arg >= 8:
            return image.copy()
        if arg <= 0:  # Pillow < 13: ~(2 ** 8 - 1) masks every bit away
            return np.zeros_like(image)
        out = ImageOps.posterize(img, int(arg))
    elif name in (n.SOLARIZE, n.SOLARIZE_INCREASING):
        out = ImageOps.solarize(img, arg)
    elif name == n.SOLARIZE_ADD:
        lut = [min(255, i + arg) if i < 128 else i for i in range(256)]
        out = img.point(lut * 3)
    else:
        enhance = {
            n.COLOR: ImageEnhance.Color,
            n.COLOR_INCREASING: ImageEnhance.Color,
            n.CONTRAST: ImageEnhance.Contrast,
            n.CONTRAST_INCREASING: ImageEnhance.Contrast,
            n.BRIGHTNESS: ImageEnhance.Brightness,
            n.BRIGHTNESS_INCREASING: ImageEnhance.Brightness,
            n.SHARPNESS: ImageEnhance.Sharpness,
            n.SHARPNESS_INCREASING: ImageEnhance.Sharpness,
        }[name]
        out = enhance(img).enhance(arg)
    return np.asarray(out, dtype=np.uint8).copy()
