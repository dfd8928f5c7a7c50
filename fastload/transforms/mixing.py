"""Batch-level mixing: MixUp and CutMix on a decoded batch and its labels (torchvision.transforms.v2).

Sample ``i`` is mixed with sample ``i - 1`` (sample 0 with the last: torch's ``roll(1, 0)``), the
labels become one-hot soft labels of ``num_classes`` mixed with the same weights:

- :class:`MixUp`: ``lam ~ Beta(alpha, alpha)``; ``out = rolled * (1 - lam) + image * lam`` in float32
  (float16 outputs round each product and the sum to half, as torch's half arithmetic; uint8
  outputs, which torch refuses, are rounded half to even), labels with the same ``lam``;
- :class:`CutMix`: ``lam ~ Beta(alpha, alpha)``, a box of half-size ``0.5 * sqrt(1 - lam)`` of the
  image around a uniform centre, clipped to the image, copied from the rolled batch; labels weighted
  by the box's actual area;
- :class:`RandomChoice`: one of them per batch, uniformly (torchvision's ``v2.RandomChoice``).

:func:`mix_batch` does it in place with one engine call per batch (``mix_batch`` in
``csrc/pixel/pixel_ops.h``, GIL released, the work spread over the engine's threads); the numpy reference
below is the Pillow path and the tests' oracle. Randomness: the key of the batch's first sample,
``sample_key(seed, epoch, first_index)``, counters from ``1 << 30``: ``+0`` which op of a
RandomChoice, ``+1`` / ``+2`` the CutMix centre x / y, ``+16 ..`` and ``+272 ..`` the two gamma
variates whose ratio is the Beta draw (Marsaglia-Tsang: per attempt t a normal from ``3t+1``,
``3t+2`` and the acceptance draw ``3t+3``; for ``alpha < 1`` the ``U^(1/alpha)`` boost from ``+0``).
Batch boundaries therefore decide a batch's ``lam``: the same batches give the same mixing on any
thread count and after a resume.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fastload.engine import pixel_engine
from fastload.engine_structs import to_native
from fastload.transforms.pixel import BATCH_OPS_COUNTER_BASE
from fastload.transforms.rng import beta, randint, sample_key, uniform

__all__ = [
    "CutMix",
    "MixResult",
    "MixUp",
    "RandomChoice",
    "engine_mix_fields",
    "mix_batch",
    "mix_labels",
    "sample_beta",
    "sample_mix",
]

_K = BATCH_OPS_COUNTER_BASE
_GAMMA_X = _K + 16
_GAMMA_Y = _K + 16 + 256


def _check_alpha(alpha: Any) -> float:
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, numbers.Real)
        or not (float(alpha) > 0 and math.isfinite(alpha))
    ):
        raise ValueError(f"alpha={alpha!r} must be a finite number > 0")
    return float(alpha)


def _check_classes(num_classes: Any) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise ValueError(f"num_classes={num_classes!r} must be an int >= 1")
    return int(num_classes)


@dataclass(frozen=True, kw_only=True)
class MixUp:
    """torchvision v2 ``MixUp(alpha, num_classes)`` on a whole batch.

    Args:
        alpha: Beta(alpha, alpha) parameter of the mixing weight.
        num_classes: Classes of the one-hot soft labels.
    """

    alpha: float = 1.0
    num_classes: int = 1000

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _check_alpha(self.alpha))
        object.__setattr__(self, "num_classes", _check_classes(self.num_classes))


@dataclass(frozen=True, kw_only=True)
class CutMix:
    """torchvision v2 ``CutMix(alpha, num_classes)`` on a whole batch.

    Args:
        alpha: Beta(alpha, alpha) parameter of the box size.
        num_classes: Classes of the one-hot soft labels.
    """

    alpha: float = 1.0
    num_classes: int = 1000

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _check_alpha(self.alpha))
        object.__setattr__(self, "num_classes", _check_classes(self.num_classes))


@dataclass(frozen=True, kw_only=True)
class RandomChoice:
    """torchvision v2 ``RandomChoice([MixUp(...), CutMix(...)], p)``: one of the batch ops per batch.

    Args:
        transforms: MixUp / CutMix specs with the same ``num_classes``.
        p: Probabilities (normalized); None for uniform.
    """

    transforms: tuple[MixUp | CutMix, ...] = ()
    p: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        ts = tuple(self.transforms)
        if not ts or not all(isinstance(t, (MixUp, CutMix)) for t in ts):
            raise ValueError(f"transforms={self.transforms!r} must be a non-empty sequence of MixUp / CutMix")
        if len({t.num_classes for t in ts}) != 1:
            raise ValueError("every transform of a RandomChoice must have the same num_classes")
        p = self.p
        if p is not None:
            p = tuple(float(v) for v in p)
            if len(p) != len(ts) or any(v < 0 or not math.isfinite(v) for v in p) or sum(p) <= 0:
                raise ValueError(f"p={self.p!r} must hold {len(ts)} non-negative weights with a positive sum")
            total = sum(p)
            p = tuple(v / total for v in p)
        object.__setattr__(self, "transforms", ts)
        object.__setattr__(self, "p", p)

    @property
    def num_classes(self) -> int:
        return self.transforms[0].num_classes


BatchOp = MixUp | CutMix | RandomChoice


def sample_beta(key: int, alpha: float) -> float:
    """Beta(alpha, alpha) from the batch counters: the ratio of two gamma variates."""
    return beta(key, _GAMMA_X, _GAMMA_Y, alpha)


def sample_mix(mix: BatchOp, key: int, height: int, width: int) -> dict[str, Any]:
    """The batch's parameters: ``{"op": "mixup" | "cutmix", "lam", "box", "lam_labels"}``."""
    if isinstance(mix, RandomChoice):
        if mix.p is None:
            mix = mix.transforms[randint(key, _K, len(mix.transforms))]
        else:
            u = uniform(key, _K)
            acc = 0.0
            chosen = mix.transforms[-1]
            for t, w in zip(mix.transforms, mix.p, strict=False):
                acc += w
                if u < acc:
                    chosen = t
                    break
            mix = chosen
    lam = sample_beta(key, mix.alpha)
    if isinstance(mix, MixUp):
        return {"op": "mixup", "lam": lam, "box": None, "lam_labels": lam}
    rx = randint(key, _K + 1, width)
    ry = randint(key, _K + 2, height)
    r = 0.5 * math.sqrt(1.0 - lam)
    rw, rh = int(r * width), int(r * height)
    x0, y0 = max(rx - rw, 0), max(ry - rh, 0)
    x1, y1 = min(rx + rw, width), min(ry + rh, height)
    lam_adj = float(1.0 - (x1 - x0) * (y1 - y0) / (width * height))
    return {"op": "cutmix", "lam": lam, "box": (x0, y0, x1, y1), "lam_labels": lam_adj}


