"""MXNet's default augmenter geometry: the spec against MXNet's own parameters, the windows and pixels
against ``mx.io.ImageRecordIter`` on the same ``.rec``, the random draws against MXNet's own
distributions, and the engine's twin against the reference.

Pixels (measured on the fixture images, 4:2:0 JPEGs of 400x350 and odd sizes), fastload's one-pass
result against MXNet's ``ImageRecordIter(dtype='uint8')``:

- centre window without ``resize`` (image larger than ``data_shape``), ``pad`` + ``fill_value``,
  a fixed ``rotate`` with bilinear ``inter_method``: identical (same windows, same OpenCV warp
  positions, exact integer bilinear);
- ``resize`` + centre window: off by one at most, mean 0.12 (bilinear), 0.04 (bicubic): OpenCV's
  fixed-point weights;
- ``rotate`` with bicubic: off by one at most, mean 0.001;
- images smaller than ``data_shape`` (MXNet scales them twice, fastload once), or ``resize``
  followed by a rotation (two resamplings in MXNet, one here): mean 1-10 grey levels, the
  deliberate difference of sampling the source once.
"""

from __future__ import annotations

import dataclasses
import io
import re

import numpy as np
import pytest
from PIL import Image

from fastload import transforms as T
from fastload.engine_structs import to_native
from fastload.transforms.mxnet_augment import MXNET_PARAM_NAMES, MXNetDefaultAugment, MXNetSampleError, mxnet_plan
from fastload.transforms.warp import WarpPlan, warp_image

from conftest import HAVE_ENGINE, make_jpeg, requires_engine, requires_mxnet

GEOMETRY_FIELDS = [f.name for f in dataclasses.fields(MXNetDefaultAugment)]


def _native(name: str, fields: dict):
    from fastload import _engine

    return to_native(_engine, name, fields)


def _warp(img: np.ndarray, plan: WarpPlan) -> np.ndarray:
    if HAVE_ENGINE:
        from fastload import _engine

        return _engine._warp_image(img, _native("WarpPlan", plan.engine_fields()))
    return warp_image(img, plan)


# --- the spec --------------------------------------------------------------------------------


@requires_mxnet
def test_field_names_and_defaults_are_mxnets():
    import mxnet as mx

    doc = mx.io.ImageRecordIter.__doc__
    for name in GEOMETRY_FIELDS:
        m = re.search(rf"\n{name} : ([^\n]*)", doc)
        assert m is not None, f"{name} is not an ImageRecordIter parameter"
        if name == "data_shape":
            assert "required" in m.group(1)
            continue
        raw = re.search(r"default=(.*)$", m.group(1)).group(1).strip("'")
        default = getattr(MXNetDefaultAugment(data_shape=(3, 8, 8)), name)
        expected = (
            None if raw == "None" else type(default)(float(raw)) if not isinstance(default, bool) else bool(int(raw))
        )
        assert default == expected, (name, default, raw)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(data_shape=(4, 8, 8)),
        dict(data_shape=(3, 0, 8)),
        dict(data_shape=(8, 8)),
        dict(resize=0),
        dict(resize=-5),
        dict(inter_method=5),
        dict(pad=-1),
        dict(fill_value=256),
        dict(max_rotate_angle=-1),
        dict(max_shear_ratio=-0.1),
        dict(min_random_scale=1.2),
        dict(max_aspect_ratio=1.5),
        dict(min_aspect_ratio=0.0, max_aspect_ratio=1.0),
        dict(inter_method=0, max_rotate_angle=10),  # MXNet refuses nearest for its warp
        dict(random_resized_crop=True, rand_crop=True),
        dict(random_resized_crop=True, max_random_scale=1.2),
        dict(random_resized_crop=True, max_crop_size=10, min_crop_size=10),
        dict(random_resized_crop=True, min_random_area=0.9, max_random_area=0.5),
        dict(max_crop_size=10),
        dict(min_crop_size=10),
        dict(min_crop_size=20, max_crop_size=10),
        dict(resize=1.5),
        dict(rand_crop="yes"),
    ],
)
def test_bad_settings_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        MXNetDefaultAugment(**{"data_shape": (3, 8, 8), **kwargs})


