"""MixUp / CutMix fused into decode_batch's output stage (``decode_batch(mix=...)``).

The fused result must equal the unfused one (decode, then ``mix_batch`` with
``first_index=indices[0]``) bit for bit for every output dtype and layout, with and without pixel
ops and erasing, on any thread count; a batch with an image that did not decode comes back unmixed
(``BatchResult.mix is None``) so the caller can replace it and mix afterwards; the Pillow path gives
the same bytes; and the Loader's batches carry the soft labels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastload import decode
from fastload import transforms as T

from conftest import requires_engine

IMAGENET = T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
HALF = T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), dtype="float16")
SIZE = 48
CLASSES = 5


@pytest.fixture(scope="module")
def jpegs(realistic_folder):
    return [p.read_bytes() for p in sorted(Path(realistic_folder).rglob("*.JPEG"))[:9]]


def _pipeline(normalize, *, ops=(), erase=None):
    return T.Pipeline(geometry=T.RandomResizedCrop(size=SIZE), ops=ops, normalize=normalize, erase=erase)


def _out(n, pipeline, layout):
    shape = (n, SIZE, SIZE, 3) if layout == "NHWC" else (n, 3, SIZE, SIZE)
    return np.zeros(shape, pipeline.output_dtype)


def _labels(n):
    return np.arange(n) % CLASSES


def _both(jpegs, pipeline, mix, *, layout="NCHW", threads=2, indices=None, seed=4, epoch=2):
    n = len(jpegs)
    idx = np.arange(30, 30 + n) if indices is None else np.asarray(indices)
    plain = _out(n, pipeline, layout)
    res = decode.decode_batch(
        jpegs, plain, pipeline, seed=seed, epoch=epoch, indices=idx, threads=threads, layout=layout
    )
    assert res.ok and res.mix is None
    expected = T.mix_batch(plain, _labels(n), mix, seed=seed, epoch=epoch, first_index=int(idx[0]), layout=layout)
    fused = _out(n, pipeline, layout)
    got = decode.decode_batch(
        jpegs,
        fused,
        pipeline,
        seed=seed,
        epoch=epoch,
        indices=idx,
        threads=threads,
        layout=layout,
        mix=mix,
        labels=_labels(n),
    )
    assert got.ok and got.mix is not None
    return plain, fused, expected, got.mix


MIXES = [
    T.MixUp(alpha=0.2, num_classes=CLASSES),
    T.CutMix(alpha=1.0, num_classes=CLASSES),
    T.RandomChoice(transforms=(T.MixUp(alpha=0.2, num_classes=CLASSES), T.CutMix(alpha=1.0, num_classes=CLASSES))),
]


@requires_engine
@pytest.mark.parametrize("normalize", [None, IMAGENET, HALF], ids=["uint8", "float32", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mix", MIXES, ids=["mixup", "cutmix", "choice"])
def test_fused_mix_equals_decode_then_mix_batch(jpegs, normalize, layout, mix):
    plain, fused, expected, got = _both(jpegs, _pipeline(normalize), mix, layout=layout)
    np.testing.assert_array_equal(fused, plain)  # mix_batch mixed `plain` in place
    np.testing.assert_array_equal(got.labels, expected.labels)
    assert got.params == expected.params


@requires_engine
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_fused_mix_with_pixel_ops_and_erasing_on_any_thread_count(jpegs, threads):
    pipeline = _pipeline(IMAGENET, ops=(T.TrivialAugmentWide(),), erase=T.RandomErasing(p=0.7, value="random"))
    mixup = T.MixUp(alpha=1.0, num_classes=CLASSES)
    plain, fused, _, got = _both(jpegs, pipeline, mixup, threads=threads)
    np.testing.assert_array_equal(fused, plain)
    assert 0.0 < got.params["lam"] < 1.0
    assert not np.array_equal(fused[0], fused[1])


@requires_engine
@pytest.mark.parametrize("normalize", [None, IMAGENET, HALF], ids=["uint8", "float32", "float16"])
def test_fused_mix_without_simd_output_kernels(jpegs, normalize):
    """With the output stage's scalar kernels the rows are written, then mixed: the same bytes."""
    import fastload._engine as engine

    mixup = T.MixUp(alpha=0.5, num_classes=CLASSES)
    assert engine._resize_force_kernels("scalar")
    try:
        plain, fused, _, _ = _both(jpegs, _pipeline(normalize), mixup)
    finally:
        engine._resize_force_kernels("best")
    np.testing.assert_array_equal(fused, plain)
    _, simd, _, _ = _both(jpegs, _pipeline(normalize), mixup)
    np.testing.assert_array_equal(simd, fused)


