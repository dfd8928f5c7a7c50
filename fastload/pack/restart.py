"""Write stage: the lossless restart-marker transcode applied to each JPEG by ``fastload pack --restart-index``.

Why: Huffman decoding is sequential and is most of a JPEG decode's cost. With restart markers every
N MCUs (N dividing the MCU row width), the decode engine entropy-decodes only the intervals a crop
covers (``csrc/decode/restart_slice.h``). The transcode copies the DCT coefficients (no re-quantization), so
every image decodes bit-identically to its original; progressive JPEGs come out baseline. The record
stays a plain JPEG that MXNet, Pillow and every other reader decode.

Measured with libjpeg-turbo 2.1.5 on the ImageNet-like JPEGs of ``tools.make_dataset``
(one core, medians): the transcode runs at ~400 images/s (~220 with verification); files come out
1.6% *smaller* than their originals, because the optimized Huffman tables save more than the markers
cost (+1.5% against the same tables with one interval per MCU row); a progressive input grows ~6%.
A full decode of a marked file is ~3-4% slower (libjpeg-turbo's fast Huffman path stops at every
marker), while a RandomResizedCrop slice decodes ~1.4x faster than a plain region decode.

Why opt-in rather than the default: it changes the stored bytes (a pass-through pack is otherwise
byte-identical to the source files), it makes packing CPU-bound (~2.5 ms per image per core), and
evaluation sets, which decode whole images, only pay the 3-4%. Use ``--restart-index`` for training
sets; leave it off for evaluation sets.

The packer calls a :class:`RestartTranscoder` once per image (from several converter threads: the
C++ call releases the GIL) and stores its :meth:`RestartTranscoder.manifest_entry` as the manifest's
``restart_index`` entry.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any

from fastload.engine import native, unavailable_reason
from fastload.engine_structs import from_native, to_native

__all__ = [
    "RestartIndexConfig",
    "RestartIndexError",
    "RestartTranscoder",
    "VerifyPolicy",
    "available",
    "manifest_settings",
    "restart_geometry",
    "transcode",
]

_JPEG_SOI = b"\xff\xd8"


class RestartIndexError(ValueError):
    """An image could not be transcoded losslessly (not a JPEG, libjpeg error, or a verify mismatch)."""


class VerifyPolicy(str, enum.Enum):
    """Which transcoded images are decoded and compared pixel for pixel with their originals."""

    SAMPLE = "sample"  # the first image, then one in `sample_every`: every shard gets samples
    ALL = "all"  # every image (`fastload pack --restart-index --verify`)


@dataclass(frozen=True, kw_only=True)
class RestartIndexConfig:
    """How ``pack --restart-index`` transcodes.

    Args:
        max_mcus: Upper bound on the restart interval in MCUs; the interval is the largest divisor
            of the MCU row width not above it. The default, 1 (a marker after every MCU), gives the
            tightest slices: on the generated ImageNet-like set, RandomResizedCrop(224)+flip ran
            1.5% (1 thread) and 5.8% (2 threads) faster than with intervals of up to 4 MCUs, while
            the files stay 0.7% smaller than the originals (the transcode optimizes the Huffman
            tables; up to 4 MCUs: 1.9% smaller). Larger values make slices coarser (1 interval per
            row: 1.08x over a plain region decode instead of ~1.3x).
        verify: :class:`VerifyPolicy` (or its string value).
        sample_every: With ``VerifyPolicy.SAMPLE``, verify one image in this many (and the first).
    """

    max_mcus: int = 1
    verify: VerifyPolicy = VerifyPolicy.SAMPLE
    sample_every: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.max_mcus, int) or isinstance(self.max_mcus, bool) or not 1 <= self.max_mcus <= 65535:
            raise ValueError(f"max_mcus={self.max_mcus!r} must be an int in [1, 65535]")
        try:
            object.__setattr__(self, "verify", VerifyPolicy(self.verify))
        except ValueError:
            raise ValueError(f"verify={self.verify!r} must be one of {[p.value for p in VerifyPolicy]}") from None
        if not isinstance(self.sample_every, int) or isinstance(self.sample_every, bool) or self.sample_every < 1:
            raise ValueError(f"sample_every={self.sample_every!r} must be a positive int")


def _engine() -> Any:
    engine = native()
    if engine is None:
        raise RestartIndexError(f"restart indexing needs the C++ engine: {unavailable_reason()}")
    return engine


def available() -> bool:
    """Whether the C++ engine (which has the restart-index functions) is loaded."""
    try:
        _engine()
    except RestartIndexError:
        return False
    return True


def transcode(
    image_bytes: bytes | memoryview, *, max_mcus: int = 1, verify: bool = False
) -> tuple[bytes, dict[str, Any]]:
    """Losslessly add restart markers to one JPEG.

    Args:
        image_bytes: The encoded JPEG (any buffer).
        max_mcus: Upper bound on the restart interval in MCUs.
        verify: Decode both versions fully and require bit-identical pixels.

    Returns:
        ``(jpeg_bytes, geometry)``; ``geometry`` holds the frame and MCU grid, ``restart_interval``,
        ``intervals_per_row``, ``source_progressive``, ``source_bytes``, ``output_bytes``, ``verified``.

    Raises:
        RestartIndexError: Not a JPEG, a libjpeg error (message included), or a verify mismatch.
    """
    view = memoryview(image_bytes)
    if view.nbytes < 2 or bytes(view[:2]) != _JPEG_SOI:
        raise RestartIndexError("not a JPEG (no SOI marker)")
    engine = _engine()
    options = to_native(engine, "TranscodeOptions", {"max_mcus": max_mcus, "verify": verify})
    try:
        data, geometry, notes = engine.add_restart_markers(view, options)
    except ValueError as exc:
        raise RestartIndexError(str(exc)) from None
    facts = {**from_native(geometry, "RestartGeometry"), **from_native(notes, "TranscodeNotes"), "verified": verify}
    return data, facts


def restart_geometry(image_bytes: bytes | memoryview) -> dict[str, Any] | None:
    """The restart geometry a JPEG's headers claim, or ``None`` when it has none (or is not sliceable)."""
    geometry = _engine().restart_geometry(memoryview(image_bytes))
    return None if geometry is None else from_native(geometry, "RestartGeometry")


