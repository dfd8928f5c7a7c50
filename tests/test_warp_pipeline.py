"""Warp geometries wired into the decode path: a Pipeline's ``affine`` (RandomAffine after the crop)
and ``MXNetDefaultAugment`` as the geometry, through ``decode_batch`` (engine and Pillow path) and
the Loader: the engine's pixels and draws are the numpy reference's, independent of threads and
batch boundaries; bad input is a per-image error, never a crash."""

from __future__ import annotations

import io

import numpy as np
import pytest
from fake_dataset import FakeDataset
from PIL import Image

import fastload.transforms as T
from fastload.decode import DecodeOptions, DecodeStatus, decode_batch, decode_image
from fastload.loader import Loader, LoaderConfig
from fastload.transforms.warp import gather_frame, uses_crop_frame

from conftest import make_jpeg, requires_engine

EXACT = DecodeOptions(dct_scaling=False)  # the reference decodes at full size

AFFINE = T.RandomAffine(degrees=25, translate=(0.1, 0.05), scale=(0.8, 1.2), shear=(-8, 8, -4, 4), fill=(10, 120, 250))
PIPELINES = {
    "rrc+affine-nearest": T.Pipeline(geometry=T.RandomResizedCrop(size=(48, 56), flip=0.5), affine=AFFINE),
    "centercrop+affine-bilinear": T.Pipeline(
        geometry=T.CenterCrop(size=48, resize=56),
        affine=T.RandomAffine(degrees=30, interpolation="bilinear", fill=7),
    ),
    "resize+affine-bicubic": T.Pipeline(
        geometry=T.Resize(size=(40, 52), interpolation="bicubic"),
        affine=T.RandomAffine(degrees=(-5, 40), scale=(0.7, 0.9), interpolation="bicubic"),
    ),
    "mxnet-aug-level-3": T.Pipeline(
        geometry=T.MXNetDefaultAugment(
            data_shape=(3, 48, 48),
            rand_crop=True,
            rand_mirror=True,
            max_rotate_angle=10,
            max_shear_ratio=0.1,
            max_aspect_ratio=0.25,
            min_random_scale=0.533,
            pad=4,
            fill_value=127,
        )
    ),
    "mxnet-resize-centre": T.Pipeline(geometry=T.MXNetDefaultAugment(data_shape=(3, 40, 40), resize=50)),
}


@pytest.fixture(scope="module")
def images(realistic_folder):
    paths = sorted(realistic_folder.rglob("*.JPEG"))[:10]
    return [p.read_bytes() for p in paths] + [make_jpeg(70, 90, seed=5), make_jpeg(130, 64, seed=6)]


def _decode(images, pipe, *, indices=None, threads=2, epoch=0, options=EXACT):
    h, w = pipe.size
    out = np.zeros((len(images), h, w, 3), np.uint8)
    idx = np.arange(len(images)) if indices is None else indices
    r = decode_batch(
        images, out, pipe, seed=11, epoch=epoch, indices=idx, threads=threads, want_params=True, options=options
    )
    return out, r


def _reference(buf, pipe, index, epoch=0):
    """The numpy reference: full decode, the reference samplers' plan, warp_image.

    Returns ``(pixels, params, plan)``; for a RandomAffine(nearest) (``uses_crop_frame``) the pixels
    are the plain crop of Pillow's decode with ``gather_frame``, what both backends run.
    """
    full = decode_image(buf, options=EXACT)
    key = T.sample_key(11, epoch, index)
    if isinstance(pipe.geometry, T.MXNetDefaultAugment):
        plan, params = T.mxnet_plan(pipe.geometry, full.shape[1], full.shape[0], key)
    else:
        p = T.sample_params(full.shape[1], full.shape[0], pipe.geometry, seed=11, epoch=epoch, index=index)
        plan, params = T.affine_plan(
            pipe.affine,
            p.box,
            p.flip,
            pipe.size,
            key,
            crop_interpolation=pipe.geometry.interpolation,
            crop_antialias=pipe.geometry.antialias,
        )
        if uses_crop_frame(plan):
            img = Image.open(io.BytesIO(buf)).convert("RGB")
            return gather_frame(T.resample(img, p, pipe.geometry), plan), params, plan
    return T.warp_image(full, plan), params, plan


