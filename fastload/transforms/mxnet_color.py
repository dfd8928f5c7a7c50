"""MXNet's colour augmentation (ImageRecordIter's default augmenter), on the output-sized image.

MXNet 1.9's ``src/io/image_aug_default.cc`` runs, after the crop, on OpenCV's BGR ``cv::Mat``:

1. colour jitter when any of ``brightness`` / ``contrast`` / ``saturation`` is set: factors
   ``1 + U(-v, v)``, applied in a random order: brightness ``convertTo(alpha)``; contrast
   ``convertTo(alpha, (1 - alpha) * mean(gray))``; saturation ``addWeighted(img, alpha, gray, 1 - alpha)``.
   The gray image comes from ``cvtColor(CV_RGB2GRAY)`` on the BGR buffer, so its weights are swapped
   (0.299 on blue, 0.114 on red): kept here, as MXNet users train with it;
2. HSL jitter when any of ``random_h`` / ``random_s`` / ``random_l`` is set: OpenCV's 8-bit HLS
   (H in [0, 180]), each channel shifted by ``int(((u + 4 u') / 5) * 2 v - v)`` and clipped;
3. PCA noise when ``pca_noise > 0``: alphas ``~ N(0, pca_noise)`` mixed through MXNet's
   eigenvectors-times-eigenvalues table, added to each channel with C's truncation, clipped.

Then, in the iterator's normalization (float outputs only): ``out * c + l * scale / std`` with
``c ~ U(1 - max_random_contrast, 1 + max_random_contrast)`` and ``l ~ U(-max_random_illumination,
max_random_illumination)`` (:func:`fastload.transforms.erasing.apply_output_ops`, the engine's
``apply_erasing``).

The arithmetic is OpenCV 3.4's (the version MXNet 1.9.1 bundles): float32 ``x * a + b`` rounded half to
even and saturated; 14-bit fixed-point gray (4899, 9617, 1868); the float HLS conversion of its scalar
code. The reference below is numpy float32 step for step; the engine (``csrc/pixel/pixel_color.cpp``) gives
the same bytes. MXNet's own random generator (mt19937, per-thread streams) cannot be reproduced, so
the draws come from fastload's counters (:mod:`fastload.transforms.pixel`): the distributions are
MXNet's, the individual samples are not.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.transforms.pixel import PixelOp
from fastload.transforms.rng import normal, permutation, uniform

__all__ = ["MXNetColorAugment", "mx_gray", "mx_hls_to_rgb", "mx_rgb_to_hls"]

f32 = np.float32
_FLT_EPSILON = f32(np.finfo(np.float32).eps)
# MXNet's eigval * eigvec table (rows R, G, B), products in float32 as its initializer computes them.
_EIGVAL = (f32(55.46), f32(4.794), f32(1.148))
_EIGVEC = (
    (f32(-0.5675), f32(0.7192), f32(0.4009)),
    (f32(-0.5808), f32(-0.0045), f32(-0.8140)),
    (f32(-0.5836), f32(-0.6948), f32(0.4203)),
)
_PCA = tuple(tuple(f32(_EIGVAL[j] * _EIGVEC[i][j]) for j in range(3)) for i in range(3))


def _saturate_u8(x: np.ndarray) -> np.ndarray:
    """OpenCV's ``saturate_cast<uchar>(float)``: round half to even, clip to [0, 255]."""
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def mx_gray(image: np.ndarray) -> np.ndarray:
    """``cvtColor(CV_RGB2GRAY)`` of MXNet's BGR buffer, from an RGB image (blue gets the red weight)."""
    i = image.astype(np.int32)
    return ((i[..., 2] * 4899 + i[..., 1] * 9617 + i[..., 0] * 1868 + (1 << 13)) >> 14).astype(np.uint8)


def _convert(image: np.ndarray, alpha: np.float32, beta: np.float32) -> np.ndarray:
    # cv::Mat::convertTo(dst, -1, alpha, beta) on 8-bit data.
    return _saturate_u8(image.astype(f32) * f32(alpha) + f32(beta))


