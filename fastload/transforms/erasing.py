"""Output-stage ops: RandomErasing (and MXNet's normalization jitter) on the final, normalized output.

These run after Normalize, on one sample of the batch in its final dtype (uint8, float32, float16)
and layout (NCHW or NHWC): the engine calls ``apply_erasing`` (``csrc/pixel/pixel_ops.h``) right after the
output write, the Pillow path calls :func:`apply_output_ops`. Order: MXNet's random contrast /
illumination (from a :class:`~fastload.transforms.mxnet_color.MXNetColorAugment` in the ops, float
outputs only, as MXNet), then :class:`RandomErasing`.

RandomErasing follows torchvision's ``transforms.RandomErasing`` (applied to the normalized tensor,
as the reference recipes do): with probability ``p``, up to 10 attempts at a box of area
``scale * H * W`` and aspect ``exp(U(log ratio))``; the first box that fits strictly inside is filled
with ``value``; when none fits, nothing changes. Counters (from ``1 << 20`` of the sample's stream):
``+0`` apply, attempt ``a``: ``+1+4a`` area, ``+2+4a`` log aspect ratio, ``+3+4a`` top,
``+4+4a`` left; ``value="random"`` takes element ``k`` of the box (channel-major, as torch's
``[C, h, w]`` noise) from ``+64+2k`` and ``+65+2k``: a standard normal for float outputs, a uniform
integer in [0, 255] for uint8 outputs (torch would cast N(0, 1) to uint8, which gives only the values
0-3 and 253-255: a deliberate difference). ``value="random_color"`` (timm's ``mode='rand'``) fills
the whole box with one such value per channel: channel ``c`` takes element ``c``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fastload.transforms.pixel import OUTPUT_OPS_COUNTER_BASE, op_counter_base
from fastload.transforms.rng import normal, randint, uniform

if TYPE_CHECKING:
    from fastload.transforms.mxnet_color import MXNetColorAugment

__all__ = ["RandomErasing", "apply_output_ops", "engine_output_spec", "output_params_from_trace"]

_E = OUTPUT_OPS_COUNTER_BASE
_ATTEMPTS = 10
_NOISE = 64


def _pair(value: Any, name: str) -> tuple[float, float]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name}={value!r} must be a (min, max) pair")
    lo, hi = float(value[0]), float(value[1])
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(f"{name}={value!r} must satisfy min <= max (finite)")
    return (lo, hi)


@dataclass(frozen=True, kw_only=True)
class RandomErasing:
    """torchvision's ``RandomErasing(p, scale, ratio, value, inplace)``, on the normalized output.

    Args:
        p: Probability of erasing a box.
        scale: Range of the box area as a fraction of the image area.
        ratio: Range of the box aspect ratio (height / width, as torchvision).
        value: The fill in output units (normalized values for float outputs, 0..255 for uint8):
            a number, one value per channel, ``"random"`` (a random value per element) or
            ``"random_color"`` (a random value per channel, timm's ``mode='rand'``).
        inplace: Accepted for torchvision compatibility; the engine always erases in place in the
            batch buffer.
    """

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: float | str | tuple[float, ...] = 0
    inplace: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, numbers.Real) or not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p={self.p!r} must be a probability in [0, 1]")
        scale = _pair(self.scale, "scale")
        if scale[0] < 0 or scale[1] > 1:
            raise ValueError(f"scale={self.scale!r} must lie within [0, 1]")
        ratio = _pair(self.ratio, "ratio")
        if ratio[0] <= 0:
            raise ValueError(f"ratio={self.ratio!r} must be positive")
        value = self.value
        if isinstance(value, str):
            if value not in ("random", "random_color"):
                raise ValueError(f"value={value!r}: the strings accepted are 'random' and 'random_color'")
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = (float(value),)
        elif (
            isinstance(value, (tuple, list))
            and len(value) in (1, 3)
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
        ):
            value = tuple(float(v) for v in value)
        else:
            raise ValueError(
                f"value={value!r} must be a number, 1 or 3 numbers (one per channel), 'random' or 'random_color'"
            )
        if not isinstance(value, str) and not all(math.isfinite(v) for v in value):
            raise ValueError(f"value={self.value!r} must be finite")
        object.__setattr__(self, "p", float(self.p))
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "inplace", bool(self.inplace))

    @property
    def random_value(self) -> bool:
        return self.value == "random"

    @property
    def random_color(self) -> bool:
        return self.value == "random_color"

    def channel_values(self) -> tuple[float, float, float]:
        """The constant fill per channel (undefined for ``"random"`` and ``"random_color"``)."""
        if isinstance(self.value, str):
            return (0.0, 0.0, 0.0)
        value: Any = self.value  # a number tuple once __post_init__ has checked it
        if len(value) == 1:
            value = tuple(value) * 3
        return (float(value[0]), float(value[1]), float(value[2]))

    def sample(self, key: int, height: int, width: int) -> dict[str, Any]:
        """The box for one sample: ``{"applied", "top", "left", "height", "width"}``."""
        if not uniform(key, _E) < self.p:
            return {"applied": False}
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for a in range(_ATTEMPTS):
            c = _E + 1 + 4 * a
            erase_area = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * uniform(key, c))
            aspect = math.exp(log_lo + (log_hi - log_lo) * uniform(key, c + 1))
            eh = round(math.sqrt(erase_area * aspect))
            ew = round(math.sqrt(erase_area / aspect))
            if not (eh < height and ew < width):
                continue
            top = randint(key, c + 2, height - eh + 1)
            left = randint(key, c + 3, width - ew + 1)
            return {"applied": True, "top": top, "left": left, "height": eh, "width": ew}
        return {"applied": False}

    def fill_values(self, key: int, params: dict[str, Any], dtype: np.dtype[Any]) -> NDArray[np.float64]:
        """The ``[3, h, w]`` float64 fill of the box (channel-major, as torch's noise)."""
        eh, ew = params["height"], params["width"]
        if not self.random_value:
            values = self.channel_values()
            if self.random_color:
                values = (self._noise(key, 0, dtype), self._noise(key, 1, dtype), self._noise(key, 2, dtype))
            return np.broadcast_to(np.asarray(values, np.float64)[:, None, None], (3, eh, ew))
        vals = [self._noise(key, k, dtype) for k in range(3 * eh * ew)]
        return np.asarray(vals, np.float64).reshape(3, eh, ew)

    @staticmethod
    def _noise(key: int, k: int, dtype: np.dtype[Any]) -> float:
        if np.dtype(dtype) == np.uint8:
            return float(randint(key, _E + _NOISE + 2 * k, 256))
        return normal(key, _E + _NOISE + 2 * k)

    def apply_params(self, sample: NDArray[Any], params: dict[str, Any], key: int, *, channels_first: bool) -> None:
        """Erases ``sample`` (one output image, ``[3, H, W]`` or ``[H, W, 3]``) in place."""
        if not params["applied"]:
            return
        top, left, eh, ew = params["top"], params["left"], params["height"], params["width"]
        fill = self.fill_values(key, params, sample.dtype)
        if sample.dtype == np.uint8:
            fill = np.clip(np.rint(fill), 0, 255)
        fill = fill.astype(sample.dtype)
        if channels_first:
            sample[:, top : top + eh, left : left + ew] = fill
        else:
            sample[top : top + eh, left : left + ew, :] = fill.transpose(1, 2, 0)


def _mx_jitter(ops: Sequence[Any]) -> tuple[MXNetColorAugment, int] | None:
    # The MXNetColorAugment op with a normalization jitter, and its counter base.
    from fastload.transforms.mxnet_color import MXNetColorAugment

    found = None
    for position, op in enumerate(ops):
        if isinstance(op, MXNetColorAugment) and op.has_output_jitter:
            found = (op, op_counter_base(position))
    return found


def apply_output_ops(
    sample: NDArray[Any],
    *,
    key: int,
    channels_first: bool,
    ops: Sequence[Any] = (),
    normalize: Any = None,
    erase: RandomErasing | None = None,
) -> dict[str, Any]:
    """The Pillow path's output stage for one sample, in place: MXNet's jitter, then RandomErasing.

    Args:
        sample: One image of the output batch (``[3, H, W]`` or ``[H, W, 3]``, uint8 / float32 / float16).
        key: The sample's key.
        channels_first: Layout of ``sample``.
        ops: The Pipeline's pixel ops (an MXNetColorAugment among them brings its normalization jitter).
        normalize: The Pipeline's Normalize (its ``scale`` and ``std`` scale the illumination); None
            for raw outputs.
        erase: The Pipeline's RandomErasing, or None.

    Returns:
        What was drawn: ``{"erase": {...}, "mx_contrast": c, "mx_illumination": l}`` (NaN when not drawn).
    """
    out: dict[str, Any] = {"erase": {"applied": False}, "mx_contrast": float("nan"), "mx_illumination": float("nan")}
    jitter = _mx_jitter(ops)
    if jitter is not None and sample.dtype != np.uint8:
        op, base = jitter
        c, illum = op.output_jitter(key, base)
        out["mx_contrast"], out["mx_illumination"] = c, illum
        scale = np.asarray(op.illumination_scale(normalize), np.float32)
        shape = (3, 1, 1) if channels_first else (1, 1, 3)
        work = sample.astype(np.float32)
        work = work * np.float32(c) + (np.float32(illum) * scale).reshape(shape)
        sample[...] = work.astype(sample.dtype)
    if erase is not None:
        h, w = (sample.shape[1], sample.shape[2]) if channels_first else (sample.shape[0], sample.shape[1])
        params = erase.sample(key, h, w)
        erase.apply_params(sample, params, key, channels_first=channels_first)
        out["erase"] = params
    return out


def engine_output_spec(
    ops: Sequence[Any] = (), normalize: Any = None, erase: RandomErasing | None = None
) -> dict[str, Any]:
    """The engine's description of the output stage (``ErasingSpec`` in csrc/pixel/pixel_ops.h), as plain numbers.

    Args:
        ops: The Pipeline's pixel ops (an MXNetColorAugment with a normalization jitter contributes it).
        normalize: The Pipeline's Normalize (``scale`` and ``std`` scale the illumination), or None.
        erase: The Pipeline's RandomErasing, or None.
    """
    spec: dict[str, Any] = {"mx_jitter": False, "erase": erase is not None}
    jitter = _mx_jitter(ops)
    if jitter is not None:
        op, base = jitter
        spec.update(
            mx_jitter=True,
            max_random_contrast=op.max_random_contrast,
            max_random_illumination=op.max_random_illumination,
            mx_counter_base=base,
            illumination_scale=op.illumination_scale(normalize),
        )
    if erase is not None:
        spec.update(
            p=erase.p,
            scale=erase.scale,
            log_ratio=(math.log(erase.ratio[0]), math.log(erase.ratio[1])),
            random_value=erase.random_value,
            random_color=erase.random_color,
            value=erase.channel_values(),
        )
    return spec


def output_params_from_trace(values: Sequence[float]) -> dict[str, Any]:
    """The engine's output-stage trace of one sample as :func:`apply_output_ops` reports it."""
    v = [float(x) for x in values]
    erase: dict[str, Any] = {"applied": bool(v[0] == 1.0)}
    if erase["applied"]:
        erase.update(top=int(v[1]), left=int(v[2]), height=int(v[3]), width=int(v[4]))
    return {"erase": erase, "mx_contrast": v[5], "mx_illumination": v[6]}