def test_image_smaller_than_max_crop_size_is_an_error_naming_both():
    aug = MXNetDefaultAugment(data_shape=(3, 32, 32), max_crop_size=100, min_crop_size=50)
    with pytest.raises(MXNetSampleError, match="max_crop_size=100"):
        mxnet_plan(aug, 80, 120, 0)


def test_warp_condition_follows_mxnet():
    assert not MXNetDefaultAugment(data_shape=(3, 8, 8)).has_warp
    assert not MXNetDefaultAugment(
        data_shape=(3, 8, 8), random_resized_crop=True, max_aspect_ratio=4 / 3, min_aspect_ratio=3 / 4
    ).has_warp
    for kwargs in (
        dict(max_rotate_angle=1),
        dict(rotate=5),
        dict(max_shear_ratio=0.1),
        dict(max_random_scale=1.1),
        dict(max_aspect_ratio=0.25),
        dict(max_img_size=300.0),
        dict(min_img_size=10.0),
    ):
        assert MXNetDefaultAugment(data_shape=(3, 8, 8), **kwargs).has_warp, kwargs


# --- deterministic windows: MXNet's arithmetic -----------------------------------------------


def test_centre_window_is_mxnets_not_a_scaled_box():
    # No resize, image larger than data_shape: MXNet cuts the data_shape window at
    # ((cols - w) / 2, (rows - h) / 2), integer division, without scaling.
    plan, p = mxnet_plan(MXNetDefaultAugment(data_shape=(3, 224, 224)), 401, 350, 0)
    assert (p.crop_x, p.crop_y, p.crop_w, p.crop_h) == (88, 63, 224, 224)
    assert plan.composite == (1.0, 0.0, 88.0, 0.0, 1.0, 63.0)
    img = np.random.default_rng(0).integers(0, 256, (350, 401, 3), dtype=np.uint8)
    np.testing.assert_array_equal(warp_image(img, plan), img[63:287, 88:312])


def test_resize_then_window_sizes():
    aug = MXNetDefaultAugment(data_shape=(3, 224, 224), resize=256)
    _, p = mxnet_plan(aug, 500, 375, 0)
    assert (p.resized_w, p.resized_h) == (341, 256)  # 256 * 500 // 375
    assert (p.crop_x, p.crop_y) == ((341 - 224) // 2, (256 - 224) // 2)
    _, p = mxnet_plan(aug, 375, 500, 0)
    assert (p.resized_w, p.resized_h) == (256, 341)


def test_small_image_is_scaled_up_as_mxnet_does():
    _, p = mxnet_plan(MXNetDefaultAugment(data_shape=(3, 200, 200)), 90, 140, 0)
    # rows 140 < 200: cols -> int(200 / 140 * 90) = 128; then cols 128 < 200: rows -> int(200 / 128 * 200).
    assert (p.scaled_w, p.scaled_h) == (200, 312)
    assert (p.crop_x, p.crop_y) == (0, 56)


def test_pad_fills_and_keeps_pixels():
    aug = MXNetDefaultAugment(data_shape=(3, 40, 40), pad=4, fill_value=127, rand_crop=True)
    img = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    padded = np.full((40, 40, 3), 127, np.uint8)
    padded[4:36, 4:36] = img
    for i in range(20):
        plan, p = mxnet_plan(aug, 32, 32, T.sample_key(0, 0, i))
        assert p.crop_w == 40 and (p.crop_x, p.crop_y) == (0, 0)
        np.testing.assert_array_equal(warp_image(img, plan), padded)


# --- against MXNet's own iterator ------------------------------------------------------------


@pytest.fixture(scope="module")
def mx_rec(tmp_path_factory, realistic_folder):
    """A .rec of 5 fixture photos (~400x350) and 2 smaller odd-sized JPEGs, written by MXNet."""
    import mxnet as mx

    root = tmp_path_factory.mktemp("mxaug")
    payloads = [p.read_bytes() for p in sorted(realistic_folder.rglob("*.JPEG"))[:5]]
    payloads += [make_jpeg(180, 121, seed=3), make_jpeg(90, 140, seed=4)]
    writer = mx.recordio.MXIndexedRecordIO(str(root / "a.idx"), str(root / "a.rec"), "w")
    for i, b in enumerate(payloads):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, 0.0, i, 0), b))
    writer.close()
    images = [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in payloads]
    return root, images


