"""Device stage (torch): the torchvision -> engine compiler, op by op (fastload.torch.compile)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from torchvision import transforms as T
from torchvision.transforms import v2

from fastload.torch import compile_transform
from fastload.transforms import CenterCrop, RandomResizedCrop, Resize

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def test_imagenet_train_and_eval_compile_whole():
    p = compile_transform(
        T.Compose(
            [
                T.RandomResizedCrop(224, scale=(0.2, 1.0)),
                T.RandomHorizontalFlip(0.3),
                T.ToTensor(),
                T.Normalize(MEAN, STD),
            ]
        )
    )
    assert p.geometry == RandomResizedCrop(size=224, scale=(0.2, 1.0), flip=0.3)
    assert not p.rest and p.is_tensor and p.dtype == torch.float32
    assert p.scale == pytest.approx(1 / 255) and p.mean == tuple(MEAN) and p.std == tuple(STD)
    e = compile_transform(
        v2.Compose(
            [
                v2.Resize(256),
                v2.CenterCrop(224),
                v2.ToImage(),
                v2.ToDtype(torch.float16, scale=True),
                v2.Normalize(MEAN, STD),
            ]
        )
    )
    assert e.geometry == CenterCrop(size=224, resize=256, flip=0.0) and e.tv_image and e.dtype == torch.float16
    r = compile_transform(T.Compose([T.Resize((100, 120)), T.PILToTensor()]))
    assert r.geometry == Resize(size=(100, 120), flip=0.0) and r.dtype == torch.uint8 and not r.rest


def test_flip_before_the_crop_and_normalize_chains():
    p = compile_transform(
        T.Compose(
            [
                T.RandomHorizontalFlip(),
                T.RandomResizedCrop(64),
                T.ToTensor(),
                T.Normalize([0.5] * 3, [0.5] * 3),
                T.Normalize([0.1] * 3, [2.0] * 3),
            ]
        )
    )
    assert p.geometry.flip == 0.5 and not p.rest
    # ((x/255 - .5)/.5 - .1)/2 == (x/255 - (.5 + .1*.5)) / (.5*2)
    assert p.mean == pytest.approx((0.55,) * 3) and p.std == pytest.approx((1.0,) * 3)
    unscaled = compile_transform(v2.Compose([v2.RandomResizedCrop(64), v2.PILToTensor(), v2.ToDtype(torch.float32)]))
    assert unscaled.scale == 1.0 and unscaled.dtype == torch.float32


@pytest.mark.parametrize(
    ("ops", "first_rest", "reason"),
    [
        ([T.RandomResizedCrop(64), T.AugMix(), T.ToTensor()], "AugMix", "not an op fastload compiles"),
        ([T.ColorJitter(0.4), T.RandomResizedCrop(64), T.ToTensor()], "ColorJitter", "before the crop"),
        ([T.RandomResizedCrop(64), T.PILToTensor(), T.ColorJitter(0.4)], "ColorJitter", "tensor backend"),
        (
            [T.RandomResizedCrop(64), T.TrivialAugmentWide(), T.RandomHorizontalFlip()],
            "RandomHorizontalFlip",
            "commute",
        ),
        ([T.RandomCrop(32, padding=4, padding_mode="reflect"), T.ToTensor()], "RandomCrop", "reflect"),
        ([T.RandomResizedCrop(64), T.ToTensor(), T.RandomErasing(), T.Normalize(MEAN, STD)], "Normalize", "after"),
        (
            [T.RandomResizedCrop(64, interpolation=T.InterpolationMode.LANCZOS), T.ToTensor()],
            "RandomResizedCrop",
            "lanczos",
        ),
        ([T.Resize(72), T.ToTensor()], "Resize", "CenterCrop follows"),
        ([T.CenterCrop(64), T.ToTensor()], "CenterCrop", "not in the engine yet"),
        (
            [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.RandomHorizontalFlip()],
            "RandomHorizontalFlip",
            "second",
        ),
        ([T.RandomResizedCrop(64), T.ToTensor(), T.Normalize([0.5] * 3, [0.0] * 3)], "Normalize", "zero"),
        ([T.RandomResizedCrop(64), T.ToTensor(), T.ConvertImageDtype(torch.int32)], "ConvertImageDtype", "int32"),
    ],
)
def test_what_does_not_compile_stays_per_sample_with_a_reason(ops, first_rest, reason):
    p = compile_transform(T.Compose(ops))
    assert type(p.rest[0]).__name__ == first_rest and reason in p.stop
    assert p.rest[0] is ops[len(ops) - len(p.rest)]  # the original objects, untouched


def test_subclasses_and_other_callables_are_not_taken_for_torchvision_ops():
    class MyCrop(T.RandomResizedCrop):
        def get_params(self, img, scale, ratio):
            return 0, 0, 10, 10

    p = compile_transform(T.Compose([MyCrop(64), T.ToTensor()]))
    assert p.geometry is None and isinstance(p.rest[0], MyCrop)
    assert compile_transform(lambda img: img).geometry is None


def test_preset_classes_that_only_delegate_are_seen_through():
    class Preset:
        def __init__(self):
            self.transforms = T.Compose([T.RandomResizedCrop(64), T.ToTensor()])

        def __call__(self, img):
            return self.transforms(img)

    class Augmenting(Preset):
        def __call__(self, img):
            return self.transforms(img) * 2

    assert compile_transform(Preset()).geometry is not None
    assert compile_transform(Augmenting()).geometry is None


def test_interpolation_follows_the_engine_ops():
    p = compile_transform(T.Compose([T.RandomResizedCrop(64, interpolation=T.InterpolationMode.BICUBIC), T.ToTensor()]))
    assert p.geometry.interpolation == "bicubic" and p.geometry.antialias and not p.rest
    e = compile_transform(v2.Compose([v2.Resize(72, interpolation="nearest"), v2.CenterCrop(64), v2.PILToTensor()]))
    assert e.geometry.interpolation == "nearest" and not e.rest
    # On a uint8 tensor (not a PIL image) antialias follows the op.
    t = compile_transform(v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(64, antialias=False)]))
    assert t.geometry.antialias is False
