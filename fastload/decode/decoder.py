"""Pixels stage, the decoder: which backend runs, the argument checks, and the calls that dispatch to it.

``decode_batch`` sends the batch to the engine in one call and the positions the engine leaves (not
a JPEG, an EXIF orientation) to the Pillow path; with ``FASTLOAD_DECODER=pillow`` or without the
engine, the Pillow path takes the whole batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import fastload.engine_abi as engine_abi
from fastload.decode.contract import BatchResult, DecodeOptions, DecodeStatus, Layout, _slice_entropy
from fastload.decode.native import (
    _native_decode_batch,
    _native_decode_image,
    _native_params,
    _native_resize_encode,
    _warp_spec,
)
from fastload.decode.pillow import _Failure, _pillow_batch, _pillow_open_rgb, _PillowBatch
from fastload.engine import native, pillow_reason, pixel_engine
from fastload.errors import DecodeError
from fastload.transforms import Pipeline, Transform, as_pipeline
from fastload.transforms.mixing import BatchOp, MixResult, mix_batch, mix_labels


def active_backend() -> str:
    """The backend :func:`decode_batch` uses now: ``"libjpeg-turbo"`` or ``"pillow"``."""
    return "libjpeg-turbo" if pixel_engine() is not None else "pillow"


def default_threads() -> int:
    """Threads used when ``threads=None``: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def engine_info() -> dict[str, Any]:
    """Which decoder is live and its versions.

    Returns:
        ``backend`` (``"libjpeg-turbo"`` or ``"pillow"``), ``libjpeg_turbo`` (version or None),
        ``simd`` (the resize kernel in use), ``slice_entropy`` (the Huffman decoder restart-interval
        slices get by default now: ``"fastload"`` or ``"libjpeg"``), ``threads`` (default thread
        count), ``pillow``
        (version) and ``reason`` (why the Pillow path is live, when it is).
    """
    import PIL

    backend = active_backend()
    info = {
        "backend": backend,
        "libjpeg_turbo": None,
        "simd": None,
        "slice_entropy": None,
        "threads": default_threads(),
        "pillow": PIL.__version__,
        "reason": "",
    }
    engine = native()
    if engine is not None:
        built = engine.info()
        info["libjpeg_turbo"] = built["libjpeg_turbo"]
        info["simd"] = built["simd"]
        wanted = _slice_entropy(DecodeOptions())
        usable = wanted is engine_abi.EntropyDecoder.LIBJPEG or built["slice_entropy_available"]
        info["slice_entropy"] = wanted.name.lower() if usable else "libjpeg"
    if backend == "pillow":
        info["reason"] = pillow_reason()
    return info


# --- argument checks -------------------------------------------------------------------------


def _resolve_layout(out: np.ndarray, size: tuple[int, int], layout: str | Layout | None) -> Layout:
    h, w = size
    nhwc = out.shape[1:] == (h, w, 3)
    nchw = out.shape[1:] == (3, h, w)
    if layout is not None:
        try:
            layout = Layout(layout)
        except ValueError:
            raise ValueError(f"layout={layout!r} must be 'NHWC' or 'NCHW'") from None
        if (layout is Layout.NHWC and not nhwc) or (layout is Layout.NCHW and not nchw):
            want = (h, w, 3) if layout is Layout.NHWC else (3, h, w)
            raise ValueError(
                f"out.shape={out.shape} does not match layout {layout.value} for transform size "
                f"{size}: expected [B, {', '.join(map(str, want))}]"
            )
        return layout
    if nhwc:
        return Layout.NHWC
    if nchw:
        return Layout.NCHW
    raise ValueError(
        f"out.shape={out.shape} must be [B, {h}, {w}, 3] (NHWC) or [B, 3, {h}, {w}] (NCHW) "
        f"for transform size (H, W)={size}"
    )


def _check_args(
    images: Sequence[Any],
    out: np.ndarray,
    pipeline: Pipeline,
    indices: npt.ArrayLike,
    threads: int | None,
    layout: str | Layout | None,
    options: DecodeOptions,
) -> tuple[Layout, np.ndarray, int]:
    if not isinstance(out, np.ndarray):
        raise ValueError(f"out must be a numpy.ndarray (got {type(out).__name__}); wrap torch tensors with .numpy()")
    if out.dtype != pipeline.output_dtype:
        why = "the Pipeline's Normalize dtype" if pipeline.normalize is not None else "uint8: no Normalize"
        raise ValueError(f"out.dtype={out.dtype} must be {pipeline.output_dtype} ({why})")
    if out.ndim != 4:
        raise ValueError(f"out.ndim={out.ndim} must be 4 ([B, H, W, 3] or [B, 3, H, W])")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    n = len(images)
    if out.shape[0] != n:
        raise ValueError(f"out has {out.shape[0]} slots but {n} images were given")
    idx = np.ascontiguousarray(np.asarray(indices), dtype=np.int64) if n else np.zeros(0, np.int64)
    if idx.ndim != 1 or idx.shape[0] != n:
        raise ValueError(f"indices must be a 1-D array of {n} sample indices (got shape {np.shape(indices)})")
    if threads is None:
        threads = default_threads()
    if not isinstance(threads, (int, np.integer)) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads={threads!r} must be a positive int")
    if not isinstance(options, DecodeOptions):
        raise ValueError(f"options={options!r} must be a fastload.decode.DecodeOptions")
    return _resolve_layout(out, pipeline.size, layout), idx, int(threads)