@requires_engine
def test_fused_mix_single_image_batch_mixes_with_itself(jpegs):
    plain, fused, expected, got = _both(jpegs[:1], _pipeline(IMAGENET), T.MixUp(alpha=0.4, num_classes=CLASSES))
    np.testing.assert_array_equal(fused, plain)
    np.testing.assert_array_equal(got.labels, expected.labels)


@requires_engine
def test_failed_image_leaves_the_batch_unmixed(jpegs):
    pipeline = _pipeline(IMAGENET, erase=T.RandomErasing(p=0.5))
    batch = list(jpegs[:5])
    batch[2] = b"\xff\xd8 not a jpeg"
    idx = np.arange(10, 15)
    unmixed = _out(5, pipeline, "NCHW")
    decode.decode_batch(batch, unmixed, pipeline, seed=1, epoch=0, indices=idx, threads=2)
    out = _out(5, pipeline, "NCHW")
    res = decode.decode_batch(
        batch,
        out,
        pipeline,
        seed=1,
        epoch=0,
        indices=idx,
        threads=2,
        mix=T.MixUp(num_classes=CLASSES),
        labels=_labels(5),
    )
    assert res.failed == [2] and res.mix is None
    np.testing.assert_array_equal(out, unmixed)  # the good images are written, unmixed; the bad one is zeros
    assert not out[2].any()


@requires_engine
def test_pillow_path_mixes_to_the_same_bytes(jpegs, monkeypatch):
    mix = MIXES[2]
    _, fused, _, got = _both(jpegs, _pipeline(IMAGENET), mix)
    monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    out = _out(len(jpegs), _pipeline(IMAGENET), "NCHW")
    res = decode.decode_batch(
        jpegs,
        out,
        _pipeline(IMAGENET),
        seed=4,
        epoch=2,
        indices=np.arange(30, 30 + len(jpegs)),
        threads=2,
        mix=mix,
        labels=_labels(len(jpegs)),
    )
    assert res.backend == "pillow" and res.mix is not None
    assert res.mix.params == got.params
    np.testing.assert_array_equal(res.mix.labels, got.labels)
    # The Pillow path decodes with Pillow's own IDCT and resize: close to the engine, not equal.
    assert np.abs(out.astype(np.float64) - fused).mean() < 0.05


def test_mix_arguments_are_checked(jpegs):
    pipeline = _pipeline(None)
    out = _out(2, pipeline, "NCHW")
    with pytest.raises(ValueError, match="labels"):
        decode.decode_batch(jpegs[:2], out, pipeline, seed=0, epoch=0, indices=[0, 1], mix=MIXES[0])
    with pytest.raises(ValueError, match="rows for a batch of 2"):
        decode.decode_batch(jpegs[:2], out, pipeline, seed=0, epoch=0, indices=[0, 1], mix=MIXES[0], labels=[1, 2, 3])
    with pytest.raises(ValueError, match="MixUp, CutMix or RandomChoice"):
        decode.decode_batch(jpegs[:2], out, pipeline, seed=0, epoch=0, indices=[0, 1], mix="mixup", labels=[0, 1])
    with pytest.raises(ValueError, match="class index"):
        decode.decode_batch(jpegs[:2], out, pipeline, seed=0, epoch=0, indices=[0, 1], mix=MIXES[0], labels=[0, 9])


