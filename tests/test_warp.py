"""The one-pass warp: the numpy reference sampler, RandomAffine (spec, draws, torchvision parity) and
the engine's twin (plans and pixels against the reference).

Measured on the ImageNet-sized fixture images (``realistic_folder``), RandomResizedCrop(224) + flip
then RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=(-5, 5, -3, 3)):
mean absolute difference to torchvision's two-pass PIL result with the same drawn parameters is
0.2 grey levels for ``nearest`` (the two-pass result: only rounding and exact-tie picks differ) and
3.3-3.7 for ``bilinear`` / ``bicubic``, where fastload interpolates once instead of twice (sharper;
PIL also truncates instead of rounding, -0.5 on average). The bounds below hold those numbers with
a margin.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastload import transforms as T
from fastload.engine_structs import to_native
from fastload.transforms.affine import (
    AFFINE_COUNTER,
    AffineParams,
    RandomAffine,
    affine_plan,
    inverse_affine_matrix,
    sample_affine,
)
from fastload.transforms.warp import Border, Kernel, WarpPlan, warp_image

from conftest import requires_engine, requires_torch

IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


def _images(folder: Path, count: int):
    paths = sorted(folder.rglob("*.JPEG"))[:count]
    assert len(paths) == count
    return [np.asarray(Image.open(p).convert("RGB")) for p in paths]


def _box_plan(out_h, out_w, box, kernel, *, antialias=True, border=Border.DROP, shift=(0.0, 0.0)):
    x0, y0, x1, y1 = box
    sx, sy = (x1 - x0) / out_w, (y1 - y0) / out_h
    return WarpPlan(
        out_h=out_h,
        out_w=out_w,
        to_frame=IDENTITY,
        frame=None,
        snap=False,
        to_source=(sx, 0.0, x0, 0.0, sy, y0),
        scale=(sx, sy),
        kernel=kernel,
        antialias=antialias,
        nearest_shift=shift,
        border=border,
        fill=(0, 0, 0),
        dct_scaling=False,
    )


# --- the reference sampler -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kernel", "pil_filter", "max_diff", "max_mean"),
    [
        (Kernel.LINEAR, Image.BILINEAR, 1, 0.25),
        (Kernel.CUBIC, Image.BICUBIC, 12, 0.35),
    ],
)
def test_axis_aligned_plan_is_pillows_resize(realistic_folder, kernel, pil_filter, max_diff, max_mean):
    # Pillow rounds its horizontal pass to uint8 (and clips bicubic overshoot there): the only
    # differences from the one-pass float evaluation.
    for img in _images(realistic_folder, 3):
        h, w = img.shape[:2]
        for box, size in [((10.0, 20.0, w - 30.0, h - 5.0), (100, 120)), ((5.5, 3.25, 80.0, 90.0), (150, 160))]:
            ref = np.asarray(Image.fromarray(img).resize(size[::-1], pil_filter, box=box)).astype(int)
            out = warp_image(img, _box_plan(*size, box, kernel)).astype(int)
            d = np.abs(ref - out)
            assert d.max() <= max_diff and d.mean() <= max_mean, (box, size, d.max(), d.mean())


@pytest.mark.parametrize(
    ("kernel", "flag"),
    [
        (Kernel.LINEAR, "INTER_LINEAR"),
        (Kernel.CUBIC_CV, "INTER_CUBIC"),
        (Kernel.LANCZOS4, "INTER_LANCZOS4"),
        (Kernel.AREA, "INTER_AREA"),
        (Kernel.NEAREST, "INTER_NEAREST"),
    ],
)
def test_opencv_kernels_are_cv2_resize(realistic_folder, kernel, flag):
    cv2 = pytest.importorskip("cv2")
    img = _images(realistic_folder, 1)[0]
    h, w = img.shape[:2]
    for size in [(100, 120), (h * 2 + 3, w + 17), (115, 150)]:
        ref = cv2.resize(img, size[::-1], interpolation=getattr(cv2, flag)).astype(int)
        sx, sy = w / size[1], h / size[0]
        plan = _box_plan(
            *size,
            (0.0, 0.0, float(w), float(h)),
            kernel,
            antialias=False,
            border=Border.REPLICATE,
            shift=(-sx / 2, -sy / 2),
        )
        d = np.abs(warp_image(img, plan).astype(int) - ref)
        # OpenCV's fixed-point weights (11 bits, truncating shifts) against float ones: off by one
        # at most (measured mean 0.00-0.13).
        assert d.max() <= 1 and d.mean() < 0.2, (size, d.max(), d.mean())


@pytest.mark.parametrize("flag", ["INTER_LINEAR", "INTER_NEAREST"])
def test_quantized_plan_is_cv2_warp_affine_exactly(realistic_folder, flag):
    cv2 = pytest.importorskip("cv2")
    img = _images(realistic_folder, 1)[0]
    h, w = img.shape[:2]
    kernel = Kernel.LINEAR if flag == "INTER_LINEAR" else Kernel.NEAREST
    for angle, scale in [(30.0, 1.0), (-7.0, 0.8), (95.0, 1.3)]:
        m = cv2.getRotationMatrix2D((w / 2, h / 2), angle, scale)
        ref = cv2.warpAffine(
            img, m, (w, h), flags=getattr(cv2, flag), borderMode=cv2.BORDER_CONSTANT, borderValue=(17, 99, 200)
        )
        inv = cv2.invertAffineTransform(m)
        a, b, c, d, e, f = inv.ravel()
        # OpenCV's centred coordinates -> Pillow's: p_src = A (p - 0.5) + b + 0.5.
        to_source = (a, b, c - 0.5 * (a + b) + 0.5, d, e, f - 0.5 * (d + e) + 0.5)
        plan = WarpPlan(
            out_h=h,
            out_w=w,
            to_frame=IDENTITY,
            frame=None,
            snap=False,
            to_source=to_source,
            scale=(1.0, 1.0),
            kernel=kernel,
            antialias=False,
            nearest_shift=(0.0, 0.0),
            border=Border.CONSTANT,
            fill=(17, 99, 200),
            dct_scaling=False,
            quantize=True,
        )
        np.testing.assert_array_equal(warp_image(img, plan), ref)


def test_frame_fill_and_snap():
    img = np.arange(10 * 12 * 3, dtype=np.uint8).reshape(10, 12, 3)
    # Frame points x in [2, 6) only; snapped to pixel centres, a box map of scale 1 copies pixels.
    plan = WarpPlan(
        out_h=10,
        out_w=12,
        to_frame=(1.0, 0.0, 0.3, 0.0, 1.0, 0.0),
        frame=(2.0, 0.0, 6.0, 10.0),
        snap=True,
        to_source=IDENTITY,
        scale=(1.0, 1.0),
        kernel=Kernel.LINEAR,
        antialias=True,
        nearest_shift=(0.0, 0.0),
        border=Border.DROP,
        fill=(1, 2, 3),
        dct_scaling=False,
    )
    out = warp_image(img, plan)
    # Output column x has frame x + 0.8: inside for x = 2..5, snapped to column x.
    np.testing.assert_array_equal(out[:, 2:6], img[:, 2:6])
    assert (out[:, :2] == (1, 2, 3)).all() and (out[:, 6:] == (1, 2, 3)).all()


# --- RandomAffine: spec and draws ------------------------------------------------------------


def test_random_affine_takes_torchvision_parameter_forms():
    t = RandomAffine(degrees=10, shear=5, fill=7)
    assert t.degrees == (-10.0, 10.0) and t.shear == (-5.0, 5.0) and t.fill == (7, 7, 7)
    assert t.interpolation == "nearest"  # torchvision's default
    t = RandomAffine(
        degrees=(-3, 20),
        translate=(0.1, 0.3),
        scale=(0.5, 2),
        shear=(1, 2, 3, 4),
        interpolation="BILINEAR",
        fill=(1.9, 2, 3),
        center=(5, 6),
    )
    assert t.degrees == (-3.0, 20.0) and t.translate == (0.1, 0.3) and t.scale == (0.5, 2.0)
    assert t.shear == (1.0, 2.0, 3.0, 4.0) and t.interpolation == "bilinear" and t.fill == (1, 2, 3)
    assert t.center == (5.0, 6.0)


@requires_torch
def test_random_affine_accepts_interpolation_mode():
    from torchvision.transforms import InterpolationMode

    assert RandomAffine(degrees=0, interpolation=InterpolationMode.BICUBIC).interpolation == "bicubic"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(degrees=-1),
        dict(degrees=(1, 2, 3)),
        dict(degrees=(5, 1)),
        dict(degrees=0, translate=(0.1,)),
        dict(degrees=0, translate=(0.1, 1.5)),
        dict(degrees=0, scale=(0, 1)),
        dict(degrees=0, scale=(2, 1)),
        dict(degrees=0, shear=(1, 2, 3)),
        dict(degrees=0, shear=-2),
        dict(degrees=0, interpolation="lanczos"),
        dict(degrees=0, fill=(1, 2)),
        dict(degrees=0, fill=300),
        dict(degrees=0, center=(1,)),
    ],
)
def test_random_affine_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        RandomAffine(**kwargs)
    with pytest.raises(TypeError):
        RandomAffine(10)  # keyword-only, as every spec


def test_draws_cover_torchvision_ranges():
    t = RandomAffine(degrees=(-20, 30), translate=(0.1, 0.2), scale=(0.8, 1.25), shear=(-5, 5, -3, 4))
    n = 10_000
    draws = [sample_affine(t, 200, 100, T.sample_key(0, 0, i)) for i in range(n)]
    angle = np.array([d.angle for d in draws])
    tx = np.array([d.translate[0] for d in draws])
    ty = np.array([d.translate[1] for d in draws])
    scale = np.array([d.scale for d in draws])
    shx = np.array([d.shear[0] for d in draws])
    shy = np.array([d.shear[1] for d in draws])
    from scipy import stats

    for values, lo, hi in [(angle, -20, 30), (scale, 0.8, 1.25), (shx, -5, 5), (shy, -3, 4)]:
        assert lo <= values.min() and values.max() < hi
        assert stats.kstest((values - lo) / (hi - lo), "uniform").pvalue > 1e-3
    # Translations: round(uniform(-20, 20)) and round(uniform(-20, 20)): every integer, ends half as often.
    assert tx.min() == -20 and tx.max() == 20 and ty.min() == -20 and ty.max() == 20
    counts = np.bincount(tx + 20, minlength=41)
    assert abs(counts[0] / counts[20] - 0.5) < 0.3 and abs(counts[1:-1].mean() / (n / 40) - 1) < 0.05
    assert abs(np.corrcoef(angle, scale)[0, 1]) < 0.05 and abs(np.corrcoef(tx, shx)[0, 1]) < 0.05


def test_each_draw_has_its_own_counter():
    key = T.sample_key(5, 1, 9)
    full = sample_affine(
        RandomAffine(degrees=10, translate=(0.2, 0.2), scale=(0.5, 2), shear=(1, 2, 3, 4)), 50, 50, key
    )
    only_scale = sample_affine(RandomAffine(degrees=0, scale=(0.5, 2)), 50, 50, key)
    assert only_scale.scale == full.scale and only_scale.angle == 0.0
    assert full.angle == -10 + 20 * T.uniform(key, AFFINE_COUNTER)


@requires_torch
def test_inverse_matrix_is_torchvisions():
    import torchvision.transforms.functional as F

    rng = np.random.default_rng(0)
    for _ in range(200):
        p = AffineParams(
            angle=float(rng.uniform(-180, 180)),
            translate=(int(rng.integers(-30, 30)), int(rng.integers(-30, 30))),
            scale=float(rng.uniform(0.3, 3)),
            shear=(float(rng.uniform(-40, 40)), float(rng.uniform(-40, 40))),
        )
        center = (float(rng.uniform(0, 300)), float(rng.uniform(0, 300)))
        ref = F._get_inverse_affine_matrix(list(center), p.angle, list(p.translate), p.scale, list(p.shear))
        assert inverse_affine_matrix(p, center) == tuple(ref)


# --- RandomAffine: one pass against torchvision's two ----------------------------------------


@requires_torch
@pytest.mark.parametrize(("interpolation", "max_mean"), [("nearest", 0.5), ("bilinear", 4.5), ("bicubic", 4.5)])
def test_fused_affine_against_torchvision_two_pass(realistic_folder, interpolation, max_mean):
    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode

    geometry = T.RandomResizedCrop(size=224, flip=0.5)
    affine = RandomAffine(
        degrees=15,
        translate=(0.1, 0.1),
        scale=(0.9, 1.1),
        shear=(-5, 5, -3, 3),
        interpolation=interpolation,
        fill=(10, 128, 250),
    )
    means = []
    for i, img in enumerate(_images(realistic_folder, 6)):
        h, w = img.shape[:2]
        p = T.sample_params(w, h, geometry, seed=0, epoch=0, index=i)
        plan, drawn = affine_plan(affine, p.box, p.flip, (224, 224), T.sample_key(0, 0, i))
        resized = Image.fromarray(img).resize((224, 224), Image.BILINEAR, box=p.box)
        if p.flip:
            resized = resized.transpose(Image.FLIP_LEFT_RIGHT)
        ref = F.affine(
            resized,
            drawn.angle,
            list(drawn.translate),
            drawn.scale,
            list(drawn.shear),
            interpolation=InterpolationMode(interpolation),
            fill=list(affine.fill),
        )
        d = np.abs(warp_image(img, plan).astype(int) - np.asarray(ref).astype(int))
        means.append(d.mean())
        # Same frame: the pixels torchvision fills, fastload fills (fill is an exact colour).
        filled_ref = (np.asarray(ref) == affine.fill).all(-1)
        filled = (warp_image(img, plan) == affine.fill).all(-1)
        assert (filled_ref != filled).mean() < 0.01
    assert np.mean(means) <= max_mean, means


def test_no_rotation_is_the_plain_resize(realistic_folder):
    # Degrees 0 and no other draw: every interpolation lands on the resized crop's pixel centres.
    img = _images(realistic_folder, 1)[0]
    h, w = img.shape[:2]
    box = (30.0, 20.0, w - 40.0, h - 10.0)
    ref = np.asarray(Image.fromarray(img).resize((200, 180), Image.BILINEAR, box=box)).astype(int)
    for interpolation in ("nearest", "bilinear"):
        plan, _ = affine_plan(RandomAffine(degrees=0, interpolation=interpolation), box, False, (180, 200), 0)
        d = np.abs(warp_image(img, plan).astype(int) - ref)
        assert d.max() <= 1 and d.mean() < 0.25


# --- the engine's twin -----------------------------------------------------------------------


def _native(plan: WarpPlan):
    """The reference plan as the engine's WarpPlan struct."""
    from fastload import _engine

    return to_native(_engine, "WarpPlan", plan.engine_fields())


