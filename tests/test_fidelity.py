"""Eval and train geometry within 0.02 normalized units (per-image mean absolute difference) of
torchvision's own PIL pipeline at every output size: ``Resize(s * 8 / 7)`` + ``CenterCrop(s)`` and
``RandomResizedCrop(s)`` (the engine's boxes replayed), then ``ToTensor`` + ``Normalize``, on
realistic generated JPEGs, ImageNet-sized and camera-sized (where the 1/4 and 1/8 DCT scales apply).
A few sizes here; every size from 32 to 512 in the slow test (and ``python -m bench.fidelity``)."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("torchvision")
from PIL import Image

from bench import fidelity
from tools.make_dataset import encode_jpeg, render_image

from conftest import HAVE_ENGINE

pytestmark = pytest.mark.skipif(not HAVE_ENGINE, reason="the C++ engine is not built")


@pytest.fixture(scope="module")
def images(realistic_folder):
    data = [p.read_bytes() for p in sorted(realistic_folder.rglob("*.JPEG"))]
    data += [encode_jpeg(render_image(w, h, seed=k), quality=88) for k, (w, h) in enumerate(fidelity.LARGE_SIZES[:2])]
    return data, [Image.open(io.BytesIO(b)).convert("RGB") for b in data]


def _check(images, sizes, interpolation):
    data, pils = images
    over = []
    for size in sizes:
        m = fidelity.measure_size(data, pils, size, interpolation=interpolation)
        for kind, diffs in (("eval", m.eval), ("train", m.train)):
            over += [(size, kind, i, round(d, 4)) for i, d in enumerate(diffs) if d > fidelity.BOUND]
    assert over == [], f"images above {fidelity.BOUND} (size, kind, image, difference): {over}"


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_a_few_sizes_stay_within_the_bound(images, interpolation):
    # 32 and 64: 1/2 and 1/4 DCT scales on the ImageNet-sized images; 112: the eval size that was
    # furthest off (Resize(128) + CenterCrop(112)); 224: the usual size, deeper scales on
    # the camera-sized images only.
    _check(images, [32, 64, 112, 224], interpolation)


@pytest.mark.slow
def test_every_size_from_32_to_512_stays_within_the_bound(images):
    data, pils = images
    _check((data[::3], pils[::3]), list(range(32, 513)), "bilinear")