@requires_engine
def test_soft_labels_go_to_the_callers_array(jpegs):
    pipeline = _pipeline(None)
    out = _out(3, pipeline, "NCHW")
    soft = np.full((3, CLASSES), np.nan, np.float32)
    res = decode.decode_batch(
        jpegs[:3], out, pipeline, seed=0, epoch=0, indices=[5, 6, 7], mix=MIXES[0], labels=[0, 1, 2], soft_labels=soft
    )
    assert res.mix.labels is soft
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-6)


# --- the Loader's mix= ----------------------------------------------------------------------------


def _loader_epoch(ds, **kw):
    from fastload.loader import Loader, LoaderConfig

    config = LoaderConfig(
        batch_size=8, transform=_pipeline(IMAGENET, erase=T.RandomErasing(p=0.5)), num_threads=2, seed=3, **kw
    )
    with Loader(ds, config) as loader:
        return [(b.indices.copy(), b.labels.copy(), b.images.copy()) for b in loader]


@requires_engine
@pytest.mark.parametrize("bad", [(), (2, 12)], ids=["clean", "bad-records"])
def test_loader_mix_equals_mixing_its_plain_batches(bad):
    from fake_dataset import FakeDataset

    ds = FakeDataset(37, classes=CLASSES, bad=bad)
    mix = MIXES[2]
    fused = _loader_epoch(ds, shuffle="none", mix=mix)
    plain = _loader_epoch(ds, shuffle="none")
    assert len(fused) == len(plain) == 5
    for k, ((ia, la, xa), (ib, lb, xb)) in enumerate(zip(fused, plain, strict=True)):
        np.testing.assert_array_equal(ia, ib)
        # shuffle="none": batch k starts at record 8 k in the order (the key, whatever replaced it)
        expected = T.mix_batch(xb, lb, mix, seed=3, epoch=0, first_index=8 * k, layout="NCHW")
        assert la.shape == (len(ia), CLASSES) and la.dtype == np.float32
        np.testing.assert_array_equal(la, expected.labels)
        np.testing.assert_array_equal(xa, xb)


def test_loader_mix_is_checked():
    from fake_dataset import FakeDataset

    from fastload.loader import Loader, LoaderConfig

    with pytest.raises(ValueError, match="MixUp, CutMix or RandomChoice"):
        LoaderConfig(mix="mixup")
    with pytest.raises(ValueError, match="probabilities per record"):
        Loader(FakeDataset(8, label_width=2), LoaderConfig(batch_size=4, mix=T.MixUp(num_classes=CLASSES)))


@requires_engine
@pytest.mark.parametrize("stop_after", [2, 5])
def test_loader_mix_resumes_exactly(stop_after):
    """The mix is keyed by (seed, epoch, the batch's first index): a resumed run mixes the same."""
    from fake_dataset import FakeDataset

    from fastload.loader import Loader, LoaderConfig

    ds = FakeDataset(37, classes=CLASSES, bad=(9,))
    config = LoaderConfig(
        batch_size=8, transform=_pipeline(IMAGENET), num_threads=2, seed=5, shuffle="global", mix=MIXES[2]
    )

    def epochs(loader, count):
        out = []
        for _ in range(count):
            out += [(b.indices.copy(), b.labels.copy(), b.images.copy()) for b in loader]
        return out

    with Loader(ds, config) as loader:
        reference = epochs(loader, 2)  # 5 batches an epoch
    with Loader(ds, config) as first:
        for k, _batch in enumerate(first):
            if k + 1 == stop_after:
                break
        state = first.state_dict()
    with Loader(ds, config) as second:
        second.load_state_dict(state)
        resumed = epochs(second, 2)[: len(reference) - stop_after]
    assert len(resumed) == len(reference) - stop_after
    for (ia, la, xa), (ib, lb, xb) in zip(resumed, reference[stop_after:], strict=True):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(xa, xb)
