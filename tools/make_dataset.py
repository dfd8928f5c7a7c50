#!/usr/bin/env python3
"""Folder stage tool: writes realistic synthetic ImageNet-like JPEG folders, offline and reproducibly.

The pixels come from real photographs that installed packages ship (scikit-image's ``data`` folder,
matplotlib's ``sample_data``), never from the network. Each image is a random crop of one photo
(position, scale, aspect), resized to an ImageNet-train-like size, with occasional flips, quarter
turns, colour jitter, blur and sensor-like noise, then re-encoded by Pillow at a random quality and
chroma subsampling. Plain gradients or flat colours would compress to a few KB and make every
decode benchmark lie. The shipped photos are smoother than ImageNet's, so a fine detail layer
(texture photos' high frequencies) and grain raise the entropy: the default sizes average about
405x355 px and 85-90 KB a file (ImageNet train: about 400x350 px, 110 KB).

Image ``i`` is a pure function of ``(seed, i)`` (its own ``numpy.random.Generator(PCG64)``), so the
same seed and count give byte-identical files whatever the worker count, provided the same photos,
Pillow and libjpeg are installed.

Layout (what ImageFolder readers expect)::

    OUT/class_000/n01440764_0.JPEG
    OUT/class_001/n01441773_1.JPEG
    ...
    OUT/odd_files.json          (only with --odd: the deliberately odd files and their kinds)

Usage::

    python tools/make_dataset.py OUT --count N --seed S [--classes K] [--odd] [--workers W]
                                 [--quality-range 75 95] [--tiny] [--overwrite]
"""

from __future__ import annotations

import argparse
import enum
import functools
import io
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile, ImageFilter, ImageOps

__all__ = [
    "ODD_MANIFEST",
    "DatasetSpec",
    "OddKind",
    "SourcePhoto",
    "encode_jpeg",
    "format_summary",
    "main",
    "make_dataset",
    "render_image",
    "source_photos",
    "wnid",
]

ODD_MANIFEST = "odd_files.json"
# Distinct from any image index so the odd files' randomness never collides with image i's.
_ODD_STREAM = 0x0DD0
_CLASS_DIR = re.compile(r"^class_\d{3,}$")

# (file name, weight). Colour photographs dominate, as in ImageNet; grayscale textures are
# colourised so they add texture variety without adding grayscale images to the regular set.
_COLOR_PHOTOS = (
    ("astronaut.png", 1.0),
    ("chelsea.png", 1.0),
    ("coffee.png", 1.0),
    ("rocket.jpg", 1.0),
    ("motorcycle_left.png", 1.0),
    ("motorcycle_right.png", 0.5),
    ("hubble_deep_field.jpg", 0.8),
    ("retina.jpg", 0.6),
    ("ihc.png", 0.6),
    ("color.png", 0.2),
    ("grace_hopper.jpg", 1.0),
)
_GRAY_PHOTOS = (
    ("grass.png", 0.5),
    ("gravel.png", 0.5),
    ("brick.png", 0.5),
    ("camera.png", 0.4),
    ("coins.png", 0.3),
    ("moon.png", 0.2),
)
# Photos whose fine structure (stones, blades of grass) serves as the detail layer.
_TEXTURES = ("grass.png", "gravel.png")
_SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}
_RESAMPLE = (Image.BILINEAR, Image.BICUBIC, Image.LANCZOS)
# Pillow's default ImageFile.MAXBLOCK, fixed here: the encode decision must not follow a global.
_PILLOW_MIN_BLOCK = 65536
_MAXBLOCK_LOCK = threading.Lock()  # guards temporary changes of Pillow's global ImageFile.MAXBLOCK


