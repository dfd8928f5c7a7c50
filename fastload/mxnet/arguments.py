"""Device stage (MXNet): ``ImageRecordIter``'s keyword arguments, parsed the way MXNet 1.9 parses them.

MXNet builds ``mx.io.ImageRecordIter`` from six parameter structs (``ImageRecParserParam``,
``ImageRecordParam``, ``BatchParam``, ``PrefetcherParam``, ``DefaultImageAugmentParam``,
``ImageNormalizeParam`` in ``src/io/image_iter_common.h`` and ``src/io/image_aug_default.cc``). Each
value crosses the C API as ``str(value)`` and is parsed by dmlc's parameter code, which
:func:`parse_args` follows: ``rand_crop=1``, ``"True"`` and ``True`` are the same, ``resize=3.5`` is
refused, ``data_shape`` may be a tuple, a list or ``"(3, 224, 224)"``, and ``"None"`` leaves an
optional parameter unset. Every parameter gets MXNet's default.

Leniency as MXNet's: the structs are initialized with ``InitAllowUnknown``, so an argument no
struct declares is ignored (a misspelt ``and_mirror=False`` in MXNet's own tests); here it is
ignored too, with one :class:`UnknownArgumentWarning` naming every such argument.

Errors: a value MXNet would refuse (and a few it would accept but that make no sense: a zero or
negative ``std_*``, which gives NaN pixels, a negative crop or rotation bound, which is undefined
behaviour in MXNet) raises :class:`MXNetArgumentError`, a subclass of both ``mx.base.MXNetError``
(what MXNet raises, and what scripts catch) and ``ValueError``; the message names the argument.

fastload's extras are not stringified: ``ctx`` may also be an ``mx.Context`` or a list of them,
and ``work_load_list``, ``kvstore``, ``rank``, ``num_workers`` are passed through as objects.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import mxnet as mx

__all__ = [
    "DTYPES",
    "EXTRA_ARGS",
    "PARAMS",
    "MXNetArgumentError",
    "Param",
    "RecordIterArgs",
    "UnknownArgumentWarning",
    "decode_threads",
    "parse_args",
]


class MXNetArgumentError(mx.base.MXNetError, ValueError):
    """A bad ``ImageRecordIter`` argument: MXNet's own exception type, and a ``ValueError``."""


class UnknownArgumentWarning(UserWarning):
    """Arguments no MXNet ``ImageRecordIter`` parameter struct declares (ignored, as MXNet ignores them)."""


@dataclass(frozen=True)
class Param:
    """One MXNet parameter: its name, how its string is parsed, MXNet's default, and what uses it.

    Attributes:
        name: MXNet's parameter name.
        kind: ``int``, ``uint`` (dmlc's unsigned fields), ``float``, ``bool``, ``str``, ``shape``,
            ``opt_int``, ``opt_float``, ``dtype``, ``ctx`` or ``int_list``.
        default: MXNet's default (``None`` for an unset optional; ``REQUIRED`` when there is none).
        group: Which part of the pipeline consumes it: ``reader``, ``batch``, ``geometry`` (MXNet's
            default augmenter: ``fastload.transforms.MXNetDefaultAugment``), ``color`` (its colour
            steps and the normalizer's random contrast / illumination:
            ``fastload.transforms.MXNetColorAugment``), ``normalize`` (``fastload.transforms.Normalize``
            or the mean image) or ``output``.
        minimum: Smallest accepted value for numbers (None: no bound).
    """

    name: str
    kind: str
    default: Any
    group: str
    minimum: float | None = None


REQUIRED = object()