def mx_rgb_to_hls(image: np.ndarray) -> np.ndarray:
    """OpenCV's 8-bit BGR2HLS of the image's true colours: ``[..., (H, L, S)]``, H in [0, 180]."""
    x = image.astype(f32) * f32(1.0 / 255.0)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    vmax = np.maximum(np.maximum(r, g), b)
    vmin = np.minimum(np.minimum(r, g), b)
    diff = vmax - vmin
    light = (vmax + vmin) * f32(0.5)
    colourful = diff > _FLT_EPSILON
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(light < f32(0.5), diff / (vmax + vmin), diff / ((f32(2) - vmax) - vmin))
        d = f32(60.0) / diff
        h = np.where(vmax == r, (g - b) * d, np.where(vmax == g, (b - r) * d + f32(120), (r - g) * d + f32(240)))
    h = np.where(h < 0, h + f32(360), h)
    h = np.where(colourful, h, f32(0)).astype(f32)
    s = np.where(colourful, s, f32(0)).astype(f32)
    out = np.empty(image.shape, np.uint8)
    out[..., 0] = _saturate_u8(h * f32(0.5))
    out[..., 1] = _saturate_u8(light * f32(255))
    out[..., 2] = _saturate_u8(s * f32(255))
    return out


# (b, g, r) tab indices per sector, from OpenCV's HLS2RGB.
_SECTORS = np.array([[1, 3, 0], [1, 0, 2], [3, 0, 1], [0, 2, 1], [0, 1, 3], [2, 1, 0]])


def mx_hls_to_rgb(hls: np.ndarray) -> np.ndarray:
    """OpenCV's 8-bit HLS2BGR, returned as RGB."""
    h = hls[..., 0].astype(f32)
    light = hls[..., 1].astype(f32) * f32(1.0 / 255.0)
    s = hls[..., 2].astype(f32) * f32(1.0 / 255.0)
    p2 = np.where(light <= f32(0.5), light * (f32(1) + s), (light + s) - light * s).astype(f32)
    p1 = (f32(2) * light - p2).astype(f32)
    h = (h * f32(6.0 / 180.0)).astype(f32)
    h = np.where(h >= f32(6), h - f32(6), h).astype(f32)  # H <= 180 needs at most one wrap
    sector = np.floor(h).astype(np.int64)
    frac = (h - sector.astype(f32)).astype(f32)
    tab = np.stack([p2, p1, p1 + (p2 - p1) * (f32(1) - frac), p1 + (p2 - p1) * frac], axis=-1).astype(f32)
    idx = _SECTORS[np.clip(sector, 0, 5)]
    bgr = np.take_along_axis(tab, idx, axis=-1)
    grey = (s == 0)[..., None]
    bgr = np.where(grey, light[..., None], bgr)
    out = _saturate_u8(bgr * f32(255))
    return out[..., ::-1].copy()