def engine_mix_fields(params: dict[str, Any]) -> dict[str, Any]:
    """A batch's drawn parameters (:func:`sample_mix`) as the engine's ``MixParams`` fields."""
    x0, y0, x1, y1 = params["box"] or (0, 0, 0, 0)
    return {
        "cutmix": params["op"] == "cutmix",
        "lam": float(params["lam"]),
        "x0": int(x0),
        "y0": int(y0),
        "x1": int(x1),
        "y1": int(y1),
        "lam_labels": float(params["lam_labels"]),
    }


@dataclass(frozen=True)
class MixResult:
    """What :func:`mix_batch` did: the soft labels ``[B, num_classes]`` float32 and the parameters."""

    labels: NDArray[np.float32]
    params: dict[str, Any]


def _layout(images: NDArray[Any], layout: str | None) -> bool:
    """True for NCHW."""
    if images.ndim != 4:
        raise ValueError(f"images must be a 4-D batch, got shape {images.shape}")
    if layout is not None:
        layout = getattr(layout, "value", layout)
        if layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout={layout!r} must be 'NHWC' or 'NCHW'")
        want = 1 if layout == "NCHW" else 3
        if images.shape[want] != 3:
            raise ValueError(f"images shape {images.shape} is not {layout} with 3 channels")
        return layout == "NCHW"
    nchw, nhwc = images.shape[1] == 3, images.shape[3] == 3
    if nchw and nhwc:
        raise ValueError(f"images shape {images.shape} is ambiguous: pass layout='NHWC' or 'NCHW'")
    if not (nchw or nhwc):
        raise ValueError(f"images shape {images.shape} has no 3-channel axis (NHWC or NCHW)")
    return nchw