def decode_batch(
    images: Sequence,
    out: np.ndarray,
    transform: Pipeline | Transform,
    *,
    seed: int,
    epoch: int,
    indices: npt.ArrayLike,
    threads: int | None = None,
    layout: str | Layout | None = None,
    want_params: bool = False,
    options: DecodeOptions = DecodeOptions(),
    mix: BatchOp | None = None,
    labels: Any = None,
    soft_labels: np.ndarray | None = None,
) -> BatchResult:
    """Decode ``images`` through ``transform`` into ``out``, one slot per image.

    Args:
        images: Encoded images, any objects exporting the buffer protocol (bytes, memoryviews into
            mmap'd shards, numpy arrays); they are not copied.
        out: Caller-owned C-contiguous ``[B, H, W, 3]`` or ``[B, 3, H, W]`` with
            ``(H, W) == transform.size``, of the pipeline's output dtype (uint8 without a
            Normalize, else the Normalize's float32 / float16); may be pinned memory.
        transform: A :class:`~fastload.transforms.Pipeline`, or a bare geometry op
            (:mod:`fastload.transforms`).
        seed: Loader seed.
        epoch: Epoch number.
        indices: Global sample index of each image (int64 ``[B]``); keys the per-sample randomness.
        threads: Decode threads (default: :func:`default_threads`).
        layout: ``"NHWC"`` or ``"NCHW"``; inferred from ``out.shape`` when omitted.
        want_params: Return the crop boxes and flips used, and each sample's pixel-op and output-stage
            parameters.
        options: :class:`DecodeOptions`.
        mix: A batch op (:class:`~fastload.transforms.MixUp`, ``CutMix``, ``RandomChoice``) applied
            to the decoded batch with ``labels``: the result equals :func:`~fastload.transforms.mix_batch`
            with ``first_index=indices[0]`` on the unmixed batch, bit for bit, but the engine mixes
            in its output stage, without another pass over ``out``. ``BatchResult.mix`` holds the
            soft labels.
        labels: The batch's class indices ``[B]`` / ``[B, 1]`` or probabilities ``[B, num_classes]``
            (with ``mix``).
        soft_labels: Caller-owned float32 ``[B, num_classes]`` array for the soft labels (with
            ``mix``), or None for a new one. It is written before the decode, so it holds the
            planned labels even when ``BatchResult.mix`` is None (``mix_batch`` with
            ``out=soft_labels`` then rewrites it).

    Returns:
        A :class:`BatchResult`. Failed positions have a non-zero status, a reason in ``errors`` and a
        zero-filled slot.

    Raises:
        ValueError: On API misuse (wrong ``out`` shape, dtype or contiguity, mismatched lengths,
            ``mix`` without ``labels``).
    """
    pipeline = as_pipeline(transform)
    layout, idx, threads = _check_args(images, out, pipeline, indices, threads, layout, options)
    n = len(images)
    seed = int(seed)
    epoch = int(epoch)
    planned: MixResult | None = None
    if mix is not None:
        if labels is None:
            raise ValueError("mix needs the batch's labels (labels=)")
        height, width = pipeline.size
        planned = mix_labels(
            labels,
            mix,
            seed=seed,
            epoch=epoch,
            first_index=int(idx[0]) if n else 0,
            height=height,
            width=width,
            out=soft_labels,
        )
        if planned.labels.shape[0] != n:
            raise ValueError(f"labels have {planned.labels.shape[0]} rows for a batch of {n}")
    backend = active_backend()
    warnings_count = sliced = slice_fallbacks = 0
    if backend == "pillow":
        status = np.zeros(n, np.int32)
        errors: dict[int, str] = {}
        boxes = np.zeros((n, 4), np.float64)
        flips = np.zeros(n, bool)
        vflips = np.zeros(n, bool)
        pending = list(range(n))
    else:
        native = _native_decode_batch(
            images,
            out,
            pipeline,
            layout=layout,
            seed=seed,
            epoch=epoch,
            idx=idx,
            threads=threads,
            options=options,
            want_params=want_params,
            mix_params=planned.params if planned is not None and n else None,
        )
        status, errors, boxes = native["status"], dict(native["errors"]), native["boxes"]
        flips, vflips = native["flips"], native["vflips"]
        warnings_count, sliced, slice_fallbacks = native["warnings"], native["sliced"], native["slice_fallbacks"]
        pending = np.flatnonzero(status == DecodeStatus.NEEDS_PILLOW).tolist()
    op_params: list[Any] = [None] * n
    output_params: list[Any] = [None] * n
    warp_params: list[Any] = [None] * n
    if backend != "pillow" and want_params:
        op_params, output_params, warp_params = _native_params(native, pipeline, n)
    if pending:
        _pillow_batch(
            _PillowBatch(
                images=images,
                positions=pending,
                out=out,
                layout=layout,
                pipeline=pipeline,
                seed=seed,
                epoch=epoch,
                idx=idx,
                threads=threads,
                options=options,
                status=status,
                errors=errors,
                boxes=boxes,
                flips=flips,
                vflips=vflips,
                op_params=op_params,
                output_params=output_params,
                warp_params=warp_params,
            )
        )
    has_output_ops = pipeline.erase is not None or any(getattr(op, "has_output_jitter", False) for op in pipeline.ops)
    mixed: MixResult | None = None
    if mix is not None and planned is not None and not errors:
        if n == 0 or (backend != "pillow" and native["mixed"]):
            mixed = planned
        else:  # the Pillow path decoded some images: mix the finished batch
            mixed = mix_batch(
                out,
                labels,
                mix,
                seed=seed,
                epoch=epoch,
                first_index=int(idx[0]),
                layout=layout.value,
                threads=threads,
                out=soft_labels,
            )
    return BatchResult(
        status=status,
        errors=errors,
        boxes=boxes if want_params else None,
        flips=flips if want_params else None,
        vflips=vflips if want_params else None,
        warnings=int(warnings_count),
        sliced=int(sliced),
        slice_fallbacks=int(slice_fallbacks),
        pillow=len(pending),
        backend=backend,
        op_params=op_params if want_params and pipeline.ops else None,
        output_params=output_params if want_params and has_output_ops else None,
        warp_params=warp_params if want_params and _warp_spec(pipeline) is not None else None,
        mix=mixed,
    )


