"""MXNet's default augmenter geometry (``src/io/image_aug_default.cc``, MXNet 1.9) as one fused op.

``MXNetDefaultAugment`` takes the geometric parameters of ``mx.io.ImageRecordIter`` with MXNet's names
and defaults and reproduces ``DefaultImageAugmenter::Process``'s chain of OpenCV steps:

1. ``resize``: the shorter side becomes ``resize`` (the longer one by integer division);
2. the affine warp (``max_rotate_angle`` / ``rotate``, ``max_shear_ratio``, ``min/max_random_scale``,
   the aspect ratio range, ``min/max_img_size``): MXNet's 2x3 matrix in float32 arithmetic, the output
   size ``(int(scale * cols), int(scale * rows))``, ``fill_value`` outside, as ``cv::warpAffine``;
3. ``pad`` pixels of ``fill_value`` on every side;
4. the crop: ``random_resized_crop`` (``min/max_random_area``, aspect ratio, up to 10 attempts, a
   random swap of width and height), or ``min/max_crop_size`` (a random square, centred unless
   ``rand_crop``), each resized to ``data_shape``; otherwise the window of ``data_shape`` at the centre
   (or at a random place with ``rand_crop``) without scaling, after scaling images smaller than
   ``data_shape`` up to it;
5. the mirror (``rand_mirror``: probability 0.5; ``mirror``: always), applied by MXNet's iterator.

The windows and sizes are MXNet's, computed with the same integer and float32 arithmetic, so for the
deterministic settings (no random draw) fastload cuts exactly MXNet's windows. MXNet's random stream
cannot be reproduced; each draw comes from fastload's counter-based generator with MXNet's
distribution (counter layout below). The pixels are sampled once from the decoded image through the
composition of all the steps (:mod:`fastload.transforms.warp`) with the kernel of the step that
resamples last (``inter_method``: 0 nearest, 1 bilinear, 2 bicubic, 3 area, 4 Lanczos, 9 MXNet's
size-dependent choice, 10 a random one), instead of MXNet's chain of OpenCV resamplings; where MXNet
resamples once (``resize`` + crop, the affine warp + crop, ``pad`` + crop) the result is MXNet's up to
OpenCV's fixed-point rounding (tolerances measured in ``tests/test_mxnet_augment.py``).

Counters of the sample's stream (all below 64, the geometry's share): 0, 1, 2 the random
``inter_method=10`` choices of the resize, warp and crop steps; 3 shear; 4 angle; 5 scale; 6 aspect
ratio; 7 crop size; 8, 9 the crop's y and x; 10 + 5 * attempt + (0 area, 1 ratio, 2 swap, 3 y, 4 x)
the random-resized-crop attempts; 60 the mirror.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.engine_abi import GeometryKind
from fastload.transforms.rng import uniform, uniform_float32, uniform_int
from fastload.transforms.warp import Affine2, Border, Kernel, WarpPlan, compose

__all__ = ["MXNET_PARAM_NAMES", "MXNetDefaultAugment", "MXNetParams", "MXNetSampleError", "mxnet_plan"]

_F32 = np.float32
_MAX_SIZE = 65535  # JPEG's largest dimension: sizes beyond it are no image
_IDENTITY: Affine2 = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)

# Counter layout (see the module docstring).
_C_INTER = 0  # + step (0 resize, 1 warp, 2 crop)
_C_SHEAR = 3
_C_ANGLE = 4
_C_SCALE = 5
_C_RATIO = 6
_C_CROP_SIZE = 7
_C_CROP_Y = 8
_C_CROP_X = 9
_C_RRC = 10
_RRC_DRAWS = 5
_RRC_ATTEMPTS = 10
_C_MIRROR = 60

_INTER_KERNELS = {0: Kernel.NEAREST, 1: Kernel.LINEAR, 2: Kernel.CUBIC_CV, 3: Kernel.AREA, 4: Kernel.LANCZOS4}


class MXNetSampleError(ValueError):
    """The image cannot take the augmenter's settings (MXNet aborts with a CHECK failure there)."""


