"""Pixel ops, erasing and MXNet's normalization jitter fused into decode_batch (fastload.transforms.Pipeline).

The fused engine path must give exactly what the separate steps give (geometry-only decode, then
the pixel ops, then the output stage), report every sample's draws (``want_params``) so that the
references replay them to the same bytes, and draw the same parameters on the Pillow path.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fastload import decode
from fastload import transforms as T
from fastload.transforms.pixel import run_pixel_ops_batch

from conftest import requires_engine

IMAGENET = T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
SIZE = 64


@pytest.fixture(scope="module")
def jpegs(realistic_folder):
    return [p.read_bytes() for p in sorted(Path(realistic_folder).rglob("*.JPEG"))[:12]]


def _decode(jpegs, transform, *, seed=3, epoch=1, indices=None, threads=2, layout="NHWC", dtype=np.uint8):
    n = len(jpegs)
    indices = np.arange(100, 100 + n) if indices is None else np.asarray(indices)
    shape = (n, SIZE, SIZE, 3) if layout == "NHWC" else (n, 3, SIZE, SIZE)
    out = np.zeros(shape, dtype)
    res = decode.decode_batch(
        jpegs, out, transform, seed=seed, epoch=epoch, indices=indices, threads=threads, layout=layout, want_params=True
    )
    assert res.ok, res.errors
    return out, res


OPS = (
    T.TrivialAugmentWide(interpolation="bilinear"),
    T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
    T.RandomGrayscale(p=0.2),
    T.Lighting(alphastd=0.1),
)
GEOMETRY = T.RandomResizedCrop(size=SIZE)


@requires_engine
def test_fused_pixel_ops_equal_separate_steps(jpegs, monkeypatch):
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    plain, _ = _decode(jpegs, GEOMETRY)
    fused, res = _decode(jpegs, T.Pipeline(geometry=GEOMETRY, ops=OPS))
    separate = plain.copy()
    params = run_pixel_ops_batch(
        separate, OPS, seed=3, epoch=1, indices=np.arange(100, 100 + len(jpegs)), threads=2, want_params=True
    )
    np.testing.assert_array_equal(fused, separate)
    # The reported draws are the ones the ops used: the references replay them to the same bytes.
    assert res.op_params is not None and res.output_params is None
    for i in range(len(jpegs)):
        img = plain[i]
        for k, op in enumerate(OPS):
            assert res.op_params[i][k] == params[i][k]
            img = op.apply_params(img, res.op_params[i][k])
        np.testing.assert_array_equal(img, fused[i])


@requires_engine
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_normalize_and_erasing(jpegs, monkeypatch, layout, dtype):
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    norm = T.Normalize(mean=IMAGENET.mean, std=IMAGENET.std, dtype=dtype)
    erase = T.RandomErasing(p=1.0, value=(1.5, -2.0, 0.25))
    with_ops, _ = _decode(
        jpegs, T.Pipeline(geometry=GEOMETRY, ops=OPS, normalize=norm), layout=layout, dtype=np.dtype(dtype)
    )
    erased, res = _decode(
        jpegs, T.Pipeline(geometry=GEOMETRY, ops=OPS, normalize=norm, erase=erase), layout=layout, dtype=np.dtype(dtype)
    )
    # Pixels before erasing: the ops then the Normalize (the engine's and the reference's float arithmetic).
    uint8, _ = _decode(jpegs, T.Pipeline(geometry=GEOMETRY, ops=OPS))
    want = norm.apply(uint8)
    got = with_ops if layout == "NHWC" else with_ops.transpose(0, 2, 3, 1)
    np.testing.assert_allclose(
        got.astype(np.float32), want.astype(np.float32), atol=2e-3 if dtype == "float16" else 1e-5
    )
    assert res.output_params is not None
    for i, p in enumerate(res.output_params):
        e = p["erase"]
        assert e["applied"]
        box = (slice(e["top"], e["top"] + e["height"]), slice(e["left"], e["left"] + e["width"]))
        a = erased[i] if layout == "NHWC" else erased[i].transpose(1, 2, 0)
        b = with_ops[i] if layout == "NHWC" else with_ops[i].transpose(1, 2, 0)
        np.testing.assert_array_equal(a[box], np.broadcast_to(np.asarray(erase.value, dtype=dtype), a[box].shape))
        mask = np.ones(a.shape[:2], bool)
        mask[box] = False
        np.testing.assert_array_equal(a[mask], b[mask])


@requires_engine
def test_fused_mxnet_normalization_jitter(jpegs, monkeypatch):
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    norm = T.Normalize(mean=(123.68, 116.28, 103.53), std=(58.395, 57.12, 57.375), scale=1.0)
    mx = T.MXNetColorAugment(max_random_contrast=0.3, max_random_illumination=20)
    plain, _ = _decode(jpegs, T.Pipeline(geometry=GEOMETRY, normalize=norm), dtype=np.float32)
    out, res = _decode(jpegs, T.Pipeline(geometry=GEOMETRY, ops=(mx,), normalize=norm), dtype=np.float32)
    for i, p in enumerate(res.output_params):
        c, l = np.float32(p["mx_contrast"]), np.float32(p["mx_illumination"])
        assert 0.7 <= c <= 1.3 and -20 <= l <= 20
        add = (l * np.asarray([1.0 / s for s in norm.std], np.float32)).astype(np.float32)
        np.testing.assert_array_equal(out[i], plain[i] * c + add)
    # uint8 outputs: no normalization jitter, as MXNet.
    u_plain, _ = _decode(jpegs, GEOMETRY)
    u_out, _ = _decode(jpegs, T.Pipeline(geometry=GEOMETRY, ops=(mx,)))
    np.testing.assert_array_equal(u_out, u_plain)


@requires_engine
def test_fused_path_independent_of_threads_and_batches(jpegs, monkeypatch):
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    pipe = T.Pipeline(geometry=GEOMETRY, ops=(T.RandAugment(), T.ColorJitter(hue=0.3)), erase=T.RandomErasing(p=0.5))
    one, r1 = _decode(jpegs, pipe, threads=1)
    two, r2 = _decode(jpegs, pipe, threads=2)
    np.testing.assert_array_equal(one, two)
    assert _close(r1.op_params, r2.op_params) and _close(r1.output_params, r2.output_params)
    half, _ = _decode(jpegs[5:9], pipe, indices=np.arange(105, 109))
    np.testing.assert_array_equal(half, one[5:9])


def test_pillow_path_draws_the_engine_parameters(jpegs, monkeypatch):
    pipe = T.Pipeline(
        geometry=GEOMETRY,
        ops=(*OPS, T.MXNetColorAugment(brightness=0.3, random_h=20)),
        normalize=IMAGENET,
        erase=T.RandomErasing(p=0.5, value="random"),
    )
    monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    pil, rp = _decode(jpegs, pipe, dtype=np.float32)
    assert rp.backend == "pillow"
    for i in range(len(jpegs)):
        for k, _op in enumerate(pipe.ops):
            # The Pillow path's draws are the documented counters: replaying them gives its bytes.
            assert rp.op_params[i][k] is not None
    monkeypatch.delenv("FASTLOAD_DECODER")
    from conftest import HAVE_ENGINE

    if not HAVE_ENGINE:
        return
    eng, re_ = _decode(jpegs, pipe, dtype=np.float32)
    assert re_.backend == "libjpeg-turbo"
    for i in range(len(jpegs)):
        assert _close(re_.op_params[i], rp.op_params[i])
        assert _close(re_.output_params[i], rp.output_params[i])
    # The geometry's resampling differs slightly between the backends (see test_pipeline); the
    # pixel ops keep that small on average.
    diff = np.abs(eng - pil)
    mask = np.isfinite(diff)
    assert float(diff[mask].mean()) < 0.1


def _close(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=False))
    if a is None or b is None:
        return a is b
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return float(a) == float(b)
