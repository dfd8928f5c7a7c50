"""Pixels stage: decode a batch of encoded images through a transform Pipeline, into caller memory.

Two backends share one contract (docs/ARCHITECTURE.md, "Decode") and run the same
:class:`~fastload.transforms.Pipeline`: geometry -> pixel ops -> output stage (dtype, layout,
normalization) -> erasing, every random draw keyed by ``(seed, epoch, sample index)``:

* ``libjpeg-turbo``: the C++ engine ``fastload._engine``. One call per batch, the GIL released once,
  a persistent thread pool with one reused decompressor per thread, region decode (only the rows and
  iMCU columns the crop needs, power-of-two DCT scaling where the resize still shrinks 4-5x after it)
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

The package's modules, one job each: ``contract`` (the options, layouts, statuses and result both
backends share), ``decoder`` (which backend runs, the argument checks, the public calls), ``native``
(the engine path: its parameter structs and calls) and ``pillow`` (the Pillow path).
"""

# The enums' one definition, and the engine's structs, as the tests reach them through this package.
from fastload import engine_abi as engine_abi
from fastload.decode.contract import BatchResult, DecodeOptions, DecodeStatus, Layout
from fastload.decode.contract import _slice_entropy as _slice_entropy
from fastload.decode.decoder import (
    active_backend,
    decode_batch,
    decode_image,
    default_threads,
    engine_info,
    resize_encode_batch,
)
from fastload.decode.native import _native_geometry as _native_geometry
from fastload.decode.native import _native_options as _native_options
from fastload.decode.native import _native_output as _native_output
from fastload.engine import native

# The engine module itself (None without it), as the tests that call it directly reach it.
_engine = native()

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
