"""Random sampling of the pixel, output and batch ops against the references' own distributions.

10,000 draws from fastload's counters (fixed seed) against 10,000 from torchvision's sampler
(torch.manual_seed fixed; the ops are recorded by patching the function that applies them): op
choice frequencies and magnitude values by chi-square contingency tests, continuous parameters by
two-sample Kolmogorov-Smirnov tests, each at a 1e-4 significance level (about 40 tests here: a
family-wise false-alarm rate under 0.5%, while a real bias at N = 10,000 gives p-values far below it). The engine's draws equal the
references' exactly (tests/test_pixel_ops.py), so these cover both.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from fastload.transforms import (
    AutoAugment,
    ColorJitter,
    CutMix,
    Lighting,
    MixUp,
    RandAugment,
    RandomChoice,
    RandomErasing,
    RandomGrayscale,
    TrivialAugmentWide,
    sample_key,
)
from fastload.transforms import primitives as P
from fastload.transforms.mixing import sample_beta, sample_mix
from fastload.transforms.pixel import op_counter_base

from conftest import requires_torch

scipy_stats = pytest.importorskip("scipy.stats")

N = 10_000
ALPHA = 1e-4
BASE = op_counter_base(0)
_NAMES = {
    P.Prim.IDENTITY: "Identity",
    P.Prim.SHEAR_X: "ShearX",
    P.Prim.SHEAR_Y: "ShearY",
    P.Prim.TRANSLATE_X: "TranslateX",
    P.Prim.TRANSLATE_Y: "TranslateY",
    P.Prim.ROTATE: "Rotate",
    P.Prim.BRIGHTNESS: "Brightness",
    P.Prim.COLOR: "Color",
    P.Prim.CONTRAST: "Contrast",
    P.Prim.SHARPNESS: "Sharpness",
    P.Prim.POSTERIZE: "Posterize",
    P.Prim.SOLARIZE: "Solarize",
    P.Prim.AUTOCONTRAST: "AutoContrast",
    P.Prim.EQUALIZE: "Equalize",
    P.Prim.INVERT: "Invert",
}


def _keys(n=N, seed=123):
    return [sample_key(seed, 0, i) for i in range(n)]


def _same_categorical(ours, theirs, what):
    """Chi-square contingency test of two samples of hashable categories; also the same support."""
    a, b = Counter(ours), Counter(theirs)
    cats = sorted(set(a) | set(b), key=repr)
    # Categories too rare for the test's approximation are pooled.
    common = [c for c in cats if a[c] + b[c] >= 10]
    rare_a = sum(a[c] for c in cats if c not in common)
    rare_b = sum(b[c] for c in cats if c not in common)
    table = [[a[c] for c in common], [b[c] for c in common]]
    if rare_a + rare_b:
        table[0].append(rare_a)
        table[1].append(rare_b)
    p = scipy_stats.chi2_contingency(table).pvalue
    assert p > ALPHA, (
        f"{what}: chi-square p={p:.2e}\nours {sorted(a.items(), key=repr)[:20]}\ntheirs {sorted(b.items(), key=repr)[:20]}"
    )
    return p


def _same_continuous(ours, theirs, what):
    p = scipy_stats.ks_2samp(ours, theirs).pvalue
    assert p > ALPHA, f"{what}: KS p={p:.2e} (ours mean {np.mean(ours):.4f}, theirs {np.mean(theirs):.4f})"


@pytest.fixture
def record_apply_op(monkeypatch):
    """Patches torchvision's _apply_op to record (op name, magnitude) instead of touching pixels."""
    import torchvision.transforms.autoaugment as aa

    calls = []

    def fake(img, op_name, magnitude, interpolation, fill):
        calls.append((op_name, float(magnitude)))
        return img

    monkeypatch.setattr(aa, "_apply_op", fake)
    return calls


def _tv_image():
    import torch

    return torch.zeros((3, 224, 224), dtype=torch.uint8)


