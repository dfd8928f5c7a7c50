"""Pixels stage: decode a batch of encoded images through a transform Pipeline, into caller memory.

Two backends share one contract (docs/ARCHITECTURE.md, "Decode") and run the same
:class:`~fastload.transforms.Pipeline`: geometry -> pixel ops -> output stage (dtype, layout,
normalization) -> erasing, every random draw keyed by ``(seed, epoch, sample index)``:

* ``libjpeg-turbo``: the C++ engine ``fastload._engine``. One call per batch, the GIL released once,
  a persistent thread pool with one reused decompressor per thread, region decode (only the rows and
  iMCU columns the crop needs, power-of-two DCT scaling when the crop is at least twice the output)
  and a vectorized antialiased resize with the flips fused; its vertical pass hands each output row
  to the output stage, which writes it in the final dtype and layout, normalized, straight into
  ``out`` (no second pass over the batch). Payloads that are not baseline/progressive JPEG (PNG,
  WebP, ...) are marked by the engine and then decoded by the Pillow path inside the same call, with
  the same ops and output.
* ``pillow``: the reference path (also used when the extension is missing, or with
  ``FASTLOAD_DECODER=pillow``): full decode, ``convert("RGB")``, the reference geometry
  :func:`fastload.transforms.resample` (PIL's filters on the box from
  :func:`fastload.transforms.sample_params`; numpy for torch's non-antialiased modes), the flips,
  each pixel op's Python reference, :meth:`Normalize.apply <fastload.transforms.Normalize.apply>`,
  then erasing.

Warp geometries (``MXNetDefaultAugment``, a Pipeline's ``affine``) are per-sample
:class:`~fastload.transforms.WarpPlan` s: the engine decodes the region a plan reads (at a DCT scale
when the plan allows it) and samples it once (``csrc/warp.h``); the Pillow path evaluates the same
plan with its numpy reference :func:`fastload.transforms.warp_image` on the full decode (a
RandomAffine with nearest interpolation: the plain crop, then
:func:`~fastload.transforms.warp.gather_frame`, in both backends).

Both return per-image status codes; a bad image never raises from :func:`decode_batch`.
"""

from __future__ import annotations

import enum
import io
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

import fastload.engine_abi as engine_abi
from fastload.errors import DecodeError
from fastload.transforms import (
    AffineParams,
    MXNetParams,
    OpKind,
    Pipeline,
    Transform,
    affine_plan,
    as_pipeline,
    mxnet_plan,
    op_counter_base,
    resample,
    sample_key,
    sample_params,
    warp_image,
)
from fastload.transforms.affine import AFFINE_PARAM_NAMES
from fastload.transforms.erasing import apply_output_ops, output_params_from_trace
from fastload.transforms.geometry import ImageTooSmall
from fastload.transforms.mixing import BatchOp, MixResult, mix_batch, mix_labels
from fastload.transforms.mxnet_augment import MXNET_PARAM_NAMES, MXNetSampleError
from fastload.transforms.warp import gather_frame, uses_crop_frame

__all__ = [
    "BatchResult",
    "DecodeOptions",
    "DecodeStatus",
    "Layout",
    "active_backend",
    "decode_batch",
    "decode_image",
    "default_threads",
    "engine_info",
    "resize_encode_batch",
]

# Pillow's own decompression-bomb warning threshold (~89.5 MP, 256 MiB of RGB): a larger image is
# far outside what a training loader should ever see, and rejecting it by default keeps one bad
# record from allocating gigabytes.
_DEFAULT_MAX_PIXELS = 89_478_485


#: Per-image outcome codes (one definition with the C++ engine: :class:`fastload.engine_abi.Status`).
#: ``NEEDS_PILLOW`` is internal: the engine left the image to the Pillow path (not a JPEG, or an EXIF
#: orientation to apply).
DecodeStatus = engine_abi.Status


class Layout(str, enum.Enum):
    """Memory layout of the output batch."""

    NHWC = "NHWC"
    NCHW = "NCHW"


@dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """Decoder knobs; the defaults reproduce the Pillow reference as closely as possible.

    Args:
        max_pixels: Largest ``width * height`` accepted; larger headers are rejected before any
            pixel memory is allocated (decompression-bomb guard). Default: Pillow's warning
            threshold, 89,478,485 pixels.
        fast_idct: Use libjpeg's fast integer IDCT (``JDCT_IFAST``). Measured on ImageNet-like
            JPEGs, RandomResizedCrop(224): mean absolute difference to the Pillow reference 1.1
            grey levels (default settings: 0.11), speed within a few percent of the default (the
            IDCT is a small share once entropy decoding dominates). C++ engine only.
        fancy_upsampling: Smooth (triangle) chroma upsampling, libjpeg's and Pillow's default.
            ``False`` replicates chroma samples (libjpeg's merged upsampler): about 3-7% faster,
            mean difference 1.8 levels, blockier colour edges. C++ engine only.
        apply_exif: Rotate/mirror by the EXIF orientation tag before cropping. Default ``False``:
            torchvision (``PIL.Image.open``) and most training pipelines ignore it, so the pixels
            match theirs. When ``True``, images whose tag asks for a transform take the Pillow path.
        use_restart_slices: For records packed with restart-marker indexing, decode only the restart
            intervals covering the crop (see ``csrc/restart_slice.h``); falls back to the plain
            region decode when slicing does not apply.
        dct_scaling: Let libjpeg downscale by 1/2 in the DCT domain when the crop is at least
            twice the output in both directions (1/4 from 8x, 1/8 from 16x, so the antialiased
            resize always keeps a 2x step). Measured: RandomResizedCrop(112) about 7% faster, mean
            difference to Pillow 1.26 levels instead of 0.004; at 224 on ImageNet-sized images it
            rarely applies (0.11 vs 0.04).
        slice_entropy: Huffman decoder of restart-interval slices: ``"fastload"`` (the interval
            decoder, where the build has it) or ``"libjpeg"`` (slices keep their RST markers and go
            through libjpeg's decoder: same pixels, slower). ``None`` (default): the
            ``FASTLOAD_SLICE_ENTROPY`` environment variable when the call is made, else
            ``"fastload"``. Per call: nothing process-wide changes. C++ engine only.
    """

    max_pixels: int = _DEFAULT_MAX_PIXELS
    fast_idct: bool = False
    fancy_upsampling: bool = True
    apply_exif: bool = False
    use_restart_slices: bool = True
    dct_scaling: bool = True
    slice_entropy: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_pixels, int) or isinstance(self.max_pixels, bool) or self.max_pixels <= 0:
            raise ValueError(f"max_pixels={self.max_pixels!r} must be a positive int")
        for name in ("fast_idct", "fancy_upsampling", "apply_exif", "use_restart_slices", "dct_scaling"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        if self.slice_entropy is not None:
            _entropy_decoder(self.slice_entropy, "slice_entropy")


def _entropy_decoder(name: str, what: str) -> engine_abi.EntropyDecoder:
    try:
        return engine_abi.EntropyDecoder[str(name).strip().upper()]
    except KeyError:
        raise ValueError(f"{what}={name!r} must be 'fastload' or 'libjpeg'") from None


def _slice_entropy(options: DecodeOptions) -> engine_abi.EntropyDecoder:
    """The slice Huffman decoder a call uses: the option, else FASTLOAD_SLICE_ENTROPY read now."""
    if options.slice_entropy is not None:
        return _entropy_decoder(options.slice_entropy, "slice_entropy")
    env = os.environ.get("FASTLOAD_SLICE_ENTROPY", "").strip()
    return _entropy_decoder(env, "FASTLOAD_SLICE_ENTROPY") if env else engine_abi.EntropyDecoder.FASTLOAD


@dataclass(frozen=True)
class BatchResult:
    """What :func:`decode_batch` did.

    Attributes:
        status: int32 ``[B]``, :class:`DecodeStatus` values (0 = ok).
        errors: Position in the batch -> human-readable reason, for every failed position.
        boxes: float64 ``[B, 4]`` source boxes ``(x0, y0, x1, y1)`` in full-size pixels (NaN where
            the image failed); ``None`` unless ``want_params``.
        flips: bool ``[B]``, horizontal flips; ``None`` unless ``want_params``.
        vflips: bool ``[B]``, vertical flips; ``None`` unless ``want_params``.
        warnings: Number of libjpeg warnings (slightly corrupt data that still decoded).
        sliced: Images decoded through restart-interval slices.
        slice_fallbacks: Restart-indexed images whose slicing failed and that the plain region decode
            handled instead.
        pillow: Images decoded by the Pillow path.
        backend: ``"libjpeg-turbo"`` or ``"pillow"``.
        op_params: Per sample, each pixel op's drawn parameters (``op.sample``'s dicts; replay them
            with ``op.apply_params``), None for a failed sample; ``None`` unless ``want_params`` and
            the pipeline has pixel ops.
        output_params: Per sample, the output stage's draws (:func:`fastload.transforms.erasing.apply_output_ops`'s
            dict: the erased box, MXNet's normalization contrast and illumination); ``None`` unless
            ``want_params`` and the pipeline has an output-stage op.
        warp_params: Per sample, the warp geometry's draws (an ``AffineParams`` for a Pipeline's
            ``affine``, an ``MXNetParams`` for ``MXNetDefaultAugment``), None for a failed sample;
            ``None`` unless ``want_params`` and the pipeline has a warp geometry. The boxes of an
            ``MXNetDefaultAugment`` are NaN (its windows are in ``warp_params``).
        mix: With ``mix=``, the batch's :class:`~fastload.transforms.mixing.MixResult` (soft labels
            and the draw) once the images are mixed; ``None`` when some image failed (the slots are
            then unmixed: replace them and call :func:`~fastload.transforms.mix_batch` with
            ``first_index=indices[0]``), or without ``mix=``.
    """

    status: np.ndarray
    errors: dict[int, str]
    boxes: np.ndarray | None
    flips: np.ndarray | None
    vflips: np.ndarray | None
    warnings: int
    sliced: int
    slice_fallbacks: int
    pillow: int
    backend: str
    op_params: list[list[dict[str, Any]] | None] | None = None
    output_params: list[dict[str, Any] | None] | None = None
    warp_params: list[Any] | None = None
    mix: Any = None

    @property
    def ok(self) -> bool:
        """True when every image decoded."""
        return not self.errors

    @property
    def failed(self) -> list[int]:
        """Positions that failed, ascending."""
        return sorted(self.errors)


# --- backend selection -----------------------------------------------------------------------

_engine: Any = None
_engine_reason = ""
try:
    import fastload._engine as _engine
except ImportError as exc:  # built without libjpeg-turbo, or not built yet
    _engine = None
    _engine_reason = f"fastload._engine is not available ({exc})"


def active_backend() -> str:
    """The backend :func:`decode_batch` uses now: ``"libjpeg-turbo"`` or ``"pillow"``."""
    if os.environ.get("FASTLOAD_DECODER", "").strip().lower() == "pillow":
        return "pillow"
    return "libjpeg-turbo" if _engine is not None else "pillow"


def default_threads() -> int:
    """Threads used when ``threads=None``: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def engine_info() -> dict:
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
    if _engine is not None:
        native = _engine.info()
        info["libjpeg_turbo"] = native["libjpeg_turbo"]
        info["simd"] = native["simd"]
        wanted = _slice_entropy(DecodeOptions())
        usable = wanted is engine_abi.EntropyDecoder.LIBJPEG or native["slice_entropy_available"]
        info["slice_entropy"] = wanted.name.lower() if usable else "libjpeg"
    if backend == "pillow":
        info["reason"] = "FASTLOAD_DECODER=pillow" if _engine is not None else _engine_reason
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


def _check_args(images, out, pipeline: Pipeline, indices, threads, layout, options):
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
    return _resolve_layout(out, tuple(pipeline.size), layout), idx, int(threads)


# --- Pillow path -----------------------------------------------------------------------------


def _pillow_open_rgb(buf, options: DecodeOptions):
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
        img = Image.open(io.BytesIO(view.cast("B") if view.ndim != 1 or view.format != "B" else view))
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
    buf, slot: np.ndarray, layout: Layout, pipeline: Pipeline, seed: int, epoch: int, index: int, options: DecodeOptions
):
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
        if pipeline.kind == OpKind.MXNET_AUGMENT:
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
                    crop_interpolation=geometry.interpolation,
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


def _pillow_batch(
    images,
    positions,
    out,
    layout,
    pipeline,
    seed,
    epoch,
    idx,
    threads,
    options,
    status,
    errors,
    boxes,
    flips,
    vflips,
    op_params,
    output_params,
    warp_params,
) -> None:
    def run(p):
        return p, _pillow_one(images[p], out[p], layout, pipeline, seed, epoch, int(idx[p]), options)

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
        op_params[p] = drawn_ops
        output_params[p] = drawn_output
        warp_params[p] = drawn_warp
        status[p] = int(st)
        boxes[p] = box
        flips[p] = flip
        vflips[p] = vflip
        if st != DecodeStatus.OK:
            errors[p] = f"{st.name.lower()}: {msg}"
        else:
            errors.pop(p, None)


# --- public API ------------------------------------------------------------------------------


def _native_struct(name: str, values: Mapping[str, Any]) -> Any:
    """The engine's ``name`` struct (a ``py::class_`` generated from :data:`engine_abi.STRUCTS`)."""
    types = {field: ctype for ctype, field, _default, _doc in engine_abi.STRUCTS[name]}
    obj = getattr(_engine, name)()
    for field, value in values.items():
        ctype = types[field]
        if ctype in engine_abi.ENUMS:
            value = getattr(_engine, ctype)(int(value))
        setattr(obj, field, value)
    return obj


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


def _native_geometry(transform: Transform) -> Any:
    out_h, out_w = transform.size
    kind = OpKind(int(transform.kind))
    if kind == OpKind.MXNET_AUGMENT:  # its parameters travel as the warp argument
        return _native_struct("GeometryParams", {"kind": kind, "out_h": int(out_h), "out_w": int(out_w)})
    values: dict[str, Any] = {
        "kind": kind,
        "out_h": int(out_h),
        "out_w": int(out_w),
        "flip": float(transform.flip),
        "vflip": float(getattr(transform, "vflip", 0.0)),
        "interpolation": engine_abi.Interpolation[transform.interpolation.upper()],
        "antialias": bool(transform.antialias),
    }
    if kind == OpKind.RANDOM_CROP:
        left, top, right, bottom = transform.padding
        values.update(
            pad_left=left,
            pad_top=top,
            pad_right=right,
            pad_bottom=bottom,
            pad_if_needed=transform.pad_if_needed,
            padding_mode=engine_abi.PaddingMode[transform.padding_mode.upper()],
            fill=[float(v) for v in transform.fill],
        )
    if kind == OpKind.RANDOM_RESIZED_CROP:
        values.update(
            scale_lo=float(transform.scale[0]),
            scale_hi=float(transform.scale[1]),
            ratio_lo=float(transform.ratio[0]),
            ratio_hi=float(transform.ratio[1]),
        )
    elif kind == OpKind.RESIZE_CENTER_CROP:
        values["resize"] = int(transform.resize or 0)
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
            mean=list(norm.mean),
            std_dev=list(norm.std),
        )
    return _native_struct("OutputParams", values)