def manifest_settings(config: RestartIndexConfig) -> dict[str, Any]:
    """The settings part of the manifest's ``restart_index`` entry (what a reader needs to know)."""
    return {
        "transcoder": "fastload._engine.add_restart_markers",
        "lossless": True,
        "max_mcus": config.max_mcus,
        "verified": config.verify.value,
        "sample_every": config.sample_every if config.verify is VerifyPolicy.SAMPLE else 1,
    }


class RestartTranscoder:
    """The packer's per-image hook: transcodes, verifies a sample (or all), and keeps the figures.

    Calling it returns the restart-indexed bytes, or raises :class:`RestartIndexError` when the
    image cannot be transcoded (not a JPEG, an unsupported JPEG such as 12-bit, a damaged source, or
    a verify mismatch): the packer then stores the original bytes unchanged and counts the record
    as not restart-indexed, so the shard stays correct and that record takes the plain decode path.
    Thread-safe (the C++ call releases the GIL, so converter threads run it in parallel).

    Args:
        config: The transcode settings.
    """

    def __init__(self, config: RestartIndexConfig = RestartIndexConfig()) -> None:
        _engine()  # fail at construction, not at the first image, when the engine is missing
        self.config = config
        self._lock = threading.Lock()
        self._seen = 0
        self._transcoded = 0
        self._verified = 0
        self._bytes_in = 0
        self._bytes_out = 0
        self._refused: dict[str, int] = {}
        self._first_refusal: str | None = None

    def __call__(self, image_bytes: bytes) -> bytes:
        """The restart-indexed JPEG for ``image_bytes``.

        Raises:
            RestartIndexError: The image cannot be transcoded; store the original.
        """
        with self._lock:
            position = self._seen
            self._seen += 1
        verify = self.config.verify is VerifyPolicy.ALL or position % self.config.sample_every == 0
        size = memoryview(image_bytes).nbytes
        try:
            data, geometry = transcode(image_bytes, max_mcus=self.config.max_mcus, verify=verify)
            if geometry["source_warnings"]:
                # A damaged source (e.g. truncated) would come out "repaired" with zero-filled
                # blocks; keep the original so `fastload verify --decode` still reports it.
                raise RestartIndexError(
                    f"source JPEG has corrupt data ({geometry['source_warnings']} libjpeg warnings)"
                )
        except RestartIndexError as exc:
            reason = str(exc)
            kind = (
                "not_jpeg"
                if reason.startswith("not a JPEG")
                else "verify_mismatch"
                if "identical" in reason
                else "corrupt_source"
                if reason.startswith("source JPEG has corrupt data")
                else "libjpeg_error"
            )
            with self._lock:
                self._refused[kind] = self._refused.get(kind, 0) + 1
                if self._first_refusal is None:
                    self._first_refusal = reason
            raise
        with self._lock:
            self._transcoded += 1
            self._verified += int(verify)
            self._bytes_in += size
            self._bytes_out += len(data)
        return data

    def manifest_entry(self) -> dict[str, Any]:
        """The manifest's ``restart_index`` entry: settings, verification and size figures."""
        with self._lock:
            overhead = (self._bytes_out / self._bytes_in - 1.0) * 100.0 if self._bytes_in else 0.0
            entry: dict[str, Any] = dict(manifest_settings(self.config))
            entry.update(
                {
                    "images": self._transcoded,
                    "verified_images": self._verified,
                    "not_indexed": dict(sorted(self._refused.items())),
                    "bytes_in": self._bytes_in,
                    "bytes_out": self._bytes_out,
                    "size_overhead_percent": round(overhead, 3),
                }
            )
            if self._first_refusal is not None:
                entry["first_refusal"] = self._first_refusal
            return entry