@requires_engine
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_engine_pixels_and_draws_are_the_references(images, name):
    pipe = PIPELINES[name]
    out, r = _decode(images, pipe)
    assert r.ok, r.errors
    for i, buf in enumerate(images):
        ref, params, plan = _reference(buf, pipe, i)
        assert r.warp_params[i] == params
        if uses_crop_frame(plan):
            continue  # the engine's own crop, gathered: test_nearest_affine_copies_the_plain_crops_pixels_exactly
        np.testing.assert_array_equal(out[i], ref)
    if pipe.affine is not None:
        assert np.isfinite(r.boxes).all()  # the crop's box, as without the affine
    else:
        assert np.isnan(r.boxes).all() and r.flips.tolist() == [p.mirror for p in r.warp_params]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pillow_path_runs_the_same_plans(images, name, monkeypatch):
    pipe = PIPELINES[name]
    monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    out, r = _decode(images, pipe)
    assert r.backend == "pillow" and r.ok, r.errors
    for i, buf in enumerate(images):
        ref, params, _plan = _reference(buf, pipe, i)
        assert r.warp_params[i] == params
        np.testing.assert_array_equal(out[i], ref)


@requires_engine
@pytest.mark.parametrize("name", ["rrc+affine-nearest", "mxnet-aug-level-3"])
def test_draws_depend_on_sample_and_epoch_not_threads_or_batches(images, name):
    pipe = PIPELINES[name]
    whole, _ = _decode(images, pipe, threads=2)
    one, _ = _decode(images, pipe, threads=1)
    np.testing.assert_array_equal(whole, one)
    parts = [_decode(images[k : k + 5], pipe, indices=np.arange(k, min(k + 5, len(images))))[0] for k in (0, 5, 10)]
    np.testing.assert_array_equal(whole, np.concatenate(parts))
    other_epoch, _ = _decode(images, pipe, epoch=1)
    assert not np.array_equal(whole, other_epoch)


@requires_engine
def test_normalized_output_with_pixel_ops_and_erasing_after_the_warp(images, monkeypatch):
    pipe = T.Pipeline(
        geometry=T.RandomResizedCrop(size=40, flip=0.5),
        affine=T.RandomAffine(degrees=20, interpolation="bilinear"),
        ops=(T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),),
        normalize=T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
        erase=T.RandomErasing(p=0.5),
    )
    results = {}
    for backend in ("engine", "pillow"):
        if backend == "pillow":
            monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
        out = np.zeros((len(images), 3, 40, 40), np.float32)
        r = decode_batch(images, out, pipe, seed=3, epoch=0, indices=np.arange(len(images)), options=EXACT)
        assert r.ok, r.errors
        results[backend] = out
    # Same draws, same plan; the colour ops' float arithmetic may differ by a grey level.
    assert np.abs(results["engine"] - results["pillow"]).max() <= 1.0 / (255 * 0.224) + 1e-5