def _class_indices(labels: NDArray[Any], n: int, num_classes: int) -> NDArray[np.int64] | None:
    """Index labels as int64 ``[B]`` class indices (checked as :func:`_one_hot` checks them).

    Returns None for probability rows.
    """
    lab = np.asarray(labels)
    if lab.ndim == 0 or lab.shape[0] != n:
        raise ValueError(f"labels have {lab.shape[0] if lab.ndim else 0} rows for a batch of {n}")
    if lab.ndim == 1 or (lab.ndim == 2 and lab.shape[1] == 1 and num_classes > 1):
        idx = lab.reshape(n)
        if idx.dtype.kind in "iu":
            if n and (idx.min() < 0 or idx.max() >= num_classes):
                _one_hot(lab, n, num_classes)  # raises, naming the first bad label
            return idx.astype(np.int64, copy=False)
        if not np.all((idx >= 0) & (idx < num_classes) & (idx == np.floor(idx))):
            _one_hot(lab, n, num_classes)  # raises, naming the first bad label (NaN included)
        return idx.astype(np.int64)
    return None


def _one_hot(labels: NDArray[Any], n: int, num_classes: int) -> NDArray[np.float32]:
    lab = np.asarray(labels)
    if lab.shape[0] != n:
        raise ValueError(f"labels have {lab.shape[0]} rows for a batch of {n}")
    if lab.ndim == 1 or (lab.ndim == 2 and lab.shape[1] == 1 and num_classes > 1):
        idx = lab.reshape(n).astype(np.float64)
        if (
            not np.all(np.isfinite(idx))
            or np.any(idx != np.floor(idx))
            or np.any(idx < 0)
            or np.any(idx >= num_classes)
        ):
            bad = int(
                np.flatnonzero(~(np.isfinite(idx) & (idx == np.floor(idx)) & (idx >= 0) & (idx < num_classes)))[0]
            )
            raise ValueError(f"labels[{bad}]={lab.reshape(n)[bad]!r} is not a class index in [0, {num_classes})")
        out = np.zeros((n, num_classes), np.float32)
        out[np.arange(n), idx.astype(np.int64)] = 1.0
        return out
    if lab.ndim == 2 and lab.shape[1] == num_classes:
        return lab.astype(np.float32)
    raise ValueError(
        f"labels of shape {lab.shape} must be class indices [B] / [B, 1] or probabilities [B, {num_classes}]"
    )


def _soft(onehot: NDArray[np.float32], params: dict[str, Any]) -> NDArray[np.float32]:
    """The mixed labels, with the engine's float32 arithmetic (``prev * w_roll + own * w_own``)."""
    w_own = np.float32(params["lam_labels"])
    w_roll = np.float32(1.0 - params["lam_labels"])
    return (np.roll(onehot, 1, axis=0) * w_roll + onehot * w_own).astype(np.float32)


def _reference(
    images: NDArray[Any], onehot: NDArray[np.float32], params: dict[str, Any], nchw: bool
) -> NDArray[np.float32]:
    soft = _soft(onehot, params)
    rolled = np.roll(images, 1, axis=0)
    if params["op"] == "cutmix":
        x0, y0, x1, y1 = params["box"]
        if nchw:
            images[:, :, y0:y1, x0:x1] = rolled[:, :, y0:y1, x0:x1]
        else:
            images[:, y0:y1, x0:x1, :] = rolled[:, y0:y1, x0:x1, :]
        return soft
    a = np.float32(params["lam"])
    b = np.float32(1.0 - params["lam"])
    if images.dtype == np.float16:
        images[...] = (rolled.astype(np.float32) * b).astype(np.float16).astype(np.float32) + (
            images.astype(np.float32) * a
        ).astype(np.float16).astype(np.float32)
    elif images.dtype == np.uint8:
        images[...] = np.clip(np.rint(rolled.astype(np.float32) * b + images.astype(np.float32) * a), 0, 255)
    else:
        images[...] = rolled * b + images * a
    return soft


def _check_mix(mix: Any) -> None:
    if not isinstance(mix, (MixUp, CutMix, RandomChoice)):
        raise ValueError(f"mix={mix!r} must be a MixUp, CutMix or RandomChoice")