class OddKind(str, enum.Enum):
    """The odd files ``--odd`` adds; the value is the ``kind`` field of ``odd_files.json``."""

    GRAYSCALE = "grayscale"  # a valid baseline JPEG with one component (Pillow mode L)
    CMYK = "cmyk"  # a valid four-component Adobe JPEG (Pillow mode CMYK)
    PROGRESSIVE = "progressive"  # a valid progressive (SOF2) RGB JPEG
    PNG = "png"  # a valid PNG whose name says .JPEG
    TRUNCATED = "truncated"  # a JPEG cut in the middle of its entropy-coded data
    EMPTY = "empty"  # a zero-byte file
    TEXT = "text"  # a text file with an image name


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """What to generate; validated at construction.

    Args:
        count: Number of regular images (odd files come on top).
        seed: Seed of every random choice; image ``i`` depends only on ``(seed, i)``.
        classes: Number of class folders; image ``i`` goes to class ``i % classes``.
        odd: Also write the odd files listed in :class:`OddKind` and ``odd_files.json``.
        tiny: Small images (about 60-200 px a side) for fast tests, instead of ImageNet sizes.
        quality_range: Inclusive range the JPEG quality is drawn from, uniformly.
    """

    count: int
    seed: int = 0
    classes: int = 10
    odd: bool = False
    tiny: bool = False
    quality_range: tuple[int, int] = (75, 95)

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 1:
            raise ValueError(f"count={self.count!r} must be an int >= 1")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be an int >= 0")
        if not isinstance(self.classes, int) or not 1 <= self.classes <= 50000:
            # Bounded so every synset-style name keeps its 8 digits (see wnid).
            raise ValueError(f"classes={self.classes!r} must be an int in [1, 50000]")
        lo, hi = (int(q) for q in self.quality_range)
        if not 1 <= lo <= hi <= 100:
            raise ValueError(f"quality_range={self.quality_range!r} must satisfy 1 <= low <= high <= 100")
        object.__setattr__(self, "quality_range", (lo, hi))


@dataclass(frozen=True)
class SourcePhoto:
    """One installed photograph: its file name, pixels (RGB or L, loaded, shared read-only) and weight."""

    name: str
    image: Image.Image  # RGB or L, fully loaded, shared read-only between threads
    weight: float


def _photo_dirs() -> list[str]:
    dirs = []
    try:
        import skimage  # imported lazily: only to locate its data folder

        dirs.append(os.path.join(os.path.dirname(skimage.__file__), "data"))
    except ImportError:
        pass
    try:
        import matplotlib  # imported lazily: only to locate its sample data

        dirs.append(os.path.join(matplotlib.get_data_path(), "sample_data"))
    except ImportError:
        pass
    return dirs


@functools.lru_cache(maxsize=1)
def source_photos() -> tuple[SourcePhoto, ...]:
    """The installed photographs the images are cut from, in a fixed order.

    Returns:
        The photos found, colour ones first; grayscale textures are used only when present.

    Raises:
        RuntimeError: No photograph was found (neither scikit-image nor matplotlib is installed).
    """
    dirs = _photo_dirs()
    found = []
    for name, weight in _COLOR_PHOTOS + _GRAY_PHOTOS:
        for d in dirs:
            path = os.path.join(d, name)
            if os.path.isfile(path):
                with Image.open(path) as im:
                    mode = "L" if im.mode in ("L", "I;16", "I", "1") else "RGB"
                    img = im.convert(mode)
                img.load()
                found.append(SourcePhoto(name, img, weight))
                break
    if not found:
        raise RuntimeError(
            "make_dataset: no source photographs found. It cuts images from the photos shipped with "
            "scikit-image (skimage/data/*.png|jpg) or matplotlib (mpl-data/sample_data/grace_hopper.jpg); "
            f"install one of them (pip install scikit-image). Looked in: {dirs or 'nothing importable'}"
        )
    return tuple(found)


def wnid(class_index: int) -> str:
    """An ImageNet-style synset id (``n`` + 8 digits) for a class folder; fixed per class index."""
    return f"n{1440764 + 1009 * class_index:08d}"


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *stream])))


def _draw_size(rng: np.random.Generator, tiny: bool) -> tuple[int, int]:
    """An ImageNet-train-like (width, height): mostly 4:3 landscape, some portrait and square."""
    long_side = float(np.exp(rng.normal(np.log(425.0), 0.25)))
    shape = rng.random()
    ratio = float(np.clip(rng.normal(0.72, 0.07), 0.5, 0.95)) if shape < 0.88 else float(rng.uniform(0.95, 1.0))
    if shape < 0.64 or shape >= 0.88:
        w, h = long_side, long_side * ratio
    else:
        w, h = long_side * ratio, long_side
    if tiny:
        return int(np.clip(w * 0.3, 60, 200)), int(np.clip(h * 0.3, 60, 200))
    return int(np.clip(w, 200, 700)), int(np.clip(h, 150, 600))