@pytest.mark.parametrize("name", ["rrc+affine-nearest", "mxnet-resize-centre"])
def test_damaged_images_fail_alone_with_zeroed_slots(images, name, monkeypatch):
    pipe = PIPELINES[name]
    bad = [images[0][: len(images[0]) // 3], b"not a jpeg at all", b"", images[1]]
    for backend in ("engine", "pillow"):
        if backend == "pillow":
            monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
        h, w = pipe.size
        out = np.full((4, h, w, 3), 77, np.uint8)
        r = decode_batch(bad, out, pipe, seed=0, epoch=0, indices=np.arange(4), want_params=True)
        assert sorted(r.errors) == [1, 2] or sorted(r.errors) == [0, 1, 2], r.errors  # a cut JPEG may still decode
        for i in r.errors:
            assert not out[i].any() and r.warp_params[i] is None
        assert r.status[3] == DecodeStatus.OK and out[3].any()


def test_mxnet_refusal_is_a_per_image_error_naming_the_sizes(monkeypatch):
    pipe = T.Pipeline(geometry=T.MXNetDefaultAugment(data_shape=(3, 32, 32), max_crop_size=100, min_crop_size=80))
    small, large = make_jpeg(60, 50, seed=1), make_jpeg(160, 140, seed=2)
    for backend in ("engine", "pillow"):
        if backend == "pillow":
            monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
        out = np.zeros((2, 32, 32, 3), np.uint8)
        r = decode_batch([small, large], out, pipe, seed=0, epoch=0, indices=np.arange(2))
        assert r.status.tolist() == [DecodeStatus.TOO_SMALL, DecodeStatus.OK], r.errors
        assert "60x50" in r.errors[0]


def test_pipeline_refuses_an_affine_it_cannot_compose():
    with pytest.raises(ValueError, match="RandomAffine"):
        T.Pipeline(geometry=T.RandomCrop(size=32, padding=4), affine=T.RandomAffine(degrees=10))
    with pytest.raises(ValueError, match="vertical flip"):
        T.Pipeline(geometry=T.RandomResizedCrop(size=32, vflip=0.5), affine=T.RandomAffine(degrees=10))
    with pytest.raises(ValueError, match="RandomAffine"):
        T.Pipeline(geometry=T.RandomResizedCrop(size=32), affine=T.ColorJitter(brightness=0.2))
    with pytest.raises(ValueError, match="degrees"):
        T.RandomAffine(degrees=-3)
    with pytest.raises(ValueError, match="fill"):
        T.RandomAffine(degrees=3, fill=300)


def test_loader_batches_are_the_decode_of_their_indices():
    ds = FakeDataset(37)
    pipe = PIPELINES["mxnet-aug-level-3"]
    cfg = LoaderConfig(batch_size=8, transform=pipe, num_threads=2, shuffle="global", seed=11, layout="NHWC")
    with Loader(ds, cfg) as loader:
        batches = [(b.indices.copy(), b.images.copy()) for b in loader]
    assert sum(len(i) for i, _ in batches) == 37
    for idx, imgs in batches:
        out = np.zeros_like(imgs)
        r = decode_batch([ds.image(int(i)) for i in idx], out, pipe, seed=11, epoch=0, indices=idx)
        assert r.ok
        np.testing.assert_array_equal(out, imgs)


@requires_engine
def test_nearest_affine_copies_the_plain_crops_pixels_exactly(images):
    # RandomAffine(nearest) after a crop: the engine resizes the crop exactly as the plain crop path
    # does, then each output pixel copies the crop pixel its frame point falls in (or gets fill).
    # Rebuilt here from the plain path's bytes with the same double arithmetic: equal byte for byte
    # (this pins the engine's gather, vectorized or not).
    geometry = T.RandomResizedCrop(size=(48, 56), flip=0.5)
    affine = T.RandomAffine(degrees=35, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=(-10, 10, -5, 5), fill=(1, 2, 3))
    crops, _ = _decode(images, T.Pipeline(geometry=geometry))
    warped, r = _decode(images, T.Pipeline(geometry=geometry, affine=affine))
    h, w = 48, 56
    for i in range(len(images)):
        params = r.warp_params[i]
        # Written out here rather than through gather_frame, so that the reference is checked too.
        m = T.affine.inverse_affine_matrix(params, (w * 0.5, h * 0.5))
        py = np.arange(h, dtype=np.float64)[:, None] + 0.5
        px = np.arange(w, dtype=np.float64)[None, :] + 0.5
        fx = m[0] * px + (m[1] * py + m[2])
        fy = m[3] * px + (m[4] * py + m[5])
        inside = (fx >= 0) & (fx < w) & (fy >= 0) & (fy < h)
        expected = np.empty((h, w, 3), np.uint8)
        expected[...] = affine.fill
        expected[inside] = crops[i][fy[inside].astype(int), fx[inside].astype(int)]
        np.testing.assert_array_equal(warped[i], expected)
        plan, _ = T.affine_plan(affine, tuple(r.boxes[i]), bool(r.flips[i]), (h, w), T.sample_key(11, 0, i))
        np.testing.assert_array_equal(gather_frame(crops[i], plan), expected)