def _mxnet_batch(root, n, **kwargs):
    import mxnet as mx

    it = mx.io.ImageRecordIter(
        path_imgrec=str(root / "a.rec"),
        path_imgidx=str(root / "a.idx"),
        batch_size=n,
        dtype="uint8",
        preprocess_threads=1,
        round_batch=False,
        **kwargs,
    )
    return it.next().data[0].asnumpy().transpose(0, 2, 3, 1).astype(int)


# (MXNet arguments, max and mean absolute difference on the photos, mean on the small images).
MXNET_PIXEL_CASES = [
    (dict(data_shape=(3, 200, 200)), 0, 0.0, 3.0),
    (dict(data_shape=(3, 224, 224), resize=256), 1, 0.2, 0.2),
    (dict(data_shape=(3, 224, 224), resize=256, inter_method=2), 1, 0.1, 0.1),
    (dict(data_shape=(3, 100, 120), resize=130, inter_method=9), 1, 0.2, 0.2),
    (dict(data_shape=(3, 128, 128), pad=20, fill_value=127), 0, 0.0, 0.0),
    (dict(data_shape=(3, 200, 200), rotate=30, fill_value=127), 0, 0.0, 6.0),
    (dict(data_shape=(3, 200, 200), rotate=30, fill_value=0, inter_method=2), 1, 0.01, 5.0),
    (dict(data_shape=(3, 100, 100), resize=110, mirror=True), 1, 0.2, 0.2),
    (dict(data_shape=(3, 160, 160), rotate=12, max_shear_ratio=0.0, pad=6, fill_value=33), 0, 0.0, 6.0),
]


@requires_mxnet
@pytest.mark.parametrize(("kwargs", "large_max", "large_mean", "small_mean"), MXNET_PIXEL_CASES)
def test_pixels_against_mxnet_image_record_iter(mx_rec, kwargs, large_max, large_mean, small_mean):
    root, images = mx_rec
    ours_kwargs = dict(kwargs.items())
    aug = MXNetDefaultAugment(**ours_kwargs)
    theirs = _mxnet_batch(root, len(images), **kwargs)
    for i, img in enumerate(images):
        plan, _ = mxnet_plan(aug, img.shape[1], img.shape[0], T.sample_key(0, 0, i))
        d = np.abs(_warp(img, plan).astype(int) - theirs[i])
        if i < 5:  # the photos: larger than data_shape
            assert d.max() <= large_max and d.mean() <= large_mean, (i, d.max(), d.mean())
        else:  # smaller than data_shape: MXNet scales twice, fastload once
            assert d.mean() <= small_mean, (i, d.max(), d.mean())


@requires_mxnet
@pytest.mark.parametrize(("kwargs", "large_max", "large_mean", "small_mean"), MXNET_PIXEL_CASES)
def test_fastload_image_record_iter_batch_against_mxnets(mx_rec, kwargs, large_max, large_mean, small_mean):
    # The drop-in itself (decode_batch through the engine, or the Pillow path under
    # FASTLOAD_DECODER=pillow): MXNet's iterator with only the class changed, batch for batch.
    import fastload.mxnet as fm

    root, images = mx_rec
    common = dict(
        path_imgrec=str(root / "a.rec"),
        path_imgidx=str(root / "a.idx"),
        batch_size=len(images),
        dtype="uint8",
        preprocess_threads=1,
        round_batch=False,
        **kwargs,
    )
    theirs = _mxnet_batch(root, len(images), **kwargs)
    with fm.ImageRecordIter(**common) as it:
        ours = it.next().data[0].asnumpy().transpose(0, 2, 3, 1).astype(int)
    for i in range(len(images)):
        d = np.abs(ours[i] - theirs[i])
        if i < 5:
            assert d.max() <= large_max and d.mean() <= large_mean, (i, d.max(), d.mean())
        else:
            assert d.mean() <= small_mean, (i, d.max(), d.mean())