def _nonneg(value: Any, name: str, kind=numbers.Real) -> Any:
    if (
        isinstance(value, bool)
        or not isinstance(value, kind)
        or not value >= 0
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        raise ValueError(f"{name}={value!r} must be a finite number >= 0")
    return value


@dataclass(frozen=True, kw_only=True)
class MXNetColorAugment(PixelOp):
    """MXNet ImageRecordIter's colour augmentation, with its parameter names and defaults.

    Args:
        brightness: Brightness factor jitter ``1 + U(-brightness, brightness)``.
        contrast: Contrast factor jitter.
        saturation: Saturation factor jitter.
        pca_noise: Standard deviation of the PCA lighting alphas.
        random_h: Max shift of the HLS hue (OpenCV units, [0, 180]).
        random_s: Max shift of the HLS saturation ([0, 255]).
        random_l: Max shift of the HLS lightness ([0, 255]).
        max_random_contrast: Contrast jitter of the normalization (float outputs).
        max_random_illumination: Illumination jitter of the normalization, in pixel units times
            ``scale / std`` (float outputs).
    """

    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    pca_noise: float = 0.0
    random_h: int = 0
    random_s: int = 0
    random_l: int = 0
    max_random_contrast: float = 0.0
    max_random_illumination: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "brightness",
            "contrast",
            "saturation",
            "pca_noise",
            "max_random_contrast",
            "max_random_illumination",
        ):
            object.__setattr__(self, name, float(_nonneg(getattr(self, name), name)))
        for name in ("random_h", "random_s", "random_l"):
            object.__setattr__(self, name, int(_nonneg(getattr(self, name), name, numbers.Integral)))

    @property
    def has_jitter(self) -> bool:
        return self.brightness > 0 or self.contrast > 0 or self.saturation > 0

    @property
    def has_hsl(self) -> bool:
        return self.random_h != 0 or self.random_s != 0 or self.random_l != 0

    @property
    def has_output_jitter(self) -> bool:
        return self.max_random_contrast > 0 or self.max_random_illumination > 0

    def sample(self, key: int, base: int, height: int, width: int) -> dict[str, Any]:
        out: dict[str, Any] = {"alpha": None, "order": None, "hls": None, "pca": None}
        if self.has_jitter:
            out["alpha"] = [
                float(f32(1.0 + (2.0 * uniform(key, base + i) - 1.0) * v))
                for i, v in enumerate((self.brightness, self.contrast, self.saturation))
            ]
            out["order"] = permutation(key, base + 3, 3)
        if self.has_hsl:
            shifts = []
            for i, v in enumerate((self.random_h, self.random_s, self.random_l)):
                r = (f32(uniform(key, base + 5 + 2 * i)) + f32(4) * f32(uniform(key, base + 6 + 2 * i))) / f32(5)
                shifts.append(int(f32(f32(r * f32(v) * f32(2)) - f32(v))))
            out["hls"] = shifts  # (h, s, l)
        if self.pca_noise > 0:
            a = [f32(self.pca_noise * normal(key, base + 11 + 2 * j)) for j in range(3)]
            out["pca"] = [float(f32(f32(f32(row[0] * a[0]) + f32(row[1] * a[1])) + f32(row[2] * a[2]))) for row in _PCA]
        return out

    def apply_params(self, image: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        img = np.ascontiguousarray(image)
        if params["alpha"] is not None:
            ab, ac, as_ = (f32(a) for a in params["alpha"])
            for step in params["order"]:
                if step == 0:
                    img = _convert(img, ab, f32(0))
                elif step == 1:
                    gray_mean = f32(mx_gray(img).astype(np.float64).mean())
                    img = _convert(img, ac, f32((f32(1) - ac) * gray_mean))
                else:
                    gray = mx_gray(img).astype(f32)[..., None]
                    img = _saturate_u8(img.astype(f32) * as_ + gray * f32(f32(1) - as_))
        if params["hls"] is not None:
            dh, ds, dl = params["hls"]
            hls = mx_rgb_to_hls(img).astype(np.int32)
            hls[..., 0] = np.clip(hls[..., 0] + dh, 0, 180)
            hls[..., 1] = np.clip(hls[..., 1] + dl, 0, 255)
            hls[..., 2] = np.clip(hls[..., 2] + ds, 0, 255)
            img = mx_hls_to_rgb(hls.astype(np.uint8))
        if params["pca"] is not None:
            work = img.astype(f32) + np.asarray(params["pca"], f32)
            img = np.clip(np.trunc(work), 0, 255).astype(np.uint8)
        return img

    def output_jitter(self, key: int, base: int) -> tuple[float, float]:
        """The normalization's (contrast, illumination) for one sample (MXNet: float outputs only)."""
        c = 2.0 * uniform(key, base + 17) - 1.0
        illum = 2.0 * uniform(key, base + 18) - 1.0
        return (float(f32(1.0 + c * self.max_random_contrast)), float(f32(illum * self.max_random_illumination)))

    @staticmethod
    def illumination_scale(normalize: Any) -> tuple[float, float, float]:
        """Per-channel ``scale / std`` of the Pipeline's Normalize (1 without one)."""
        if normalize is None:
            return (1.0, 1.0, 1.0)
        scale = float(getattr(normalize, "scale", 1.0))
        std = getattr(normalize, "std", (1.0, 1.0, 1.0))
        std = tuple(std) * 3 if len(tuple(std)) == 1 else tuple(std)
        return (scale / float(std[0]), scale / float(std[1]), scale / float(std[2]))

    def trace(self, params: dict[str, Any]) -> np.ndarray:
        out = np.full(64, np.nan)
        if params["alpha"] is not None:
            out[0:3] = params["alpha"]
            out[3:6] = params["order"]
        if params["hls"] is not None:
            out[6:9] = params["hls"]
        if params["pca"] is not None:
            out[9:12] = params["pca"]
        return out

    def engine_fields(self, height: int, width: int) -> dict[str, Any]:
        return {
            "kind": "MXNET_COLOR",
            "mx_brightness": self.brightness,
            "mx_contrast": self.contrast,
            "mx_saturation": self.saturation,
            "mx_pca_noise": self.pca_noise,
            "random_h": self.random_h,
            "random_s": self.random_s,
            "random_l": self.random_l,
        }

    def params_from_trace(self, values: Sequence[float]) -> dict[str, Any]:
        v = list(values)
        return {
            "alpha": None if math.isnan(v[0]) else [float(x) for x in v[0:3]],
            "order": None if math.isnan(v[3]) else [int(x) for x in v[3:6]],
            "hls": None if math.isnan(v[6]) else [int(x) for x in v[6:9]],
            "pca": None if math.isnan(v[9]) else [float(x) for x in v[9:12]],
        }