def _pick_photo(rng: np.random.Generator, photos: Sequence[SourcePhoto]) -> SourcePhoto:
    weights = np.array([p.weight for p in photos])
    return photos[int(rng.choice(len(photos), p=weights / weights.sum()))]


@functools.lru_cache(maxsize=1)
def _texture_tiles() -> tuple[Image.Image, ...]:
    """Grayscale textures mirrored 2x2, so a crop can be larger than the photo and squeezed finer."""
    photos = source_photos()
    chosen = [p.image for p in photos if p.name in _TEXTURES] or [p.image for p in photos]
    tiles = []
    for img in chosen:
        gray = img.convert("L")
        w, h = gray.size
        tile = Image.new("L", (2 * w, 2 * h))
        tile.paste(gray, (0, 0))
        tile.paste(gray.transpose(Image.FLIP_LEFT_RIGHT), (w, 0))
        tile.paste(gray.transpose(Image.FLIP_TOP_BOTTOM), (0, h))
        tile.paste(gray.transpose(Image.ROTATE_180), (w, h))
        tile.load()
        tiles.append(tile)
    return tuple(tiles)


def _detail_layer(rng: np.random.Generator, width: int, height: int, amplitude: float) -> np.ndarray:
    """Zero-mean fine detail (float32 [H, W]) of the given standard deviation, from a texture photo."""
    tiles = _texture_tiles()
    tex = tiles[int(rng.integers(len(tiles)))]
    tw, th = tex.size
    # Squeezing more texture than the output holds (zoom < 1) puts the energy in the mid-high
    # DCT frequencies that survive quantisation, which is where real photos spend their bytes.
    zoom = float(rng.uniform(0.6, 1.1))
    cw, ch = min(tw, width / zoom), min(th, height / zoom)
    x0, y0 = rng.uniform(0, tw - cw), rng.uniform(0, th - ch)
    crop = tex.resize((width, height), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
    low = crop.filter(ImageFilter.GaussianBlur(float(rng.uniform(2.0, 5.0))))
    high = np.asarray(crop, dtype=np.float32) - np.asarray(low, dtype=np.float32)
    return high * np.float32(amplitude / (float(high.std()) + 1e-3))


def render_image(width: int, height: int, *, seed: int = 0, rng: np.random.Generator | None = None) -> Image.Image:
    """A natural-looking RGB image of the given size, cut from the installed photographs.

    Args:
        width: Output width in pixels (>= 1).
        height: Output height in pixels (>= 1).
        seed: Seed used when ``rng`` is not given.
        rng: Generator to draw every choice from (lets callers own the stream).

    Returns:
        A ``PIL.Image`` in mode RGB.
    """
    if width < 1 or height < 1:
        raise ValueError(f"width={width!r} and height={height!r} must be >= 1")
    rng = rng if rng is not None else _rng(seed)
    photo = _pick_photo(rng, source_photos())
    src = photo.image
    sw, sh = src.size
    quarter_turn = rng.random() < 0.08
    # A quarter turn swaps the axes, so the crop is cut with the transposed aspect.
    aspect = (height / width if quarter_turn else width / height) * float(np.exp(rng.uniform(-0.15, 0.15)))
    area = rng.uniform(0.15, 1.0) * sw * sh
    cw, ch = np.sqrt(area * aspect), np.sqrt(area / aspect)
    shrink = max(cw / sw, ch / sh, 1.0)
    cw, ch = cw / shrink, ch / shrink
    x0, y0 = rng.uniform(0, max(sw - cw, 0.0)), rng.uniform(0, max(sh - ch, 0.0))
    resample = _RESAMPLE[int(rng.integers(len(_RESAMPLE)))]
    out_size = (height, width) if quarter_turn else (width, height)
    img = src.resize(out_size, resample, box=(x0, y0, x0 + cw, y0 + ch))
    if quarter_turn:
        img = img.transpose(Image.ROTATE_90 if rng.random() < 0.5 else Image.ROTATE_270)
    if img.mode == "L":
        dark = tuple(int(v) for v in rng.integers(0, 90, 3))
        light = tuple(int(v) for v in rng.integers(150, 256, 3))
        img = ImageOps.colorize(img, black=dark, white=light)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    upscale = max(width / cw, height / ch) if not quarter_turn else max(width / ch, height / cw)
    if rng.random() < 0.15:
        img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.4, 1.0))))
    elif upscale > 1.2:
        # Upscaled crops are softer than ImageNet's (mostly downscaled) photos; restore edges.
        img = img.filter(
            ImageFilter.UnsharpMask(
                radius=float(rng.uniform(1.0, 2.5)), percent=int(rng.integers(60, 160)), threshold=2
            )
        )
    arr = np.asarray(img, dtype=np.float32)
    if rng.random() < 0.6:
        # Elementwise, not a BLAS matmul: BLAS kernels may round differently per CPU or thread count.
        gray = arr[..., 0] * np.float32(0.299) + arr[..., 1] * np.float32(0.587) + arr[..., 2] * np.float32(0.114)
        sat = np.float32(rng.uniform(0.7, 1.3))
        arr = gray[..., None] + (arr - gray[..., None]) * sat
        mean = np.float32(gray.mean())
        arr = (arr - mean) * np.float32(rng.uniform(0.85, 1.2)) + mean + np.float32(rng.uniform(-20, 20))
        arr *= (1.0 + rng.normal(0.0, 0.05, 3)).astype(np.float32)
    # The photos are smoother than ImageNet's (mostly downscaled camera shots) and compress to
    # a third of its ~0.6-0.8 bytes/pixel. A natural texture's fine detail plus sensor-like grain,
    # both mostly on luminance, bring the JPEG entropy (and so the decode cost) to that level.
    # Headroom first: detail added onto clipped highlights or shadows would be lost again.
    arr = arr * np.float32(0.84) + np.float32(20.0)
    arr += _detail_layer(rng, width, height, float(rng.uniform(22.0, 46.0)))[..., None]
    # A weaker, independent layer along one random chroma direction: real textures vary in hue too.
    tint = rng.normal(0.0, 1.0, 3)
    tint = (tint - tint.mean()) / (np.linalg.norm(tint - tint.mean()) + 1e-6) * np.sqrt(1.5)
    arr += _detail_layer(rng, width, height, float(rng.uniform(12.0, 30.0)))[..., None] * tint.astype(np.float32)
    sigma = float(np.exp(rng.uniform(np.log(6.0), np.log(18.0))))
    arr += rng.standard_normal((height, width, 1), dtype=np.float32) * np.float32(sigma)
    arr += rng.standard_normal((height, width, 3), dtype=np.float32) * np.float32(sigma * 0.4)
    return Image.fromarray(np.clip(arr + 0.5, 0, 255).astype(np.uint8), "RGB")