# --- random draws against MXNet's distributions ----------------------------------------------


def _gradient_jpeg(size: int = 256) -> bytes:
    # R = x, G = y: the output's pixels say where they came from.
    ramp = np.arange(size, dtype=np.float64) * 255.0 / (size - 1)
    img = np.empty((size, size, 3), np.uint8)
    img[..., 0] = np.round(ramp)[None, :]
    img[..., 1] = np.round(ramp)[:, None]
    img[..., 2] = 128
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=100, subsampling=0)
    return buf.getvalue()


def _fit_planes(batch: np.ndarray):
    """Least-squares planes R = a x + b y + c and G = d x + e y + f of each output (source px per output px)."""
    n, h, w, _ = batch.shape
    ys, xs = np.mgrid[0:h, 0:w]
    design = np.stack([xs.ravel(), ys.ravel(), np.ones(h * w)], axis=1)
    coef_r = np.linalg.lstsq(design, batch[..., 0].reshape(n, -1).T.astype(float), rcond=None)[0]
    coef_g = np.linalg.lstsq(design, batch[..., 1].reshape(n, -1).T.astype(float), rcond=None)[0]
    return coef_r.T, coef_g.T


@pytest.fixture(scope="module")
def gradient_rec(tmp_path_factory):
    import mxnet as mx

    root = tmp_path_factory.mktemp("mxgrad")
    data = _gradient_jpeg()
    n = 2000
    writer = mx.recordio.MXIndexedRecordIO(str(root / "g.idx"), str(root / "g.rec"), "w")
    for i in range(n):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, 0.0, i, 0), data))
    writer.close()
    return root, n, np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _both(gradient_rec, **kwargs):
    """(MXNet's outputs, fastload's outputs) for the same settings on the gradient image."""
    import mxnet as mx

    root, n, img = gradient_rec
    # No seed_aug: MXNet reseeds each record's generator from its position in the chunk, which
    # repeats across chunks (2,000 records would give ~250 distinct draws).
    it = mx.io.ImageRecordIter(
        path_imgrec=str(root / "g.rec"),
        path_imgidx=str(root / "g.idx"),
        batch_size=250,
        dtype="uint8",
        preprocess_threads=1,
        **kwargs,
    )
    theirs = np.concatenate([b.data[0].asnumpy() for b in it]).transpose(0, 2, 3, 1)[:n]
    aug = MXNetDefaultAugment(**kwargs)
    ours = np.stack([_warp(img, mxnet_plan(aug, 256, 256, T.sample_key(11, 0, i))[0]) for i in range(n)])
    return theirs, ours


def _same_distribution(a: np.ndarray, b: np.ndarray) -> float:
    from scipy import stats

    return stats.ks_2samp(a, b).pvalue


@requires_mxnet
def test_random_resized_crop_area_and_aspect_follow_mxnet(gradient_rec):
    theirs, ours = _both(
        gradient_rec,
        data_shape=(3, 32, 32),
        random_resized_crop=True,
        min_random_area=0.08,
        max_random_area=1.0,
        min_aspect_ratio=0.75,
        max_aspect_ratio=4 / 3,
        rand_mirror=True,
    )
    stats = []
    for batch in (theirs, ours):
        r, g = _fit_planes(batch)
        sx, sy = np.abs(r[:, 0]) * 255 / 255, g[:, 1]
        area = (32 * sx) * (32 * sy) / 256**2
        mirrored = r[:, 0] < 0
        stats.append((area, sx / sy, mirrored))
    (a1, r1, m1), (a2, r2, m2) = stats
    # The windows' area fraction covers [0.08, 1], with MXNet's histogram.
    assert 0.07 < a2.min() < 0.12 and 0.9 < a2.max() <= 1.05
    assert _same_distribution(a1, a2) > 1e-3
    assert _same_distribution(r1, r2) > 1e-3
    h1, _ = np.histogram(a1, bins=10, range=(0, 1))
    h2, _ = np.histogram(a2, bins=10, range=(0, 1))
    assert np.abs(h1 - h2).max() < 0.05 * len(a1)
    assert abs(m1.mean() - 0.5) < 0.05 and abs(m2.mean() - 0.5) < 0.05


