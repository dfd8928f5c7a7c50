"""Tests of the data tool (tools/make_dataset.py): reproducibility, ImageNet-like statistics, odd files."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from tools import make_dataset as md

from conftest import load_odd_manifest, make_jpeg

NAME = re.compile(r"^n\d{8}_(\d+)\.(JPEG|jpg)$")


def _digests(root: Path) -> dict:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _images(root: Path):
    return sorted(p for p in root.glob("class_*/*") if p.is_file())


@pytest.fixture(scope="module")
def quality_of():
    """Maps a JPEG's luminance quantisation table back to the Pillow quality that produced it."""
    tables = {}
    probe = Image.new("RGB", (8, 8), (128, 128, 128))
    for q in range(1, 101):
        buf = io.BytesIO()
        probe.save(buf, format="JPEG", quality=q)
        tables.setdefault(tuple(Image.open(buf).quantization[0]), q)
    return lambda im: tables.get(tuple(im.quantization[0]))


def test_same_seed_same_bytes_whatever_the_workers(tmp_path):
    one = md.make_dataset(tmp_path / "w1", count=14, seed=5, classes=3, tiny=True, odd=True, workers=1)
    two = md.make_dataset(tmp_path / "w3", count=14, seed=5, classes=3, tiny=True, odd=True, workers=3)
    assert one["workers"] == 1 and two["workers"] == 3
    first, second = _digests(tmp_path / "w1"), _digests(tmp_path / "w3")
    assert len(first) == 14 + len(md.OddKind) + 1
    assert first == second


def test_image_depends_only_on_seed_and_index(tmp_path):
    md.make_dataset(tmp_path / "short", count=5, seed=9, classes=3, tiny=True, workers=1)
    md.make_dataset(tmp_path / "long", count=11, seed=9, classes=3, tiny=True, workers=2)
    md.make_dataset(tmp_path / "other", count=5, seed=10, classes=3, tiny=True, workers=1)
    short, long_, other = (_digests(tmp_path / n) for n in ("short", "long", "other"))
    assert all(long_[name] == digest for name, digest in short.items())
    assert set(short) == set(other)
    assert not set(short.values()) & set(other.values()), "a different seed must give different images"


def test_class_folders_and_imagenet_names(tiny_folder):
    classes = sorted(p.name for p in tiny_folder.iterdir() if p.is_dir())
    assert classes == ["class_000", "class_001", "class_002"]
    indices = []
    for path in _images(tiny_folder):
        m = NAME.match(path.name)
        assert m, path.name
        index = int(m.group(1))
        indices.append(index)
        assert path.parent.name == f"class_{index % 3:03d}"
        assert path.name.startswith(md.wnid(index % 3) + "_")
    assert sorted(indices) == list(range(40))
    assert not list(tiny_folder.rglob("*.part"))


def test_tiny_images_are_small_natural_jpegs(tiny_folder):
    for path in _images(tiny_folder):
        with Image.open(path) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert 60 <= im.width <= 200 and 60 <= im.height <= 200
            pixels = np.asarray(im, dtype=np.float32)
        assert pixels.std() > 15, f"{path} looks flat"


def test_realistic_size_statistics(realistic_folder, quality_of):
    widths, heights, sizes, qualities, sampling = [], [], [], [], []
    for path in _images(realistic_folder):
        with Image.open(path) as im:
            im.load()
            widths.append(im.width)
            heights.append(im.height)
            qualities.append(quality_of(im))
            sampling.append(JpegImagePlugin.get_sampling(im))
        sizes.append(path.stat().st_size)
    assert len(widths) == 24
    assert all(200 <= w <= 700 for w in widths) and all(150 <= h <= 600 for h in heights)
    # Loose bands around the ImageNet-train targets (mean ~400x350 px, ~100 KB): 24 samples vary.
    assert 320 <= np.mean(widths) <= 490
    assert 280 <= np.mean(heights) <= 430
    assert 50_000 <= np.mean(sizes) <= 150_000
    assert all(q is not None and 75 <= q <= 95 for q in qualities), qualities
    assert len(set(qualities)) > 3
    assert set(sampling) <= {0, 1, 2}
    assert sampling.count(2) > len(sampling) / 2, "4:2:0 must dominate, as in ImageNet"


def test_summary_matches_the_files(tmp_path):
    summary = md.make_dataset(tmp_path / "d", count=9, seed=3, classes=2, tiny=True, workers=2)
    files = _images(tmp_path / "d")
    assert len(files) == summary["count"] == 9
    assert summary["classes"] == 2 and summary["odd"] == []
    sizes = [p.stat().st_size for p in files]
    assert summary["mean_kb"] == pytest.approx(np.mean(sizes) / 1000)
    assert summary["total_mb"] == pytest.approx(sum(sizes) / 1e6)
    dims = [Image.open(p).size for p in files]
    assert summary["mean_width"] == pytest.approx(np.mean([d[0] for d in dims]))
    assert summary["mean_height"] == pytest.approx(np.mean([d[1] for d in dims]))
    assert not (tmp_path / "d" / md.ODD_MANIFEST).exists()