def _warp_spec(pipeline: Pipeline) -> Any:
    """The warp geometry's spec the engine takes beside the GeometryParams, or None."""
    if pipeline.kind == OpKind.MXNET_AUGMENT:
        return pipeline.geometry
    return pipeline.affine


def _warp_params_from_trace(pipeline: Pipeline, trace: np.ndarray) -> Any:
    """The engine's warp trace row as the reference's AffineParams / MXNetParams."""
    if pipeline.kind == OpKind.MXNET_AUGMENT:
        values = dict(zip(MXNET_PARAM_NAMES, trace.tolist(), strict=False))
        floats = ("shear", "scale", "ratio")
        return MXNetParams(
            **{k: (float(v) if k in floats else bool(v) if k == "mirror" else int(v)) for k, v in values.items()}
        )
    angle, tx, ty, scale, shear_x, shear_y = trace[: len(AFFINE_PARAM_NAMES)].tolist()
    return AffineParams(angle=angle, translate=(int(tx), int(ty)), scale=scale, shear=(shear_x, shear_y))


def _native_mix(params: dict[str, Any]) -> tuple[bool, float, tuple[int, int, int, int], float]:
    """A batch draw of :func:`~fastload.transforms.mixing.sample_mix` as the engine's ``mix`` argument."""
    box = params["box"] or (0, 0, 0, 0)
    return (params["op"] == "cutmix", float(params["lam"]), tuple(int(v) for v in box), float(params["lam_labels"]))


