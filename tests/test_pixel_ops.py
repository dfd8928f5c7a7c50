"""Pixel ops (colour, policies) on the output-sized image: the Python references against torchvision's
PIL backend, the C++ engine against the references (byte for byte, both kernel sets), and the
counter-based draws (thread count, batch boundaries, replay of reported parameters).

Reference backend: torchvision.transforms.functional on PIL images (what pipelines run before
ToTensor). Every comparison here is exact (tolerance 0): Pillow's arithmetic is reproduced step for
step.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fastload.engine_structs import to_native
from fastload.transforms import (
    AutoAugment,
    ColorJitter,
    Grayscale,
    Lighting,
    MXNetColorAugment,
    RandAugment,
    RandomGrayscale,
    TrivialAugmentWide,
    sample_key,
)
from fastload.transforms import primitives as P
from fastload.transforms.pixel import apply_pixel_ops, engine_specs, op_counter_base
from fastload.transforms.policy import _posterize_bits, torch_linspace
from fastload.transforms.rng import permutation
from fastload.transforms.timm_policy import TIMM_OP_NAMES, TimmAugMix, TimmAutoAugment, TimmRandAugment

from conftest import HAVE_ENGINE, requires_engine, requires_torch

Prim = P.Prim
GEOMETRIC = sorted(P.GEOMETRIC_PRIMS)
KERNELS = ("scalar", "avx512")


def _engine():
    from fastload import _engine

    return _engine


@pytest.fixture(scope="module")
def images(realistic_folder):
    """Output-sized crops of the fixture photos: 224x224 (square: quarter turns are transposes) and odd sizes."""
    from PIL import Image

    files = sorted(Path(realistic_folder).rglob("*.JPEG"))[:6]
    out = []
    for i, f in enumerate(files):
        img = np.asarray(Image.open(f).convert("RGB"))
        h, w = img.shape[:2]
        size = [(224, 224), (131, 97), (64, 200)][i % 3]
        y, x = (h - size[0]) // 2, (w - size[1]) // 2
        out.append(np.ascontiguousarray(img[y : y + size[0], x : x + size[1]]))
    return out


@pytest.fixture(params=KERNELS)
def kernels(request):
    """Runs a test with the scalar kernels and with the AVX-512 ones (skipped where the CPU lacks them)."""
    if not HAVE_ENGINE:
        pytest.skip("the C++ engine is not built")
    engine = _engine()
    if not engine.pixel_kernels(request.param):
        pytest.skip(f"{request.param} kernels are not available on this CPU")
    yield request.param
    engine.pixel_kernels("best")


# Parameters that reach every branch: blends inside and outside [0, 1], both signs, quarter turns.
PRIM_CASES = {
    Prim.IDENTITY: [0.0],
    Prim.SHEAR_X: [0.3, -0.2, 0.99, -0.99],
    Prim.SHEAR_Y: [0.3, -0.2, 0.99],
    Prim.TRANSLATE_X: [30.7, -12.2, 101.5],
    Prim.TRANSLATE_Y: [30.7, -12.2],
    Prim.ROTATE: [30.0, -13.5, 90.0, -90.0, 135.0, 180.0, 0.0, 4.5],
    Prim.BRIGHTNESS: [0.5, -0.3, 0.99, -0.99, 0.0],
    Prim.COLOR: [0.5, -0.3, 0.99, -0.99],
    Prim.CONTRAST: [0.5, -0.3, 0.99, -0.99],
    Prim.SHARPNESS: [0.5, -0.3, 0.9, -0.99],
    Prim.POSTERIZE: [8, 4, 2, 1],
    Prim.SOLARIZE: [255.0, 128.0, 237.5, 0.0],
    Prim.AUTOCONTRAST: [0.0],
    Prim.EQUALIZE: [0.0],
    Prim.INVERT: [0.0],
}

_TV_NAMES = {
    Prim.IDENTITY: "Identity",
    Prim.SHEAR_X: "ShearX",
    Prim.SHEAR_Y: "ShearY",
    Prim.TRANSLATE_X: "TranslateX",
    Prim.TRANSLATE_Y: "TranslateY",
    Prim.ROTATE: "Rotate",
    Prim.BRIGHTNESS: "Brightness",
    Prim.COLOR: "Color",
    Prim.CONTRAST: "Contrast",
    Prim.SHARPNESS: "Sharpness",
    Prim.POSTERIZE: "Posterize",
    Prim.SOLARIZE: "Solarize",
    Prim.AUTOCONTRAST: "AutoContrast",
    Prim.EQUALIZE: "Equalize",
    Prim.INVERT: "Invert",
}


# --- references against torchvision -----------------------------------------------------------


@requires_torch
@pytest.mark.parametrize("prim", list(PRIM_CASES))
def test_reference_prims_equal_torchvision_pil(images, prim):
    from PIL import Image
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.autoaugment import _apply_op

    for img in images:
        pil = Image.fromarray(img)
        for m in PRIM_CASES[prim]:
            for interp in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
                for fill in (None, [10, 200, 30]):
                    want = np.asarray(_apply_op(pil, _TV_NAMES[prim], m, interpolation=interp, fill=fill))
                    got = P.apply_prim(
                        img, prim, m, bilinear=interp == InterpolationMode.BILINEAR, fill=tuple(fill or (0, 0, 0))
                    )
                    np.testing.assert_array_equal(got, want, err_msg=f"{prim.name} {m} {interp} {fill} {img.shape}")


@requires_torch
def test_reference_hue_grayscale_equal_torchvision_pil(images):
    import torchvision.transforms.functional as F
    from PIL import Image

    for img in images:
        pil = Image.fromarray(img)
        for h in (0.0, 0.1, -0.3, 0.5, -0.5, 0.004):
            np.testing.assert_array_equal(P.hue(img, h), np.asarray(F.adjust_hue(pil, h)))
        np.testing.assert_array_equal(P.grayscale(img), np.asarray(F.rgb_to_grayscale(pil, 3)))


@requires_torch
def test_magnitude_tables_equal_torchvision():
    import torch

    for n in (2, 5, 10, 31, 100):
        for a, b in [
            (0.0, 0.3),
            (0.0, 150.0 / 331.0 * 224),
            (0.0, 150.0 / 331.0 * 97),
            (255.0, 0.0),
            (0.0, 0.99),
            (0.0, 32.0),
            (0.0, 135.0),
            (0.0, 30.0),
            (0.0, 0.9),
        ]:
            np.testing.assert_array_equal(torch_linspace(a, b, n), torch.linspace(a, b, n).numpy())
        for top, span in ((8, 4), (8, 6), (4, 4)):
            want = (top - (torch.arange(n) / ((n - 1) / span)).round().int()).numpy()
            np.testing.assert_array_equal(_posterize_bits(n, top, span), want)


@requires_torch
@pytest.mark.parametrize(
    "op",
    [
        ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.2),
        ColorJitter(brightness=(0.2, 1.8), hue=(-0.1, 0.3)),
    ],
)
def test_colorjitter_reference_equals_torchvision_with_same_params(images, op):
    # torchvision's forward with get_params forced to our draws: the same bytes.
    import torch
    import torchvision.transforms as T
    from PIL import Image

    tv = T.ColorJitter(
        brightness=op.brightness or 0, contrast=op.contrast or 0, saturation=op.saturation or 0, hue=op.hue or 0
    )
    for i, img in enumerate(images):
        key = sample_key(0, 0, i)
        params = op.sample(key, op_counter_base(0), *img.shape[:2])
        forced = (
            torch.tensor(params["order"]),
            params["brightness"],
            params["contrast"],
            params["saturation"],
            params["hue"],
        )
        tv.get_params = lambda *a, _f=forced: _f
        want = np.asarray(tv(Image.fromarray(img)))
        np.testing.assert_array_equal(op.apply_params(img, params), want)


# --- engine against the references ------------------------------------------------------------


def _engine_prim(img, prim, m, bilinear, fill):
    out = img.copy()
    warp = P.warp_plan(prim, m, *img.shape[:2]).as_row() if prim in P.GEOMETRIC_PRIMS else ()
    _engine().pixel_prim(out, _engine().PixelPrim(int(prim)), float(m), warp, bilinear, fill)
    return out


@pytest.mark.parametrize("prim", list(PRIM_CASES))
def test_engine_prims_equal_reference(images, kernels, prim):
    for img in images:
        for m in PRIM_CASES[prim]:
            for bilinear in (False, True):
                for fill in ((0, 0, 0), (10, 200, 30)):
                    want = P.apply_prim(img, prim, m, bilinear=bilinear, fill=fill)
                    got = _engine_prim(img, prim, m, bilinear, fill)
                    np.testing.assert_array_equal(got, want, err_msg=f"{kernels} {prim.name} {m} {bilinear} {fill}")


def test_engine_prims_on_tiny_images(kernels):
    # Sizes where the 3x3 filter has no interior, masks cover partial vectors, warps map outside.
    rng = np.random.default_rng(5)
    for h, w in [(1, 1), (1, 5), (2, 2), (3, 3), (5, 17), (17, 3)]:
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for prim, ms in PRIM_CASES.items():
            for m in ms[:2]:
                want = P.apply_prim(img, prim, m, bilinear=True, fill=(1, 2, 3))
                np.testing.assert_array_equal(
                    _engine_prim(img, prim, m, True, (1, 2, 3)), want, err_msg=f"{prim.name} {m} {h}x{w}"
                )


def _assert_same(got, want, msg):
    # array_equal first: assert_array_equal formats its report eagerly and is slow on 50 MB arrays.
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)[:5]
        raise AssertionError(f"{msg}: {np.count_nonzero(got != want)} values differ, first at {bad.tolist()}")


def _all_colours():
    c = np.arange(1 << 24, dtype=np.uint32)
    return np.stack([(c >> 16) & 255, (c >> 8) & 255, c & 255], axis=-1).astype(np.uint8).reshape(4096, 4096, 3)


_HUE_FACTORS = (0.13, -0.5)
_BLENDS = ((Prim.COLOR, -0.37), (Prim.COLOR, 0.61), (Prim.CONTRAST, 0.25), (Prim.BRIGHTNESS, 0.77))


@pytest.fixture(scope="module")
def all_colours():
    """Every RGB value once, and Pillow's results for the exhaustive checks (computed once for both kernel sets)."""
    img = _all_colours()
    refs = {("hue", f): P.hue(img, f) for f in _HUE_FACTORS}
    refs.update({(prim, m): P.apply_prim(img, prim, m, bilinear=False, fill=(0, 0, 0)) for prim, m in _BLENDS})
    refs["gray"] = P.grayscale(img)
    return img, refs