@requires_engine
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic"])
def test_engine_affine_plans_and_pixels_are_the_reference(realistic_folder, interpolation):
    from fastload import _engine

    img = _images(realistic_folder, 1)[0]
    h, w = img.shape[:2]
    geometry = T.RandomResizedCrop(size=(160, 144))
    for i in range(12):
        affine = RandomAffine(
            degrees=(-20, 30),
            translate=(0.1, 0.2),
            scale=(0.8, 1.2),
            shear=(-5, 5, -3, 4),
            interpolation=interpolation,
            fill=(1, 2, 3),
            center=(70, 60) if i % 3 == 0 else None,
        )
        p = T.sample_params(w, h, geometry, seed=1, epoch=2, index=i)
        key = T.sample_key(1, 2, i)
        plan, drawn = affine_plan(affine, p.box, p.flip, (160, 144), key)
        spec = to_native(_engine, "AffineSpec", affine.engine_fields())
        engine_plan, engine_drawn = _engine._warp_affine_plan(spec, p.box, p.flip, 160, 144, key)
        assert engine_plan == _native(plan) and tuple(engine_drawn) == drawn.as_tuple()
        # The engine reads only the source rectangle it would decode: equal pixels prove it covers every tap.
        np.testing.assert_array_equal(_engine._warp_image(img, _native(plan)), warp_image(img, plan))


