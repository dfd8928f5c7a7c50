"""Output stage spec: the dtype a batch is written in and the normalization applied on the way.

:class:`Normalize` means ``out = (pixel * scale - mean) / std`` per channel, pixel in 0..255:

* torchvision (``ToTensor()`` / ``ConvertImageDtype(float)`` then ``Normalize(mean, std)``):
  ``Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))`` (``scale=1/255``, the default);
* MXNet (``mean_r/g/b``, ``std_r/g/b``, ``scale`` of ``ImageRecordIter``, which computes
  ``(pixel - mean) * scale / std``): ``Normalize(mean=m, std=s / scale, scale=1.0)``.

The C++ engine writes the result in the final dtype (float32 or float16) and layout straight into
the batch buffer, fused into the resampler's vertical pass (``csrc/decode/output.h``); without a
Normalize a batch is uint8 pixels. :meth:`Normalize.apply` is the reference both backends are
tested against (the Pillow path uses it).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["OUTPUT_DTYPES", "Normalize"]

#: The element types a normalized batch can have.
OUTPUT_DTYPES = ("float32", "float16")


def _triple(value: float | Sequence[float], name: str) -> tuple[float, float, float]:
    given: Any = (value,) * 3 if isinstance(value, numbers.Real) and not isinstance(value, bool) else value
    try:
        items = tuple(float(v) for v in given)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be a number or 3 numbers (one per channel)") from None
    if len(items) != 3 or not all(math.isfinite(v) for v in items):
        raise ValueError(f"{name}={value!r} must be a number or 3 finite numbers (one per channel)")
    return (items[0], items[1], items[2])


@dataclass(frozen=True, kw_only=True)
class Normalize:
    """Per-channel normalization written by the engine in the output dtype.

    Args:
        mean: Per-channel mean, in the units of ``pixel * scale`` (one number for all channels).
        std: Per-channel standard deviation, same units; non-zero.
        scale: Factor applied to the 0..255 pixel first: ``1/255`` (torchvision's ``ToTensor``) by
            default, ``1.0`` for MXNet-style means in 0..255.
        dtype: ``"float32"`` (default) or ``"float16"`` (numpy dtypes accepted).
    """

    mean: float | tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: float | tuple[float, float, float] = (1.0, 1.0, 1.0)
    scale: float = 1.0 / 255.0
    dtype: Any = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", _triple(self.mean, "mean"))
        std = _triple(self.std, "std")
        if any(s == 0.0 for s in std):
            raise ValueError(f"std={self.std!r} must be non-zero")
        object.__setattr__(self, "std", std)
        if (
            isinstance(self.scale, bool)
            or not isinstance(self.scale, numbers.Real)
            or not math.isfinite(self.scale)
            or self.scale == 0
        ):
            raise ValueError(f"scale={self.scale!r} must be a finite non-zero number")
        object.__setattr__(self, "scale", float(self.scale))
        try:
            name = np.dtype(self.dtype).name
        except TypeError:
            name = str(self.dtype)
        if name not in OUTPUT_DTYPES:
            raise ValueError(f"dtype={self.dtype!r} must be one of {OUTPUT_DTYPES} (no Normalize: uint8 pixels)")
        object.__setattr__(self, "dtype", name)

    @property
    def numpy_dtype(self) -> np.dtype:
        """The output dtype as a numpy dtype."""
        return np.dtype(self.dtype)

    def apply(self, image: np.ndarray) -> np.ndarray:
        """The reference: ``(image * scale - mean) / std`` in float32 (then the output dtype).

        Args:
            image: uint8 pixels with channels last (``[..., 3]``).

        Returns:
            The normalized array, same shape, in :attr:`numpy_dtype`.
        """
        x = np.asarray(image, dtype=np.float32) * np.float32(self.scale)
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return x.astype(self.numpy_dtype, copy=False)