def test_engine_hue_every_colour(all_colours, kernels):
    # adjust_hue's HSV round trip over all 16.7M RGB values: Pillow's float and double steps reproduced.
    img, refs = all_colours
    for factor in _HUE_FACTORS:
        got = img.copy()
        _engine().pixel_prim(got, _engine().PixelPrim.HUE, factor, (), False, (0, 0, 0))
        _assert_same(got, refs[("hue", factor)], f"{kernels} hue {factor}")


def test_engine_blends_every_colour(all_colours, kernels):
    img, refs = all_colours
    for prim, m in _BLENDS:
        got = img.copy()
        _engine().pixel_prim(got, _engine().PixelPrim(int(prim)), m, (), False, (0, 0, 0))
        _assert_same(got, refs[(prim, m)], f"{kernels} {prim.name} {m}")
    got = img.copy()
    _engine().pixel_prim(got, _engine().PixelPrim.GRAYSCALE, 0.0, (), False, (0, 0, 0))
    _assert_same(got, refs["gray"], f"{kernels} grayscale")


def _ops_cases():
    return [
        [ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)],
        [ColorJitter(brightness=(0.5, 1.5), hue=(-0.5, 0.5)), RandomGrayscale(p=0.5), Grayscale()],
        [Lighting(alphastd=0.1), Lighting(alphastd=2.0, eigval=(1.0, 0.5, 0.1))],
        [TrivialAugmentWide()],
        [TrivialAugmentWide(num_magnitude_bins=11, interpolation="bilinear", fill=(10, 20, 30))],
        [RandAugment(), RandAugment(num_ops=3, magnitude=30, interpolation="bilinear")],
        [AutoAugment(), AutoAugment(policy="cifar10", interpolation="bilinear"), AutoAugment(policy="svhn", fill=7)],
        [MXNetColorAugment(brightness=0.4, contrast=0.4, saturation=0.4, pca_noise=0.1)],
        [MXNetColorAugment(random_h=36, random_s=50, random_l=50), ColorJitter(saturation=0.3)],
        # timm's policies, every op of theirs (bicubic warps, posterize to 0 bits, magnitude noise).
        [
            TimmRandAugment(ops=tuple((n, 0.5, 9) for n in TIMM_OP_NAMES), num_layers=3, magnitude_std=0.5),
            TimmRandAugment(
                ops=tuple((n, 1.0, 10) for n in TIMM_OP_NAMES), num_layers=2, magnitude_std=math.inf, fill=(1, 2, 3)
            ),
        ],
        [
            TimmRandAugment(
                ops=tuple((n, 0.7, 7) for n in TIMM_OP_NAMES),
                choice_weights=tuple(range(1, len(TIMM_OP_NAMES) + 1)),
                interpolation="bicubic",
            ),
            TimmAutoAugment(
                subpolicies=(
                    (("Rotate", 0.8, 8), ("ShearX", 0.6, 5)),
                    (("SolarizeAdd", 0.9, 3), ("Posterize", 1.0, 0)),
                ),
                magnitude_std=1.0,
                interpolation="nearest",
            ),
        ],
        [TimmAugMix(ops=tuple((n, 1.0, 3) for n in TIMM_OP_NAMES)), TimmAugMix(ops=(("Rotate", 1, 5),), alpha=0.4)],
    ]


