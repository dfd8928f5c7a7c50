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

The geometry is MXNet's own chain, not an approximation: ``MXNetDefaultAugment`` cuts MXNet's
windows with MXNet's integer and float32 arithmetic and samples the decoded image once through the
composition of resize, warp, pad and crop (``fastload.transforms.warp``). Random draws come from
fastload's counter-based generator with MXNet's distributions. ``rotate_list`` (a random choice from a
list of angles) is the one geometric argument it does not take: any value other than MXNet's default
raises :class:`~fastload.mxnet.arguments.MXNetArgumentError`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import fastload.transforms as transforms
from fastload.mxnet.arguments import MXNetArgumentError, RecordIterArgs

_T = TypeVar("_T")

__all__ = [
    "COLOR_ARGS",
    "FLOAT_ONLY_COLOR_ARGS",
    "GEOMETRY_ARGS",
    "aug_seed",
    "color_spec",
    "geometry_spec",
    "normalize_spec",
]

#: MXNet's geometric arguments (default augmenter + the normalizer's mirror): MXNetDefaultAugment's
#: fields under MXNet's names, and ``rotate_list``, which it does not take.
GEOMETRY_ARGS = (
    *(f.name for f in dataclasses.fields(transforms.MXNetDefaultAugment) if f.init and f.name != "data_shape"),
    "rotate_list",
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


def _fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def _not_supported(args: dict[str, Any], what: str) -> MXNetArgumentError:
    detail = ", ".join(f"{k}={v!r}" for k, v in sorted(args.items()))
    return MXNetArgumentError(f"ImageRecordIter argument(s) {detail}: not supported by fastload ({what})")


def _build(cls: type[_T], kwargs: dict[str, Any]) -> _T:
    try:
        return cls(**kwargs)
    except MXNetArgumentError:
        raise
    except (TypeError, ValueError) as exc:
        raise MXNetArgumentError(f"ImageRecordIter: {exc}") from exc


def geometry_spec(args: RecordIterArgs) -> transforms.MXNetDefaultAugment:
    """The geometry op for ``args``: ``MXNetDefaultAugment`` with every geometric argument under MXNet's name.

    Raises:
        MXNetArgumentError: An argument MXNet would refuse (naming it), or ``rotate_list``.
    """
    cls = transforms.MXNetDefaultAugment
    fields = _fields(cls)
    missing = {n: args[n] for n in GEOMETRY_ARGS if n not in fields and not args.is_default(n)}
    if missing:
        raise _not_supported(missing, "only MXNet's default value is accepted")
    kwargs = {n: args[n] for n in GEOMETRY_ARGS if n in fields}
    kwargs["data_shape"] = tuple(args.data_shape)
    return _build(cls, kwargs)


def color_spec(args: RecordIterArgs, dtype: str) -> Any | None:
    """``MXNetColorAugment`` for the colour arguments, or None when every one is at MXNet's default.

    Args:
        args: The parsed arguments.
        dtype: The output dtype; ``max_random_contrast`` / ``max_random_illumination`` count only
            for float outputs (MXNet ignores them for uint8 and int8).

    Raises:
        MXNetArgumentError: A colour argument MXNet would refuse.
    """
    names = [n for n in COLOR_ARGS if dtype in ("float32", "float16") or n not in FLOAT_ONLY_COLOR_ARGS]
    changed = args.non_default(names)
    if not changed:
        return None
    cls = transforms.MXNetColorAugment
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
    cls = transforms.Normalize
    if dtype not in ("float32", "float16") or args.data_shape[0] != 3 or args.mean_img:
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