def test_quality_range_is_honoured(tmp_path, quality_of):
    md.make_dataset(tmp_path / "q", count=6, seed=4, classes=2, tiny=True, quality_range=(88, 88))
    assert {quality_of(Image.open(p)) for p in _images(tmp_path / "q")} == {88}


def test_odd_manifest_lists_every_kind_at_the_root(odd_folder):
    manifest = json.loads((odd_folder / md.ODD_MANIFEST).read_text())
    assert manifest["version"] == 1
    kinds = [e["kind"] for e in manifest["files"]]
    assert sorted(kinds) == sorted(k.value for k in md.OddKind)
    for entry in manifest["files"]:
        path = odd_folder / entry["path"]
        assert path.is_file() and path.parent.parent == odd_folder
        assert path.parent.name.startswith("class_")
        assert path.suffix in (".JPEG", ".jpg")
        assert path.stat().st_size == entry["bytes"]
    assert not list(odd_folder.glob("class_*/" + md.ODD_MANIFEST))


def test_odd_files_are_what_they_claim(odd_files):
    with Image.open(odd_files["grayscale"]) as im:
        assert im.format == "JPEG" and im.mode == "L"
        im.load()
        assert len(im.layer) == 1
    with Image.open(odd_files["cmyk"]) as im:
        assert im.format == "JPEG" and im.mode == "CMYK"
        im.load()
        assert len(im.layer) == 4
    with Image.open(odd_files["progressive"]) as im:
        assert im.format == "JPEG" and im.mode == "RGB" and im.info.get("progressive")
        im.load()
    assert odd_files["progressive"].read_bytes().find(b"\xff\xc2") >= 0  # SOF2
    with Image.open(odd_files["png"]) as im:
        assert im.format == "PNG" and odd_files["png"].suffix == ".JPEG"
        im.load()
    assert odd_files["empty"].stat().st_size == 0
    text = odd_files["text"].read_bytes()
    assert text.decode("ascii").startswith("This is not an image")
    for kind in ("empty", "text"):
        with pytest.raises(Image.UnidentifiedImageError):
            Image.open(odd_files[kind])


def test_truncated_file_is_cut_inside_the_entropy_data(odd_files):
    data = odd_files["truncated"].read_bytes()
    sos = data.find(b"\xff\xda")
    assert sos > 0, "the header (and the SOS marker) must survive the cut"
    scan_start = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    assert len(data) - scan_start > 100, "the cut must leave some entropy-coded data"
    assert not data.endswith(b"\xff\xd9")
    with Image.open(io.BytesIO(data)) as im:
        assert im.format == "JPEG"  # the header parses ...
        with pytest.raises(OSError):
            im.load()  # ... but the pixels do not decode fully


def test_odd_files_do_not_disturb_regular_images(odd_folder):
    odd = set(load_odd_manifest(odd_folder).values())
    regular = [p for p in _images(odd_folder) if p not in odd]
    assert len(regular) == 12
    for path in regular:
        with Image.open(path) as im:
            im.load()
            assert im.format == "JPEG" and im.mode == "RGB"