def _run_engine(batch, ops, seed, epoch, indices, threads, trace=True):
    out = batch.copy()
    h, w = out.shape[1:3]
    traces = _engine().pixel_ops_batch(
        out, engine_specs(ops, h, w, _engine()), seed, epoch, np.asarray(indices, np.int64), threads, trace
    )
    return out, traces


@pytest.mark.parametrize("case", range(len(_ops_cases())))
def test_engine_pipeline_equals_reference(images, kernels, case):
    ops = _ops_cases()[case]
    for img in images:
        batch = np.stack([img] * 12)
        indices = np.arange(12) * 7 + 3
        out, traces = _run_engine(batch, ops, 11, 2, indices, 2)
        for i, index in enumerate(indices):
            want, params = apply_pixel_ops(img, ops, sample_key(11, 2, int(index)))
            np.testing.assert_array_equal(out[i], want, err_msg=f"case {case} sample {i} {img.shape}")
            for k, op in enumerate(ops):
                reported = op.params_from_trace(traces[i, k])
                # The engine reports what it drew: replaying it through the reference gives its bytes.
                assert _same_params(reported, params[k]), (reported, params[k])


def _same_params(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_params(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_params(x, y) for x, y in zip(a, b, strict=False))
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=0, abs_tol=0) or float(a) == float(b)


