"""MXNet's colour augmentation (MXNetColorAugment) against MXNet's own ImageRecordIter and OpenCV.

MXNet's random generator cannot be replayed, so the check is distributional: a .rec of 10,000
uniform-colour images goes through MXNet 1.9's ImageRecordIter with each colour setting, and
through fastload's op (same decoded inputs, fastload's counters); from each output the per-image
parameter is recovered (brightness factor, contrast and saturation factors through MXNet's swapped
gray weights, HLS shifts, PCA shifts, normalization contrast / illumination) and the two samples of
10,000 are compared: two-sample KS test at 1e-4, means and ranges. The arithmetic is checked against
OpenCV itself (cv2 4.x; MXNet 1.9.1 bundles 3.4.2): the HLS conversions agree with cv2 on all
16.7M colours but for 0.02% of hues/saturations off by one (OpenCV 4's fused multiply-add), and
MXNet's 14-bit gray differs from OpenCV 4's 15-bit gray by one level on 0.26% of colours.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from fastload.transforms import MXNetColorAugment, sample_key
from fastload.transforms.erasing import apply_output_ops
from fastload.transforms.mxnet_color import mx_gray, mx_hls_to_rgb, mx_rgb_to_hls
from fastload.transforms.pixel import run_pixel_ops_batch

from conftest import HAVE_ENGINE, requires_engine, requires_mxnet

scipy_stats = pytest.importorskip("scipy.stats")

N = 10_000
SIZE = 8
ALPHA = 1e-4


@pytest.fixture(scope="module")
def colour_rec(tmp_path_factory):
    """10,000 uniform-colour 8x8 JPEGs (quality 100, 4:4:4) in an indexed .rec, and MXNet's decode of them."""
    mx = pytest.importorskip("mxnet")
    from PIL import Image

    d = tmp_path_factory.mktemp("mxcolour")
    rng = np.random.default_rng(0)
    colours = rng.integers(25, 231, (N, 3))
    rec = mx.recordio.MXIndexedRecordIO(str(d / "c.idx"), str(d / "c.rec"), "w")
    for i, col in enumerate(colours):
        buf = io.BytesIO()
        Image.new("RGB", (SIZE, SIZE), tuple(int(v) for v in col)).save(buf, "JPEG", quality=100, subsampling=0)
        rec.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i), i, 0), buf.getvalue()))
    rec.close()
    decoded, _ = _mx_run(d, dtype="uint8")
    return d, decoded


def _mx_run(d, **kwargs):
    import mxnet as mx

    it = mx.io.ImageRecordIter(
        path_imgrec=str(d / "c.rec"),
        path_imgidx=str(d / "c.idx"),
        data_shape=(3, SIZE, SIZE),
        batch_size=500,
        preprocess_threads=2,
        shuffle=False,
        **kwargs,
    )
    data, labels = [], []
    for batch in it:
        data.append(batch.data[0].asnumpy())
        labels.append(batch.label[0].asnumpy())
    order = np.argsort(np.concatenate(labels).astype(int), kind="stable")
    return np.concatenate(data)[order].transpose(0, 2, 3, 1), order  # NHWC, record order


def _ours(decoded, op):
    out = decoded.copy()
    run_pixel_ops_batch(out, [op], seed=0, epoch=0, indices=np.arange(len(out)), threads=2)
    return out


def _compare(name, ours, theirs, *, mean_tol):
    ours, theirs = np.asarray(ours, float), np.asarray(theirs, float)
    p = scipy_stats.ks_2samp(ours, theirs).pvalue
    assert p > ALPHA, f"{name}: KS p={p:.2e}"
    assert abs(ours.mean() - theirs.mean()) < mean_tol, (name, ours.mean(), theirs.mean())
    return p


@requires_mxnet
def test_decoded_inputs_are_uniform(colour_rec):
    _, decoded = colour_rec
    assert decoded.dtype == np.uint8 and decoded.shape == (N, SIZE, SIZE, 3)
    assert np.all(decoded == decoded[:, :1, :1, :])


