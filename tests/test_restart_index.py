"""Restart-indexed JPEGs: lossless transcode, interval slicing, robustness, MXNet compatibility."""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest
from PIL import Image

from fastload.engine_structs import from_native, to_native

from conftest import make_jpeg

_engine = pytest.importorskip("fastload._engine")


def _add_markers(buf, max_mcus=4, verify=False):
    """The engine's transcode: the bytes, and its geometry and notes in one dict (as the packer keeps them)."""
    options = to_native(_engine, "TranscodeOptions", {"max_mcus": max_mcus, "verify": verify})
    out, geometry, notes = _engine.add_restart_markers(buf, options)
    return out, {**from_native(geometry, "RestartGeometry"), **from_native(notes, "TranscodeNotes"), "verified": verify}


def _geometry(buf):
    """The restart geometry the engine reads from a JPEG's headers, as a dict (None without restart markers)."""
    geometry = _engine.restart_geometry(buf)
    return None if geometry is None else from_native(geometry, "RestartGeometry")


_RST = re.compile(rb"\xff[\xd0-\xd7]")


# --- test images ------------------------------------------------------------------------------


def _pixels(width: int, height: int, seed: int) -> np.ndarray:
    """Gradients, hard edges and noise: enough entropy that every interval holds real Huffman data."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack([(x * 3 + y) % 256, (y * 2 + x / 3) % 256, 128 + 100 * np.sin(x / 7) * np.cos(y / 5)], -1)
    img[(x // 11 + y // 13) % 2 == 0] *= 0.6
    img += rng.normal(0, 18, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


_SUBSAMPLING = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}


def _encode(
    width: int, height: int, *, mode: str = "RGB", subsampling: int = 2, progressive: bool = False, seed: int = 0
) -> bytes:
    return make_jpeg(
        width, height, quality=90, subsampling=_SUBSAMPLING[subsampling], mode=mode, progressive=progressive, seed=seed
    )


def _decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        return np.asarray(im)


CASES = {
    "420": dict(width=203, height=157, subsampling=2),
    "444": dict(width=203, height=157, subsampling=0),
    "422": dict(width=203, height=157, subsampling=1),
    "gray": dict(width=203, height=157, mode="L"),
    "progressive420": dict(width=203, height=157, subsampling=2, progressive=True),
    "progressive444": dict(width=90, height=70, subsampling=0, progressive=True),
    "cmyk": dict(width=120, height=88, mode="CMYK", subsampling=0),
    "odd420_tiny": dict(width=17, height=9, subsampling=2),
    "odd422_prime_mcus": dict(width=7 * 16 - 3, height=61, subsampling=1),  # 7 MCUs per row: N = 1
    "exact_mcu_multiple": dict(width=128, height=96, subsampling=2),
    "one_mcu": dict(width=16, height=16, subsampling=2),
    "tall_gray": dict(width=9, height=300, mode="L"),
    # A last MCU column 3-4 px wide: a slice of it alone would be too narrow for fancy upsampling.
    "narrow_last_mcu420": dict(width=16 * 9 + 3, height=50, subsampling=2),
    "narrow_last_mcu422": dict(width=16 * 7 + 4, height=43, subsampling=1),
}


@pytest.fixture(scope="module")
def originals():
    return {name: _encode(seed=i, **kw) for i, (name, kw) in enumerate(CASES.items())}


@pytest.fixture(scope="module")
def transcoded(originals):
    return {name: _add_markers(data, 4, True) for name, data in originals.items()}


# --- lossless transcode -----------------------------------------------------------------------


@pytest.fixture(params=["best", "scalar"])
def scan(request):
    """Runs a test with the slicer's best interval scan, then with its portable one."""
    _engine._restart_force_scalar_scan(request.param == "scalar")
    yield request.param
    _engine._restart_force_scalar_scan(False)


@pytest.mark.parametrize("name", list(CASES))
def test_transcode_decodes_bit_identically(name, originals, transcoded):
    src = originals[name]
    out, geo = transcoded[name]
    assert out[:2] == b"\xff\xd8" and out[-2:] == b"\xff\xd9"
    a, b = _decode(src), _decode(out)
    assert a.shape == b.shape
    assert np.array_equal(a, b), f"{name}: transcoded pixels differ from the original"
    assert geo["verified"] is True
    assert geo["source_progressive"] is bool(CASES[name].get("progressive"))
    assert geo["output_bytes"] == len(out) and geo["source_bytes"] == len(src)