def test_engine_independent_of_threads_and_batch_boundaries(images):
    if not HAVE_ENGINE:
        pytest.skip("the C++ engine is not built")
    ops = [
        ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
        RandAugment(num_ops=2, magnitude=9),
        RandomGrayscale(p=0.2),
    ]
    img = images[0]
    batch = np.stack([img] * 20)
    indices = np.arange(1000, 1020)
    whole1, t1 = _run_engine(batch, ops, 5, 3, indices, 1)
    whole2, t2 = _run_engine(batch, ops, 5, 3, indices, 2)
    np.testing.assert_array_equal(whole1, whole2)
    np.testing.assert_array_equal(t1, t2)
    # Split differently and shuffled: a sample's result depends only on its index.
    perm = np.random.default_rng(0).permutation(20)
    parts = []
    for chunk in np.array_split(perm, 3):
        out, _ = _run_engine(batch[chunk], ops, 5, 3, indices[chunk], 2, trace=False)
        parts.append((chunk, out))
    for chunk, out in parts:
        np.testing.assert_array_equal(out, whole1[chunk])
    # Another epoch draws other parameters.
    other, _ = _run_engine(batch, ops, 5, 4, indices, 2)
    assert not np.array_equal(other, whole1)


def test_pixel_enums_are_the_abi_enums():
    # One definition (fastload/engine_abi.py); tests/test_engine_abi.py checks the engine against it.
    from fastload import engine_abi

    assert P.Prim is engine_abi.PixelPrim and P.WarpMode is engine_abi.WarpMode
    kinds = {op.engine_fields(224, 224)["kind"] for ops in _ops_cases() for op in ops}
    assert kinds == {k.name for k in engine_abi.PixelOpKind}