@requires_mxnet
def test_rotation_angles_follow_mxnet(gradient_rec):
    theirs, ours = _both(gradient_rec, data_shape=(3, 64, 64), max_rotate_angle=10, fill_value=0)
    angles = []
    for batch in (theirs, ours):
        r, _ = _fit_planes(batch)
        # R = x_src = cos(t) x + sin(t) y + c for MXNet's (clockwise-positive) integer angle t.
        angles.append(np.round(np.degrees(np.arctan2(r[:, 1], r[:, 0]))).astype(int))
    for a in angles:
        assert a.min() == -10 and a.max() == 10
        counts = np.bincount(a + 10, minlength=21)
        from scipy import stats

        assert stats.chisquare(counts).pvalue > 1e-3  # uniform over the 21 integers
    assert _same_distribution(*angles) > 1e-3


@requires_mxnet
def test_random_scale_and_crop_sizes_follow_mxnet(gradient_rec):
    theirs, ours = _both(gradient_rec, data_shape=(3, 64, 64), min_random_scale=0.8, max_random_scale=1.2)
    scales = [1.0 / _fit_planes(b)[0][:, 0] for b in (theirs, ours)]
    for s in scales:
        assert 0.78 < s.min() < 0.82 and 1.18 < s.max() < 1.22
    assert _same_distribution(*scales) > 1e-3
    theirs, ours = _both(gradient_rec, data_shape=(3, 32, 32), max_crop_size=200, min_crop_size=100, rand_crop=True)
    sizes = [np.round(32 * _fit_planes(b)[0][:, 0]).astype(int) for b in (theirs, ours)]
    for s in sizes:
        assert 99 <= s.min() <= 101 and 199 <= s.max() <= 201
    assert _same_distribution(*sizes) > 1e-3


def test_draw_distributions_over_10000_samples():
    from scipy import stats

    n = 10_000
    rrc = MXNetDefaultAugment(
        data_shape=(3, 224, 224),
        random_resized_crop=True,
        min_random_area=0.08,
        min_aspect_ratio=0.75,
        max_aspect_ratio=4 / 3,
        rand_mirror=True,
        inter_method=10,
    )
    warp = MXNetDefaultAugment(
        data_shape=(3, 224, 224),
        rand_crop=True,
        max_rotate_angle=10,
        max_shear_ratio=0.1,
        max_aspect_ratio=0.25,
        min_random_scale=0.9,
        max_random_scale=1.1,
    )
    areas, ratios, mirrors, inters = [], [], [], []
    angles, shears, scales, aspects = [], [], [], []
    for i in range(n):
        key = T.sample_key(3, 1, i)
        _, p = mxnet_plan(rrc, 500, 375, key)
        areas.append(p.crop_w * p.crop_h / (500 * 375))
        ratios.append(p.crop_w / p.crop_h)
        mirrors.append(p.mirror)
        inters.append(p.inter_crop)
        _, q = mxnet_plan(warp, 500, 375, key)
        angles.append(q.angle), shears.append(q.shear), scales.append(q.scale), aspects.append(q.ratio)
    areas = np.array(areas)
    # image_aug_default.cc's loop, restated with numpy's generator: the distribution our draws must have.
    rng = np.random.default_rng(0)
    expected, expected_ratios = [], []
    while len(expected) < n:
        for _ in range(10):
            target = 500 * 375 * rng.uniform(0.08, 1.0)
            r = rng.uniform(0.75, 4 / 3)
            hh, ww = round(np.sqrt(target / r)), round(np.sqrt(target * r))
            if rng.uniform() > 0.5:
                hh, ww = ww, hh
            if hh <= 375 and ww <= 500:
                expected.append(hh * ww / (500 * 375))
                expected_ratios.append(ww / hh)
                break
        else:  # no attempt fits: MXNet's centre window of data_shape
            expected.append(224 * 224 / (500 * 375))
            expected_ratios.append(1.0)
    assert stats.ks_2samp(areas, expected).pvalue > 1e-3
    assert areas.min() > 0.079 and areas.max() <= 1.0
    assert min(ratios) > 0.75 * 0.97 and max(ratios) < 4 / 3 * 1.03
    # With the random swap of width and height, and the landscape image favouring wide windows.
    assert stats.ks_2samp(ratios, expected_ratios).pvalue > 1e-3
    assert abs(np.mean(mirrors) - 0.5) < 0.02
    assert stats.chisquare(np.bincount(inters, minlength=5)).pvalue > 1e-3  # inter_method=10: uniform over 0..4
    assert stats.chisquare(np.bincount(np.array(angles) + 10, minlength=21)).pvalue > 1e-3
    for values, lo, hi in [(shears, -0.1, 0.1), (scales, 0.9, 1.1), (aspects, 0.75, 1.25)]:
        v = np.array(values)
        assert lo <= v.min() and v.max() < hi
        assert stats.kstest((v - lo) / (hi - lo), "uniform").pvalue > 1e-3


