"""Pixels stage, the engine path: the engine's parameter structs built from a Pipeline, and its calls."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

import fastload.engine_abi as engine_abi
import fastload.engine_structs as engine_structs
from fastload.decode.contract import DecodeOptions, DecodeStatus, Layout, _slice_entropy
from fastload.engine import native, unavailable_reason
from fastload.transforms import AffineParams, MXNetParams, OpKind, Pipeline
from fastload.transforms.affine import AFFINE_PARAM_NAMES
from fastload.transforms.erasing import engine_output_spec, output_params_from_trace
from fastload.transforms.geometry import CenterCrop, RandomCrop, RandomResizedCrop
from fastload.transforms.mixing import engine_mix_fields
from fastload.transforms.mxnet_augment import MXNET_PARAM_NAMES, MXNetDefaultAugment
from fastload.transforms.pipeline import GeometryOp
from fastload.transforms.pixel import engine_specs


def _loaded() -> ModuleType:
    """The engine; the engine path runs only when it is loaded (else a RuntimeError that says why)."""
    engine = native()
    if engine is None:
        raise RuntimeError(f"the C++ engine is not loaded: {unavailable_reason()}")
    return engine


def _native_struct(name: str, values: Mapping[str, Any]) -> Any:
    """The engine's ``name`` struct (a ``py::class_`` generated from :data:`engine_abi.STRUCTS`)."""
    return engine_structs.to_native(_loaded(), name, values)


def _native_options(options: DecodeOptions) -> Any:
    return _native_struct(
        "DecodeSettings",
        {
            "max_pixels": int(options.max_pixels),
            "fast_idct": options.fast_idct,
            "fancy_upsampling": options.fancy_upsampling,
            "apply_exif": options.apply_exif,
            "use_restart_slices": options.use_restart_slices,
            "dct_scaling": options.dct_scaling,
            "slice_entropy": _slice_entropy(options),
        },
    )


def _native_geometry(transform: GeometryOp) -> Any:
    # Every geometry op stores its size as (h, w) once constructed; the field also takes one int.
    out_h, out_w = cast("tuple[int, int]", transform.size)
    kind = OpKind(int(transform.kind))
    if isinstance(transform, MXNetDefaultAugment):  # its parameters travel as the warp argument
        return _native_struct("GeometryParams", {"kind": kind, "out_h": int(out_h), "out_w": int(out_w)})
    values: dict[str, Any] = {
        "kind": kind,
        "out_h": int(out_h),
        "out_w": int(out_w),
        "flip": float(transform.flip),
        "vflip": float(getattr(transform, "vflip", 0.0)),
        "antialias": bool(transform.antialias),
    }
    filters = transform.interpolation  # one filter, or a pair drawn per image (counter 42)
    if isinstance(filters, tuple):
        values.update(
            interpolation=engine_abi.Interpolation[filters[0].upper()],
            interpolation2=engine_abi.Interpolation[filters[1].upper()],
            random_interpolation=True,
        )
    else:
        values["interpolation"] = engine_abi.Interpolation[filters.upper()]
    # The kind says which op it is (ops are told apart by kind, as the engine does).
    if kind == OpKind.RANDOM_CROP:
        crop = cast(RandomCrop, transform)
        left, top, right, bottom = crop.padding
        values.update(
            pad_left=left,
            pad_top=top,
            pad_right=right,
            pad_bottom=bottom,
            pad_if_needed=crop.pad_if_needed,
            padding_mode=engine_abi.PaddingMode[crop.padding_mode.upper()],
            fill=[float(v) for v in crop.fill],
        )
    if kind == OpKind.RANDOM_RESIZED_CROP:
        rrc = cast(RandomResizedCrop, transform)
        values.update(
            scale_lo=float(rrc.scale[0]),
            scale_hi=float(rrc.scale[1]),
            ratio_lo=float(rrc.ratio[0]),
            ratio_hi=float(rrc.ratio[1]),
        )
    elif kind == OpKind.RESIZE_CENTER_CROP:
        values["resize"] = int(cast(CenterCrop, transform).resize or 0)
    return _native_struct("GeometryParams", values)


def _native_output(pipeline: Pipeline, layout: Layout) -> Any:
    values: dict[str, Any] = {"layout": engine_abi.Layout[layout.value]}
    norm = pipeline.normalize
    if norm is None:
        values["dtype"] = engine_abi.DType.UINT8
    else:
        values.update(
            dtype=engine_abi.DType[norm.dtype.upper()],
            normalize=True,
            scale=norm.scale,
            # Normalize stores both as per-channel triples once constructed.
            mean=list(cast("tuple[float, float, float]", norm.mean)),
            std_dev=list(cast("tuple[float, float, float]", norm.std)),
        )
    return _native_struct("OutputParams", values)


def _warp_spec(pipeline: Pipeline) -> Any:
    """The warp geometry's spec the engine takes beside the GeometryParams, or None."""
    if pipeline.kind == OpKind.MXNET_AUGMENT:
        return pipeline.geometry
    return pipeline.affine