def test_refuses_non_empty_output_unless_overwrite(tmp_path):
    out = tmp_path / "d"
    md.make_dataset(out, count=7, seed=0, classes=3, tiny=True, odd=True)
    (out / "NOTES.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        md.make_dataset(out, count=3, seed=0, classes=3, tiny=True)
    md.make_dataset(out, count=3, seed=0, classes=3, tiny=True, overwrite=True)
    # The old, larger dataset and its manifest are gone; a user's own file is left alone.
    assert len(_images(out)) == 3
    assert not (out / md.ODD_MANIFEST).exists()
    assert (out / "NOTES.txt").read_text() == "mine"


def test_empty_existing_folder_is_fine(tmp_path):
    (tmp_path / "empty").mkdir()
    assert md.make_dataset(tmp_path / "empty", count=2, tiny=True)["count"] == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": 0}, "count"),
        ({"count": 3, "classes": 0}, "classes"),
        ({"count": 3, "seed": -1}, "seed"),
        ({"count": 3, "quality_range": (96, 80)}, "quality_range"),
        ({"count": 3, "workers": 0}, "workers"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        md.make_dataset(tmp_path / "bad", tiny=True, **kwargs)
    assert not (tmp_path / "bad").exists()


def test_worker_errors_reach_the_caller_with_traceback(tmp_path, monkeypatch):
    real = md._image_file

    def failing(spec, index):
        if index == 3:
            raise RuntimeError("boom at image 3")
        return real(spec, index)

    monkeypatch.setattr(md, "_image_file", failing)
    with pytest.raises(RuntimeError, match="boom at image 3") as info:
        md.make_dataset(tmp_path / "f", count=8, tiny=True, workers=2)
    assert any(entry.name == "failing" for entry in info.traceback)


def test_no_photos_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(md, "_photo_dirs", list)
    md.source_photos.cache_clear()
    md._texture_tiles.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="no source photographs"):
            md.make_dataset(tmp_path / "none", count=2, tiny=True)
    finally:
        monkeypatch.undo()
        md.source_photos.cache_clear()
        md._texture_tiles.cache_clear()
    assert not (tmp_path / "none").exists()
    assert len(md.source_photos()) > 0


def test_prefers_colour_photos():
    photos = md.source_photos()
    colour = [p for p in photos if p.image.mode == "RGB"]
    assert colour, "scikit-image or matplotlib colour photos should be installed in the test env"
    assert sum(p.weight for p in colour) > sum(p.weight for p in photos if p.image.mode == "L")


@pytest.mark.parametrize(("width", "height"), [(1, 1), (7, 5), (17, 33), (257, 129)])
@pytest.mark.parametrize(
    ("mode", "subsampling", "luma_factors"),
    [
        ("RGB", "4:2:0", (2, 2)),
        ("RGB", "4:2:2", (2, 1)),
        ("RGB", "4:4:4", (1, 1)),
        ("L", "4:2:0", (1, 1)),
        ("CMYK", "4:4:4", (1, 1)),
    ],
)
def test_jpeg_bytes_factory(jpeg_bytes, width, height, mode, subsampling, luma_factors):
    data = jpeg_bytes(width, height, quality=85, subsampling=subsampling, mode=mode, seed=width)
    assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"
    with Image.open(io.BytesIO(data)) as im:
        assert im.size == (width, height) and im.mode == mode
        # (h, v) sampling factors of the first component; the others are always 1x1 here.
        assert [layer[1:3] for layer in im.layer] == [luma_factors] + [(1, 1)] * (len(mode) - 1)
        im.load()
        if width * height > 100:
            assert np.asarray(im, dtype=np.float32).std() > 10, "factory images must not be flat"
    assert data == jpeg_bytes(width, height, quality=85, subsampling=subsampling, mode=mode, seed=width)


def test_jpeg_bytes_progressive_and_seeds_differ(jpeg_bytes):
    prog = jpeg_bytes(123, 77, progressive=True, quality=95)
    assert Image.open(io.BytesIO(prog)).info.get("progressive")
    assert jpeg_bytes(64, 48, seed=1) != jpeg_bytes(64, 48, seed=2)
    assert make_jpeg(64, 48, seed=1) == jpeg_bytes(64, 48, seed=1)


def test_high_entropy_images_encode_progressive_and_optimised():
    # Noise needs ~3 bytes/pixel: beyond the buffer Pillow gives optimised / progressive encodes.
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 1200, 3), dtype=np.uint8), "RGB")
    prog = md.encode_jpeg(noise, quality=94, subsampling="4:4:4", progressive=True)
    with Image.open(io.BytesIO(prog)) as im:
        assert im.info.get("progressive") and im.size == (1200, 96)
        im.load()
    opt = md.encode_jpeg(noise, quality=94, subsampling="4:4:4", optimize=True)
    assert opt == md.encode_jpeg(noise, quality=94, subsampling="4:4:4")  # kept baseline, by rule
    small = noise.crop((0, 0, 64, 48))
    assert len(md.encode_jpeg(small, quality=80, optimize=True)) < len(md.encode_jpeg(small, quality=80))


def test_cli_end_to_end(tmp_path, repo_root):
    out = tmp_path / "cli"
    cmd = [
        sys.executable,
        str(repo_root / "tools" / "make_dataset.py"),
        str(out),
        "--count",
        "4",
        "--seed",
        "7",
        "--classes",
        "2",
        "--tiny",
        "--odd",
        "--workers",
        "1",
    ]
    # Run from an unrelated folder: the script must not rely on the repository being the cwd.
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wrote 4 images in 2 classes" in done.stdout
    for kind in (k.value for k in md.OddKind):
        assert f"odd file ({kind})" in done.stdout
    assert _digests(out) == _digests(_api_twin(tmp_path))
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "error:" in again.stderr and "--overwrite" in again.stderr
    bad = subprocess.run([*cmd[:2], str(tmp_path / "x"), "--count", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "count" in bad.stderr


def _api_twin(tmp_path: Path) -> Path:
    out = tmp_path / "api"
    md.make_dataset(out, count=4, seed=7, classes=2, tiny=True, odd=True, workers=2)
    return out


def test_tool_depends_on_no_fastload_module(repo_root):
    # `python tools/make_dataset.py` must work on a machine where fastload is not installed yet.
    source = (repo_root / "tools" / "make_dataset.py").read_text()
    assert not re.search(r"^\s*(from|import)\s+fastload\b", source, re.M)
    assert not re.search(r"^\s*from\s+\.", source, re.M)