# --- the engine's twin -----------------------------------------------------------------------


SETTINGS = [
    dict(data_shape=(3, 200, 200)),
    dict(data_shape=(3, 224, 224), resize=256, inter_method=9),
    dict(
        data_shape=(3, 224, 224),
        rand_crop=True,
        rand_mirror=True,
        max_rotate_angle=10,
        max_shear_ratio=0.1,
        max_aspect_ratio=0.25,
        fill_value=127,
    ),
    dict(
        data_shape=(3, 224, 224),
        random_resized_crop=True,
        min_random_area=0.08,
        max_aspect_ratio=4 / 3,
        min_aspect_ratio=3 / 4,
        rand_mirror=True,
        inter_method=10,
    ),
    dict(
        data_shape=(3, 128, 128),
        max_crop_size=200,
        min_crop_size=120,
        rand_crop=True,
        pad=8,
        inter_method=3,
        max_random_scale=1.2,
        min_random_scale=0.9,
    ),
    dict(data_shape=(3, 500, 520), inter_method=4, rotate=20),
    dict(data_shape=(3, 100, 100), inter_method=0, resize=120),
    dict(
        data_shape=(3, 64, 80),
        resize=70,
        max_rotate_angle=30,
        max_img_size=90.0,
        min_img_size=50.0,
        inter_method=10,
        rand_crop=True,
        mirror=True,
    ),
]


@requires_engine
@pytest.mark.parametrize("kwargs", SETTINGS)
def test_engine_plans_params_and_pixels_are_the_reference(realistic_folder, kwargs):
    from fastload import _engine

    aug = MXNetDefaultAugment(**kwargs)
    img = np.asarray(Image.open(sorted(realistic_folder.rglob("*.JPEG"))[1]).convert("RGB"))
    h, w = img.shape[:2]
    for i in range(15):
        key = T.sample_key(3, 0, i)
        plan, params = mxnet_plan(aug, w, h, key)
        engine_plan, engine_params = _engine._warp_mxnet_plan(
            _native("MXNetAugmentSpec", aug.engine_fields()), w, h, key
        )
        assert engine_plan == _native("WarpPlan", plan.engine_fields())
        assert dict(zip(MXNET_PARAM_NAMES, engine_params, strict=False)) == dict(
            zip(MXNET_PARAM_NAMES, params.as_tuple(), strict=False)
        )
        if i < 4:
            np.testing.assert_array_equal(_warp(img, plan), warp_image(img, plan))


@requires_engine
def test_engine_reports_mxnets_refusals():
    from fastload import _engine

    aug = MXNetDefaultAugment(data_shape=(3, 32, 32), max_crop_size=100, min_crop_size=50)
    with pytest.raises(ValueError, match="max_crop_size=100"):
        _engine._warp_mxnet_plan(_native("MXNetAugmentSpec", aug.engine_fields()), 80, 120, 0)