# MXNet 1.9.1's parameters of ImageRecordIter, with its defaults. Bounds marked "(MXNet)" are MXNet's
# own; the others refuse values MXNet turns into NaN pixels, undefined behaviour or a crash.
PARAMS: tuple[Param, ...] = (
    # ImageRecParserParam
    Param("path_imglist", "str", "", "reader"),
    Param("path_imgrec", "str", "", "reader"),
    Param("path_imgidx", "str", "", "reader"),
    Param("aug_seq", "str", "aug_default", "geometry"),
    Param("label_width", "int", 1, "reader", minimum=1),  # (MXNet)
    Param("data_shape", "shape", REQUIRED, "output"),
    Param("preprocess_threads", "int", 4, "reader", minimum=1),  # (MXNet)
    Param("verbose", "bool", True, "reader"),
    Param("num_parts", "int", 1, "reader", minimum=1),
    Param("part_index", "int", 0, "reader", minimum=0),
    Param("device_id", "int", 0, "output", minimum=-1),
    Param("shuffle_chunk_size", "uint", 0, "reader", minimum=0),
    Param("shuffle_chunk_seed", "int", 0, "reader"),
    Param("seed_aug", "opt_int", None, "geometry"),
    # ImageRecordParam (its `seed` and `verbose` are shared with the normalizer's)
    Param("shuffle", "bool", False, "reader"),
    Param("seed", "int", 0, "reader"),
    # BatchParam
    Param("batch_size", "uint", REQUIRED, "batch", minimum=1),
    Param("round_batch", "bool", True, "batch"),
    # PrefetcherParam
    Param("prefetch_buffer", "uint", 4, "reader", minimum=0),
    Param("ctx", "ctx", "gpu", "output"),
    Param("dtype", "dtype", None, "output"),
    # DefaultImageAugmentParam (data_shape is shared)
    Param("resize", "int", -1, "geometry", minimum=-1),
    Param("rand_crop", "bool", False, "geometry"),
    Param("random_resized_crop", "bool", False, "geometry"),
    Param("max_rotate_angle", "int", 0, "geometry", minimum=0),
    Param("max_aspect_ratio", "float", 0.0, "geometry", minimum=0.0),
    Param("min_aspect_ratio", "opt_float", None, "geometry"),
    Param("max_shear_ratio", "float", 0.0, "geometry", minimum=0.0),
    Param("max_crop_size", "int", -1, "geometry", minimum=-1),
    Param("min_crop_size", "int", -1, "geometry", minimum=-1),
    Param("max_random_scale", "float", 1.0, "geometry"),
    Param("min_random_scale", "float", 1.0, "geometry"),
    Param("max_random_area", "float", 1.0, "geometry"),
    Param("min_random_area", "float", 1.0, "geometry"),
    Param("max_img_size", "float", 1e10, "geometry"),
    Param("min_img_size", "float", 0.0, "geometry", minimum=0.0),
    Param("brightness", "float", 0.0, "color", minimum=0.0),
    Param("contrast", "float", 0.0, "color", minimum=0.0),
    Param("saturation", "float", 0.0, "color", minimum=0.0),
    Param("pca_noise", "float", 0.0, "color", minimum=0.0),
    Param("random_h", "int", 0, "color", minimum=0),
    Param("random_s", "int", 0, "color", minimum=0),
    Param("random_l", "int", 0, "color", minimum=0),
    Param("rotate", "int", -1, "geometry"),
    Param("fill_value", "int", 255, "geometry", minimum=0),
    Param("inter_method", "int", 1, "geometry"),
    Param("pad", "int", 0, "geometry", minimum=0),
    # Not a declared field: DefaultImageAugmenter::Init reads it from the leftover arguments.
    Param("rotate_list", "int_list", (), "geometry"),
    # ImageNormalizeParam
    Param("mirror", "bool", False, "geometry"),
    Param("rand_mirror", "bool", False, "geometry"),
    Param("mean_img", "str", "", "normalize"),
    Param("mean_r", "float", 0.0, "normalize"),
    Param("mean_g", "float", 0.0, "normalize"),
    Param("mean_b", "float", 0.0, "normalize"),
    Param("mean_a", "float", 0.0, "normalize"),
    Param("std_r", "float", 1.0, "normalize"),
    Param("std_g", "float", 1.0, "normalize"),
    Param("std_b", "float", 1.0, "normalize"),
    Param("std_a", "float", 1.0, "normalize"),
    Param("scale", "float", 1.0, "normalize"),
    Param("max_random_contrast", "float", 0.0, "color", minimum=0.0),
    Param("max_random_illumination", "float", 0.0, "color", minimum=0.0),
    # MXDataIter (the Python wrapper) reads these two.
    Param("data_name", "str", "data", "output"),
    Param("label_name", "str", "softmax_label", "output"),
)

_BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}

#: fastload's own arguments (objects, not MXNet strings): see ``ImageRecordIter``.
EXTRA_ARGS = ("work_load_list", "kvstore", "rank", "num_workers")

#: ``dtype`` values: MXNet's enum, and which of them its ImageRecordIter can produce (plus float16,
#: a fastload extension: MXNet 1.9.1 accepts the name but aborts with "unknown dtype").
_DTYPE_ENUM = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "int8")
DTYPES = ("float32", "uint8", "int8", "float16")

_INT = re.compile(r"^\s*[+-]?\d+\s*$")
_NONE = ("none", "")