def resize_encode_batch(
    images: Sequence, *, shorter: int, quality: int, threads: int = 1, options: DecodeOptions = DecodeOptions()
) -> list[bytes | None]:
    """Decode, resize and re-encode JPEGs in one GIL-free engine call (``fastload pack --resize``).

    Each image's shorter side becomes ``shorter`` (the longer side scaled by floor division, as
    MXNet's im2rec does), with the same antialiased bilinear resize as :func:`decode_batch` (DCT
    scaling first where the resize still shrinks 4-5x after it), then libjpeg-turbo encodes it at
    ``quality`` with libjpeg's defaults (4:2:0, baseline, standard Huffman tables).

    Args:
        images: Encoded images (buffer-protocol objects, not copied).
        shorter: Target shorter side in pixels.
        quality: JPEG quality, 1..100.
        threads: Engine threads; 1 runs on the calling thread with its own decompressor and
            compressor, so several Python threads may call this at once.
        options: :class:`DecodeOptions` for the decode.

    Returns:
        One JPEG ``bytes`` per image, or None where the engine could not take it (not a JPEG,
        corrupt, too large): the caller decides what to do with those.

    Raises:
        RuntimeError: The C++ engine is not live (see :func:`engine_info`).
        ValueError: ``shorter``, ``quality`` or ``threads`` out of range.
    """
    if active_backend() != "libjpeg-turbo":
        raise RuntimeError(f"resize_encode_batch needs the C++ engine: {engine_info()['reason']}")
    return _native_resize_encode(images, shorter, quality, threads, options)


def decode_image(buf: Any, *, options: DecodeOptions = DecodeOptions()) -> np.ndarray:
    """Decode one image at full size to RGB.

    Args:
        buf: Encoded image (any buffer).
        options: :class:`DecodeOptions` (``max_pixels``, ``apply_exif``, ``fast_idct``,
            ``fancy_upsampling`` apply).

    Returns:
        uint8 array ``[H, W, 3]``.

    Raises:
        DecodeError: When the image cannot be decoded (the reason names the failure class).
    """
    if not isinstance(options, DecodeOptions):
        raise ValueError(f"options={options!r} must be a fastload.decode.DecodeOptions")
    if active_backend() != "pillow":
        st, msg, arr = _native_decode_image(buf, options)
        if st == DecodeStatus.OK:
            return arr
        if st != DecodeStatus.NEEDS_PILLOW:
            raise DecodeError(f"{st.name.lower()}: {msg}")
    try:
        img = _pillow_open_rgb(buf, options)
    except _Failure as exc:
        raise DecodeError(f"{exc.status.name.lower()}: {exc}") from None
    return np.array(img, dtype=np.uint8)