@requires_engine
@pytest.mark.parametrize("kernel", list(Kernel))
@pytest.mark.parametrize("border", list(Border))
def test_engine_sampler_is_the_reference_for_every_kernel_and_border(realistic_folder, kernel, border):
    from fastload import _engine

    img = _images(realistic_folder, 1)[0]
    h, w = img.shape[:2]
    rot = math.radians(25)
    # A rotation and zoom that reaches past the image on every side, with and without widening.
    for scale, antialias in [(0.7, False), (1.6, True), (2.5, True)]:
        c, s = math.cos(rot) * scale, math.sin(rot) * scale
        to_source = (c, -s, w / 2 - c * 60 + s * 50, s, c, h / 2 - s * 60 - c * 50)
        plan = WarpPlan(
            out_h=100,
            out_w=120,
            to_frame=IDENTITY,
            frame=(3.0, 2.0, 115.0, 96.0),
            snap=False,
            to_source=to_source,
            scale=(scale, scale),
            kernel=kernel,
            antialias=antialias,
            nearest_shift=(-0.3, 0.2),
            border=border,
            fill=(9, 8, 7),
            dct_scaling=False,
        )
        np.testing.assert_array_equal(_engine._warp_image(img, _native(plan)), warp_image(img, plan))


@requires_engine
def test_engine_region_decode_then_warp(realistic_folder):
    from fastload import _engine
    from fastload.decode import DecodeOptions, _native_options

    path = sorted(realistic_folder.rglob("*.JPEG"))[0]
    data = path.read_bytes()
    img = np.asarray(Image.open(path).convert("RGB"))
    h, w = img.shape[:2]
    affine = RandomAffine(degrees=20, scale=(0.7, 1.3), interpolation="bilinear", fill=5)
    # A small crop (region decode of a corner) and a 12x downscale (DCT scaling when allowed: the rule
    # leaves the warp at least a 4x step at 1/2, so 1/2 whatever the affine's drawn scale).
    shrunk = (h // 12, w // 12)
    for box, size in [((200.0, 150.0, 300.0, 250.0), (64, 64)), ((0.0, 0.0, float(w), float(h)), shrunk)]:
        plan, _ = affine_plan(affine, box, True, size, T.sample_key(0, 0, 3))
        status, message, out, denom = _engine._warp_decode(
            data, _native(plan), _native_options(DecodeOptions(dct_scaling=False))
        )
        assert status == 0 and denom == 1, message
        # The region decode is bit-identical to the full decode: so are the warped pixels.
        np.testing.assert_array_equal(out, warp_image(img, plan))
        status, _, scaled, denom = _engine._warp_decode(data, _native(plan), _native_options(DecodeOptions()))
        assert status == 0
        if size == shrunk:
            # libjpeg's scaled IDCT replaces part of the filter: close, not equal.
            assert denom == 2
            d = np.abs(scaled.astype(int) - warp_image(img, plan).astype(int))
            assert d.mean() < 2.0
        else:
            assert denom == 1
    status, message, out, _ = _engine._warp_decode(
        data[: len(data) // 3], _native(plan), _native_options(DecodeOptions())
    )
    assert status != 0 and out is None and message


@requires_engine
def test_engine_snapped_affine_plan_is_the_reference(realistic_folder):
    # interpolation="nearest" through the region decode + warp (the _warp_decode hook): the snapped
    # plan is evaluated as any other, bit for bit the reference (the decode path makes such frames
    # with its plain crop path instead: tests/test_warp_pipeline.py).
    from fastload import _engine
    from fastload.decode import DecodeOptions, _native_options

    for i, path in enumerate(sorted(realistic_folder.rglob("*.JPEG"))[:4]):
        data = path.read_bytes()
        img = np.asarray(Image.open(path).convert("RGB"))
        h, w = img.shape[:2]
        p = T.sample_params(w, h, T.RandomResizedCrop(size=224), seed=0, epoch=0, index=i)
        plan, _ = affine_plan(
            RandomAffine(degrees=15, translate=(0.1, 0.1), fill=(3, 2, 1)),
            p.box,
            p.flip,
            (224, 224),
            T.sample_key(0, 0, i),
        )
        status, message, out, _denom = _engine._warp_decode(
            data, _native(plan), _native_options(DecodeOptions(dct_scaling=False))
        )
        assert status == 0, message
        d = np.abs(out.astype(int) - warp_image(img, plan).astype(int))
        assert d.max() == 0, (i, d.max())
