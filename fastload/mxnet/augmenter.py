"""Device stage (MXNet): what ``ImageRecordIter``'s augmenter and normalizer arguments become in fastload's specs.

MXNet runs, per image: its default augmenter (``src/io/image_aug_default.cc``: resize, affine warp,
pad, crop, then colour jitter, HSL jitter and PCA noise), then the normalizer
(``iter_image_recordio_2.cc``: mirror, ``(pixel - mean) * (1 + c) * scale / std + i * scale / std``
with a random contrast ``c`` and illumination ``i``). fastload runs the same chain inside its engine,
as the transform specs of :mod:`fastload.transforms`:

- geometry -> ``MXNetDefaultAugment(data_shape=..., <every geometric argument under MXNet's name>)``,
  mirror included;
- colour -> ``MXNetColorAugment(brightness, contrast, saturation, pca_noise, random_h, random_s,
  random_l, max_random_contrast, max_random_illumination)`` (the last two only for float outputs:
  MXNet applies them in its float normalizer only);
- normalization -> ``Normalize(mean=(mean_r, mean_g, mean_b), std=(std_r / scale, ...), scale=1,
  dtype)``, i.e. ``(pixel - mean) * scale / std``, for float outputs of 3 channels without
  ``mean_img`` (the mean image, grayscale and int8 outputs stay in the adapter:
  :mod:`fastload.mxnet.image_iter`).

Each spec class is looked up in :mod:`fastload.transforms` when the iterator is built; an argument
is passed under MXNet's name when the class declares a field of that name. When a class is missing
from this build, its arguments keep working at MXNet's defaults and any other value raises
:class:`~fastload.mxnet.arguments.MXNetArgumentError` saying it is not supported yet; the geometry
then falls back to the ops fastload has always had (:func:`fallback_geometry`: a torchvision-style
random resized crop, a resize + centre crop, the flips), which do not cut MXNet's exact windows
(one :class:`FallbackGeometryWarning` says so).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import fastload.transforms as transforms
from fastload.mxnet.arguments import MXNetArgumentError, RecordIterArgs

__all__ = [
    "COLOR_ARGS",
    "FLOAT_ONLY_COLOR_ARGS",
    "GEOMETRY_ARGS",
    "FallbackGeometryWarning",
    "aug_seed",
    "color_spec",
    "fallback_geometry",
    "geometry_spec",
    "normalize_spec",
    "spec_class",
]

#: MXNet's geometric arguments (default augmenter + the normalizer's mirror), MXNetDefaultAugment's fields.
GEOMETRY_ARGS = (
    "resize",
    "rand_crop",
    "random_resized_crop",
    "max_rotate_angle",
    "max_aspect_ratio",
    "min_aspect_ratio",
    "max_shear_ratio",
    "max_crop_size",
    "min_crop_size",
    "max_random_scale",
    "min_random_scale",
    "max_random_area",
    "min_random_area",
    "max_img_size",
    "min_img_size",
    "rotate",
    "rotate_list",
    "fill_value",
    "inter_method",
    "pad",
    "rand_mirror",
    "mirror",
)
#: MXNet's colour arguments, MXNetColorAugment's fields.
COLOR_ARGS = (
    "brightness",
    "contrast",
    "saturation",
    "pca_noise",
    "random_h",
    "random_s",
    "random_l",
    "max_random_contrast",
    "max_random_illumination",
)
#: Applied by MXNet's float normalizer only (ignored for uint8 and int8 outputs, as MXNet does).
FLOAT_ONLY_COLOR_ARGS = ("max_random_contrast", "max_random_illumination")


class FallbackGeometryWarning(UserWarning):
    """The geometry runs on fastload's generic crop ops, whose windows differ from MXNet's augmenter."""


def spec_class(name: str) -> type | None:
    """The spec class ``fastload.transforms.<name>`` when this build has it, else None."""
    cls = getattr(transforms, name, None)
    return cls if isinstance(cls, type) else None


def _fields(cls: type) -> frozenset:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def _not_supported(args: dict[str, Any], what: str) -> MXNetArgumentError:
    detail = ", ".join(f"{k}={v!r}" for k, v in sorted(args.items()))
    return MXNetArgumentError(
        f"ImageRecordIter argument(s) {detail}: not yet supported by this fastload build "
        f"({what}); only MXNet's default value is accepted"
    )


def _build(cls: type, kwargs: dict[str, Any]) -> Any:
    try:
        return cls(**kwargs)
    except MXNetArgumentError:
        raise
    except (TypeError, ValueError) as exc:
        raise MXNetArgumentError(f"ImageRecordIter: {exc}") from exc


def geometry_spec(args: RecordIterArgs) -> Any:
    """The geometry op for ``args``: ``MXNetDefaultAugment`` when this build has it, else the fallback.

    Raises:
        MXNetArgumentError: An argument the available op cannot take.
    """
    cls = spec_class("MXNetDefaultAugment")
    if cls is None:
        return fallback_geometry(args)
    fields = _fields(cls)
    missing = {n: args[n] for n in GEOMETRY_ARGS if n not in fields and not args.is_default(n)}
    if missing:
        raise _not_supported(missing, f"{cls.__name__} has no such field")
    kwargs = {n: args[n] for n in GEOMETRY_ARGS if n in fields}
    kwargs["data_shape"] = tuple(args.data_shape)
    return _build(cls, kwargs)


# The fallback ops cannot express these at anything but MXNet's default: the affine warp (rotation,
# shear, random scale, image size bounds), the square crops, padding and other resampling kernels.
_FALLBACK_UNSUPPORTED = (
    "max_rotate_angle",
    "rotate",
    "rotate_list",
    "max_shear_ratio",
    "max_crop_size",
    "min_crop_size",
    "max_random_scale",
    "min_random_scale",
    "max_img_size",
    "min_img_size",
    "pad",
    "inter_method",
)


def fallback_geometry(args: RecordIterArgs) -> Any:
    """The geometry on fastload's generic ops, for builds without ``MXNetDefaultAugment``.

    Follows the branches of MXNet's augmenter with the nearest generic op:

    - ``random_resized_crop`` with an area or aspect range other than 1:
      ``RandomResizedCrop(scale=(min_random_area, max_random_area), ratio=aspect range)``
      (torchvision's sampling: log-uniform aspect, no width/height swap, a centred fallback box;
      MXNet: uniform aspect, a random swap, an unscaled centre window as fallback);
    - otherwise the centre crop: ``resize`` then a centred ``data_shape`` window (torchvision
      rounds the offset half to even, MXNet floors it; fastload's resampling is antialiased), or
      without ``resize`` the largest centred box of the output's aspect ratio resampled to
      ``data_shape`` (MXNet cuts the centre ``data_shape`` window unscaled);
    - ``rand_mirror`` / ``mirror``: flip with probability 0.5 / 1 (MXNet's semantics).

    Raises:
        MXNetArgumentError: A geometric argument only ``MXNetDefaultAugment`` implements: the affine
            warp (rotation, shear, random scale, an aspect range without ``random_resized_crop``,
            image size bounds), ``rand_crop``'s unscaled random window, the square crops, ``pad`` and
            resampling kernels other than bilinear.
    """
    lo, hi = _aspect_range(args)
    unsupported = args.non_default((*_FALLBACK_UNSUPPORTED, "rand_crop"))
    if not args.random_resized_crop:
        unsupported.update(args.non_default(("max_aspect_ratio", "min_aspect_ratio")))
    if unsupported:
        raise _not_supported(
            unsupported,
            "it needs fastload.transforms.MXNetDefaultAugment, the engine's implementation of MXNet's augmenter",
        )
    size = tuple(args.data_shape[1:])
    flip = 1.0 if args.mirror else (0.5 if args.rand_mirror else 0.0)
    rrc = args.random_resized_crop and (args.min_random_area, args.max_random_area, lo, hi) != (1.0, 1.0, 1.0, 1.0)
    try:
        if rrc:
            if not 0 < args.min_random_area <= args.max_random_area <= 1:
                raise MXNetArgumentError(
                    f"ImageRecordIter: min_random_area={args.min_random_area}, "
                    f"max_random_area={args.max_random_area} must satisfy 0 < min <= max <= 1"
                )
            if not 0 < lo <= hi:
                raise MXNetArgumentError(
                    f"ImageRecordIter: the aspect ratio range [{lo}, {hi}] (from min_aspect_ratio="
                    f"{args.min_aspect_ratio}, max_aspect_ratio={args.max_aspect_ratio}) must be "
                    "positive and increasing"
                )
            op: Any = transforms.RandomResizedCrop(
                size=size, scale=(args.min_random_area, args.max_random_area), ratio=(lo, hi), flip=flip
            )
        else:
            if 0 < args.resize < min(size):
                raise MXNetArgumentError(
                    f"ImageRecordIter: resize={args.resize} is smaller than data_shape {size}: "
                    "MXNet's centre crop then upscales, which needs MXNetDefaultAugment"
                )
            op = transforms.CenterCrop(size=size, resize=args.resize if args.resize > 0 else None, flip=flip)
    except MXNetArgumentError:
        raise
    except ValueError as exc:
        raise MXNetArgumentError(f"ImageRecordIter: {exc}") from exc
    warnings.warn(
        f"ImageRecordIter runs {op} until this build has fastload.transforms.MXNetDefaultAugment: crop "
        "windows and resampling differ from MXNet's augmenter",
        FallbackGeometryWarning,
        stacklevel=5,
    )
    return op


def _aspect_range(args: RecordIterArgs) -> tuple[float, float]:
    if args.min_aspect_ratio is not None:
        return float(args.min_aspect_ratio), float(args.max_aspect_ratio)
    return 1.0 - args.max_aspect_ratio, 1.0 + args.max_aspect_ratio


def color_spec(args: RecordIterArgs, dtype: str) -> Any | None:
    """``MXNetColorAugment`` for the colour arguments, or None when every one is at MXNet's default.

    Args:
        args: The parsed arguments.
        dtype: The output dtype; ``max_random_contrast`` / ``max_random_illumination`` count only
            for float outputs (MXNet ignores them for uint8 and int8).

    Raises:
        MXNetArgumentError: A non-default colour argument and no ``MXNetColorAugment`` in this build.
    """
    names = [n for n in COLOR_ARGS if dtype in ("float32", "float16") or n not in FLOAT_ONLY_COLOR_ARGS]
    changed = args.non_default(names)
    if not changed:
        return None
    cls = spec_class("MXNetColorAugment")
    if cls is None:
        raise _not_supported(
            changed,
            "it needs fastload.transforms.MXNetColorAugment, the engine's implementation "
            "of MXNet's colour augmentation",
        )
    fields = _fields(cls)
    missing = {n: v for n, v in changed.items() if n not in fields}
    if missing:
        raise _not_supported(missing, f"{cls.__name__} has no such field")
    return _build(cls, {n: args[n] for n in names if n in fields})


def normalize_spec(args: RecordIterArgs, dtype: str) -> Any | None:
    """``Normalize`` for the engine when it can do MXNet's normalization, else None (the adapter does it).

    The engine normalizes float outputs of 3 channels without a mean image:
    ``Normalize(mean=(mean_r, mean_g, mean_b), std=(std_r / scale, ...), scale=1.0, dtype=dtype)``
    computes ``(pixel - mean) / (std / scale)``, MXNet's ``(pixel - mean) * scale / std``.
    """
    cls = spec_class("Normalize")
    if cls is None or dtype not in ("float32", "float16") or args.data_shape[0] != 3 or args.mean_img:
        return None
    mean = (args.mean_r, args.mean_g, args.mean_b)
    std = tuple(s / args.scale for s in (args.std_r, args.std_g, args.std_b))
    return _build(cls, {"mean": mean, "std": std, "scale": 1.0, "dtype": dtype})


def aug_seed(args: RecordIterArgs) -> int:
    """The seed of every random augmentation: ``seed_aug`` when given, else ``seed`` (both as uint32).

    MXNet draws augmentations from per-thread generators seeded by constants (different results
    with a different thread count) unless ``seed_aug`` is set, and then reseeds them with
    ``seed_aug`` plus the image's position in its batch (every batch, every epoch gets the same
    draws). fastload keys each draw by (seed, epoch, record), so augmentations are reproducible
    whatever the threads and still differ between records and epochs.
    """
    seed = args.seed if args.seed_aug is None else args.seed_aug
    return int(seed) & 0xFFFFFFFF