def decode_batch(
    images: Sequence,
    out: np.ndarray,
    transform: Pipeline | Transform,
    *,
    seed: int,
    epoch: int,
    indices,
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
        mask = (1 << 64) - 1
        native = _engine.decode_batch(
            images if isinstance(images, (list, tuple)) else list(images),
            out,
            _native_geometry(pipeline.geometry),
            _native_output(pipeline, layout),
            pipeline.ops,
            pipeline.erase,
            seed & mask,
            epoch & mask,
            idx,
            threads,
            _native_options(options),
            bool(want_params),
            _warp_spec(pipeline),
            _native_mix(planned.params) if planned is not None and n else None,
        )
        status, errors, boxes = native["status"], dict(native["errors"]), native["boxes"]
        flips, vflips = native["flips"], native["vflips"]
        warnings_count, sliced, slice_fallbacks = native["warnings"], native["sliced"], native["slice_fallbacks"]
        pending = np.flatnonzero(status == DecodeStatus.NEEDS_PILLOW).tolist()
    op_params: list[Any] = [None] * n
    output_params: list[Any] = [None] * n
    warp_params: list[Any] = [None] * n
    if backend != "pillow" and want_params:
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
    if pending:
        _pillow_batch(
            images,
            pending,
            out,
            layout,
            pipeline,
            seed,
            epoch,
            idx,
            threads,
            options,
            status,
            errors,
            boxes,
            flips,
            vflips,
            op_params,
            output_params,
            warp_params,
        )
    has_output_ops = pipeline.erase is not None or any(getattr(op, "has_output_jitter", False) for op in pipeline.ops)
    mixed: MixResult | None = None
    if planned is not None and not errors:
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
    scaling first when the image is at least twice the target), then libjpeg-turbo encodes it at
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
    native = _engine.resize_encode_batch(
        list(images), int(shorter), int(quality), int(threads), _native_options(options)
    )
    return [data for _status, _message, data in native]


def decode_image(buf, *, options: DecodeOptions = DecodeOptions()) -> np.ndarray:
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
        native_status, msg, arr = _engine.decode_image(buf, _native_options(options))
        st = DecodeStatus(int(native_status))
        if st == DecodeStatus.OK:
            return arr
        if st != DecodeStatus.NEEDS_PILLOW:
            raise DecodeError(f"{st.name.lower()}: {msg}")
    try:
        img = _pillow_open_rgb(buf, options)
    except _Failure as exc:
        raise DecodeError(f"{exc.status.name.lower()}: {exc}") from None
    return np.array(img, dtype=np.uint8)
