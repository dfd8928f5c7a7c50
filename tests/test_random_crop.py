"""RandomCrop (pad + unscaled crop, torchvision semantics) and the vertical flip, in the engine and the
Pillow path, against torchvision's own functions on real images."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from PIL import Image

from fastload import decode
from fastload import transforms as T
from fastload.decode import DecodeStatus

from conftest import HAVE_ENGINE, make_jpeg


@pytest.fixture(scope="module")
def images():
    sizes = [(32, 32), (40, 30), (20, 50), (3, 3), (100, 80), (1, 7), (9, 2), (57, 33)]
    # 4:4:4 at high quality: both backends decode to the same pixels, so crops must match exactly.
    return [make_jpeg(w, h, seed=i, subsampling="4:4:4", quality=95) for i, (w, h) in enumerate(sizes)]


@pytest.fixture(params=["engine", "pillow"])
def backend(request, monkeypatch):
    if request.param == "pillow":
        monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    elif not HAVE_ENGINE:
        pytest.skip("the C++ engine is not built")
    else:
        monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    return request.param


def _run(images, transform, *, layout="NHWC", seed=1, epoch=0, **kw):
    pipe = T.as_pipeline(transform)
    h, w = pipe.size
    shape = (len(images), h, w, 3) if layout == "NHWC" else (len(images), 3, h, w)
    out = np.full(shape, 99, pipe.output_dtype)
    res = decode.decode_batch(
        images, out, transform, seed=seed, epoch=epoch, indices=np.arange(len(images)), want_params=True, **kw
    )
    return out, res


def _torchvision_random_crop(pil, t, box):
    """torchvision's RandomCrop steps (PIL backend) with the window our box says."""
    F = pytest.importorskip("torchvision.transforms.functional")
    out_h, out_w = t.size
    left, top, right, bottom = t.padding
    fill = tuple(t.fill)
    if any(t.padding):
        pil = F.pad(pil, [left, top, right, bottom], fill=fill, padding_mode=t.padding_mode)
    pad_x = pad_y = 0
    if t.pad_if_needed and pil.width < out_w:
        pad_x = out_w - pil.width
        pil = F.pad(pil, [pad_x, 0], fill=fill, padding_mode=t.padding_mode)
    if t.pad_if_needed and pil.height < out_h:
        pad_y = out_h - pil.height
        pil = F.pad(pil, [0, pad_y], fill=fill, padding_mode=t.padding_mode)
    i, j = int(box[1]) + top + pad_y, int(box[0]) + left + pad_x
    return np.asarray(F.crop(pil, i, j, out_h, out_w))