@requires_engine
def test_engine_rejects_bad_specs():
    engine = _engine()
    img = np.zeros((1, 8, 8, 3), np.uint8)
    idx = np.zeros(1, np.int64)
    # The specs are typed at the boundary: no kind outside PixelOpKind, no untyped field, no dict.
    with pytest.raises(ValueError, match="99 is not a valid PixelOpKind"):
        to_native(engine, "PixelOp", {"kind": 99})
    with pytest.raises(TypeError):
        engine.PixelOp().kind = 4
    with pytest.raises(ValueError, match="has no field 'strength'"):
        to_native(engine, "PixelOp", {"kind": "COLOR_JITTER", "strength": 1.0})
    with pytest.raises(TypeError):
        engine.pixel_ops_batch(img, [{"kind": 0}], 0, 0, idx, 1, False)
    spec = to_native(engine, "PixelOpsSpec", {"ops": [{**RandAugment().engine_fields(8, 8), "magnitude": 31}]})
    with pytest.raises(ValueError, match="magnitude bin"):
        engine.pixel_ops_batch(img, spec, 0, 0, idx, 1, False)
    with pytest.raises(ValueError, match=r"\[B, H, W, 3\]"):
        engine.pixel_ops_batch(np.zeros((8, 8, 3), np.uint8), engine.PixelOpsSpec(), 0, 0, idx, 1, False)


# --- draws and specs --------------------------------------------------------------------------


def test_permutation_is_uniform():
    counts = {}
    for i in range(24000):
        p = tuple(permutation(sample_key(1, 0, i), 128, 4))
        counts[p] = counts.get(p, 0) + 1
    assert len(counts) == 24
    from scipy.stats import chisquare

    assert chisquare(list(counts.values())).pvalue > 0.001


def test_spec_validation():
    with pytest.raises(ValueError):
        ColorJitter(brightness=-0.1)
    with pytest.raises(ValueError):
        ColorJitter(hue=0.6)
    with pytest.raises(TypeError):
        ColorJitter(contrast="big")
    assert ColorJitter(brightness=0).brightness is None
    assert ColorJitter(brightness=0.4).brightness == (0.6, 1.4)
    assert ColorJitter(brightness=1.5).brightness == (0.0, 2.5)
    assert ColorJitter(hue=(-0.1, 0.2)).hue == (-0.1, 0.2)
    with pytest.raises(ValueError):
        RandomGrayscale(p=1.5)
    with pytest.raises(ValueError, match="num_output_channels"):
        Grayscale(num_output_channels=1)
    with pytest.raises(ValueError):
        Lighting(eigvec=((1, 0), (0, 1)))
    with pytest.raises(ValueError):
        RandAugment(magnitude=31)
    with pytest.raises(ValueError):
        RandAugment(num_ops=0)
    with pytest.raises(ValueError):
        TrivialAugmentWide(num_magnitude_bins=1)
    with pytest.raises(ValueError, match="interpolation"):
        AutoAugment(interpolation="bicubic")
    with pytest.raises(ValueError, match="policy"):
        AutoAugment(policy="coco")
    with pytest.raises(ValueError, match="fill"):
        TrivialAugmentWide(fill=(1, 2))
    with pytest.raises(ValueError):
        MXNetColorAugment(brightness=-1)
    assert TrivialAugmentWide(fill=5).fill == (5, 5, 5)
    assert AutoAugment(fill=None).fill == (0, 0, 0)


@requires_torch
def test_specs_accept_torchvision_enums():
    from torchvision.transforms import AutoAugmentPolicy, InterpolationMode

    op = AutoAugment(policy=AutoAugmentPolicy.CIFAR10, interpolation=InterpolationMode.BILINEAR)
    assert op.policy.value == "cifar10" and op.interpolation == "bilinear"


def test_reference_leaves_input_untouched(images):
    img = images[0]
    before = img.copy()
    out, _ = apply_pixel_ops(img, [ColorJitter(brightness=0.5), TrivialAugmentWide()], sample_key(0, 0, 1))
    np.testing.assert_array_equal(img, before)
    assert out.shape == img.shape and out.dtype == np.uint8


def test_pillow_path_equals_engine(images, monkeypatch):
    # run_pixel_ops_batch: the engine call, or the references under FASTLOAD_DECODER=pillow.
    from fastload.transforms.pixel import run_pixel_ops_batch

    if not HAVE_ENGINE:
        pytest.skip("the C++ engine is not built")
    ops = [ColorJitter(brightness=0.3, hue=0.2), RandAugment(num_ops=2, magnitude=20), Lighting()]
    batch = np.stack([images[0]] * 6)
    a = batch.copy()
    pa = run_pixel_ops_batch(a, ops, seed=2, epoch=5, indices=np.arange(6), threads=2, want_params=True)
    monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    b = batch.copy()
    pb = run_pixel_ops_batch(b, ops, seed=2, epoch=5, indices=np.arange(6), threads=2, want_params=True)
    np.testing.assert_array_equal(a, b)
    assert all(_same_params(x, y) for x, y in zip(pa, pb, strict=False))
