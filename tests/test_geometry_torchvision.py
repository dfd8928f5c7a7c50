"""Geometry against torchvision itself, on real photographs: every interpolation mode, antialias on
(torchvision's PIL backend) and off (its tensor backend), train (RandomResizedCrop + flip, the
engine's boxes replayed through torchvision's resized_crop) and eval (Resize(256) + CenterCrop)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastload import decode
from fastload import transforms as T

from conftest import HAVE_ENGINE

torch = pytest.importorskip("torch")
F1 = pytest.importorskip("torchvision.transforms.functional")
F2 = pytest.importorskip("torchvision.transforms.v2.functional")
from torchvision.transforms import InterpolationMode

MODES = {
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
    "nearest": InterpolationMode.NEAREST,
}


@pytest.fixture(scope="module")
def photos(realistic_folder):
    files = sorted(p for p in realistic_folder.rglob("*") if p.suffix.lower() in (".jpeg", ".jpg"))[:12]
    data = [p.read_bytes() for p in files]
    pils = [Image.open(io.BytesIO(b)).convert("RGB") for b in data]
    return data, pils


@pytest.fixture(params=["engine", "pillow"])
def backend(request, monkeypatch):
    if request.param == "pillow":
        monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    elif not HAVE_ENGINE:
        pytest.skip("the C++ engine is not built")
    else:
        monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    return request.param


def _tensor(pil):
    return torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1).contiguous()


def _torchvision_train(pil, box, flip, mode, antialias, size):
    x0, y0, x1, y1 = (int(v) for v in box)
    if antialias:
        out = np.asarray(F1.resized_crop(pil, y0, x0, y1 - y0, x1 - x0, [size, size], MODES[mode]))
    else:
        out = (
            F2.resized_crop(
                _tensor(pil), y0, x0, y1 - y0, x1 - x0, [size, size], interpolation=MODES[mode], antialias=False
            )
            .permute(1, 2, 0)
            .numpy()
        )
    return out[:, ::-1] if flip else out


def _torchvision_eval(pil, mode, antialias, size, resize):
    if antialias:
        return np.asarray(F1.center_crop(F1.resize(pil, resize, MODES[mode]), size))
    t = F2.resize(_tensor(pil), [resize], interpolation=MODES[mode], antialias=False)
    return F2.center_crop(t, [size, size]).permute(1, 2, 0).numpy()


# Mean absolute difference to torchvision in grey levels, engine without DCT scaling (exact filters)
# and Pillow path; measured on 100 generated ImageNet-like images: antialias bilinear 0.025 / 0.003
# (train / eval), bicubic 0.031 / 0.007, nearest 0 / 0; plain bilinear 0.002 / 0.001, bicubic
# 0.002 / 0.003, nearest 0 / 0 (Pillow path: 0 for every antialiased mode, <= 0.005 plain).
LIMITS = {
    ("bilinear", True): 0.06,
    ("bicubic", True): 0.08,
    ("nearest", True): 0.0,
    ("bilinear", False): 0.02,
    ("bicubic", False): 0.03,
    ("nearest", False): 0.0,
}


@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_train_matches_torchvision(backend, photos, mode, antialias):
    data, pils = photos
    t = T.train(96, interpolation=mode, antialias=antialias)
    out = np.empty((len(data), 96, 96, 3), np.uint8)
    res = decode.decode_batch(
        data,
        out,
        t,
        seed=4,
        epoch=2,
        indices=np.arange(len(data)),
        want_params=True,
        options=decode.DecodeOptions(dct_scaling=False),
    )
    assert res.ok
    diffs = [
        np.abs(out[i].astype(int) - _torchvision_train(pils[i], res.boxes[i], res.flips[i], mode, antialias, 96))
        for i in range(len(data))
    ]
    mad = float(np.mean([d.mean() for d in diffs]))
    assert mad <= LIMITS[(mode, antialias)], (mode, antialias, mad)
    # Pillow 13 runs the vertical pass first when the height shrinks and the width does not (a speed
    # choice; the engine, like earlier Pillows, always goes horizontal first): where bicubic's
    # negative lobes clip the uint8 intermediate, a few pixels then move by up to ~10 levels.
    assert max(d.max() for d in diffs) <= {"nearest": 0, "bilinear": 3, "bicubic": 12}[mode]


@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_eval_matches_torchvision(backend, photos, mode, antialias):
    data, pils = photos
    t = T.eval_transform(112, resize=128, interpolation=mode, antialias=antialias)
    out = np.empty((len(data), 112, 112, 3), np.uint8)
    res = decode.decode_batch(
        data, out, t, seed=0, epoch=0, indices=np.arange(len(data)), options=decode.DecodeOptions(dct_scaling=False)
    )
    assert res.ok
    diffs = [
        np.abs(out[i].astype(int) - _torchvision_eval(pils[i], mode, antialias, 112, 128)) for i in range(len(data))
    ]
    mad = float(np.mean([d.mean() for d in diffs]))
    assert mad <= LIMITS[(mode, antialias)], (mode, antialias, mad)


def test_dct_scaling_stays_close_to_torchvision(photos, monkeypatch):
    """The default (DCT-domain downscaling where the resize still shrinks at least 4x afterwards)
    trades a little accuracy for speed: under one grey level per image (tests/test_fidelity.py holds
    every size to 0.02 normalized units)."""
    if not HAVE_ENGINE:
        pytest.skip("the C++ engine is not built")
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    data, pils = photos
    for mode in ("bilinear", "bicubic"):
        t = T.eval_transform(24, resize=28, interpolation=mode)  # 12-15x: the 1/2 DCT scale applies
        out = np.empty((len(data), 24, 24, 3), np.uint8)
        assert decode.decode_batch(data, out, t, seed=0, epoch=0, indices=np.arange(len(data))).ok
        per_image = [
            np.abs(out[i].astype(int) - _torchvision_eval(pils[i], mode, True, 24, 28)).mean() for i in range(len(data))
        ]
        # Measured on generated ImageNet-like images: mean 0.28, worst image 0.74 grey levels.
        assert max(per_image) < 1.0, (mode, per_image)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_engine_and_pillow_path_agree_for_every_mode(photos, mode, monkeypatch):
    if not HAVE_ENGINE:
        pytest.skip("the C++ engine is not built")
    data, _ = photos
    for antialias in (True, False):
        for t in (
            T.train(64, interpolation=mode, antialias=antialias),
            T.Resize(size=(50, 70), flip=0.5, interpolation=mode, antialias=antialias),
        ):
            outs = []
            for forced in ("", "pillow"):
                monkeypatch.setenv("FASTLOAD_DECODER", forced)
                out = np.empty((len(data), *t.size, 3), np.uint8)
                assert decode.decode_batch(
                    data,
                    out,
                    t,
                    seed=1,
                    epoch=0,
                    indices=np.arange(len(data)),
                    options=decode.DecodeOptions(dct_scaling=False),
                ).ok
                outs.append(out)
            diff = np.abs(outs[0].astype(int) - outs[1])
            assert diff.mean() <= (0.0 if mode == "nearest" else 0.08), (t, diff.mean())


def test_interpolation_is_validated():
    assert T.train(8, interpolation=InterpolationMode.BICUBIC).interpolation == "bicubic"
    assert T.Resize(size=8, interpolation="NEAREST").interpolation == "nearest"
    with pytest.raises(ValueError, match="interpolation"):
        T.train(8, interpolation="lanczos")
    with pytest.raises(ValueError, match="antialias"):
        T.CenterCrop(size=8, resize=8, antialias=1)
