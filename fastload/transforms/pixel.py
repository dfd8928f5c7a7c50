"""Pixel ops on the output-sized image: the counter layout, the draw helpers and the reference runner.

Pixel ops (:mod:`fastload.transforms.color`, :mod:`fastload.transforms.policy`) run after the
geometry, on the output-sized RGB image (HWC uint8), in the order of the Pipeline's ``ops``; the
C++ engine runs them between the resampler and the output write (``csrc/pixel/pixel_ops.h``), the Pillow
path runs :func:`apply_pixel_ops` below. Both take every random decision from the same counters of
the sample's stream ``uniform(sample_key(seed, epoch, index), counter)``, so a sample gets the same
parameters whatever the thread count, the batch it lands in or the resume point.

Counter layout of one sample (``k`` = position of the op in ``ops``, ``B = 64 * (k + 2)``)::

    [0, 64)                  geometry (crop attempts 0..39, flip 40)
    [B, B + 64)              pixel op k:
      ColorJitter            B+0..B+2 the order of the four (Fisher-Yates: position 3 swaps with
                             randint(4) of B+0, 2 with randint(3) of B+1, 1 with randint(2) of B+2);
                             B+3 brightness, B+4 contrast, B+5 saturation, B+6 hue factor
                             (low + (high - low) * u)
      RandomGrayscale        B+0 (applied when u < p); Grayscale draws nothing
      Lighting               B+0..B+5: alpha_j = alphastd * N(0, 1) from (B+2j, B+2j+1)
      MXNetColorAugment      B+0, B+1, B+2 brightness, contrast, saturation factors; B+3, B+4 the
                             order of the three (Fisher-Yates); B+5..B+10 the H, S, L jitters
                             ((u + 4 u') / 5 from pairs B+5/B+6, B+7/B+8, B+9/B+10); B+11..B+16 the
                             three PCA alphas (normal pairs); B+17 the normalization contrast and
                             B+18 the illumination (applied after Normalize, float outputs only)
      AutoAugment            B+0 sub-policy, B+1 and B+2 the two apply draws (applied when
                             u <= prob), B+3 and B+4 the two signs (negative when u < 0.5)
      RandAugment            op i (i < num_ops <= 31): B+2i which op, B+2i+1 its sign
                             (negative when u >= 0.5, as torchvision's ``randint(2) == 1``)
      TrivialAugmentWide     B+0 which op, B+1 which magnitude bin, B+2 its sign (as RandAugment)
      TimmRandAugment,       their own stream ``policy_key(key, B)`` (any number of ops): the layout
      TimmAutoAugment,       in :mod:`fastload.transforms.timm_policy`
      TimmAugMix
    [1 << 20, ...)           output-stage ops (:mod:`fastload.transforms.erasing`): RandomErasing
                             1<<20 (applied when u < p), then attempt a in 0..9: +1+4a area,
                             +2+4a log aspect ratio, +3+4a top, +4+4a left; "random" values from
                             (1<<20) + 64 + element index
    [1 << 30, ...) of the batch's first sample: batch ops (:mod:`fastload.transforms.mixing`)

Normal draws, ``randint`` and the permutations come from :mod:`fastload.transforms.rng`.

Every op reports what it drew as a flat vector of at most :data:`TRACE_VALUES_PER_OP` floats (NaN
where nothing was drawn); ``op.params_from_trace(vector)`` turns it into the op's parameter dict
and ``op.apply_params(image, params)`` replays them, which is how the tests check the engine
against the references.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fastload.engine import pixel_engine
from fastload.engine_structs import to_native
from fastload.transforms.pipeline import ERASE_COUNTER_BASE, OP_COUNTER_STRIDE, op_counter_base

__all__ = [
    "BATCH_OPS_COUNTER_BASE",
    "GEOMETRY_COUNTERS",
    "MAX_PIXEL_OPS",
    "OP_COUNTER_STRIDE",
    "OUTPUT_OPS_COUNTER_BASE",
    "TRACE_VALUES_PER_OP",
    "PixelOp",
    "apply_pixel_ops",
    "check_pixel_ops",
    "engine_specs",
    "op_counter_base",
    "run_pixel_ops_batch",
]

GEOMETRY_COUNTERS = 64
#: The output stage's first counter (the Pipeline's ERASE_COUNTER_BASE).
OUTPUT_OPS_COUNTER_BASE = ERASE_COUNTER_BASE
BATCH_OPS_COUNTER_BASE = 1 << 30
TRACE_VALUES_PER_OP = 64
#: Pixel ops per Pipeline the engine takes (kMaxPixelOps in csrc/pixel/pixel_ops.h).
MAX_PIXEL_OPS = 64


class PixelOp:
    """What every pixel op spec provides (the Python reference of contract 3).

    Subclasses are frozen dataclasses; they implement :meth:`sample`, :meth:`apply_params`,
    :meth:`trace` and :meth:`params_from_trace`.
    """

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        """The op's random parameters for one sample (draws from counters ``[base, base + 64)``)."""
        raise NotImplementedError

    def apply_params(self, image: NDArray[np.uint8], params: dict[str, Any]) -> NDArray[np.uint8]:
        """The op with the given parameters on an HWC uint8 RGB image; returns a new array."""
        raise NotImplementedError

    def trace(self, params: dict[str, Any]) -> NDArray[np.float64]:
        """``params`` as the engine's flat float64 trace vector."""
        raise NotImplementedError

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        """The parameter dict of an engine trace vector."""
        raise NotImplementedError

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        """The op as the engine's ``PixelOp`` fields (fastload/engine_abi.py; ``kind``: a ``PixelOpKind`` name)."""
        raise NotImplementedError

    def apply(self, image: NDArray[np.uint8], key: int, *, base: int) -> NDArray[np.uint8]:
        """Sample and apply: the reference of what the engine does to one image."""
        height, width = image.shape[:2]
        return self.apply_params(image, self.sample(key, base, height, width))