def _check_out(out: Any, n: int, num_classes: int) -> None:
    if out is not None and (
        not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or out.shape != (n, num_classes)
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(f"out must be a writeable C-contiguous float32 array of shape {(n, num_classes)}")


def mix_labels(
    labels: NDArray[Any],
    mix: BatchOp,
    *,
    seed: int,
    epoch: int,
    first_index: int,
    height: int,
    width: int,
    out: NDArray[np.float32] | None = None,
) -> MixResult:
    """The draw and the soft labels :func:`mix_batch` gives a batch, without touching its images.

    What ``fastload.decode.decode_batch(mix=...)`` uses to mix the images in the decode's output
    stage: the same parameters and labels as :func:`mix_batch` on the decoded batch.

    Args:
        labels: Class indices (``[B]`` or ``[B, 1]``) or probability rows ``[B, num_classes]``.
        mix: :class:`MixUp`, :class:`CutMix` or :class:`RandomChoice`.
        seed: Loader seed.
        epoch: Epoch.
        first_index: Global sample index of the batch's first sample (keys the batch's draws).
        height: Image height (CutMix's box).
        width: Image width.
        out: Caller-owned float32 ``[B, num_classes]`` array for the soft labels, or None.

    Returns:
        :class:`MixResult` with the soft labels and the sampled parameters.

    Raises:
        ValueError: Bad labels, mix or out.
    """
    _check_mix(mix)
    lab = np.asarray(labels)
    n = lab.shape[0] if lab.ndim else 0
    _check_out(out, n, mix.num_classes)
    params = sample_mix(mix, sample_key(int(seed), int(epoch), int(first_index)), int(height), int(width))
    classes = _class_indices(lab, n, mix.num_classes)
    if classes is None:  # probability rows
        soft = _soft(_one_hot(lab, n, mix.num_classes), params) if n else np.zeros((0, mix.num_classes), np.float32)
        if out is None:
            return MixResult(soft, params)
        out[...] = soft
        return MixResult(out, params)
    # One-hot rows, written sparsely (no [B, num_classes] temporaries): prev * w_roll + own * w_own
    # is w_roll at the previous sample's class, w_own at the own class, and their float32 sum when
    # the two agree; the dense formula's bits.
    soft = np.zeros((n, mix.num_classes), np.float32) if out is None else out
    if out is not None:
        soft.fill(0)
    if n:
        rows = np.arange(n)
        soft[rows, np.roll(classes, 1)] = np.float32(1.0 - params["lam_labels"])
        soft[rows, classes] += np.float32(params["lam_labels"])
    return MixResult(soft, params)


def mix_batch(
    images: NDArray[Any],
    labels: NDArray[Any],
    mix: BatchOp,
    *,
    seed: int,
    epoch: int,
    first_index: int,
    layout: str | None = None,
    threads: int | None = None,
    out: NDArray[np.float32] | None = None,
) -> MixResult:
    """MixUp / CutMix a decoded batch in place; returns the soft labels.

    Args:
        images: The batch (``[B, H, W, 3]`` or ``[B, 3, H, W]``, uint8 / float32 / float16,
            C-contiguous, writeable): mixed in place.
        labels: Class indices (``[B]`` or ``[B, 1]``, any numeric dtype) or probability rows
            ``[B, num_classes]``.
        mix: :class:`MixUp`, :class:`CutMix` or :class:`RandomChoice`.
        seed: Loader seed.
        epoch: Epoch.
        first_index: Global sample index of the batch's first sample (keys the batch's draws).
        layout: ``"NHWC"`` or ``"NCHW"``; inferred from the shape when unambiguous.
        threads: Engine threads (default: the CPUs this process may use).
        out: Caller-owned float32 ``[B, num_classes]`` C-contiguous array for the soft labels (e.g. a
            batch-slot field); a new array when None.

    Returns:
        :class:`MixResult` with float32 ``[B, num_classes]`` soft labels and the sampled parameters.

    Raises:
        ValueError: Bad shapes, dtypes, or a label that is not a class index in range.
    """
    _check_mix(mix)
    if not isinstance(images, np.ndarray) or images.dtype not in (np.uint8, np.float32, np.float16):
        raise ValueError("images must be a numpy uint8, float32 or float16 array")
    if not images.flags.c_contiguous or not images.flags.writeable:
        raise ValueError("images must be C-contiguous and writeable (they are mixed in place)")
    nchw = _layout(images, layout)
    n = images.shape[0]
    _check_out(out, n, mix.num_classes)
    h, w = (images.shape[2], images.shape[3]) if nchw else (images.shape[1], images.shape[2])
    onehot = _one_hot(labels, n, mix.num_classes)
    params = sample_mix(mix, sample_key(int(seed), int(epoch), int(first_index)), h, w)
    if n == 0:
        return MixResult(onehot if out is None else out, params)
    engine = pixel_engine()
    if engine is None:
        soft = _reference(images, onehot, params, nchw)
        if out is None:
            return MixResult(soft, params)
        out[...] = soft
        return MixResult(out, params)
    if threads is None:
        try:
            threads = max(1, len(os.sched_getaffinity(0)))
        except AttributeError:
            threads = max(1, os.cpu_count() or 1)
    soft = np.empty((n, mix.num_classes), np.float32) if out is None else out
    native = to_native(engine, "MixParams", engine_mix_fields(params))
    engine.mix_batch(images, onehot, soft, native, bool(nchw), int(threads))
    return MixResult(soft, params)
