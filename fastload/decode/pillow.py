"""Pixels stage, the Pillow path: the reference decode of one image, and of a batch's positions on threads."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fastload.decode.contract import DecodeOptions, DecodeStatus, Layout
from fastload.transforms import (
    Pipeline,
    affine_plan,
    mxnet_plan,
    op_counter_base,
    resample,
    sample_key,
    sample_params,
    warp_image,
)
from fastload.transforms.erasing import apply_output_ops
from fastload.transforms.geometry import ImageTooSmall
from fastload.transforms.mxnet_augment import MXNetDefaultAugment, MXNetSampleError
from fastload.transforms.warp import gather_frame, uses_crop_frame

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

#: What :func:`_pillow_one` returns: ``(status, message, box, flip, vflip, op_params, output_params,
#: warp_params)``.
_Outcome = tuple[DecodeStatus, str, tuple[float, ...], bool, bool, list[Any] | None, dict[str, Any] | None, Any]


def _pillow_open_rgb(buf: Any, options: DecodeOptions) -> PILImage:
    """Open and fully decode one image to an RGB PIL image; raises _Failure on any problem."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    view = memoryview(buf)
    if view.nbytes == 0:
        raise _Failure(DecodeStatus.EMPTY, "empty record (0 bytes)")
    try:
        # Pillow's warnings (a damaged EXIF block, its own decompression-bomb notice when max_pixels is
        # raised above Image.MAX_IMAGE_PIXELS) reach the user as Pillow emits them: a
        # warnings.catch_warnings() here would change the process-wide filters from a decode thread,
        # which is not thread-safe and would hide or show other threads' warnings.
        img: PILImage = Image.open(io.BytesIO(view.cast("B") if view.ndim != 1 or view.format != "B" else view))
        w, h = img.size
        if w * h > options.max_pixels:
            raise _Failure(
                DecodeStatus.TOO_LARGE, f"image is {w}x{h} = {w * h} pixels, above max_pixels={options.max_pixels}"
            )
        img.load()
        if options.apply_exif:
            img = ImageOps.exif_transpose(img)
        if img.mode != "RGB":
            img = img.convert("RGB")
        return img
    except _Failure:
        raise
    except Image.DecompressionBombError as exc:
        # Pillow's own guard fired while opening (its limit is twice Image.MAX_IMAGE_PIXELS).
        raise _Failure(DecodeStatus.TOO_LARGE, f"{exc} (fastload max_pixels={options.max_pixels})") from None
    except UnidentifiedImageError:
        raise _Failure(DecodeStatus.CORRUPT, "not a recognized image format") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        msg = str(exc) or type(exc).__name__
        status = (
            DecodeStatus.TRUNCATED if "truncated" in msg.lower() or isinstance(exc, EOFError) else DecodeStatus.CORRUPT
        )
        raise _Failure(status, msg) from None
    except MemoryError:
        raise _Failure(DecodeStatus.TOO_LARGE, "out of memory while decoding") from None
    except Exception as exc:  # Pillow plugins raise a zoo of types on hostile data
        raise _Failure(DecodeStatus.CORRUPT, f"{type(exc).__name__}: {exc}") from None