def _check_image(image: NDArray[np.uint8]) -> NDArray[np.uint8]:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(
            f"pixel ops take an HWC uint8 RGB image, got {getattr(image, 'shape', None)} "
            f"{getattr(image, 'dtype', type(image).__name__)}"
        )
    return np.ascontiguousarray(image)


def check_pixel_ops(ops: Sequence[Any]) -> tuple[Any, ...]:
    """Validates a Pipeline's ``ops`` (pixel op specs, at most :data:`MAX_PIXEL_OPS`); returns a tuple."""
    ops = tuple(ops)
    if len(ops) > MAX_PIXEL_OPS:
        raise ValueError(f"{len(ops)} pixel ops: at most {MAX_PIXEL_OPS} are supported")
    for i, op in enumerate(ops):
        if not isinstance(op, PixelOp):
            raise ValueError(
                f"ops[{i}]={op!r} is not a pixel op (ColorJitter, RandomGrayscale, Grayscale, "
                "Lighting, MXNetColorAugment, AutoAugment, RandAugment, TrivialAugmentWide, timm's policies)"
            )
    return ops


def apply_pixel_ops(
    image: NDArray[np.uint8], ops: Sequence[PixelOp], key: int
) -> tuple[NDArray[np.uint8], list[dict[str, Any]]]:
    """Runs ``ops`` in order on one output-sized image, as the engine does.

    Args:
        image: HWC uint8 RGB image (not modified).
        ops: Pixel op specs, in Pipeline order.
        key: The sample's key (``sample_key(seed, epoch, index)``).

    Returns:
        The new image and each op's sampled parameters.
    """
    image = _check_image(image)
    height, width = image.shape[:2]
    params = []
    for position, op in enumerate(check_pixel_ops(ops)):
        p = op.sample(key, op_counter_base(position), height, width)
        image = _check_image(op.apply_params(image, p))
        params.append(p)
    return image, params


@functools.lru_cache(maxsize=256)
def _native_ops(engine: Any, ops: tuple[PixelOp, ...], height: int, width: int) -> Any:
    # The policies' tables (magnitudes, a warp matrix per bin and sign) take milliseconds to build:
    # built once per op list and output size. Specs are frozen dataclasses, hence hashable.
    return to_native(engine, "PixelOpsSpec", {"ops": [op.engine_fields(height, width) for op in ops]})


def engine_specs(ops: Sequence[PixelOp], height: int, width: int, engine: Any) -> Any:
    """The ops as the engine's ``PixelOpsSpec`` for ``height`` x ``width`` outputs.

    Built once per op list and output size and shared: the caller must not modify it.

    Args:
        ops: Pixel op specs, in Pipeline order.
        height: Output height.
        width: Output width.
        engine: The ``fastload._engine`` module.
    """
    return _native_ops(engine, check_pixel_ops(ops), int(height), int(width))


def run_pixel_ops_batch(
    images: NDArray[np.uint8],
    ops: Sequence[PixelOp],
    *,
    seed: int,
    epoch: int,
    indices: Any,
    threads: int = 1,
    want_params: bool = False,
) -> list[list[dict[str, Any]]] | None:
    """Runs ``ops`` on already-decoded output-sized images ``[B, H, W, 3]`` uint8, in place.

    One engine call for the batch (GIL released, ``threads`` threads); the reference path when the
    engine is not live. Each sample ``i`` is keyed by ``sample_key(seed, epoch, indices[i])``.

    Returns:
        With ``want_params``, each sample's per-op parameter dicts; else None.
    """
    from fastload.transforms.rng import sample_key

    ops = check_pixel_ops(ops)
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
        raise ValueError("images must be a [B, H, W, 3] uint8 array")
    idx = np.ascontiguousarray(np.asarray(indices), dtype=np.int64)
    if idx.shape != (images.shape[0],):
        raise ValueError(f"indices must hold one index per image ({images.shape[0]})")
    engine = pixel_engine()
    mask = (1 << 64) - 1
    if engine is None:
        params = []
        for i in range(images.shape[0]):
            out, p = apply_pixel_ops(images[i], ops, sample_key(seed, epoch, int(idx[i])))
            images[i] = out
            params.append(p)
        return params if want_params else None
    h, w = images.shape[1], images.shape[2]
    traces = engine.pixel_ops_batch(
        images,
        engine_specs(ops, h, w, engine),
        int(seed) & mask,
        int(epoch) & mask,
        idx,
        int(threads),
        bool(want_params),
    )
    if not want_params:
        return None
    return [[op.params_from_trace(traces[i, k]) for k, op in enumerate(ops)] for i in range(images.shape[0])]