def _factor_estimates(decoded, out, reference):
    # out = v * a + ref * (1 - a) per channel; use the channel farthest from the reference value.
    v = decoded[:, 0, 0, :].astype(float)
    o = out[:, 0, 0, :].astype(float)
    ref = reference.astype(float)[:, None]
    spread = np.abs(v - ref)
    ch = np.argmax(spread, axis=1)
    rows = np.arange(len(v))
    keep = spread[rows, ch] >= 40
    with np.errstate(divide="ignore", invalid="ignore"):
        return ((o[rows, ch] - ref[:, 0]) / (v[rows, ch] - ref[:, 0]))[keep]


@requires_mxnet
def test_brightness_factor_distribution(colour_rec):
    d, decoded = colour_rec
    theirs, _ = _mx_run(d, dtype="uint8", brightness=0.4)
    ours = _ours(decoded, MXNetColorAugment(brightness=0.4))
    zero = np.zeros(N)
    a, b = _factor_estimates(decoded, ours, zero), _factor_estimates(decoded, theirs, zero)
    _compare("brightness factor", a, b, mean_tol=0.01)
    for est in (a, b):
        assert 0.58 < est.min() < 0.63 and 1.37 < est.max() < 1.42  # 1 + U(-0.4, 0.4), quantized


@requires_mxnet
@pytest.mark.parametrize("name", ["contrast", "saturation"])
def test_contrast_and_saturation_factor_distributions(colour_rec, name):
    # For a uniform image both blend with MXNet's gray of the colour (blue weighted 0.299): the
    # estimates only centre on U(0.6, 1.4) with those swapped weights.
    d, decoded = colour_rec
    theirs, _ = _mx_run(d, dtype="uint8", **{name: 0.4})
    ours = _ours(decoded, MXNetColorAugment(**{name: 0.4}))
    gray = mx_gray(decoded[:, 0, 0, :])
    a, b = _factor_estimates(decoded, ours, gray), _factor_estimates(decoded, theirs, gray)
    _compare(f"{name} factor", a, b, mean_tol=0.01)
    for est in (a, b):
        # Through the right gray the estimates stay within U(0.6, 1.4) up to rounding (at most 0.5 /
        # 40 = 0.0125); through the unswapped gray 4% of MXNet's fall outside 0.585..1.415.
        assert abs(np.median(est) - 1.0) < 0.03 and np.percentile(est, 2) < 0.65 and np.percentile(est, 98) > 1.35
        assert np.mean((est < 0.585) | (est > 1.415)) < 0.005, (np.percentile(est, 1), np.percentile(est, 99))


@requires_mxnet
def test_hsl_shift_distributions(colour_rec):
    d, decoded = colour_rec
    kw = dict(random_h=36, random_s=50, random_l=50)  # common/data.py's --aug-level 3
    theirs, _ = _mx_run(d, dtype="uint8", **kw)
    ours = _ours(decoded, MXNetColorAugment(**kw))
    before = mx_rgb_to_hls(decoded[:, 0, 0, :]).astype(int)
    for ch, name in enumerate(("H", "L", "S")):
        a = mx_rgb_to_hls(ours[:, 0, 0, :]).astype(int)[:, ch] - before[:, ch]
        b = mx_rgb_to_hls(theirs[:, 0, 0, :]).astype(int)[:, ch] - before[:, ch]
        _compare(f"HLS {name} shift", a, b, mean_tol=1.0)


@requires_mxnet
def test_pca_noise_distribution(colour_rec):
    d, decoded = colour_rec
    theirs, _ = _mx_run(d, dtype="uint8", pca_noise=0.1)
    ours = _ours(decoded, MXNetColorAugment(pca_noise=0.1))
    for ch in range(3):
        a = ours[:, 0, 0, ch].astype(int) - decoded[:, 0, 0, ch]
        b = theirs[:, 0, 0, ch].astype(int) - decoded[:, 0, 0, ch]
        _compare(f"PCA shift channel {ch}", a, b, mean_tol=0.1)
        assert b.std() > 1.0  # the noise is there (0.1 * 55.46 * 0.57 grey levels on the first component)


@requires_mxnet
def test_gluoncv_colour_setting_output_distribution(colour_rec):
    d, decoded = colour_rec
    kw = dict(brightness=0.4, contrast=0.4, saturation=0.4, pca_noise=0.1)
    theirs, _ = _mx_run(d, dtype="uint8", **kw)
    ours = _ours(decoded, MXNetColorAugment(**kw))
    for ch in range(3):
        diff_a = ours[:, 0, 0, ch].astype(int) - decoded[:, 0, 0, ch]
        diff_b = theirs[:, 0, 0, ch].astype(int) - decoded[:, 0, 0, ch]
        _compare(f"GluonCV colour channel {ch}", diff_a, diff_b, mean_tol=1.0)


