"""Pixels stage, the decode contract: options, output layouts, per-image statuses and the batch result.

Both backends (the C++ engine and the Pillow path) take and give these.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

import fastload.engine_abi as engine_abi

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
        dct_scaling: Let libjpeg downscale in the DCT domain (1/2, 1/4, 1/8) where the
            antialiased resize still shrinks enough afterwards: 1/2 from a crop 8x the output (in
            both directions, a 4x step left), 1/4 from 20x, 1/8 from 40x (a 5x step left).
            libjpeg's block-wise reduction moves the result away from the reference's filter by an
            amount set by the shrink left to the resize; with these steps every image stays within
            0.02 normalized units of torchvision's PIL pipeline at every output size
            (docs/fidelity.md has the figures per size and what the shortcut saves). C++ engine only.
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