@pytest.mark.parametrize("name", list(CASES))
def test_geometry_and_marker_count(name, originals, transcoded):
    out, geo = transcoded[name]
    kw = CASES[name]
    n = geo["restart_interval"]
    assert 1 <= n <= 4 and geo["mcus_per_row"] % n == 0
    # N is the largest divisor of the row width not above 4.
    assert all(geo["mcus_per_row"] % d for d in range(n + 1, min(4, geo["mcus_per_row"]) + 1))
    assert geo["intervals_per_row"] * n == geo["mcus_per_row"]
    assert (geo["width"], geo["height"]) == (kw["width"], kw["height"])
    if kw.get("mode") in ("L", "CMYK") or kw.get("subsampling") == 0:
        assert (geo["mcu_width"], geo["mcu_height"]) == (8, 8)
    elif kw.get("subsampling") == 1:
        assert (geo["mcu_width"], geo["mcu_height"]) == (16, 8)
    else:
        assert (geo["mcu_width"], geo["mcu_height"]) == (16, 16)
    assert geo["mcus_per_row"] == -(-kw["width"] // geo["mcu_width"])
    assert geo["mcu_rows"] == -(-kw["height"] // geo["mcu_height"])
    # Every RSTn in the file (0xFF Dn cannot occur in stuffed entropy data) separates two intervals.
    scan = out[out.index(b"\xff\xda") :]
    assert len(_RST.findall(scan)) == geo["mcu_rows"] * geo["intervals_per_row"] - 1
    parsed = _geometry(out)
    assert parsed == {k: geo[k] for k in parsed}
    assert _geometry(originals[name]) is None  # Pillow writes no DRI


def test_interval_bound_is_respected(originals):
    src = originals["420"]  # 203 px -> 13 MCUs per row (prime)
    _, geo1 = _add_markers(src, 1)
    _, geo_big = _add_markers(src, 1000)
    assert geo1["restart_interval"] == 1
    assert geo_big["restart_interval"] == geo_big["mcus_per_row"] == 13
    with pytest.raises(ValueError):
        _add_markers(src, 0)
    # Slices stay exact whatever the interval: one MCU, or a whole MCU row (row-only slicing).
    for max_mcus in (1, 1000):
        out, geo = _add_markers(src, max_mcus, True)
        full = _decode(out)
        for x, y, w, h in _crop_boxes(geo, np.random.default_rng(max_mcus), 20):
            sl, x0, y0 = _engine.restart_slice(out, x, y, w, h)
            got = _decode(sl)[y - y0 : y - y0 + h, x - x0 : x - x0 + w]
            assert np.array_equal(got, full[y : y + h, x : x + w]), (max_mcus, (x, y, w, h))


def test_metadata_markers_are_kept_once(originals):
    im = Image.open(io.BytesIO(originals["420"]))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation
    icc = b"\x00" * 200
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=90, exif=exif.tobytes(), icc_profile=icc)
    out, _ = _add_markers(buf.getvalue(), 4, True)
    with Image.open(io.BytesIO(out)) as back:
        assert back.getexif().get(0x0112) == 6
        assert back.info.get("icc_profile") == icc
    head = out[: out.index(b"\xff\xda")]
    assert head.count(b"JFIF\x00") == 1
    cmyk_out, _ = _add_markers(originals["cmyk"], 4, False)
    assert cmyk_out[: cmyk_out.index(b"\xff\xda")].count(b"Adobe") == 1


@pytest.mark.parametrize("bad", [b"", b"\xff\xd8", b"not a jpeg at all", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64])
def test_transcode_rejects_non_jpeg(bad):
    with pytest.raises(ValueError, match="cannot add restart markers"):
        _add_markers(bad)


def test_transcode_of_truncated_input_reports_or_warns(originals):
    src = originals["420"]
    for cut in (len(src) // 2, len(src) - 3, 200, 20):
        try:
            out, geo = _add_markers(src[:cut], 4, False)
        except ValueError as exc:
            assert "cannot add restart markers" in str(exc)
        else:
            # libjpeg pads a truncated scan with zeros and warns; the warning is reported.
            assert geo["source_warnings"] > 0 and out[-2:] == b"\xff\xd9"


# --- interval slicing -------------------------------------------------------------------------


def _crop_boxes(geo, rng, count):
    w, h, mw, mh = geo["width"], geo["height"], geo["mcu_width"], geo["mcu_height"]
    boxes = [(0, 0, w, h), (0, 0, 1, 1), (w - 1, h - 1, 1, 1), (0, h - 1, w, 1), (w - 1, 0, 1, h)]
    boxes += [(w - k, 0, k, h) for k in range(2, min(w, 5))] + [(0, h - k, w, k) for k in range(2, min(h, 5))]
    for _ in range(count):
        kind = rng.integers(4)
        if kind == 0:  # all four edges on MCU boundaries (or the image edge)
            x, y = mw * rng.integers(0, -(-w // mw)), mh * rng.integers(0, -(-h // mh))
            cw, ch = min(w - x, mw * rng.integers(1, 5)), min(h - y, mh * rng.integers(1, 5))
        elif kind == 1:  # touching the right/bottom edges
            cw, ch = rng.integers(1, w + 1), rng.integers(1, h + 1)
            x, y = w - cw, h - ch
        else:  # torchvision-like random resized crop box
            area = w * h * rng.uniform(0.08, 1.0)
            aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
            cw = int(min(w, max(1, round(np.sqrt(area * aspect)))))
            ch = int(min(h, max(1, round(np.sqrt(area / aspect)))))
            x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
        boxes.append((int(x), int(y), int(cw), int(ch)))
    return boxes


SLICE_CASES = [
    "420",
    "444",
    "422",
    "gray",
    "progressive420",
    "cmyk",
    "odd420_tiny",
    "odd422_prime_mcus",
    "exact_mcu_multiple",
    "one_mcu",
    "tall_gray",
    "narrow_last_mcu420",
    "narrow_last_mcu422",
]


@pytest.mark.parametrize("name", SLICE_CASES)
def test_slice_decode_matches_full_decode(name, transcoded, scan):
    out, geo = transcoded[name]
    full = _decode(out)
    rng = np.random.default_rng(len(name))
    for x, y, w, h in _crop_boxes(geo, rng, 60):
        sl, x0, y0 = _engine.restart_slice(out, x, y, w, h)
        assert x0 % geo["mcu_width"] == 0 and y0 % geo["mcu_height"] == 0
        assert x0 <= x and y0 <= y
        part = _decode(sl)
        assert part.shape[0] >= y - y0 + h and part.shape[1] >= x - x0 + w
        got = part[y - y0 : y - y0 + h, x - x0 : x - x0 + w]
        assert np.array_equal(got, full[y : y + h, x : x + w]), f"{name}: crop {(x, y, w, h)} differs"


def _decode_scaled(data: bytes, denom: int) -> np.ndarray:
    """libjpeg's 1/denom DCT-scaled decode (through Pillow's draft mode)."""
    im = Image.open(io.BytesIO(data))
    w, h = im.size
    im.draft(im.mode, (max(1, w // denom), max(1, h // denom)))
    assert im.size == (-(-w // denom), -(-h // denom)), "Pillow did not pick the requested DCT scale"
    im.load()
    return np.asarray(im)


@pytest.mark.parametrize("denom", [2, 4, 8])
@pytest.mark.parametrize("name", ["420", "422", "444", "gray", "odd422_prime_mcus", "narrow_last_mcu422"])
def test_scaled_slice_decode_matches_scaled_full_decode(name, denom, transcoded):
    """With DCT scaling the output pixels [x/d, ceil((x+w)/d)) must match a 1/d decode of the whole image."""
    out, geo = transcoded[name]
    full = _decode_scaled(out, denom)
    rng = np.random.default_rng(denom * 100 + len(name))
    for x, y, w, h in _crop_boxes(geo, rng, 25):
        sl, x0, y0 = _engine.restart_slice(out, x, y, w, h, denom)
        with Image.open(io.BytesIO(sl)) as probe:
            sw, sh = probe.size
        if sw // denom == 0 or sh // denom == 0 or sw // (sw // denom) >= 2 * denom or sh // (sh // denom) >= 2 * denom:
            continue  # too small for Pillow's draft() to select exactly this scale
        part = _decode_scaled(sl, denom)
        X0, Y0, X1, Y1 = x // denom, y // denom, -(-(x + w) // denom), -(-(y + h) // denom)
        got = part[Y0 - y0 // denom : Y1 - y0 // denom, X0 - x0 // denom : X1 - x0 // denom]
        assert np.array_equal(got, full[Y0:Y1, X0:X1]), f"{name} 1/{denom}: crop {(x, y, w, h)} differs"
    with pytest.raises(ValueError, match="scale_denom"):
        _engine.restart_slice(out, 0, 0, 8, 8, 3)


def test_slice_scan_handles_fill_bytes_and_every_alignment(transcoded, scan):
    """0xFF fill bytes before markers (legal JPEG) and markers at every offset within a 64-byte block.

    The slicer's vector scan looks at 64 bytes and their successors at once; shifting the entropy
    data three bytes at a time moves each marker and stuffed byte across those blocks' edges.
    """
    out, geo = transcoded["420"]
    full = _decode(out)
    sos = out.index(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(out[sos + 2 : sos + 4], "big")
    markers = [m.start() for m in _RST.finditer(out, scan)]
    assert len(markers) > 20 and out[scan:].count(b"\xff\x00") > 0
    rng = np.random.default_rng(5)
    for shift in range(0, 64, 3):
        # A COM segment of `shift` bytes before the scan moves all entropy data by that much.
        pad = b"\xff\xfe" + (2 + shift).to_bytes(2, "big") + b"\x00" * shift
        data = bytearray(out[:sos] + pad + out[sos:])
        # One to three fill bytes before every fifth marker, different ones per shift.
        for at in sorted(markers[shift % 5 :: 5], reverse=True):
            at += len(pad)
            data[at:at] = b"\xff" * int(rng.integers(1, 4))
        data = bytes(data)
        for x, y, w, h in _crop_boxes(geo, rng, 3):
            sl, x0, y0 = _engine.restart_slice(data, x, y, w, h)
            got = _decode(sl)[y - y0 : y - y0 + h, x - x0 : x - x0 + w]
            assert np.array_equal(got, full[y : y + h, x : x + w]), f"shift {shift}: crop {(x, y, w, h)} differs"


def test_slice_is_only_the_needed_intervals(transcoded):
    out, geo = transcoded["420"]
    sl, x0, y0 = _engine.restart_slice(out, 100, 70, 20, 20)
    assert len(sl) < len(out) / 4
    with Image.open(io.BytesIO(sl)) as im:
        # One interval column of 1 MCU (N=1 for 13 MCUs per row) plus the pads, a few MCU rows.
        assert im.size[0] <= 3 * geo["restart_interval"] * geo["mcu_width"]
        assert im.size[1] <= 3 * geo["mcu_height"]
    whole, x0, y0 = _engine.restart_slice(out, 0, 0, geo["width"], geo["height"])
    assert (x0, y0) == (0, 0)
    assert np.array_equal(_decode(whole), _decode(out))


def test_slice_rejects_bad_crops_and_plain_jpegs(originals, transcoded):
    out, geo = transcoded["420"]
    for box in [
        (-1, 0, 5, 5),
        (0, 0, 0, 5),
        (0, 0, geo["width"] + 1, 5),
        (geo["width"] - 2, 0, 5, 5),
        (0, geo["height"], 1, 1),
        (2**31 - 10, 0, 100, 5),
    ]:
        with pytest.raises(ValueError, match="outside"):
            _engine.restart_slice(out, *box)
    with pytest.raises(ValueError, match="no restart interval"):
        _engine.restart_slice(originals["420"], 0, 0, 8, 8)
    progressive = _geometry(originals["progressive420"])
    assert progressive is None
    with pytest.raises(ValueError, match="not sliceable"):
        _engine.restart_slice(originals["progressive420"], 0, 0, 8, 8)


# --- lying headers and corrupt data never crash and never yield a wrong slice ------------------


def _dri_offset(data: bytes) -> int:
    pos = data.index(b"\xff\xdd")
    assert pos < data.index(b"\xff\xda")
    return pos + 4  # FF DD Lh Ll Ih Il


def test_lying_dri_is_detected(transcoded, scan):
    out, geo = transcoded["444"]  # 26 MCUs per row, N = 2
    assert geo["restart_interval"] == 2
    at = _dri_offset(out)
    for claimed in (1, 13, 26):  # divisors of the row: the geometry is plausible, the count is not
        lie = out[:at] + claimed.to_bytes(2, "big") + out[at + 2 :]
        assert _geometry(lie)["restart_interval"] == claimed
        with pytest.raises(ValueError, match="restart"):
            _engine.restart_slice(lie, 0, 0, 8, 8)
    lie = out[:at] + (3).to_bytes(2, "big") + out[at + 2 :]  # does not divide the row width
    with pytest.raises(ValueError, match="does not divide"):
        _engine.restart_slice(lie, 0, 0, 8, 8)


def test_missing_or_misnumbered_markers_are_detected(transcoded, scan):
    out, _ = transcoded["420"]
    sos = out.index(b"\xff\xda")
    markers = [m.start() for m in _RST.finditer(out, sos)]
    mid = markers[len(markers) // 2]
    dropped = out[:mid] + out[mid + 2 :]
    with pytest.raises(ValueError, match="intervals"):
        _engine.restart_slice(dropped, 0, 0, 8, 8)
    renumbered = bytearray(out)
    renumbered[mid + 1] = 0xD0 + ((renumbered[mid + 1] - 0xD0 + 3) % 8)
    with pytest.raises(ValueError, match="RST"):
        _engine.restart_slice(bytes(renumbered), 0, 0, 8, 8)
    duplicated = out[:mid] + out[mid : mid + 2] + out[mid:]
    with pytest.raises(ValueError):
        _engine.restart_slice(duplicated, 0, 0, 8, 8)


def _with_frame_size(data: bytes, width: int, height: int) -> bytes:
    sof = data.index(b"\xff\xc0")
    return data[: sof + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[sof + 9 :]


def test_decompression_bomb_headers_are_refused_before_allocating(originals, transcoded):
    with pytest.raises(ValueError, match="transcode limit"):
        _add_markers(_with_frame_size(originals["420"], 60000, 60000))
    bomb = _with_frame_size(transcoded["420"][0], 60000, 60000)
    assert _geometry(bomb)["mcu_rows"] == 3750
    with pytest.raises(ValueError, match="more than"):
        _engine.restart_slice(bomb, 0, 0, 16, 16)


def test_truncated_slices_are_refused(transcoded, scan):
    out, geo = transcoded["420"]
    for cut in (len(out) - 2, len(out) - 100, len(out) // 2, out.index(b"\xff\xda") + 5, 10, 2):
        with pytest.raises(ValueError):
            _engine.restart_slice(out[:cut], 0, 0, geo["width"], geo["height"])


def test_corrupt_interval_stays_local(transcoded):
    """Garbage inside one interval cannot be seen by the marker scan; it damages that interval only."""
    out, geo = transcoded["444"]
    sos = out.index(b"\xff\xda")
    markers = [m.start() for m in _RST.finditer(out, sos)]
    victim = len(markers) // 2  # the interval after this marker gets scrambled
    start, end = markers[victim] + 2, markers[victim + 1]
    noisy = bytearray(out)
    noisy[start:end] = bytes(
        b if b != 0xFF else 0x00 for b in np.random.default_rng(3).integers(0, 255, end - start, dtype=np.uint8)
    )
    noisy = bytes(noisy)
    n, mw, mh, ipr = geo["restart_interval"], geo["mcu_width"], geo["mcu_height"], geo["intervals_per_row"]
    bad_row, bad_col = divmod(victim + 1, ipr)
    # A crop far from the scrambled interval comes out exactly as from the intact file.
    x = 0 if bad_col * n * mw > geo["width"] // 2 else geo["width"] - 24
    y = 0 if bad_row * mh > geo["height"] // 2 else geo["height"] - 24
    sl_ok, x0, y0 = _engine.restart_slice(noisy, x, y, 24, 24)
    ref = _decode(out)[y : y + 24, x : x + 24]
    assert np.array_equal(_decode(sl_ok)[y - y0 : y - y0 + 24, x - x0 : x - x0 + 24], ref)
    # A crop over it still slices and decodes (libjpeg warns and resynchronises), without crashing.
    sl_bad, _, _ = _engine.restart_slice(noisy, bad_col * n * mw, bad_row * mh, n * mw, mh)
    with contextlib.suppress(OSError):
        _decode(sl_bad)


def test_random_mutations_never_crash(transcoded, scan):
    out, _geo = transcoded["422"]
    rng = np.random.default_rng(11)
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(300):
        data = bytearray(out)
        for _ in range(int(rng.integers(1, 6))):
            data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        data = bytes(data)
        try:
            sl, x0, y0 = _engine.restart_slice(data, 10, 10, 50, 40)
            outcomes["ok"] += 1
            assert sl[:2] == b"\xff\xd8" and x0 <= 10 and y0 <= 10
        except ValueError:
            outcomes["refused"] += 1
        _geometry(data)
        with contextlib.suppress(ValueError):
            _add_markers(data[: int(rng.integers(2, len(data)))], 4, False)
    assert outcomes["ok"] and outcomes["refused"]  # both branches were exercised


# --- pack-time helper -------------------------------------------------------------------------


def test_restart_transcoder_verifies_a_sample_and_refuses_what_it_cannot_index(originals):
    from fastload.pack.restart import RestartIndexConfig, RestartIndexError, RestartTranscoder, VerifyPolicy

    with pytest.raises(ValueError):
        RestartIndexConfig(max_mcus=0)
    with pytest.raises(ValueError):
        RestartIndexConfig(verify="sometimes")
    with pytest.raises(ValueError):
        RestartIndexConfig(sample_every=0)
    png = io.BytesIO()
    Image.fromarray(_pixels(20, 10, 0)).save(png, format="PNG")
    truncated = originals["420"][: len(originals["420"]) // 2]
    tx = RestartTranscoder(RestartIndexConfig(verify="sample", sample_every=2))
    items = [originals["420"], png.getvalue(), originals["gray"], originals["progressive420"], truncated]
    stored = {}
    for i, b in enumerate(items):
        try:
            stored[i] = tx(b)
        except RestartIndexError as exc:
            assert isinstance(exc, ValueError)  # the packer's convert hook stores the original on ValueError
            stored[i] = None
    assert stored[1] is None and stored[4] is None  # PNG; damaged source stays as it is
    for i in (0, 2, 3):
        assert _geometry(stored[i]) is not None
        assert np.array_equal(_decode(stored[i]), _decode(items[i]))
    entry = tx.manifest_entry()
    assert entry["verified"] == "sample" and entry["max_mcus"] == 1 and entry["sample_every"] == 2
    assert entry["images"] == 3 and entry["verified_images"] == 2  # positions 0, 2 (and the refused 4) sampled
    assert entry["not_indexed"] == {"corrupt_source": 1, "not_jpeg": 1}
    assert entry["bytes_in"] == len(items[0]) + len(items[2]) + len(items[3])
    assert entry["bytes_out"] == sum(len(stored[i]) for i in (0, 2, 3))
    tx_all = RestartTranscoder(RestartIndexConfig(verify=VerifyPolicy.ALL))
    for b in (originals["420"], originals["444"], originals["cmyk"]):
        tx_all(b)
    assert tx_all.manifest_entry()["verified_images"] == 3 and tx_all.manifest_entry()["verified"] == "all"


def test_pack_restart_index_end_to_end(tmp_path, originals):
    packer = pytest.importorskip("fastload.pack.packer")
    records = pytest.importorskip("fastload.records.dataset")
    for cls, names in {"a": ["420", "444", "progressive420"], "b": ["422", "exact_mcu_multiple"]}.items():
        (tmp_path / "src" / cls).mkdir(parents=True)
        for n in names:
            (tmp_path / "src" / cls / f"{n}.jpg").write_bytes(originals[n])
    result = packer.pack_folder(str(tmp_path / "src"), str(tmp_path / "out"), restart_index=True, workers=2)
    entry = result.manifest["restart_index"]
    assert entry["verified"] == "sample" and entry["max_mcus"] == 1 and entry["images"] == 5
    assert sum(s["restart_index"]["images"] for s in result.manifest["shards"]) == 5
    assert all(s["restart_index"]["verified"] == "sample" for s in result.manifest["shards"])
    with records.open_dataset(str(tmp_path / "out")) as ds:
        assert ds.restart_indexed and len(ds) == 5
        for i in range(len(ds)):
            data = bytes(ds.image(i))
            assert _geometry(data) is not None, ds.locate(i)
        from fastload.decode import active_backend
        from fastload.loader import Loader, LoaderConfig
        from fastload.transforms import RandomResizedCrop

        if active_backend() == "libjpeg-turbo":
            config = LoaderConfig(batch_size=5, transform=RandomResizedCrop(size=32, scale=(0.1, 0.5)), num_threads=1)
            with Loader(ds, config) as loader:
                for _ in loader:
                    pass
                stats = loader.stats()
            # Crops of at most half the area never cover a whole image: every record is sliced. The
            # producer may already have decoded batches of the next epoch: whole batches of 5.
            assert stats.sliced >= 5 and stats.sliced % 5 == 0 and stats.slice_fallbacks == 0
            assert f"sliced {stats.sliced}" in stats.summary()


# --- other readers ----------------------------------------------------------------------------


def test_mxnet_reads_restart_indexed_shards(tmp_path, originals, transcoded):
    mx = pytest.importorskip("mxnet")
    names = ["420", "444", "422", "progressive420", "exact_mcu_multiple"]
    rec, idx = str(tmp_path / "ri.rec"), str(tmp_path / "ri.idx")
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for i, name in enumerate(names):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i), i, 0), transcoded[name][0]))
    writer.close()
    reader = mx.recordio.MXIndexedRecordIO(idx, rec, "r")
    for i, name in enumerate(names):
        header, payload = mx.recordio.unpack(reader.read_idx(i))
        assert header.label == float(i)
        assert _geometry(payload) is not None
        got = mx.image.imdecode(payload).asnumpy()
        want = mx.image.imdecode(originals[name]).asnumpy()
        assert np.array_equal(got, want), f"MXNet decodes the restart-indexed {name} differently"
    reader.close()
    it = mx.io.ImageRecordIter(
        path_imgrec=rec,
        path_imgidx=idx,
        data_shape=(3, 32, 32),
        batch_size=len(names),
        resize=32,
        preprocess_threads=1,
        round_batch=False,
    )
    batch = next(iter(it))
    assert batch.data[0].shape == (len(names), 3, 32, 32)
    assert sorted(batch.label[0].asnumpy().tolist()) == [float(i) for i in range(len(names))]
    assert float(batch.data[0].asnumpy().std()) > 1.0  # real pixels, not a zero-filled failure


# --- the decode engine's sliced path ----------------------------------------------------------


@pytest.fixture(params=["fastload", "libjpeg"])
def entropy(request):
    """Runs a test with slices Huffman-decoded by fastload's interval decoder, then by libjpeg's
    (``DecodeOptions(slice_entropy=...)``, a per-call choice)."""
    if request.param == "fastload" and not _engine.info()["slice_entropy_available"]:
        pytest.skip("this build has no interval Huffman decoder (no jpegint.h)")
    return request.param


@pytest.fixture(scope="module")
def transcoded_one_mcu(originals):
    """The pack's default geometry: one MCU per interval."""
    return {name: _add_markers(data, 1, True) for name, data in originals.items()}


@pytest.mark.parametrize(
    "transform_name",
    ["train64", "train16_dct_scaled", "eval", "train_tiny_scale", "whole", "train64_bicubic", "eval_nearest_plain"],
)
def test_engine_sliced_decode_equals_plain_decode(transform_name, originals, transcoded, transcoded_one_mcu, entropy):
    decode = pytest.importorskip("fastload.decode")
    from fastload.transforms import CenterCrop, RandomResizedCrop, Resize

    if decode.active_backend() != "libjpeg-turbo":
        pytest.skip("the C++ engine is not the active decoder")
    transform = {
        "train64": RandomResizedCrop(size=64),
        "train16_dct_scaled": RandomResizedCrop(size=16, scale=(0.3, 1.0)),
        "eval": CenterCrop(size=48, resize=56),
        # crops 30-60x the output: DCT scaling down to 1/8, where libjpeg needs only DC
        "train_tiny_scale": RandomResizedCrop(size=4, scale=(0.5, 1.0)),
        # whole images: sliced (all intervals) only with fastload's interval decoder
        "whole": Resize(size=(40, 56), flip=0.5),
        # wider filters reach further past the crop; nearest samples single pixels
        "train64_bicubic": RandomResizedCrop(size=64, interpolation="bicubic"),
        "eval_nearest_plain": CenterCrop(size=48, resize=56, interpolation="nearest", antialias=False),
    }[transform_name]
    names = [
        "420",
        "444",
        "422",
        "gray",
        "progressive420",
        "cmyk",
        "odd422_prime_mcus",
        "narrow_last_mcu422",
        "exact_mcu_multiple",
    ]
    out444, geo = transcoded["444"]
    at = _dri_offset(out444)
    lying = out444[:at] + (geo["restart_interval"] * 13).to_bytes(2, "big") + out444[at + 2 :]
    one_mcu = ["420", "422", "gray", "narrow_last_mcu420"]
    images = [transcoded[n][0] for n in names] + [transcoded_one_mcu[n][0] for n in one_mcu] + [lying, originals["420"]]
    indices = np.arange(len(images), dtype=np.int64)
    h, w = transform.size
    sliced_total = fallbacks_total = 0
    epochs = 40  # a crop edge lands on an MCU boundary (where the padding matters) in ~2% of crops
    for epoch in range(epochs):
        outs, results = [], []
        for use in (True, False):
            out = np.zeros((len(images), h, w, 3), np.uint8)
            res = decode.decode_batch(
                images,
                out,
                transform,
                seed=5,
                epoch=epoch,
                indices=indices,
                threads=2,
                options=decode.DecodeOptions(use_restart_slices=use, slice_entropy=entropy),
            )
            outs.append(out)
            results.append(res)
        on, off = results
        assert off.sliced == 0 and off.slice_fallbacks == 0
        assert on.status.tolist() == off.status.tolist()
        assert np.array_equal(outs[0], outs[1]), "the sliced path changed pixels"
        assert on.slice_fallbacks <= 1  # only the lying-DRI record may fall back
        sliced_total += on.sliced
        fallbacks_total += on.slice_fallbacks
    # Every crop of the other transforms is partial; at 1/8 scale many cover the whole image.
    expected = {"train_tiny_scale": 4, "whole": 0 if entropy == "libjpeg" else len(names) + len(one_mcu) - 2}
    assert sliced_total >= epochs * expected.get(transform_name, len(names) + len(one_mcu) - 2)
    if transform_name == "whole" and entropy == "libjpeg":
        assert sliced_total == fallbacks_total == 0  # libjpeg's decoder gains nothing from a whole slice
    else:
        assert fallbacks_total >= 1


def _entropy_span(data: bytes) -> tuple:
    """[start, end) of a baseline JPEG's entropy-coded data (after the SOS header, before EOI)."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big"), len(data) - 2


@pytest.mark.parametrize("max_mcus", [1, 4])
def test_corrupt_intervals_never_change_sliced_pixels(originals, max_mcus, entropy):
    """Garbage inside intervals (markers intact): the sliced path either decodes what libjpeg decodes
    from the same bytes or falls back; its pixels always equal the plain path's on the same record."""
    decode = pytest.importorskip("fastload.decode")
    from fastload.transforms import RandomResizedCrop

    if decode.active_backend() != "libjpeg-turbo":
        pytest.skip("the C++ engine is not the active decoder")
    rng = np.random.default_rng(17 + max_mcus)
    sources = [_add_markers(originals[n], max_mcus, False)[0] for n in ("420", "422", "444", "gray")]
    images = []
    for i in range(96):
        data = bytearray(sources[i % len(sources)])
        start, end = _entropy_span(bytes(data))
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(start, end))
            if data[at] == 0xFF or (at > 0 and data[at - 1] == 0xFF):
                continue  # keep markers and stuffing intact: only the Huffman data is damaged
            value = int(rng.integers(0, 255))  # never 0xFF: that would make a new marker
            data[at] = value
        images.append(bytes(data))
    indices = np.arange(len(images), dtype=np.int64)
    transform = RandomResizedCrop(size=32, scale=(0.2, 1.0))
    sliced = fallbacks = 0
    for epoch in range(3):
        outs, results = [], []
        for use in (True, False):
            out = np.zeros((len(images), 32, 32, 3), np.uint8)
            results.append(
                decode.decode_batch(
                    images,
                    out,
                    transform,
                    seed=9,
                    epoch=epoch,
                    indices=indices,
                    threads=2,
                    options=decode.DecodeOptions(use_restart_slices=use, slice_entropy=entropy),
                )
            )
            outs.append(out)
        on, off = results
        assert on.status.tolist() == off.status.tolist()
        ok = on.status == 0
        assert np.array_equal(outs[0][ok], outs[1][ok]), "a corrupt interval changed the sliced pixels"
        sliced += on.sliced
        fallbacks += on.slice_fallbacks
    assert sliced > 0
    if entropy == "fastload":
        assert fallbacks > 0  # damaged intervals were refused, not decoded differently


def test_engine_survives_corrupt_restart_indexed_records(transcoded, entropy):
    decode = pytest.importorskip("fastload.decode")
    from fastload.transforms import RandomResizedCrop

    if decode.active_backend() != "libjpeg-turbo":
        pytest.skip("the C++ engine is not the active decoder")
    rng = np.random.default_rng(5)
    sources = [transcoded[n][0] for n in ("420", "422", "444", "gray")]
    images = []
    for i in range(64):
        data = bytearray(sources[i % len(sources)])
        for _ in range(int(rng.integers(1, 8))):
            data[int(rng.integers(2, len(data)))] = int(rng.integers(0, 256))
        if i % 5 == 0:
            data = data[: int(rng.integers(4, len(data)))]
        images.append(bytes(data))
    out = np.zeros((len(images), 24, 24, 3), np.uint8)
    res = decode.decode_batch(
        images,
        out,
        RandomResizedCrop(size=24),
        seed=1,
        epoch=0,
        indices=np.arange(len(images), dtype=np.int64),
        threads=2,
        options=decode.DecodeOptions(slice_entropy=entropy),
    )
    assert len(res.status) == len(images)
    assert set(res.errors) == set(np.flatnonzero(res.status).tolist())
    assert res.sliced + res.slice_fallbacks <= len(images)
    assert res.sliced > 0 and res.slice_fallbacks > 0  # both paths were exercised