@requires_mxnet
def test_normalization_jitter_distribution(colour_rec):
    d, decoded = colour_rec
    kw = dict(max_random_contrast=0.3, max_random_illumination=20)
    theirs, _ = _mx_run(d, dtype="float32", **kw)
    op = MXNetColorAugment(**kw)
    ours = decoded.astype(np.float32)
    for i in range(N):
        apply_output_ops(ours[i], key=sample_key(0, 0, i), channels_first=False, ops=(op,))
    v = decoded[:, 0, 0, :].astype(float)
    # out = v * c + l on every channel: two channels give c and l.
    a0, a1 = np.argmax(v, axis=1), np.argmin(v, axis=1)
    rows = np.arange(N)
    keep = (v[rows, a0] - v[rows, a1]) >= 40
    for out, store in ((ours, "ours"), (theirs, "theirs")):
        o = out[:, 0, 0, :].astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            c = (o[rows, a0] - o[rows, a1]) / (v[rows, a0] - v[rows, a1])
        l_ = o[rows, a0] - v[rows, a0] * c
        if store == "ours":
            c_ours, l_ours = c[keep], l_[keep]
        else:
            c_theirs, l_theirs = c[keep], l_[keep]
    _compare("normalization contrast", c_ours, c_theirs, mean_tol=0.01)
    _compare("normalization illumination", l_ours, l_theirs, mean_tol=0.5)
    assert c_theirs.min() > 0.69 and c_theirs.max() < 1.31 and np.abs(l_theirs).max() < 20.5


def test_hls_matches_opencv():
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)
    ours = mx_rgb_to_hls(rgb).astype(int)
    cv = cv2.cvtColor(rgb[..., ::-1].copy(), cv2.COLOR_BGR2HLS).astype(int)
    assert np.abs(ours - cv).max() <= 1 and (ours != cv).mean() < 1e-3
    hls = rgb.copy()
    hls[..., 0] = np.minimum(hls[..., 0], 180)
    np.testing.assert_array_equal(mx_hls_to_rgb(hls), cv2.cvtColor(hls, cv2.COLOR_HLS2BGR)[..., ::-1])


@requires_engine
@pytest.mark.parametrize("kernels", ["scalar", "avx512"])
def test_engine_mxnet_steps_equal_reference(kernels):
    from fastload import _engine

    if not _engine.pixel_kernels(kernels):
        pytest.skip(f"{kernels} kernels are not available")
    try:
        c = np.arange(0, 1 << 24, 7, dtype=np.uint32)  # every 7th colour
        rgb = np.stack([(c >> 16) & 255, (c >> 8) & 255, c & 255], axis=-1).astype(np.uint8)[None]
        for dh, dl, ds in ((0, 0, 0), (17, -30, 45), (-36, 50, -50)):
            got = rgb.copy()
            _engine.pixel_mx_prim(got, _engine.MXNetColorStep.HLS, (dh, dl, ds))
            hls = mx_rgb_to_hls(rgb).astype(int)
            hls[..., 0] = np.clip(hls[..., 0] + dh, 0, 180)
            hls[..., 1] = np.clip(hls[..., 1] + dl, 0, 255)
            hls[..., 2] = np.clip(hls[..., 2] + ds, 0, 255)
            assert np.array_equal(got, mx_hls_to_rgb(hls.astype(np.uint8))), (dh, dl, ds)
        for alpha in (0.63, 1.37):
            op = MXNetColorAugment()
            for step, name in enumerate(("BRIGHTNESS", "CONTRAST", "SATURATION")):
                got = rgb.copy()
                _engine.pixel_mx_prim(got, _engine.MXNetColorStep[name], (alpha,))
                order = {0: [0, 1, 2], 1: [1, 0, 2], 2: [2, 0, 1]}[step]
                alphas = [1.0, 1.0, 1.0]
                alphas[step] = alpha
                want = op.apply_params(rgb[0], {"alpha": alphas, "order": order[:1], "hls": None, "pca": None})
                assert np.array_equal(got[0], want), (name, alpha)
    finally:
        _engine.pixel_kernels("best")
    assert HAVE_ENGINE