def encode_jpeg(
    img: Image.Image,
    *,
    quality: int = 90,
    subsampling: str = "4:2:0",
    mode: str = "RGB",
    progressive: bool = False,
    optimize: bool = False,
) -> bytes:
    """Encode an image as JPEG bytes with Pillow.

    Args:
        img: Source image (any mode Pillow can convert to ``mode``).
        quality: JPEG quality 1-100.
        subsampling: ``"4:2:0"``, ``"4:2:2"`` or ``"4:4:4"`` (ignored for mode L).
        mode: ``"RGB"``, ``"L"`` (one component) or ``"CMYK"`` (four components).
        progressive: Write a progressive (SOF2) JPEG.
        optimize: Optimised Huffman tables.

    Returns:
        The encoded bytes.
    """
    if subsampling not in _SUBSAMPLING:
        raise ValueError(f"subsampling={subsampling!r} must be one of {sorted(_SUBSAMPLING)}")
    if mode not in ("RGB", "L", "CMYK"):
        raise ValueError(f"mode={mode!r} must be 'RGB', 'L' or 'CMYK'")
    img = img.convert(mode)
    kwargs = {"quality": int(quality)}
    if mode != "L":
        kwargs["subsampling"] = _SUBSAMPLING[subsampling]
    buf = io.BytesIO()
    img.save(buf, format="JPEG", **kwargs)
    baseline = buf.getvalue()
    if not (optimize or progressive):
        return baseline
    # Pillow encodes optimised or progressive JPEGs in one buffer of about one byte per pixel
    # (two from quality 95, four for CMYK) and fails with "Suspension not allowed" beyond it.
    # The baseline size tells whether the other encoding fits: optimised Huffman tables shrink
    # the data, and a progressive file is within a few percent of the baseline one.
    per_pixel = 4 if mode == "CMYK" else (2 if quality >= 95 else 1)
    fits = len(baseline) <= 0.9 * max(per_pixel * img.size[0] * img.size[1], _PILLOW_MIN_BLOCK)
    if not progressive and not fits:
        return baseline  # a fixed rule, so datasets stay reproducible; the file is just unoptimised
    buf = io.BytesIO()
    if fits:
        img.save(buf, format="JPEG", optimize=bool(optimize), progressive=bool(progressive), **kwargs)
        return buf.getvalue()
    # Pillow sizes that buffer from ImageFile.MAXBLOCK when it is larger. A bigger buffer changes
    # no byte of any file, so raising it briefly cannot disturb other threads' encodes.
    with _MAXBLOCK_LOCK:
        saved = ImageFile.MAXBLOCK
        ImageFile.MAXBLOCK = max(saved, 2 * len(baseline) + 65536)
        try:
            img.save(buf, format="JPEG", optimize=bool(optimize), progressive=True, **kwargs)
        finally:
            ImageFile.MAXBLOCK = saved
    return buf.getvalue()