class _Failure(Exception):
    def __init__(self, status: DecodeStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _pillow_one(
    buf: Any,
    slot: NDArray[Any],
    layout: Layout,
    pipeline: Pipeline,
    seed: int,
    epoch: int,
    index: int,
    options: DecodeOptions,
) -> _Outcome:
    """Decode one image into ``slot`` through the pipeline.

    Returns:
        ``(status, message, box, flip, vflip, op_params, output_params, warp_params)``.
    """
    try:
        img = _pillow_open_rgb(buf, options)
        geometry = pipeline.geometry
        out_h, out_w = pipeline.size
        key = sample_key(seed, epoch, index)
        warp_params: Any = None
        if isinstance(geometry, MXNetDefaultAugment):
            try:
                plan, warp_params = mxnet_plan(geometry, img.width, img.height, key)
            except MXNetSampleError as exc:
                raise _Failure(DecodeStatus.TOO_SMALL, str(exc)) from None
            box, flip, vflip = (np.nan,) * 4, warp_params.mirror, False
            arr = warp_image(np.asarray(img), plan)
        else:
            try:
                params = sample_params(img.width, img.height, geometry, seed=seed, epoch=epoch, index=index)
            except ImageTooSmall as exc:
                raise _Failure(DecodeStatus.TOO_SMALL, str(exc)) from None
            box, flip, vflip = params.box, params.flip, bool(getattr(params, "vflip", False))
            if pipeline.affine is not None:
                plan, warp_params = affine_plan(
                    pipeline.affine,
                    params.box,
                    params.flip,
                    (out_h, out_w),
                    key,
                    crop_interpolation=params.interpolation,
                    crop_antialias=geometry.antialias,
                )
                if uses_crop_frame(plan):  # nearest: the plain crop, then a pixel gather (as the engine)
                    arr = gather_frame(resample(img, params, geometry), plan)
                else:
                    arr = warp_image(np.asarray(img), plan)
            else:
                arr = resample(img, params, geometry)
        op_params = []
        for position, op in enumerate(pipeline.ops):
            base = op_counter_base(position)
            if hasattr(op, "sample") and hasattr(op, "apply_params"):  # the pixel ops: draws kept for want_params
                drawn = op.sample(key, base, out_h, out_w)
                arr = op.apply_params(arr, drawn)
            else:  # any op with contract 3's apply(image, key, base=) reference
                drawn = None
                arr = op.apply(arr, key, base=base)
            op_params.append(drawn)
        if pipeline.normalize is not None:
            arr = pipeline.normalize.apply(arr)
        channels_first = layout is Layout.NCHW
        slot[...] = arr.transpose(2, 0, 1) if channels_first else arr
        # The output stage (MXNet's normalization jitter, RandomErasing) on the written sample.
        output_params = apply_output_ops(
            slot,
            key=key,
            channels_first=channels_first,
            ops=pipeline.ops,
            normalize=pipeline.normalize,
            erase=pipeline.erase,
        )
        return DecodeStatus.OK, "", box, flip, vflip, op_params, output_params, warp_params
    except _Failure as exc:
        slot[...] = 0
        return exc.status, str(exc), (np.nan,) * 4, False, False, None, None, None


@dataclass(frozen=True, kw_only=True)
class _PillowBatch:
    """The positions of a batch the Pillow path decodes, and the batch's arrays it records them in.

    Attributes:
        images: The batch's encoded images.
        positions: The positions to decode (those the engine left to Pillow, or all of them).
        out: The batch's output array; slot ``p`` is written for each position ``p``.
        layout: The output layout.
        pipeline: The transform.
        seed: Seed of the per-sample randomness.
        epoch: Epoch of the per-sample randomness.
        idx: int64 ``[B]``, the sample index of each position.
        threads: Threads to decode with.
        options: The decode options.
        status: int32 ``[B]``, written for each decoded position.
        errors: Position -> reason, set for a failed position and removed for a decoded one.
        boxes: float64 ``[B, 4]``, written for each decoded position.
        flips: bool ``[B]``, written for each decoded position.
        vflips: bool ``[B]``, written for each decoded position.
        op_params: Per position, each pixel op's draws (written for each decoded position).
        output_params: Per position, the output stage's draws (written for each decoded position).
        warp_params: Per position, the warp geometry's draws (written for each decoded position).
    """

    images: Any
    positions: list[int]
    out: NDArray[Any]
    layout: Layout
    pipeline: Pipeline
    seed: int
    epoch: int
    idx: NDArray[np.int64]
    threads: int
    options: DecodeOptions
    status: NDArray[np.int32]
    errors: dict[int, str]
    boxes: NDArray[np.float64]
    flips: NDArray[np.bool_]
    vflips: NDArray[np.bool_]
    op_params: list[Any]
    output_params: list[Any]
    warp_params: list[Any]


def _pillow_batch(batch: _PillowBatch) -> None:
    """Decode ``batch.positions`` on the Pillow path and record each outcome in the batch's arrays."""

    def run(p: int) -> tuple[int, _Outcome]:
        return p, _pillow_one(
            batch.images[p],
            batch.out[p],
            batch.layout,
            batch.pipeline,
            batch.seed,
            batch.epoch,
            int(batch.idx[p]),
            batch.options,
        )

    positions, threads = batch.positions, batch.threads
    if threads == 1 or len(positions) <= 1:
        results = list(map(run, positions))
    else:
        # An executor per call, owned by this call: no process-wide pool that one caller could shut
        # down or resize under another (two loaders with different thread counts), and nothing
        # inherited across fork. Starting the threads costs ~0.1 ms against the tens of
        # milliseconds Pillow spends per batch.
        with ThreadPoolExecutor(max_workers=min(threads, len(positions)), thread_name_prefix="fastload-pillow") as pool:
            results = list(pool.map(run, positions))
    for p, (st, msg, box, flip, vflip, drawn_ops, drawn_output, drawn_warp) in results:
        batch.op_params[p] = drawn_ops
        batch.output_params[p] = drawn_output
        batch.warp_params[p] = drawn_warp
        batch.status[p] = int(st)
        batch.boxes[p] = box
        batch.flips[p] = flip
        batch.vflips[p] = vflip
        if st != DecodeStatus.OK:
            batch.errors[p] = f"{st.name.lower()}: {msg}"
        else:
            batch.errors.pop(p, None)
