"""Transform specs and the reference per-sample sampler (shared by the C++ engine and the Pillow path)."""

import math

import pytest

from fastload import transforms as T


def test_splitmix64_known_values():
    # First outputs of SplitMix64 seeded with 0, as published with the algorithm.
    x, outs = 0, []
    for _ in range(3):
        outs.append(T.splitmix64(x))
        x = (x + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    assert outs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_uniform_range_and_key_sensitivity():
    key = T.sample_key(1, 2, 3)
    values = [T.uniform(key, c) for c in range(1000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert 0.45 < sum(values) / len(values) < 0.55
    assert len({T.sample_key(1, 2, 3), T.sample_key(1, 2, 4), T.sample_key(1, 3, 3), T.sample_key(2, 2, 3)}) == 4


def test_random_resized_crop_boxes_follow_torchvision_rules():
    t = T.train(224)
    flips, fallbacks = 0, 0
    width, height = 500, 375
    for index in range(3000):
        p = T.sample_params(width, height, t, seed=7, epoch=0, index=index)
        w, h = p.x1 - p.x0, p.y1 - p.y0
        assert p.x0 >= 0 and p.y0 >= 0 and p.x1 <= width and p.y1 <= height
        assert p.x0 == int(p.x0) and w == int(w)  # integer boxes, as torchvision
        frac = w * h / (width * height)
        if (w, h) == (width, height):
            fallbacks += 1
        else:
            # Rounding w and h moves the area and the aspect slightly past the sampled ranges.
            assert 0.08 * 0.9 <= frac <= 1.0
            assert 3 / 4 * 0.95 <= w / h <= 4 / 3 * 1.05
        flips += p.flip
    assert 0.45 < flips / 3000 < 0.55
    assert fallbacks < 100


def test_same_sample_same_params_whatever_the_call_order():
    t = T.train(224)
    forward = [T.sample_params(640, 480, t, seed=3, epoch=5, index=i) for i in range(50)]
    backward = [T.sample_params(640, 480, t, seed=3, epoch=5, index=i) for i in reversed(range(50))]
    assert forward == list(reversed(backward))
    assert forward != [T.sample_params(640, 480, t, seed=3, epoch=6, index=i) for i in range(50)]


def test_fallback_is_center_crop_clamped_to_ratio():
    # A 1000x10 strip: no sampled box can fit, so the fallback clamps the aspect to 4/3.
    t = T.train(224, scale=(0.9, 1.0))
    p = T.sample_params(1000, 10, t, seed=0, epoch=0, index=0)
    assert (p.y0, p.y1) == (0.0, 10.0)
    assert p.x1 - p.x0 == round(10 * 4 / 3)
    assert p.x0 == (1000 - 13) // 2


def test_eval_box_matches_torchvision_resize_then_center_crop():
    t = T.eval_transform(224, resize=256)
    p = T.sample_params(500, 375, t, seed=0, epoch=0, index=0)
    # Resize(256): 375 -> 256, 500 -> int(256 * 500 / 375) = 341; crop left round(117 / 2) = 58 (ties to even).
    sx, sy = 500 / 341, 375 / 256
    assert p.box == pytest.approx((58 * sx, 16 * sy, 282 * sx, 240 * sy))
    assert not p.flip


def test_resize_box_is_whole_image():
    p = T.sample_params(33, 17, T.Resize(size=(8, 12)), seed=0, epoch=0, index=0)
    assert p.box == (0.0, 0.0, 33.0, 17.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(size=0),
        dict(size=(3,)),
        dict(scale=(0.5, 0.1)),
        dict(scale=(0.0, 1.0)),
        dict(scale=(0.5, 1.5)),
        dict(ratio=(-1.0, 2.0)),
        dict(flip=1.5),
        dict(size="224"),
    ],
)
def test_invalid_specs_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        T.RandomResizedCrop(**kwargs)


def test_specs_are_frozen_and_keyword_only():
    t = T.train(224)
    with pytest.raises(Exception):
        t.flip = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        T.RandomResizedCrop(224)  # type: ignore[misc]
    with pytest.raises(ValueError):
        T.CenterCrop(size=224, resize=200)
    assert T.CenterCrop(size=(224, 200)).size == (224, 200)
    assert math.isclose(T.train().ratio[1], 4 / 3)