def _image_file(spec: DatasetSpec, index: int) -> tuple[str, bytes, int, int]:
    """Relative path, bytes, width and height of regular image ``index``."""
    rng = _rng(spec.seed, index)
    width, height = _draw_size(rng, spec.tiny)
    img = render_image(width, height, rng=rng)
    u = rng.random()
    subsampling = "4:2:0" if u < 0.85 else ("4:4:4" if u < 0.95 else "4:2:2")
    quality = int(rng.integers(spec.quality_range[0], spec.quality_range[1] + 1))
    data = encode_jpeg(img, quality=quality, subsampling=subsampling, optimize=bool(rng.random() < 0.1))
    cls = index % spec.classes
    return f"class_{cls:03d}/{wnid(cls)}_{index}.JPEG", data, width, height


def _truncate_in_entropy_data(data: bytes) -> bytes:
    """Cut a baseline JPEG halfway through the entropy-coded segment that follows its SOS header."""
    sos = data.find(b"\xff\xda")
    if sos < 0:
        raise ValueError("no SOS marker in the JPEG to truncate")
    scan_start = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    return data[: scan_start + (len(data) - 2 - scan_start) // 2]


def _odd_files(spec: DatasetSpec) -> list[tuple[str, str, bytes, dict]]:
    """(relative path, kind value, bytes, extra manifest fields) of each odd file."""
    out = []
    size = (150, 110) if spec.tiny else (320, 240)
    for j, kind in enumerate(OddKind):
        rng = _rng(spec.seed, _ODD_STREAM, j)
        img = render_image(*size, rng=rng)
        quality = int(rng.integers(spec.quality_range[0], spec.quality_range[1] + 1))
        extra: dict = {"format": "JPEG", "decodable": True}
        if kind == OddKind.GRAYSCALE:
            data = encode_jpeg(img, quality=quality, mode="L")
            extra["mode"] = "L"
        elif kind == OddKind.CMYK:
            data = encode_jpeg(img, quality=quality, mode="CMYK", subsampling="4:4:4")
            extra["mode"] = "CMYK"
        elif kind == OddKind.PROGRESSIVE:
            data = encode_jpeg(img, quality=quality, progressive=True)
            extra["mode"] = "RGB"
        elif kind == OddKind.PNG:
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            data = buf.getvalue()
            extra.update(format="PNG", mode="RGB")
        elif kind == OddKind.TRUNCATED:
            data = _truncate_in_entropy_data(encode_jpeg(img, quality=quality))
            extra.update(mode="RGB", decodable=False)
        elif kind == OddKind.EMPTY:
            data = b""
            extra.update(format=None, decodable=False)
        else:
            data = (
                b"This is not an image. Real crawls contain HTML error pages and notes\n"
                b"saved under image names; a loader must report, not crash on, this file.\n"
            )
            extra.update(format=None, decodable=False)
        # Numbered after the regular images, in ordinary-looking names: a reader cannot tell
        # them apart by name, exactly as in real crawls. Some carry the lower-case .jpg suffix.
        index = spec.count + j
        cls = index % spec.classes
        suffix = ".jpg" if kind in (OddKind.CMYK, OddKind.TEXT) else ".JPEG"
        out.append((f"class_{cls:03d}/{wnid(cls)}_{index}{suffix}", kind.value, data, extra))
    return out


def _prepare_out(out: str, overwrite: bool) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise FileExistsError(f"make_dataset: {out} exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out):
        if not overwrite:
            raise FileExistsError(f"make_dataset: {out} is not empty; pass --overwrite (overwrite=True) to replace it")
        # Remove only what this tool writes: never a user's unrelated files.
        for name in os.listdir(out):
            path = os.path.join(out, name)
            if _CLASS_DIR.match(name) and os.path.isdir(path):
                shutil.rmtree(path)
            elif name == ODD_MANIFEST:
                os.remove(path)
    os.makedirs(out, exist_ok=True)


def _write(path: str, data: bytes) -> None:
    tmp = path + ".part"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def make_dataset(
    out: str,
    *,
    count: int,
    seed: int = 0,
    classes: int = 10,
    odd: bool = False,
    workers: int | None = None,
    tiny: bool = False,
    quality_range: tuple[int, int] = (75, 95),
    overwrite: bool = False,
    quiet: bool = True,
) -> dict[str, object]:
    """Write an ImageFolder tree of realistic JPEGs (and, with ``odd``, the odd files).

    Args:
        out: Output folder; created if missing, must be empty unless ``overwrite``.
        count: Number of regular images.
        seed: Seed; the same ``(seed, count, classes, tiny, quality_range)`` gives identical bytes.
        classes: Number of class folders ``class_000 .. class_{K-1}``.
        odd: Also write the odd files and ``odd_files.json`` at the root.
        workers: Threads encoding in parallel (Pillow releases the GIL); default all cores.
        tiny: Small images for fast tests.
        quality_range: Inclusive JPEG quality range.
        overwrite: Replace the class folders and manifest of an existing dataset in ``out``.
        quiet: Do not print progress and the summary.

    Returns:
        A summary dict: ``out``, ``count``, ``classes``, ``mean_width``, ``mean_height``,
        ``mean_kb``, ``total_mb``, ``seconds``, ``workers``, ``odd`` (list of ``{path, kind, ...}``).

    Raises:
        ValueError: A bad argument.
        FileExistsError: ``out`` is not empty and ``overwrite`` is false.
        RuntimeError: No source photographs are installed.
    """
    spec = DatasetSpec(count=count, seed=seed, classes=classes, odd=odd, tiny=tiny, quality_range=tuple(quality_range))
    workers = workers if workers is not None else (os.cpu_count() or 1)
    if workers < 1:
        raise ValueError(f"workers={workers!r} must be >= 1")
    # Fail before touching the output folder when there is nothing to cut from; warm the caches
    # here, once, rather than racing to fill them from every worker thread.
    source_photos()
    _texture_tiles()
    start = time.perf_counter()
    out = os.fspath(out)
    _prepare_out(out, overwrite)
    # Only classes that receive a file get a folder: ImageFolder readers reject empty classes.
    for cls in sorted(
        {i % spec.classes for i in range(min(spec.count, spec.classes))}
        | ({(spec.count + j) % spec.classes for j in range(len(OddKind))} if spec.odd else set())
    ):
        os.makedirs(os.path.join(out, f"class_{cls:03d}"), exist_ok=True)

    def one(index: int) -> tuple[int, int, int]:
        rel, data, width, height = _image_file(spec, index)
        _write(os.path.join(out, rel), data)
        return width, height, len(data)

    stats = np.zeros((spec.count, 3), dtype=np.int64)
    step = max(spec.count // 10, 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="make_dataset") as pool:
        try:
            for i, row in enumerate(pool.map(one, range(spec.count))):
                stats[i] = row
                if not quiet and spec.count >= 500 and (i + 1) % step == 0:
                    print(f"  {i + 1}/{spec.count} images", file=sys.stderr, flush=True)
        except BaseException:
            # A failed image (or Ctrl-C) stops the run now instead of after every queued image.
            pool.shutdown(wait=True, cancel_futures=True)
            raise

    odd_entries = []
    if spec.odd:
        for rel, kind, data, extra in _odd_files(spec):
            _write(os.path.join(out, rel), data)
            odd_entries.append({"path": rel, "kind": kind, "bytes": len(data), **extra})
        manifest = {"version": 1, "seed": spec.seed, "count": spec.count, "files": odd_entries}
        with open(os.path.join(out, ODD_MANIFEST), "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.write("\n")

    summary = {
        "out": out,
        "count": spec.count,
        "classes": spec.classes,
        "seed": spec.seed,
        "tiny": spec.tiny,
        "mean_width": float(stats[:, 0].mean()),
        "mean_height": float(stats[:, 1].mean()),
        "mean_kb": float(stats[:, 2].mean() / 1000.0),
        "total_mb": float(stats[:, 2].sum() / 1e6),
        "seconds": time.perf_counter() - start,
        "workers": workers,
        "odd": odd_entries,
    }
    if not quiet:
        print(format_summary(summary), flush=True)
    return summary


def format_summary(summary: dict[str, object]) -> str:
    """Human-readable lines for a :func:`make_dataset` summary."""
    lines = [
        f"wrote {summary['count']} images in {summary['classes']} classes to {summary['out']}: "
        f"mean {summary['mean_width']:.0f}x{summary['mean_height']:.0f} px, "
        f"mean {summary['mean_kb']:.1f} KB, total {summary['total_mb']:.1f} MB, "
        f"{summary['seconds']:.1f} s with {summary['workers']} workers"
    ]
    for entry in summary["odd"]:  # type: ignore[union-attr]
        lines.append(f"  odd file ({entry['kind']}): {entry['path']} ({entry['bytes']} bytes)")
    if summary["odd"]:
        lines.append(f"  odd files listed in {os.path.join(str(summary['out']), ODD_MANIFEST)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="make_dataset.py", description="Write a realistic synthetic ImageNet-like JPEG folder (no network needed)."
    )
    parser.add_argument("out", help="output folder (must be empty unless --overwrite)")
    parser.add_argument("--count", type=int, required=True, help="number of regular images")
    parser.add_argument("--seed", type=int, default=0, help="seed; same seed and count give identical files")
    parser.add_argument("--classes", type=int, default=10, help="number of class folders (default 10)")
    parser.add_argument(
        "--odd",
        action="store_true",
        help="also add grayscale, CMYK, progressive, PNG-named-JPEG, truncated, empty and text files",
    )
    parser.add_argument("--workers", type=int, default=None, help="encoding threads (default: all cores)")
    parser.add_argument(
        "--quality-range",
        type=int,
        nargs=2,
        default=(75, 95),
        metavar=("LOW", "HIGH"),
        help="inclusive JPEG quality range (default 75 95)",
    )
    parser.add_argument("--tiny", action="store_true", help="small images (60-200 px) for fast tests")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset in OUT")
    args = parser.parse_args(argv)
    try:
        make_dataset(
            args.out,
            count=args.count,
            seed=args.seed,
            classes=args.classes,
            odd=args.odd,
            workers=args.workers,
            tiny=args.tiny,
            quality_range=tuple(args.quality_range),
            overwrite=args.overwrite,
            quiet=False,
        )
    except (ValueError, FileExistsError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