def _warp_params_from_trace(pipeline: Pipeline, trace: NDArray[np.float64]) -> Any:
    """The engine's warp trace row as the reference's AffineParams / MXNetParams."""
    if pipeline.kind == OpKind.MXNET_AUGMENT:
        values = dict(zip(MXNET_PARAM_NAMES, trace.tolist(), strict=False))
        floats = ("shear", "scale", "ratio")
        fields: dict[str, Any] = {
            k: (float(v) if k in floats else bool(v) if k == "mirror" else int(v)) for k, v in values.items()
        }
        return MXNetParams(**fields)
    angle, tx, ty, scale, shear_x, shear_y = trace[: len(AFFINE_PARAM_NAMES)].tolist()
    return AffineParams(angle=angle, translate=(int(tx), int(ty)), scale=scale, shear=(shear_x, shear_y))


def _native_mix(params: dict[str, Any]) -> Any:
    """A batch draw of :func:`~fastload.transforms.mixing.sample_mix` as the engine's ``MixParams``."""
    return _native_struct("MixParams", engine_mix_fields(params))


@functools.lru_cache(maxsize=64)
def _native_spec(name: str, spec: Any) -> Any:
    # Built once per (frozen, hashable) spec and shared, read-only, by every batch that uses it.
    return _native_struct(name, spec.engine_fields())


def _native_warp(pipeline: Pipeline) -> dict[str, Any]:
    """The warp geometry's spec as decode_batch's ``mxnet`` or ``affine`` argument (empty: none)."""
    if pipeline.kind == OpKind.MXNET_AUGMENT:
        return {"mxnet": _native_spec("MXNetAugmentSpec", pipeline.geometry)}
    if pipeline.affine is not None:
        return {"affine": _native_spec("AffineSpec", pipeline.affine)}
    return {}


def _native_decode_batch(
    images: Sequence[Any],
    out: NDArray[Any],
    pipeline: Pipeline,
    *,
    layout: Layout,
    seed: int,
    epoch: int,
    idx: NDArray[np.int64],
    threads: int,
    options: DecodeOptions,
    want_params: bool,
    mix_params: dict[str, Any] | None,
) -> dict[str, Any]:
    """The engine's ``decode_batch`` for the whole batch (one call, the GIL released once): its result dict."""
    mask = (1 << 64) - 1
    engine = _loaded()
    result: dict[str, Any] = engine.decode_batch(
        images if isinstance(images, (list, tuple)) else list(images),
        out,
        _native_geometry(pipeline.geometry),
        _native_output(pipeline, layout),
        engine_specs(pipeline.ops, *pipeline.size, engine),
        _native_struct("ErasingSpec", engine_output_spec(pipeline.ops, None, pipeline.erase)),
        seed & mask,
        epoch & mask,
        idx,
        threads,
        _native_options(options),
        bool(want_params),
        mix=_native_mix(mix_params) if mix_params is not None else None,
        **_native_warp(pipeline),
    )
    return result


def _native_params(native: dict[str, Any], pipeline: Pipeline, n: int) -> tuple[list[Any], list[Any], list[Any]]:
    """``(op_params, output_params, warp_params)`` per sample from the engine's traces (None where it failed)."""
    status = native["status"]
    op_params: list[Any] = [None] * n
    output_params: list[Any] = [None] * n
    warp_params: list[Any] = [None] * n
    ok = status == DecodeStatus.OK
    if native.get("warp_traces") is not None:
        traces = native["warp_traces"]
        warp_params = [_warp_params_from_trace(pipeline, traces[i]) if ok[i] else None for i in range(n)]
    if native.get("pixel_traces") is not None:
        traces = native["pixel_traces"]
        op_params = [
            [op.params_from_trace(traces[i, k]) for k, op in enumerate(pipeline.ops)] if ok[i] else None
            for i in range(n)
        ]
    if native.get("erase_traces") is not None:
        traces = native["erase_traces"]
        output_params = [output_params_from_trace(traces[i]) if ok[i] else None for i in range(n)]
    return op_params, output_params, warp_params


def _native_decode_image(buf: Any, options: DecodeOptions) -> tuple[DecodeStatus, str, NDArray[np.uint8]]:
    """The engine's full-size RGB decode of one image: ``(status, message, array)``."""
    native_status, msg, arr = _loaded().decode_image(buf, _native_options(options))
    return DecodeStatus(int(native_status)), msg, arr


def _native_resize_encode(
    images: Sequence[Any], shorter: int, quality: int, threads: int, options: DecodeOptions
) -> list[bytes | None]:
    """The engine's decode, resize and JPEG encode of each image (None where it could not)."""
    native = _loaded().resize_encode_batch(
        list(images), int(shorter), int(quality), int(threads), _native_options(options)
    )
    return [data for _status, _message, data in native]