def _f32(x) -> np.float32:
    return _F32(x)


def _round_away(x: np.float32) -> int:
    # std::round: halves away from zero.
    return math.floor(float(x) + 0.5) if x >= 0 else -math.floor(-float(x) + 0.5)


@dataclass(frozen=True, kw_only=True)
class MXNetDefaultAugment:
    """MXNet's default augmenter geometry; field names and defaults are ``ImageRecordIter``'s.

    Args:
        data_shape: ``(channels, height, width)`` of the output; channels 1 or 3.
        resize: Scale the shorter side to this before anything else; -1: no resize.
        rand_crop: Random window position instead of the centre.
        random_resized_crop: MXNet's random resized crop (area and aspect ratio ranges below).
        max_rotate_angle: Rotate by a random integer angle in ``[-v, v]`` degrees.
        max_aspect_ratio: Aspect ratio range ``[1 - v, 1 + v]`` (or ``[min_aspect_ratio, v]``).
        min_aspect_ratio: None, or the low end of the aspect ratio range.
        max_shear_ratio: Shear ``(x, y) -> (x + m y, y)`` with ``m`` in ``[-v, v]``.
        max_crop_size: Square crops of a random side in ``[min_crop_size, max_crop_size]``; -1: off.
        min_crop_size: See ``max_crop_size``.
        max_random_scale: Scale the image by ``s`` in ``[min_random_scale, max_random_scale]``.
        min_random_scale: See ``max_random_scale``.
        max_random_area: Area range of the random resized crop.
        min_random_area: See ``max_random_area``.
        max_img_size: Cap on the warped image's width and height.
        min_img_size: Floor on the warped image's width and height.
        rotate: A fixed angle (> 0) that overrides ``max_rotate_angle``; -1: off.
        fill_value: Value of the pixels outside the image (warp and ``pad``).
        inter_method: 0 nearest, 1 bilinear, 2 bicubic, 3 area, 4 Lanczos, 9 auto, 10 random.
        pad: Pixels of ``fill_value`` added on every side before the crop.
        rand_mirror: Mirror left-right with probability 0.5.
        mirror: Always mirror.
    """

    data_shape: tuple[int, int, int]
    resize: int = -1
    rand_crop: bool = False
    random_resized_crop: bool = False
    max_rotate_angle: int = 0
    max_aspect_ratio: float = 0.0
    min_aspect_ratio: float | None = None
    max_shear_ratio: float = 0.0
    max_crop_size: int = -1
    min_crop_size: int = -1
    max_random_scale: float = 1.0
    min_random_scale: float = 1.0
    max_random_area: float = 1.0
    min_random_area: float = 1.0
    max_img_size: float = 1e10
    min_img_size: float = 0.0
    rotate: int = -1
    fill_value: int = 255
    inter_method: int = 1
    pad: int = 0
    rand_mirror: bool = False
    mirror: bool = False

    def __post_init__(self) -> None:
        shape = tuple(self.data_shape) if isinstance(self.data_shape, (tuple, list)) else None
        if shape is None or len(shape) != 3 or not all(isinstance(s, numbers.Integral) and s > 0 for s in shape):
            raise ValueError(f"data_shape={self.data_shape!r} must be (channels, height, width) of positive ints")
        if shape[0] not in (1, 3):
            raise ValueError(f"data_shape={self.data_shape!r}: channels must be 1 or 3")
        object.__setattr__(self, "data_shape", tuple(int(s) for s in shape))
        for name in (
            "resize",
            "max_rotate_angle",
            "max_crop_size",
            "min_crop_size",
            "rotate",
            "fill_value",
            "inter_method",
            "pad",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name}={value!r} must be an int")
            object.__setattr__(self, name, int(value))
        for name in ("rand_crop", "random_resized_crop", "rand_mirror", "mirror"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
                raise ValueError(f"{name}={value!r} must be a bool")
            object.__setattr__(self, name, bool(value))
        for name in (
            "max_aspect_ratio",
            "max_shear_ratio",
            "max_random_scale",
            "min_random_scale",
            "max_random_area",
            "min_random_area",
            "max_img_size",
            "min_img_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name}={value!r} must be a finite number")
            object.__setattr__(self, name, float(value))
        if self.min_aspect_ratio is not None:
            if isinstance(self.min_aspect_ratio, bool) or not isinstance(self.min_aspect_ratio, numbers.Real):
                raise ValueError(f"min_aspect_ratio={self.min_aspect_ratio!r} must be None or a number")
            object.__setattr__(self, "min_aspect_ratio", float(self.min_aspect_ratio))
        self._validate()

    def _validate(self) -> None:
        if self.resize != -1 and not 0 < self.resize <= _MAX_SIZE:
            raise ValueError(f"resize={self.resize} must be -1 (off) or in 1..{_MAX_SIZE}")
        if max(self.data_shape[1:]) > 16384:
            raise ValueError(f"data_shape={self.data_shape}: height and width must be at most 16384")
        for name in ("pad", "max_crop_size", "min_crop_size"):
            if getattr(self, name) > _MAX_SIZE:
                raise ValueError(f"{name}={getattr(self, name)} must be at most {_MAX_SIZE}")
        if self.inter_method not in (0, 1, 2, 3, 4, 9, 10):
            raise ValueError(
                f"inter_method={self.inter_method} must be one of 0, 1, 2, 3, 4, 9, 10 "
                "(nearest, bilinear, bicubic, area, lanczos4, auto, random)"
            )
        if self.max_rotate_angle < 0:
            raise ValueError(f"max_rotate_angle={self.max_rotate_angle} must be >= 0")
        if self.max_shear_ratio < 0:
            raise ValueError(f"max_shear_ratio={self.max_shear_ratio} must be >= 0")
        if self.pad < 0:
            raise ValueError(f"pad={self.pad} must be >= 0")
        if not 0 <= self.fill_value <= 255:
            raise ValueError(f"fill_value={self.fill_value} must be a pixel value in 0..255")
        if self.min_random_scale <= 0 or self.min_random_scale > self.max_random_scale:
            raise ValueError(
                f"min_random_scale={self.min_random_scale}, max_random_scale={self.max_random_scale}: "
                "need 0 < min <= max"
            )
        lo, hi = self.aspect_range
        if lo <= 0 or lo > hi:
            raise ValueError(
                f"aspect ratio range [{lo}, {hi}] (min_aspect_ratio={self.min_aspect_ratio}, "
                f"max_aspect_ratio={self.max_aspect_ratio}) must satisfy 0 < min <= max"
            )
        if self.has_warp and self.inter_method == 0:
            # MXNet CHECKs this before cv::warpAffine.
            raise ValueError(
                "inter_method=0 (nearest) cannot be used with the affine warp "
                "(rotation, shear, random scale or aspect ratio): MXNet accepts 1, 2, 3, 4, 9, 10 there"
            )
        if self.min_img_size > self.max_img_size:
            raise ValueError(f"min_img_size={self.min_img_size} must be <= max_img_size={self.max_img_size}")
        crop_set = self.max_crop_size != -1 or self.min_crop_size != -1
        if self.random_resized_crop:
            if self.min_random_scale != 1.0 or self.max_random_scale != 1.0 or crop_set or self.rand_crop:
                raise ValueError(
                    "random_resized_crop=True conflicts with min_random_scale, max_random_scale, "
                    "min_crop_size, max_crop_size and rand_crop (MXNet refuses the combination)"
                )
            if not 0 < self.min_random_area <= self.max_random_area:
                raise ValueError(
                    f"min_random_area={self.min_random_area}, max_random_area={self.max_random_area}: "
                    "need 0 < min <= max"
                )
        elif crop_set and not 1 <= self.min_crop_size <= self.max_crop_size:
            raise ValueError(
                f"min_crop_size={self.min_crop_size}, max_crop_size={self.max_crop_size}: set both, "
                "with 1 <= min <= max"
            )

    @property
    def size(self) -> tuple[int, int]:
        """Output ``(height, width)``."""
        return (self.data_shape[1], self.data_shape[2])

    @property
    def kind(self) -> GeometryKind:
        """The geometry kind the engine dispatches on."""
        return GeometryKind.MXNET_AUGMENT

    @property
    def aspect_range(self) -> tuple[float, float]:
        """``(min, max)`` aspect ratio as MXNet computes it (float32)."""
        if self.min_aspect_ratio is not None:
            return float(_f32(self.min_aspect_ratio)), float(_f32(self.max_aspect_ratio))
        m = _f32(self.max_aspect_ratio)
        return float(_F32(1.0) - m), float(_F32(1.0) + m)

    def engine_fields(self) -> dict[str, Any]:
        """The augmenter as the engine's ``MXNetAugmentSpec`` fields (fastload/engine_abi.py)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        _channels, fields["out_h"], fields["out_w"] = fields.pop("data_shape")
        min_aspect_ratio = fields.pop("min_aspect_ratio")
        if min_aspect_ratio is not None:
            fields.update(has_min_aspect_ratio=True, min_aspect_ratio=min_aspect_ratio)
        return fields

    @property
    def has_warp(self) -> bool:
        """Whether MXNet runs its affine warp step (the condition of ``image_aug_default.cc``)."""
        lo, hi = self.aspect_range
        return (
            self.max_rotate_angle > 0
            or self.max_shear_ratio > 0.0
            or self.rotate > 0
            or _f32(self.max_random_scale) != _F32(1.0)
            or _f32(self.min_random_scale) != 1.0
            or (not self.random_resized_crop and (lo != 1.0 or hi != 1.0))
            or _f32(self.max_img_size) != _F32(1e10)
            or _f32(self.min_img_size) != _F32(0.0)
        )


#: Names of the values :class:`MXNetParams` reports, in ``as_tuple`` order.
MXNET_PARAM_NAMES = (
    "resized_w",
    "resized_h",
    "angle",
    "shear",
    "scale",
    "ratio",
    "warped_w",
    "warped_h",
    "crop_x",
    "crop_y",
    "crop_w",
    "crop_h",
    "scaled_w",
    "scaled_h",
    "mirror",
    "inter_resize",
    "inter_warp",
    "inter_crop",
)


@dataclass(frozen=True)
class MXNetParams:
    """What MXNet's augmenter did to one sample (-1 where a step did not run).

    Attributes:
        resized_w: Width after the ``resize`` step (the source width when it did not run).
        resized_h: Height after the ``resize`` step.
        angle: Rotation in degrees (0 without the warp).
        shear: Shear ratio.
        scale: Random scale.
        ratio: Aspect ratio of the warp.
        warped_w: Width after the warp (``resized_w`` without it).
        warped_h: Height after the warp.
        crop_x: Left of the crop window in the padded image (after ``scaled_w`` scaling, for the
            centre window of a small image).
        crop_y: Top of the crop window.
        crop_w: Window width (resized to the output when it differs).
        crop_h: Window height.
        scaled_w: Width the padded image was scaled to before the centre window (small images;
            the padded width otherwise).
        scaled_h: Height likewise.
        mirror: The output is mirrored.
        inter_resize: OpenCV interpolation of the resize step (-1: no resize).
        inter_warp: Interpolation of the warp (-1: no warp).
        inter_crop: Interpolation of the crop / scaling step.
    """

    resized_w: int
    resized_h: int
    angle: int
    shear: float
    scale: float
    ratio: float
    warped_w: int
    warped_h: int
    crop_x: int
    crop_y: int
    crop_w: int
    crop_h: int
    scaled_w: int
    scaled_h: int
    mirror: bool
    inter_resize: int
    inter_warp: int
    inter_crop: int

    def as_tuple(self) -> tuple:
        """The values in :data:`MXNET_PARAM_NAMES` order (floats; what ``want_params`` reports)."""
        return tuple(float(getattr(self, name)) for name in MXNET_PARAM_NAMES)


def _inter(aug: MXNetDefaultAugment, old_w: int, old_h: int, new_w: int, new_h: int, key: int, step: int) -> int:
    # DefaultImageAugmenter::GetInterMethod.
    if aug.inter_method == 9:
        if new_w > old_w and new_h > old_h:
            return 2
        if new_w < old_w and new_h < old_h:
            return 3
        return 1
    if aug.inter_method == 10:
        return uniform_int(key, _C_INTER + step, 0, 4)
    return aug.inter_method


def _window_origin(aug: MXNetDefaultAugment, key: int, spare_x: int, spare_y: int) -> tuple[int, int]:
    """``(x, y)`` of a window with ``spare_x``, ``spare_y`` pixels of room around it.

    Drawn with ``rand_crop`` (y first, as MXNet), else centred with MXNet's floor division.
    """
    if aug.rand_crop:
        y = uniform_int(key, _C_CROP_Y, 0, spare_y)
        return uniform_int(key, _C_CROP_X, 0, spare_x), y
    return spare_x // 2, spare_y // 2


def _resize_map(src_w: int, src_h: int, dst_w: int, dst_h: int) -> Affine2:
    # cv::resize: src = (dst + 0.5) * scale - 0.5 in OpenCV's centred coordinates, i.e. src = dst * scale
    # in Pillow's; the scale is 1 / (dst / src), computed as OpenCV does.
    return (1.0 / (dst_w / src_w), 0.0, 0.0, 0.0, 1.0 / (dst_h / src_h), 0.0)


def _invert_affine(m) -> tuple[float, ...]:
    # cv::invertAffineTransform in double, on MXNet's float32 matrix.
    m00, m01, m02, m10, m11, m12 = (float(v) for v in m)
    d = m00 * m11 - m01 * m10
    d = 1.0 / d if d != 0.0 else 0.0
    a11, a22, a12, a21 = m11 * d, m00 * d, -m01 * d, -m10 * d
    b1 = -a11 * m02 - a12 * m12
    b2 = -a21 * m02 - a22 * m12
    return (a11, a12, b1, a21, a22, b2)


def mxnet_plan(aug: MXNetDefaultAugment, width: int, height: int, key: int) -> tuple[WarpPlan, MXNetParams]:
    """The one-pass plan of MXNet's augmenter chain for one ``width`` x ``height`` image.

    Args:
        aug: The augmenter settings.
        width: Source width.
        height: Source height.
        key: The sample's stream (:func:`fastload.transforms.sample_key`).

    Returns:
        The plan (full-resolution source) and what the augmenter did.

    Raises:
        MXNetSampleError: The image is smaller than ``max_crop_size`` (MXNet aborts there).
    """
    dh, dw = aug.size
    cols, rows = int(width), int(height)
    to_warped: Affine2 = _IDENTITY  # warped-image point -> source point (Pillow coordinates)
    inter_resize = inter_warp = -1
    if aug.resize != -1:
        if rows > cols:
            new_h, new_w = aug.resize * rows // cols, aug.resize
        else:
            new_h, new_w = aug.resize, aug.resize * cols // rows
        inter_resize = _inter(aug, cols, rows, new_w, new_h, key, 0)
        to_warped = _resize_map(cols, rows, new_w, new_h)
        cols, rows = new_w, new_h
    resized_w, resized_h = cols, rows

    angle, shear, scale, ratio = 0, 0.0, 1.0, 1.0
    if aug.has_warp:
        max_shear = _f32(aug.max_shear_ratio)
        s = uniform_float32(key, _C_SHEAR) * max_shear * _F32(2) - max_shear
        angle = uniform_int(key, _C_ANGLE, -aug.max_rotate_angle, aug.max_rotate_angle)
        if aug.rotate > 0:
            angle = aug.rotate
        a = _f32(math.cos(angle / 180.0 * math.pi))
        b = _f32(math.sin(angle / 180.0 * math.pi))
        sc = _F32(1.0)
        rt = _F32(1.0)
        if not aug.random_resized_crop:
            sc = uniform_float32(key, _C_SCALE) * (_f32(aug.max_random_scale) - _f32(aug.min_random_scale)) + _f32(
                aug.min_random_scale
            )
            lo, hi = (_f32(v) for v in aug.aspect_range)
            rt = uniform_float32(key, _C_RATIO) * (hi - lo) + lo
        hs = _F32(2) * sc / (_F32(1) + rt)
        ws = rt * hs
        new_width = max(_f32(aug.min_img_size), min(_f32(aug.max_img_size), sc * _F32(cols)))
        new_height = max(_f32(aug.min_img_size), min(_f32(aug.max_img_size), sc * _F32(rows)))
        m00 = hs * a - s * b * ws
        m10 = -b * ws
        m01 = hs * b + s * a * ws
        m11 = a * ws
        ori_w = m00 * _F32(cols) + m01 * _F32(rows)
        ori_h = m10 * _F32(cols) + m11 * _F32(rows)
        m02 = (new_width - ori_w) / _F32(2)
        m12 = (new_height - ori_h) / _F32(2)
        if not (1.0 <= new_width < 65536.0 and 1.0 <= new_height < 65536.0):
            raise MXNetSampleError(
                f"the affine warp makes the {cols}x{rows} image {float(new_width):f}x"
                f"{float(new_height):f} (sizes must be in 1..65535)"
            )
        warped_w, warped_h = int(new_width), int(new_height)
        inter_warp = _inter(aug, cols, rows, warped_w, warped_h, key, 1)
        # Inverse warp in OpenCV's centred coordinates -> Pillow's: p_src = A (p - 0.5) + b + 0.5.
        i00, i01, ib0, i10, i11, ib1 = _invert_affine((m00, m01, m02, m10, m11, m12))
        inv = (i00, i01, ib0 - 0.5 * (i00 + i01) + 0.5, i10, i11, ib1 - 0.5 * (i10 + i11) + 0.5)
        to_warped = compose(to_warped, inv)
        shear, scale, ratio = float(s), float(sc), float(rt)
        cols, rows = warped_w, warped_h
    warped_w, warped_h = cols, rows

    p = aug.pad
    cols, rows = cols + 2 * p, rows + 2 * p
    # Output point -> padded-image point, built below; the frame test happens in warped coordinates.
    to_padded: Affine2 | None = None
    crop = (0, 0, 0, 0)
    scaled_w, scaled_h = cols, rows
    inter_crop = -1
    resampled = False  # the crop step resizes (its kernel is the last resampling of the chain)
    if aug.random_resized_crop:
        lo_a, hi_a = _f32(aug.min_random_area), _f32(aug.max_random_area)
        lo_r, hi_r = (_f32(v) for v in aug.aspect_range)
        if hi_a != 1.0 or lo_a != 1.0 or hi_r != 1.0 or lo_r != 1.0:
            area = _F32(rows * cols)
            for attempt in range(_RRC_ATTEMPTS):
                c = _C_RRC + _RRC_DRAWS * attempt
                rand_area = uniform_float32(key, c) * (hi_a - lo_a) + lo_a
                r = uniform_float32(key, c + 1) * (hi_r - lo_r) + lo_r
                target = area * rand_area
                y_area = _round_away(np.sqrt(target / r, dtype=_F32))
                x_area = _round_away(np.sqrt(target * r, dtype=_F32))
                if uniform_float32(key, c + 2) > _F32(0.5):
                    x_area, y_area = y_area, x_area
                if 1 <= y_area <= rows and 1 <= x_area <= cols:
                    y = uniform_int(key, c + 3, 0, rows - y_area)
                    x = uniform_int(key, c + 4, 0, cols - x_area)
                    crop = (x, y, x_area, y_area)
                    inter_crop = _inter(aug, x_area, y_area, dw, dh, key, 2)
                    resampled = True
                    break
    elif aug.max_crop_size != -1 or aug.min_crop_size != -1:
        if cols < aug.max_crop_size or rows < aug.max_crop_size:
            raise MXNetSampleError(
                f"the image is {cols}x{rows} after resize, warp and pad, smaller than max_crop_size={aug.max_crop_size}"
            )
        size = uniform_int(key, _C_CROP_SIZE, aug.min_crop_size, aug.max_crop_size)
        x, y = _window_origin(aug, key, cols - size, rows - size)
        crop = (x, y, size, size)
        inter_crop = _inter(aug, size, size, dw, dh, key, 2)
        resampled = True
    if crop[2] > 0:
        x, y, w, h = crop
        to_padded = (1.0 / (dw / w), 0.0, float(x), 0.0, 1.0 / (dh / h), float(y))
    else:
        inter_crop = _inter(aug, cols, rows, dw, dh, key, 2)
        to_padded = _IDENTITY
        if rows < dh:
            new_cols = int(_f32(dh) / _f32(rows) * _f32(cols))
            to_padded = compose(to_padded, _resize_map(cols, rows, new_cols, dh))
            cols, rows = new_cols, dh
            resampled = True
        if cols < dw:
            new_rows = int(_f32(dw) / _f32(cols) * _f32(rows))
            to_padded = compose(to_padded, _resize_map(cols, rows, dw, new_rows))
            cols, rows = dw, new_rows
            resampled = True
        if cols < dw or rows < dh:
            raise MXNetSampleError(f"the image is {cols}x{rows} after scaling, smaller than data_shape {dw}x{dh}")
        scaled_w, scaled_h = cols, rows
        x, y = _window_origin(aug, key, cols - dw, rows - dh)
        crop = (x, y, dw, dh)
        to_padded = compose(to_padded, (1.0, 0.0, float(x), 0.0, 1.0, float(y)))

    mirror = (aug.rand_mirror and uniform(key, _C_MIRROR) < 0.5) or aug.mirror
    to_frame = compose((1.0, 0.0, -float(p), 0.0, 1.0, -float(p)), to_padded)
    if mirror:
        to_frame = compose(to_frame, (-1.0, 0.0, float(dw), 0.0, 1.0, 0.0))

    # The kernel of the step that resamples last: the crop's resize, else the warp, else the resize.
    if resampled:
        method = inter_crop
    elif inter_warp != -1:
        method = inter_warp
    elif inter_resize != -1:
        method = inter_resize
    else:
        method = 1  # a plain window copy: the sampling points are pixel centres
    warp_last = inter_warp != -1 and not resampled
    if warp_last and method == 3:
        method = 1  # cv::warpAffine has no area mode: OpenCV uses bilinear
    composite = compose(to_warped, to_frame)
    sx, sy = abs(composite[0]) + abs(composite[1]), abs(composite[3]) + abs(composite[4])
    kernel = _INTER_KERNELS[method]
    # OpenCV's resize picks the nearest pixel of the footprint's left edge; warpAffine rounds the
    # mapped centre. No DCT-domain downscaling (csrc/warp/mxnet_augment.cpp says why).
    shift = (0.0, 0.0) if warp_last else (-sx / 2.0, -sy / 2.0)
    border = Border.CONSTANT if (inter_warp != -1 or p > 0) else Border.REPLICATE
    plan = WarpPlan(
        out_h=dh,
        out_w=dw,
        to_frame=to_frame,
        frame=(0.0, 0.0, float(warped_w), float(warped_h)),
        snap=False,
        to_source=to_warped,
        scale=(sx, sy),
        kernel=kernel,
        antialias=False,
        nearest_shift=shift,
        border=border,
        fill=(aug.fill_value,) * 3,
        dct_scaling=False,
        quantize=warp_last and aug.resize == -1,
    )
    params = MXNetParams(
        resized_w=resized_w,
        resized_h=resized_h,
        angle=int(angle),
        shear=shear,
        scale=scale,
        ratio=ratio,
        warped_w=warped_w,
        warped_h=warped_h,
        crop_x=crop[0],
        crop_y=crop[1],
        crop_w=crop[2],
        crop_h=crop[3],
        scaled_w=scaled_w,
        scaled_h=scaled_h,
        mirror=bool(mirror),
        inter_resize=inter_resize,
        inter_warp=inter_warp,
        inter_crop=inter_crop,
    )
    return plan, params
