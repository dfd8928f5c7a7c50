"""Write stage, per image: check that a file is a decodable image and turn it into the RGB JPEG bytes to store.

The hot path is pass-through of valid baseline/progressive colour JPEGs: their markers are parsed up
to the first scan (frame size, components, precision) and the file must end with the end-of-image
marker; the bytes are then stored untouched, with no decode. Anything the cheap check cannot vouch
for gets a full Pillow decode: if that works the image is converted to RGB JPEG (grayscale, CMYK,
PNG and other formats: counted per kind), otherwise the file is skipped with Pillow's reason. An
image whose header declares more than ``max_pixels`` pixels (a decompression bomb) is refused from
its header in every mode, before anything decodes it.
``--resize`` decodes everything and re-encodes: colour JPEGs through the C++ engine (one GIL-free
call per batch of files: decode, antialiased bilinear resize, libjpeg-turbo encode) when it is
built, everything else through Pillow (with JPEG DCT scaling when it shrinks by 2x or more).

An optional ``transcode`` hook (e.g. adding restart markers) runs on the final JPEG bytes.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "NOT_INDEXED",
    "BadImage",
    "ConvertOptions",
    "Converted",
    "JpegInfo",
    "cheap_info",
    "convert_image",
    "convert_images",
    "inspect_jpeg",
    "jpeg_frame_size",
    "too_many_pixels",
]

Transcode = Callable[[Any], bytes]
Buffer = bytes | bytearray | memoryview
DEFAULT_MAX_PIXELS = 89_478_485  # the decoder's default (fastload.decode.DecodeOptions.max_pixels), Pillow's
NOT_INDEXED = "not_restart_indexed"

# SOF markers that carry a frame header (DHT C4, JPG C8 and DAC CC are not frames).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_LOSSLESS = frozenset({0xC3, 0xC7, 0xCB, 0xCF})
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01, 0xD8}
_U16 = struct.Struct(">H")


class BadImage(Exception):
    """The file is not an image fastload can store; the message is the reason."""


@dataclass(frozen=True, kw_only=True)
class ConvertOptions:
    """How images are stored.

    Attributes:
        resize: Shorter side in pixels, or None to keep the size (and pass valid JPEGs through).
        quality: JPEG quality of re-encoded images (1-100).
        transcode: Optional hook applied to every stored JPEG (bytes -> bytes).
        max_pixels: Largest ``width * height`` a stored image may declare in its header; larger
            ones (decompression bombs) are refused from the header, before any decode.
    """

    resize: int | None = None
    quality: int = 95
    transcode: Transcode | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if self.resize is not None and (not isinstance(self.resize, int) or self.resize < 1):
            raise ValueError(f"resize={self.resize!r} must be a positive int or None")
        if not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
            raise ValueError(f"quality={self.quality!r} must be an int in 1..100")
        if not isinstance(self.max_pixels, int) or isinstance(self.max_pixels, bool) or self.max_pixels < 1:
            raise ValueError(f"max_pixels={self.max_pixels!r} must be a positive int")


@dataclass(frozen=True)
class JpegInfo:
    """What the marker walk found: frame size, components, precision, progressive, lossless."""

    width: int
    height: int
    components: int
    precision: int
    progressive: bool
    lossless: bool


@dataclass(frozen=True)
class Converted:
    """Result for one file.

    Attributes:
        data: The JPEG bytes to store (None when skipped).
        kind: What was done: ``"pass"``, ``"resized"``, or the conversion (``"grayscale"``,
            ``"cmyk"``, ``"png"``, ...); for skipped files, None.
        reason: Why the file was skipped (None otherwise).
        note: A counted remark (``NOT_INDEXED``: the transcode hook refused the image).
    """

    data: Buffer | None
    kind: str | None
    reason: str | None = None
    note: str | None = None


def inspect_jpeg(data: Buffer) -> JpegInfo | None:
    """Walk a JPEG's markers up to the first scan.

    Returns:
        The frame description, or None when the bytes do not start like a JPEG.

    Raises:
        BadImage: A JPEG whose header is damaged or cut short, or that lacks its end marker.
    """
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    pos = 2
    info: JpegInfo | None = None
    while True:
        if pos + 4 > n:
            raise BadImage("truncated JPEG (header cut short)")
        if data[pos] != 0xFF:
            raise BadImage(f"corrupt JPEG header (no marker at byte {pos})")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker == 0xD9:
            raise BadImage("JPEG ends before any image data")
        seglen = _U16.unpack_from(data, pos + 2)[0]
        if seglen < 2 or pos + 2 + seglen > n:
            raise BadImage("truncated JPEG (header segment cut short)")
        if marker in _SOF:
            if seglen < 8:
                raise BadImage("corrupt JPEG frame header")
            precision = data[pos + 4]
            height, width = struct.unpack_from(">HH", data, pos + 5)
            info = JpegInfo(
                width=width,
                height=height,
                components=data[pos + 9],
                precision=precision,
                progressive=marker in (0xC2, 0xC6, 0xCA, 0xCE),
                lossless=marker in _LOSSLESS,
            )
        elif marker == 0xDA:
            if info is None:
                raise BadImage("corrupt JPEG (scan before frame header)")
            break
        pos += 2 + seglen
    # Entropy-coded data never contains FF D9 (0xFF is always stuffed), so a file whose last bytes
    # (ignoring zero padding some writers add) are not EOI was cut short.
    if not bytes(data[-64:]).rstrip(b"\0").endswith(b"\xff\xd9"):
        raise BadImage("truncated JPEG (no end-of-image marker)")
    return info


def too_many_pixels(width: int, height: int, max_pixels: int) -> str | None:
    """The refusal reason for an image of ``width`` x ``height`` above ``max_pixels``, else None."""
    if width * height > max_pixels:
        return (
            f"image is {width}x{height} = {width * height} pixels, above max_pixels={max_pixels} (decompression bomb?)"
        )
    return None


def jpeg_frame_size(data: Buffer) -> tuple[int, int] | None:
    """``(width, height)`` from a JPEG's frame header (markers walked up to it), or None when not found.

    Cheaper than :func:`inspect_jpeg` (no end-marker check): for records the engine already
    checked, whose declared size must still be bounded.
    """
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    pos = 2
    while pos + 9 < n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in _SOF:
            height, width = struct.unpack_from(">HH", data, pos + 5)
            return width, height
        if marker in (0xDA, 0xD9):
            return None
        pos += 2 + _U16.unpack_from(data, pos + 2)[0]
    return None


# Pillow is imported where an image is really decoded or encoded: valid JPEGs packed as they are
# never need it, and its import is a measurable part of a short pack's run time.


def _encode(img: Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _resized_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    # im2rec's arithmetic: the shorter side becomes `shorter`, the other scales with floor division.
    if height > width:
        return shorter, height * shorter // width
    return width * shorter // height, shorter


def _decode_full(data: Buffer, max_pixels: int, draft_to: int | None = None) -> Image.Image:
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))  # reads the header only
        fmt = (img.format or "unknown").lower()
        bomb = too_many_pixels(img.width, img.height, max_pixels)
        if bomb is not None:
            raise BadImage(bomb)
        if draft_to is not None and img.format == "JPEG":
            w, h = _resized_size(img.width, img.height, draft_to)
            img.draft("RGB", (w, h))
        img.load()
    except UnidentifiedImageError:
        raise BadImage("not an image (unrecognized format)") from None
    except (OSError, ValueError, SyntaxError, struct.error, Image.DecompressionBombError) as exc:
        raise BadImage(f"undecodable image: {exc}") from None
    img.info["fastload_format"] = fmt
    return img


def _kind_of(img: Image.Image) -> str:
    fmt = img.info.get("fastload_format", "unknown")
    if fmt != "jpeg":
        return fmt
    if img.mode in ("L", "1", "I;16", "I", "F", "LA"):
        return "grayscale"
    if img.mode == "CMYK":
        return "cmyk"
    return f"jpeg-{img.mode.lower()}"


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I", "F"):
        img = img.point(lambda v: v / 256) if img.mode == "I;16" else img
        img = img.convert("L")
    return img.convert("RGB")


def _engine_resize_encode() -> Callable[[Sequence[Buffer], int, int], list[bytes | None]] | None:
    """The C++ engine's batch decode + resize + re-encode when it is live now, else None.

    The returned function takes ``(images, shorter, quality)`` and gives one JPEG ``bytes`` per
    image, or None where the engine could not do it (the Pillow path then decides). It runs with
    ``threads=1``: on the calling thread, with that thread's own decompressor and compressor, so the
    pack's converter threads call it concurrently, each with the GIL released for its whole batch.
    Asked per call, not cached: ``FASTLOAD_DECODER=pillow`` may be set at any time.
    """
    try:
        import fastload.decode as decode
    except ImportError:
        return None
    if decode.active_backend() != "libjpeg-turbo":
        return None

    def fn(images: Sequence[Buffer], shorter: int, quality: int) -> list[bytes | None]:
        return decode.resize_encode_batch(images, shorter=shorter, quality=quality, threads=1)

    return fn


def cheap_info(data: Buffer, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[JpegInfo | None, bool]:
    """The marker walk's verdict: (info, True) for an 8-bit colour JPEG the engine can take as is.

    Raises:
        BadImage: A header that declares more than ``max_pixels`` pixels.
    """
    try:
        info = inspect_jpeg(data)
    except BadImage:
        return None, False
    if info is not None:
        bomb = too_many_pixels(info.width, info.height, max_pixels)
        if bomb is not None:
            raise BadImage(bomb)
    ok = (
        info is not None
        and info.components == 3
        and info.precision == 8
        and not info.lossless
        and info.width > 0
        and info.height > 0
    )
    return info, ok


def _engine_ready(data: Buffer, max_pixels: int) -> bool:
    try:
        return cheap_info(data, max_pixels)[1]
    except BadImage:
        return False


def _finish(out: Buffer, kind: str, options: ConvertOptions) -> Converted:
    if options.transcode is not None:
        try:
            out = options.transcode(out)
        except ValueError:
            # The image stays valid, just without restart markers: store it as is and count it.
            return Converted(out, kind, note=NOT_INDEXED)
    return Converted(out, kind)


def convert_images(datas: Sequence[Buffer], options: ConvertOptions) -> list[Converted]:
    """:func:`convert_image` over a batch of files' bytes, in order.

    With ``resize`` the colour JPEGs of the batch are decoded, resized and re-encoded by one
    GIL-free engine call (about twice the Pillow round trip's rate); every other file, and any the
    engine fails on, takes the per-image path.
    """
    fn = _engine_resize_encode() if options.resize is not None else None
    if fn is None or options.resize is None or not datas:
        return [convert_image(d, options) for d in datas]
    picks = [i for i, d in enumerate(datas) if d and _engine_ready(d, options.max_pixels)]
    done: dict[int, Converted] = {}
    if picks:
        for i, jpeg in zip(picks, fn([datas[i] for i in picks], options.resize, options.quality), strict=True):
            if jpeg is not None:
                done[i] = _finish(jpeg, "resized", options)
    return [done[i] if i in done else convert_image(d, options, use_engine=False) for i, d in enumerate(datas)]


def convert_image(data: Buffer, options: ConvertOptions, *, use_engine: bool = True) -> Converted:
    """Decide what to store for one file's bytes.

    Args:
        data: The file's bytes.
        options: How images are stored.
        use_engine: With ``resize``, try the C++ engine first (False: Pillow only, e.g. after the
            engine failed on this image).

    Returns:
        A :class:`Converted`; never raises for bad image bytes (the reason is in the result).
    """
    if not data:
        return Converted(None, None, "empty file (0 bytes)")
    try:
        _info, cheap_ok = cheap_info(data, options.max_pixels)
        if options.resize is None:
            if cheap_ok:
                out, kind = data, "pass"
            else:
                img = _decode_full(data, options.max_pixels)  # raises BadImage with Pillow's reason
                kind = _kind_of(img)
                if kind == "jpeg-rgb":
                    out, kind = data, "pass"  # odd markers or trailing bytes, but it decodes: keep the bytes
                else:
                    out = _encode(_to_rgb(img), options.quality)
        else:
            kind = "resized"
            fn = _engine_resize_encode() if cheap_ok and use_engine else None
            encoded = fn([data], options.resize, options.quality)[0] if fn is not None else None
            if encoded is not None:
                out = encoded
            else:
                img = _to_rgb(_decode_full(data, options.max_pixels, draft_to=options.resize))
                size = _resized_size(img.width, img.height, options.resize)
                if img.size != size:
                    from PIL import Image

                    img = img.resize(size, Image.Resampling.BILINEAR)
                out = _encode(img, options.quality)
    except BadImage as exc:
        return Converted(None, None, str(exc))
    return _finish(out, kind, options)
