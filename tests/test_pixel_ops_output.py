"""Output-stage and batch ops: RandomErasing (and MXNet's normalization jitter) on the final output,
MixUp / CutMix on a batch and its labels; uint8, float32 and float16 outputs, NCHW and NHWC.

The engine is compared with the numpy references exactly; the references with torchvision
(``transforms.RandomErasing``'s ``F.erase`` on the normalized tensor, ``transforms.v2`` MixUp /
CutMix on float batches) given the same parameters, exactly.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fastload.engine_structs import to_native
from fastload.transforms import CutMix, MixUp, MXNetColorAugment, RandomChoice, RandomErasing, mix_batch, sample_key
from fastload.transforms.erasing import apply_output_ops, engine_output_spec
from fastload.transforms.mixing import _one_hot, _reference, sample_mix

from conftest import HAVE_ENGINE, requires_engine, requires_torch

DTYPES = (np.uint8, np.float32, np.float16)


def _batch(dtype, nchw, n=6, h=40, w=52, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, 3, h, w) if nchw else (n, h, w, 3)
    if dtype == np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.normal(0, 1.5, shape).astype(dtype)


def _engine():
    from fastload import _engine

    return _engine


def _erasing_spec(ops, normalize, erase):
    return to_native(_engine(), "ErasingSpec", engine_output_spec(ops, normalize, erase))


ERASES = [
    RandomErasing(p=1.0),
    RandomErasing(p=0.5, value=(0.5, -1.0, 2.0)),
    RandomErasing(p=1.0, value="random"),
    RandomErasing(p=1.0, scale=(0.3, 0.9), ratio=(0.1, 10.0), value=200),
]


@requires_engine
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nchw", [False, True])
@pytest.mark.parametrize("erase", ERASES)
def test_engine_erasing_equals_reference(dtype, nchw, erase):
    batch = _batch(dtype, nchw, n=12)
    indices = np.arange(12) * 3 + 50
    got = batch.copy()
    traces = _engine().erasing_batch(got, nchw, _erasing_spec((), None, erase), 7, 1, indices, 2, True)
    for i, index in enumerate(indices):
        want = batch[i].copy()
        params = apply_output_ops(want, key=sample_key(7, 1, int(index)), channels_first=nchw, erase=erase)["erase"]
        np.testing.assert_array_equal(got[i], want, err_msg=f"sample {i} {params}")
        assert bool(traces[i, 0]) == params["applied"]
        if params["applied"]:
            assert tuple(traces[i, 1:5].astype(int)) == (
                params["top"],
                params["left"],
                params["height"],
                params["width"],
            )
    changed = [not np.array_equal(got[i], batch[i]) for i in range(12)]
    assert any(changed)


@requires_torch
def test_reference_erasing_equals_torchvision_erase():
    import torch
    import torchvision.transforms.functional as F

    erase = RandomErasing(p=1.0, value=(0.1, 0.2, 0.3))
    for i in range(20):
        chw = _batch(np.float32, True, n=1, seed=i)[0]
        key = sample_key(1, 0, i)
        params = erase.sample(key, *chw.shape[1:])
        ours = chw.copy()
        erase.apply_params(ours, params, key, channels_first=True)
        if params["applied"]:
            v = torch.tensor(erase.channel_values())[:, None, None]
            want = F.erase(
                torch.from_numpy(chw.copy()), params["top"], params["left"], params["height"], params["width"], v
            )
            np.testing.assert_array_equal(ours, want.numpy())


def test_erasing_random_values():
    erase = RandomErasing(p=1.0, value="random", scale=(0.2, 0.2), ratio=(1.0, 1.0))
    f = np.zeros((3, 64, 64), np.float32)
    key = sample_key(0, 0, 3)
    params = erase.sample(key, 64, 64)
    erase.apply_params(f, params, key, channels_first=True)
    box = f[:, params["top"] : params["top"] + params["height"], params["left"] : params["left"] + params["width"]]
    assert abs(float(box.mean())) < 0.1 and 0.9 < float(box.std()) < 1.1  # N(0, 1), as torch's normal_()
    u = np.zeros((64, 64, 3), np.uint8)
    erase.apply_params(u, params, key, channels_first=False)
    boxu = u[params["top"] : params["top"] + params["height"], params["left"] : params["left"] + params["width"]]
    assert boxu.min() < 20 and boxu.max() > 235 and 100 < boxu.mean() < 155  # uniform over 0..255


@requires_engine
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("nchw", [False, True])
def test_engine_mxnet_output_jitter_equals_reference(dtype, nchw):
    ops = (MXNetColorAugment(brightness=0.2), MXNetColorAugment(max_random_contrast=0.3, max_random_illumination=20))
    normalize = SimpleNamespace(scale=1.0, std=(58.4, 57.1, 57.4))
    batch = _batch(dtype, nchw, n=8)
    got = batch.copy()
    indices = np.arange(8)
    traces = _engine().erasing_batch(got, nchw, _erasing_spec(ops, normalize, None), 3, 0, indices, 2, True)
    for i in range(8):
        want = batch[i].copy()
        drawn = apply_output_ops(want, key=sample_key(3, 0, i), channels_first=nchw, ops=ops, normalize=normalize)
        np.testing.assert_array_equal(got[i], want)
        assert traces[i, 5] == drawn["mx_contrast"] and traces[i, 6] == drawn["mx_illumination"]
        assert 0.7 <= drawn["mx_contrast"] <= 1.3 and -20 <= drawn["mx_illumination"] <= 20
    # uint8 outputs: MXNet applies no normalization jitter.
    u = _batch(np.uint8, nchw, n=2)
    before = u.copy()
    _engine().erasing_batch(u, nchw, _erasing_spec(ops, normalize, None), 3, 0, np.arange(2), 1, False)
    np.testing.assert_array_equal(u, before)


# --- MixUp / CutMix ---------------------------------------------------------------------------


def _labels(n, classes=7, seed=0):
    return np.random.default_rng(seed).integers(0, classes, n).astype(np.float32)


MIXES = [
    MixUp(alpha=0.8, num_classes=7),
    CutMix(alpha=1.0, num_classes=7),
    RandomChoice(transforms=(MixUp(alpha=0.2, num_classes=7), CutMix(alpha=1.0, num_classes=7))),
]


@requires_engine
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nchw", [False, True])
@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize(("n", "threads"), [(1, 1), (5, 2), (16, 3), (16, 1)])
def test_engine_mix_equals_reference(dtype, nchw, mix, n, threads):
    batch = _batch(dtype, nchw, n=n)
    labels = _labels(n)
    for first in (0, 256):
        got = batch.copy()
        res = mix_batch(got, labels, mix, seed=3, epoch=2, first_index=first, threads=threads)
        want = batch.copy()
        h, w = (batch.shape[2], batch.shape[3]) if nchw else batch.shape[1:3]
        params = sample_mix(mix, sample_key(3, 2, first), h, w)
        soft = _reference(want, _one_hot(labels, n, 7), params, nchw)
        assert res.params == params
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(res.labels, soft)
        np.testing.assert_allclose(res.labels.sum(axis=1), 1.0, rtol=1e-6)


@requires_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reference_mix_equals_torchvision_v2(dtype):
    import torch
    from torchvision.transforms import v2

    n, classes = 8, 10
    batch = _batch(dtype, True, n=n, h=32, w=48)
    labels = _labels(n, classes)
    for mix, tv_cls in (
        (MixUp(alpha=1.0, num_classes=classes), v2.MixUp),
        (CutMix(alpha=1.0, num_classes=classes), v2.CutMix),
    ):
        for first in range(5):
            params = sample_mix(mix, sample_key(0, 0, first), 32, 48)
            tv = tv_cls(alpha=1.0, num_classes=classes)
            forced = (
                {"lam": params["lam"]}
                if params["op"] == "mixup"
                else {"box": params["box"], "lam_adjusted": params["lam_labels"]}
            )
            tv.make_params = lambda flat, _f=forced: dict(_f)
            imgs, soft = tv(torch.from_numpy(batch.copy()), torch.from_numpy(labels.astype(np.int64)))
            ours = batch.copy()
            our_soft = _reference(ours, _one_hot(labels, n, classes), params, True)
            np.testing.assert_array_equal(ours, imgs.numpy())
            np.testing.assert_array_equal(our_soft, soft.numpy())


def test_mix_batch_probability_labels_and_errors():
    n = 4
    batch = _batch(np.float32, False, n=n)
    probs = np.full((n, 3), 1 / 3, np.float32)
    res = mix_batch(batch.copy(), probs, MixUp(num_classes=3), seed=0, epoch=0, first_index=0)
    np.testing.assert_allclose(res.labels, 1 / 3, rtol=1e-6)
    with pytest.raises(ValueError, match=r"labels\[2\]"):
        mix_batch(
            batch.copy(), np.array([0, 1, 7, 2], np.float32), MixUp(num_classes=3), seed=0, epoch=0, first_index=0
        )
    with pytest.raises(ValueError, match="class index"):
        mix_batch(batch.copy(), np.array([0, 1, 0.5, 2]), MixUp(num_classes=3), seed=0, epoch=0, first_index=0)
    with pytest.raises(ValueError, match="C-contiguous"):
        mix_batch(batch[:, ::2], np.zeros(n), MixUp(num_classes=3), seed=0, epoch=0, first_index=0)
    with pytest.raises(ValueError, match="ambiguous"):
        mix_batch(np.zeros((2, 3, 5, 3), np.float32), np.zeros(2), MixUp(num_classes=3), seed=0, epoch=0, first_index=0)
    with pytest.raises(ValueError, match="num_classes"):
        MixUp(num_classes=0)
    with pytest.raises(ValueError, match="same num_classes"):
        RandomChoice(transforms=(MixUp(num_classes=3), CutMix(num_classes=4)))


def test_mix_batch_writes_caller_owned_labels():
    batch = _batch(np.uint8, True, n=5)
    out = np.full((5, 7), -1.0, np.float32)
    res = mix_batch(batch.copy(), _labels(5), CutMix(num_classes=7), seed=0, epoch=0, first_index=0, out=out)
    assert res.labels is out and np.all(out >= 0)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="out must be"):
        mix_batch(
            batch.copy(),
            _labels(5),
            CutMix(num_classes=7),
            seed=0,
            epoch=0,
            first_index=0,
            out=np.zeros((5, 6), np.float32),
        )


def test_mix_batch_is_in_place_and_keyed_by_first_index():
    batch = _batch(np.float32, True, n=6)
    a = batch.copy()
    r1 = mix_batch(a, _labels(6), MixUp(num_classes=7), seed=1, epoch=0, first_index=12)
    assert not np.array_equal(a, batch)
    b = batch.copy()
    r2 = mix_batch(b, _labels(6), MixUp(num_classes=7), seed=1, epoch=0, first_index=12, threads=1)
    np.testing.assert_array_equal(a, b)
    assert r1.params == r2.params
    c = batch.copy()
    r3 = mix_batch(c, _labels(6), MixUp(num_classes=7), seed=1, epoch=0, first_index=18)
    assert r3.params["lam"] != r1.params["lam"]


def test_mix_batch_pillow_path_equals_engine(monkeypatch):
    if not HAVE_ENGINE:
        pytest.skip("the C++ engine is not built")
    batch = _batch(np.float16, False, n=9)
    labels = _labels(9)
    a = batch.copy()
    ra = mix_batch(a, labels, MIXES[2], seed=4, epoch=0, first_index=3)
    monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    b = batch.copy()
    rb = mix_batch(b, labels, MIXES[2], seed=4, epoch=0, first_index=3)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ra.labels, rb.labels)


@requires_engine
def test_engine_erasing_independent_of_threads_and_batches():
    erase = RandomErasing(p=0.7, value="random")
    batch = _batch(np.float32, True, n=10)
    spec = _erasing_spec((), None, erase)
    idx = np.arange(400, 410)
    one, two = batch.copy(), batch.copy()
    _engine().erasing_batch(one, True, spec, 1, 1, idx, 1, False)
    _engine().erasing_batch(two, True, spec, 1, 1, idx, 2, False)
    np.testing.assert_array_equal(one, two)
    part = batch[3:7].copy()
    _engine().erasing_batch(part, True, spec, 1, 1, idx[3:7], 2, False)
    np.testing.assert_array_equal(part, one[3:7])