CASES = [
    dict(size=32, padding=4),  # the CIFAR recipe
    dict(size=(36, 28), padding=(2, 5), pad_if_needed=True, padding_mode="reflect", fill=7),
    dict(size=(24, 70), padding=(1, 2, 30, 4), pad_if_needed=True, padding_mode="symmetric"),
    dict(size=(8, 8), padding=(17, 0, 0, 9), padding_mode="edge"),
    dict(size=40, pad_if_needed=True, fill=(10, 200, 30)),
    dict(size=(24, 70), padding=(0, 40), pad_if_needed=True, padding_mode="reflect"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_random_crop_matches_torchvision(backend, images, case):
    t = T.RandomCrop(**CASES[case], flip=0.5, vflip=0.5)
    for epoch in range(3):
        out, res = _run(images, t, epoch=epoch)
        for p, data in enumerate(images):
            pil = Image.open(io.BytesIO(data)).convert("RGB")
            w = T.random_crop_window(pil.width, pil.height, t, T.sample_key(1, epoch, p))
            if w is None:
                assert res.status[p] == DecodeStatus.TOO_SMALL and "smaller than the crop" in res.errors[p]
                assert not out[p].any()
                continue
            assert res.status[p] == DecodeStatus.OK, res.errors.get(p)
            want = T.sample_params(pil.width, pil.height, t, seed=1, epoch=epoch, index=p)
            assert tuple(res.boxes[p]) == want.box and res.flips[p] == want.flip and res.vflips[p] == want.vflip
            ref = _torchvision_random_crop(pil, t, res.boxes[p])
            if res.flips[p]:
                ref = ref[:, ::-1]
            if res.vflips[p]:
                ref = ref[::-1]
            np.testing.assert_array_equal(out[p], ref, err_msg=f"{t} image {p} epoch {epoch}")


def test_random_crop_windows_cover_torchvisions_range_uniformly():
    """Every window position torchvision's get_params can return, and no other, about equally often."""
    tv = pytest.importorskip("torchvision.transforms")
    t = T.RandomCrop(size=32, padding=4)
    counts = np.zeros((9, 9), int)
    for index in range(9000):
        w = T.random_crop_window(32, 32, t, T.sample_key(3, 0, index))
        counts[w.top, w.left] += 1
    import torch

    padded = torch.zeros(3, 40, 40)
    tops = {tv.RandomCrop.get_params(padded, (32, 32))[0] for _ in range(2000)}
    assert tops == set(range(9)) and counts.all()
    assert counts.min() > 0.6 * counts.mean() and counts.max() < 1.4 * counts.mean()


def test_too_small_without_padding_is_a_status_not_an_exception(backend, images):
    _, res = _run(images, T.RandomCrop(size=33))
    assert set(res.status.tolist()) == {DecodeStatus.OK, DecodeStatus.TOO_SMALL}
    assert res.status[4] == DecodeStatus.OK  # 100x80
    assert res.status[0] == DecodeStatus.TOO_SMALL and np.isnan(res.boxes[0]).all()


def test_random_crop_is_validated():
    assert T.RandomCrop(size=8, padding=(1, 2)).padding == (1, 2, 1, 2)
    assert T.RandomCrop(size=8, fill=5).fill == (5, 5, 5)
    for bad in (
        dict(padding=-1),
        dict(padding=(1, 2, 3)),
        dict(fill=256),
        dict(fill=(1, 2)),
        dict(padding_mode="wrap"),
        dict(pad_if_needed=1),
        dict(flip=2.0),
        dict(vflip=-0.1),
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            T.RandomCrop(size=8, **bad)


def test_random_crop_with_normalize_and_both_layouts(backend, images):
    norm = T.Normalize(mean=(0.49, 0.48, 0.45), std=(0.25, 0.24, 0.26))
    t = T.RandomCrop(size=32, padding=4, flip=0.5)
    pixels, _ = _run(images, t)
    for layout in ("NHWC", "NCHW"):
        out, res = _run(images, T.Pipeline(geometry=t, normalize=norm), layout=layout)
        ok = res.status == 0
        got = out if layout == "NHWC" else out.transpose(0, 2, 3, 1)
        np.testing.assert_allclose(got[ok], norm.apply(pixels[ok]), rtol=0, atol=2e-6)


# --- the vertical flip on the resampled geometry ops --------------------------------------------------


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_vflip_mirrors_rows_and_is_reported(backend, layout):
    imgs = [make_jpeg(w, h, seed=s) for s, (w, h) in enumerate([(300, 200), (123, 321), (64, 64)])]
    for geometry in (T.train(48), T.eval_transform(40, resize=50), T.Resize(size=(33, 47))):
        base, r0 = _run(imgs, geometry, layout=layout)
        flipped, r1 = _run(imgs, dataclasses.replace(geometry, vflip=1.0), layout=layout)
        assert not r0.vflips.any() and r1.vflips.all()
        np.testing.assert_array_equal(r0.boxes, r1.boxes)  # the vertical flip draws its own counter
        axis = 1 if layout == "NHWC" else 2
        np.testing.assert_array_equal(flipped, np.flip(base, axis=axis))


def test_vflip_probability_and_independence_from_the_horizontal_flip():
    t = T.train(8, flip=0.5, vflip=0.3)
    draws = [T.sample_params(100, 80, t, seed=9, epoch=0, index=i) for i in range(4000)]
    v = np.array([d.vflip for d in draws])
    h = np.array([d.flip for d in draws])
    assert abs(v.mean() - 0.3) < 0.03 and abs(h.mean() - 0.5) < 0.03
    assert abs((v & h).mean() - 0.15) < 0.03


@pytest.mark.skipif(not HAVE_ENGINE, reason="the C++ engine is not built")
def test_engine_and_pillow_agree_on_vflip_draws(monkeypatch):
    imgs = [make_jpeg(90, 70, seed=s) for s in range(16)]
    t = T.train(24, vflip=0.5)
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    _, rn = _run(imgs, t)
    monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    _, rp = _run(imgs, t)
    np.testing.assert_array_equal(rn.vflips, rp.vflips)
    assert 0 < rn.vflips.sum() < len(imgs)