def _fail(name: str, value: Any, why: str) -> MXNetArgumentError:
    return MXNetArgumentError(f"ImageRecordIter argument {name}={value!r}: {why}")


def _parse_int(name: str, value: Any) -> int:
    text = str(value)
    if not _INT.match(text):
        raise _fail(name, value, "expected an int")
    return int(text)


def _parse_float(name: str, value: Any) -> float:
    try:
        out = float(str(value))
    except ValueError:
        raise _fail(name, value, "expected a number") from None
    if not math.isfinite(out):
        raise _fail(name, value, "expected a finite number")
    return out


def _parse_bool(name: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise _fail(name, value, "expected a boolean (True/False/1/0)")


def _parse_shape(name: str, value: Any) -> tuple[int, ...]:
    text = str(value).strip()
    if text[:1] in "([" and text[-1:] in ")]":
        text = text[1:-1]
    parts = [p for p in (s.strip() for s in text.split(",")) if p]
    if not parts or not all(_INT.match(p) for p in parts):
        raise _fail(name, value, "expected a shape such as (3, 224, 224)")
    return tuple(int(p) for p in parts)


def _parse_int_list(name: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    parts = [p for p in (s.strip() for s in str(value).split(",")) if p]
    if not all(_INT.match(p) for p in parts):
        raise _fail(name, value, "expected comma-separated ints")
    return tuple(int(p) for p in parts)


def _parse(param: Param, value: Any) -> Any:
    name, kind = param.name, param.kind
    if kind == "str":
        return str(value)
    if kind in ("int", "uint"):
        return _parse_int(name, value)
    if kind == "float":
        return _parse_float(name, value)
    if kind == "bool":
        return _parse_bool(name, value)
    if kind == "shape":
        return _parse_shape(name, value)
    if kind == "opt_int":
        return None if value is None or str(value).strip().lower() in _NONE else _parse_int(name, value)
    if kind == "opt_float":
        return None if value is None or str(value).strip().lower() in _NONE else _parse_float(name, value)
    if kind == "int_list":
        return _parse_int_list(name, value)
    if kind == "dtype":
        if value is None or str(value).strip().lower() in _NONE:
            return None
        text = str(value).strip()
        if text not in _DTYPE_ENUM:
            try:  # fastload also takes numpy dtypes (np.float32, "f4", ...)
                import numpy as np

                text = np.dtype(value).name
            except TypeError:
                raise _fail(name, value, f"expected one of {_DTYPE_ENUM} or None") from None
        if text not in DTYPES:
            raise _fail(name, value, f"ImageRecordIter produces {DTYPES} (MXNet: unknown dtype for ImageRecordIter)")
        return text
    if kind == "ctx":
        if isinstance(value, str):
            if value not in ("cpu", "gpu"):
                raise _fail(name, value, "expected 'cpu', 'gpu', an mx.Context or a list of them")
            return value
        return value  # an mx.Context or a list of them: checked by the placement code
    raise AssertionError(kind)  # pragma: no cover - the table only uses the kinds above


class RecordIterArgs(Mapping):
    """Every MXNet parameter of ``ImageRecordIter`` with its parsed value (MXNet's default when not given).

    Read-only mapping, also readable as attributes (``args.resize``).

    Attributes:
        given: Names the caller passed (MXNet parameters and fastload extras).
        unknown: Names no MXNet parameter struct declares (ignored).
        extras: fastload's extra arguments that were given, unparsed.
    """

    def __init__(
        self, values: dict[str, Any], given: Iterable[str], unknown: Iterable[str], extras: dict[str, Any]
    ) -> None:
        self._values = MappingProxyType(dict(values))
        self.given = frozenset(given)
        self.unknown = tuple(sorted(unknown))
        self.extras = MappingProxyType(dict(extras))

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def is_default(self, name: str) -> bool:
        """Whether ``name`` has MXNet's default value (given explicitly or not)."""
        return self._values[name] == _BY_NAME[name].default

    def non_default(self, names: Iterable[str]) -> dict[str, Any]:
        """The subset of ``names`` whose value differs from MXNet's default."""
        return {n: self._values[n] for n in names if not self.is_default(n)}

    def __repr__(self) -> str:
        changed = {n: self._values[n] for n in self._values if not self.is_default(n)}
        return f"RecordIterArgs({changed})"


def _check(values: dict[str, Any]) -> None:
    """Ranges and combinations that do not depend on which engine ops exist."""
    for p in PARAMS:
        v = values[p.name]
        if p.minimum is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and v < p.minimum:
            raise _fail(p.name, v, f"must be >= {p.minimum:g}")
    shape = values["data_shape"]
    if len(shape) != 3:
        raise _fail("data_shape", shape, "must have 3 dimensions (channels, height, width)")
    if min(shape) <= 0:
        raise _fail("data_shape", shape, "every dimension must be nonzero")
    if shape[0] not in (1, 3):
        # MXNet: 1 (grayscale) and 3 (colour) are decoded; 4 keeps an alpha channel JPEGs do not have.
        raise _fail("data_shape", shape, "channels must be 1 (grayscale) or 3 (RGB)")
    if not values["path_imgrec"]:
        raise _fail("path_imgrec", values["path_imgrec"], "must name a .rec file or a fastload dataset folder")
    if values["part_index"] >= values["num_parts"]:
        raise _fail("part_index", values["part_index"], f"must be < num_parts={values['num_parts']}")
    if values["resize"] == 0:
        raise _fail("resize", 0, "must be -1 (no resize) or the shorter side's new length")
    if values["fill_value"] > 255:
        raise _fail("fill_value", values["fill_value"], "must be a pixel value in 0..255")
    if values["inter_method"] not in (0, 1, 2, 3, 4, 9, 10):
        raise _fail(
            "inter_method",
            values["inter_method"],
            "must be 0 (nearest), 1 (bilinear), 2 (bicubic), 3 (area), 4 (lanczos4), 9 (auto) or 10 (random)",
        )
    for name in ("max_crop_size", "min_crop_size"):
        if values[name] == 0:
            raise _fail(name, 0, "must be -1 (off) or a positive size")
    if values["random_resized_crop"] and values["rand_crop"]:
        raise _fail("random_resized_crop", True, "conflicts with rand_crop=True (MXNet refuses the combination)")
    if values["aug_seq"].replace(" ", "") != "aug_default":
        raise _fail("aug_seq", values["aug_seq"], "only MXNet's default augmenter 'aug_default' exists")
    for c in "rgba":
        if values[f"std_{c}"] <= 0:
            raise _fail(f"std_{c}", values[f"std_{c}"], "must be positive (MXNet divides by it)")
    if values["scale"] == 0:
        raise _fail("scale", 0, "must be nonzero (every pixel would be 0)")


def parse_args(
    kwargs: Mapping[str, Any], *, defaults: Mapping[str, Any] | None = None, warn_stacklevel: int = 3
) -> RecordIterArgs:
    """Parse ``ImageRecordIter`` keyword arguments as MXNet 1.9 does.

    Args:
        kwargs: The caller's keyword arguments.
        defaults: Overrides of MXNet's defaults (the ``ImageRecordUInt8Iter`` aliases set ``dtype``).
        warn_stacklevel: ``stacklevel`` of the unknown-argument warning (points at the caller).

    Returns:
        The parsed arguments.

    Raises:
        MXNetArgumentError: A value MXNet would refuse, or a required argument is missing.
    """
    values: dict[str, Any] = {}
    given, unknown, extras = [], [], {}
    merged = dict(defaults or {})
    merged.update(kwargs)
    for name, value in merged.items():
        if name in EXTRA_ARGS:
            extras[name] = value
        elif name in _BY_NAME:
            values[name] = _parse(_BY_NAME[name], value)
        else:
            unknown.append(name)
            continue
        if name in kwargs:
            given.append(name)
    for p in PARAMS:
        if p.name not in values:
            if p.default is REQUIRED:
                raise MXNetArgumentError(f"ImageRecordIter needs the argument {p.name}")
            values[p.name] = p.default
    _check(values)
    if unknown:
        warnings.warn(
            f"ImageRecordIter ignores argument(s) it does not know, as MXNet does: {sorted(unknown)}",
            UnknownArgumentWarning,
            stacklevel=warn_stacklevel,
        )
    return RecordIterArgs(values, given, unknown, extras)


def decode_threads(preprocess_threads: int) -> int:
    """The decode threads MXNet's ``ImageRecordIter`` actually runs for ``preprocess_threads``.

    MXNet's record parsers cap the argument at ``max(cores / 2 - 1, 1)`` ("be conservative, set
    number of real cores", with ``omp_get_num_procs()``: the cores this process may run on) and log
    the count they use; on 2 cores every ``preprocess_threads`` becomes 1. The cap leaves the
    training step (MXNet's own operator threads) its cores: a decode pool as large as the machine
    beside a CPU-bound step makes each of its parallel operators wait for a descheduled thread.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(int(preprocess_threads), max(cores // 2 - 1, 1)))