@requires_torch
def test_trivialaugment_matches_torchvision(record_apply_op):
    import torch
    import torchvision.transforms as T

    torch.manual_seed(0)
    tv = T.TrivialAugmentWide()
    img = _tv_image()
    for _ in range(N):
        tv(img)
    op = TrivialAugmentWide()
    ours = []
    for key in _keys():
        ((prim, m),) = op.sample(key, BASE, 224, 224)["ops"]
        ours.append((_NAMES[P.Prim(prim)], m))
    theirs = list(record_apply_op)
    assert {m for _, m in ours} == {m for _, m in theirs}  # the same magnitude values, bit for bit
    _same_categorical([n for n, _ in ours], [n for n, _ in theirs], "TrivialAugmentWide op")
    _same_categorical(ours, theirs, "TrivialAugmentWide (op, signed magnitude)")


@requires_torch
def test_randaugment_matches_torchvision(record_apply_op):
    import torch
    import torchvision.transforms as T

    torch.manual_seed(1)
    tv = T.RandAugment(num_ops=2, magnitude=9)
    img = _tv_image()
    for _ in range(N // 2):
        tv(img)
    op = RandAugment(num_ops=2, magnitude=9)
    ours = []
    for key in _keys(N // 2):
        ours += [(_NAMES[P.Prim(p)], m) for p, m in op.sample(key, BASE, 224, 224)["ops"]]
    theirs = list(record_apply_op)
    assert len(ours) == len(theirs) == N
    assert set(ours) == set(theirs)
    _same_categorical(ours, theirs, "RandAugment (op, signed magnitude)")


@requires_torch
def test_autoaugment_matches_torchvision(record_apply_op):
    import torch
    import torchvision.transforms as T

    torch.manual_seed(2)
    tv = T.AutoAugment()
    img = _tv_image()
    per_call = []
    for _ in range(N):
        before = len(record_apply_op)
        tv(img)
        per_call.append(tuple(record_apply_op[before:]))
    op = AutoAugment()
    ours = []
    for key in _keys():
        s = op.sample(key, BASE, 224, 224)
        ours.append(tuple((_NAMES[P.Prim(p)], m) for (p, m), hit in zip(s["ops"], s["applied"], strict=False) if hit))
    _same_categorical([len(c) for c in ours], [len(c) for c in per_call], "AutoAugment ops applied per image")
    _same_categorical([x for c in ours for x in c], [x for c in per_call for x in c], "AutoAugment (op, magnitude)")


@requires_torch
def test_colorjitter_matches_torchvision():
    import torch
    import torchvision.transforms as T

    torch.manual_seed(3)
    tv = T.ColorJitter(brightness=0.4, contrast=(0.5, 1.2), saturation=0.4, hue=0.1)
    theirs = [tv.get_params(tv.brightness, tv.contrast, tv.saturation, tv.hue) for _ in range(N)]
    op = ColorJitter(brightness=0.4, contrast=(0.5, 1.2), saturation=0.4, hue=0.1)
    ours = [op.sample(k, BASE, 224, 224) for k in _keys()]
    _same_categorical([tuple(p["order"]) for p in ours], [tuple(t[0].tolist()) for t in theirs], "ColorJitter order")
    for j, name in enumerate(("brightness", "contrast", "saturation", "hue")):
        _same_continuous([p[name] for p in ours], [t[j + 1] for t in theirs], f"ColorJitter {name}")
        lo, hi = getattr(op, name)
        assert all(lo <= p[name] <= hi for p in ours)


def test_randomgrayscale_frequency():
    op = RandomGrayscale(p=0.3)
    hits = sum(op.sample(k, BASE, 8, 8)["applied"] for k in _keys())
    assert scipy_stats.binomtest(hits, N, 0.3).pvalue > ALPHA


def test_lighting_alphas_are_normal():
    op = Lighting(alphastd=0.1)
    alphas = np.array([op.sample(k, BASE, 8, 8)["alpha"] for k in _keys()])
    for j in range(3):
        p = scipy_stats.kstest(alphas[:, j], "norm", args=(0.0, 0.1)).pvalue
        assert p > ALPHA, (j, p)
    assert abs(np.corrcoef(alphas.T)[0, 1]) < 0.05  # independent components


@requires_torch
def test_random_erasing_matches_torchvision(monkeypatch):
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.transforms as tt

    boxes = []

    def fake_erase(img, i, j, h, w, v, inplace=False):
        boxes.append((i, j, h, w))
        return img

    monkeypatch.setattr(tt.F, "erase", fake_erase)
    torch.manual_seed(4)
    tv = T.RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)
    img = torch.zeros((3, 224, 160))
    for _ in range(N):
        tv(img)
    op = RandomErasing(p=0.5)
    ours = [op.sample(k, 224, 160) for k in _keys()]
    hits = [p for p in ours if p["applied"]]
    # torchvision calls erase for every applied draw (also the rare all-attempts-failed case: the
    # whole image, with the image itself as value): compare the boxes that fit.
    theirs = [b for b in boxes if not (b[2] == 224 and b[3] == 160)]
    assert scipy_stats.binomtest(len(boxes), N, 0.5).pvalue > ALPHA
    for j, name in enumerate(("top", "left", "height", "width")):
        _same_continuous([p[name] for p in hits], [b[j] for b in theirs], f"RandomErasing {name}")
    _same_continuous([p["height"] * p["width"] for p in hits], [b[2] * b[3] for b in theirs], "RandomErasing area")


@pytest.mark.parametrize("alpha", [0.2, 1.0, 2.5])
def test_mix_lambda_is_beta(alpha):
    lams = [sample_beta(k, alpha) for k in _keys(N, seed=9)]
    p = scipy_stats.kstest(lams, "beta", args=(alpha, alpha)).pvalue
    assert p > ALPHA, p
    assert all(0.0 <= v <= 1.0 for v in lams)


@requires_torch
def test_cutmix_box_matches_torchvision():
    import torch
    from torchvision.transforms import v2

    torch.manual_seed(5)
    tv = v2.CutMix(alpha=1.0, num_classes=10)
    imgs = torch.zeros((2, 3, 224, 160))
    theirs = [tv.make_params([imgs]) for _ in range(N)]
    op = CutMix(alpha=1.0, num_classes=10)
    ours = [sample_mix(op, k, 224, 160) for k in _keys()]
    _same_continuous([p["lam_labels"] for p in ours], [t["lam_adjusted"] for t in theirs], "CutMix adjusted lambda")
    for j, name in enumerate(("x0", "y0", "x1", "y1")):
        _same_continuous([p["box"][j] for p in ours], [t["box"][j] for t in theirs], f"CutMix {name}")


def test_random_choice_frequencies():
    choice = RandomChoice(transforms=(MixUp(alpha=0.8, num_classes=5), CutMix(alpha=1.0, num_classes=5)))
    ops = Counter(sample_mix(choice, k, 32, 32)["op"] for k in _keys())
    assert scipy_stats.binomtest(ops["mixup"], N, 0.5).pvalue > ALPHA
    weighted = RandomChoice(transforms=choice.transforms, p=(3, 1))
    ops = Counter(sample_mix(weighted, k, 32, 32)["op"] for k in _keys())
    assert scipy_stats.binomtest(ops["mixup"], N, 0.75).pvalue > ALPHA


def test_draws_differ_between_samples_and_epochs():
    op = TrivialAugmentWide()
    a = [op.sample(sample_key(0, 0, i), BASE, 224, 224)["ops"] for i in range(200)]
    b = [op.sample(sample_key(0, 1, i), BASE, 224, 224)["ops"] for i in range(200)]
    assert len({tuple(x) for x in a}) > 100
    assert sum(x == y for x, y in zip(a, b, strict=False)) < 30
    assert math.isfinite(sample_beta(sample_key(0, 0, 0), 1e-3))
