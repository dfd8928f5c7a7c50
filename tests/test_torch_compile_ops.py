"""The torchvision ops of the training recipes (colour, AutoAugment family, erasing, RandomCrop,
vertical flip) compiled into the engine's Pipeline by fastload.torch's compiler, and run through
fastload.torch.DataLoader against torchvision's own pipeline on the same images."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

import torch.utils.data as tud
import torchvision.transforms.functional as TF
from torchvision import datasets
from torchvision import transforms as T
from torchvision.transforms import v2

import fastload.transforms as ft
from fastload.torch import DataLoader, compile_transform

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _pipeline(tf):
    plan = compile_transform(tf)
    assert not plan.rest, plan.stop
    spec, convert = plan.engine_transform()
    assert convert is None
    return spec if isinstance(spec, ft.Pipeline) else ft.Pipeline(geometry=spec)  # a bare geometry: no pixel op


def test_reference_recipe_ops_carry_torchvisions_parameters():
    bicubic = T.InterpolationMode.BICUBIC
    spec = _pipeline(
        T.Compose(
            [
                T.RandomResizedCrop(176, interpolation=bicubic),
                T.RandomHorizontalFlip(),
                T.TrivialAugmentWide(num_magnitude_bins=21, interpolation=T.InterpolationMode.BILINEAR, fill=[1, 2, 3]),
                T.PILToTensor(),
                T.ConvertImageDtype(torch.float),
                T.Normalize(MEAN, STD),
                T.RandomErasing(p=0.25, scale=(0.05, 0.2), ratio=(0.5, 2.0), value="random"),
            ]
        )
    )
    assert spec.geometry.interpolation == "bicubic" and spec.geometry.flip == 0.5
    (ta,) = spec.ops
    assert isinstance(ta, ft.TrivialAugmentWide)
    assert (ta.num_magnitude_bins, ta.interpolation, ta.fill) == (21, "bilinear", (1, 2, 3))
    assert spec.normalize.dtype == "float32" and spec.normalize.mean == pytest.approx(MEAN)
    e = spec.erase
    assert (e.p, e.scale, e.ratio, e.value) == (0.25, (0.05, 0.2), (0.5, 2.0), "random")


@pytest.mark.parametrize("api", [T, v2], ids=["v1", "v2"])
def test_each_policy_and_colour_op_compiles(api):
    cj = _pipeline(
        api.Compose([api.RandomResizedCrop(64), api.ColorJitter(0.4, 0.3, (0.5, 1.5), 0.1), api.PILToTensor()])
    )
    (op,) = cj.ops
    assert op.brightness == pytest.approx((0.6, 1.4)) and op.contrast == pytest.approx((0.7, 1.3))
    assert op.saturation == (0.5, 1.5) and op.hue == pytest.approx((-0.1, 0.1))
    gray = _pipeline(api.Compose([api.RandomResizedCrop(64), api.RandomGrayscale(0.3), api.PILToTensor()]))
    assert gray.ops == (ft.RandomGrayscale(p=0.3),)
    aa = _pipeline(
        api.Compose([api.RandomCrop(32, padding=4), api.AutoAugment(T.AutoAugmentPolicy.SVHN), api.PILToTensor()])
    )
    assert isinstance(aa.geometry, ft.RandomCrop) and aa.geometry.padding == (4, 4, 4, 4)
    assert aa.ops[0].policy.value == "svhn"
    ra = _pipeline(api.Compose([api.RandomResizedCrop(40), api.RandAugment(3, 7), api.PILToTensor()]))
    assert (ra.ops[0].num_ops, ra.ops[0].magnitude) == (3, 7)
    vf = _pipeline(api.Compose([api.RandomVerticalFlip(0.2), api.RandomResizedCrop(40), api.PILToTensor()]))
    assert vf.geometry.vflip == 0.2


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return str(tiny_folder)


def _batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def _fast(loader):
    """The batches, checking the loader took the engine path (it warns when anything runs per sample)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _batches(loader)
    assert not [w for w in caught if "per sample" in str(w.message) or "fastload" in str(w.message)]
    return out


@pytest.mark.parametrize(
    "pixel_op",
    [
        T.RandomGrayscale(p=1.0),
        T.ColorJitter(brightness=(1.4, 1.4)),
        T.ColorJitter(contrast=(0.6, 0.6)),
        T.ColorJitter(saturation=(1.7, 1.7)),
        T.ColorJitter(hue=(0.15, 0.15)),
    ],
    ids=["grayscale", "brightness", "contrast", "saturation", "hue"],
)
def test_deterministic_colour_ops_equal_torchvisions_on_the_same_crop(folder, pixel_op):
    """Fixed factors make the op deterministic: the engine's op on its crop equals torchvision's op
    (PIL backend) on the same crop, byte for byte."""
    plain = T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()])
    with_op = T.Compose([T.Resize(40), T.CenterCrop(32), pixel_op, T.PILToTensor()])
    crops = _fast(DataLoader(datasets.ImageFolder(folder, plain), batch_size=8))
    got = _fast(DataLoader(datasets.ImageFolder(folder, with_op), batch_size=8))
    for (crop, la), (b, lb) in zip(crops, got, strict=True):
        assert torch.equal(la, lb)
        ref = torch.stack([TF.pil_to_tensor(pixel_op(TF.to_pil_image(c))) for c in crop])
        assert torch.equal(ref, b)


def test_random_erasing_erases_the_normalized_output_like_torchvision(folder):
    value = (0.25, -0.5, 1.0)
    tf = T.Compose(
        [
            T.Resize(40),
            T.CenterCrop(32),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
            T.RandomErasing(p=1.0, scale=(0.25, 0.25), ratio=(1.0, 1.0), value=value),
        ]
    )
    assert "all in the engine" in compile_transform(tf).describe()
    for x, _ in _fast(DataLoader(datasets.ImageFolder(folder, tf), batch_size=8)):
        for img in x:
            hit = np.all(np.isclose(img.permute(1, 2, 0).numpy(), value), axis=-1)
            # One 16 x 16 square (a quarter of the area, aspect 1), filled with the value per channel.
            ys, xs = np.nonzero(hit)
            assert hit.sum() >= 256 and ys.max() - ys.min() == 15 and xs.max() - xs.min() == 15


def test_policies_through_the_loader_are_seeded_and_shaped_like_torchvisions(folder):
    tf = T.Compose(
        [
            T.RandomResizedCrop(32, scale=(0.5, 1.0)),
            T.RandomHorizontalFlip(),
            T.TrivialAugmentWide(),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
            T.RandomErasing(p=0.5),
        ]
    )
    ref = next(iter(tud.DataLoader(datasets.ImageFolder(folder, tf), batch_size=8)))
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(_fast(DataLoader(datasets.ImageFolder(folder, tf), batch_size=8, shuffle=True)))
    assert "all in the engine" in compile_transform(tf).describe()
    x, y = runs[0][0]
    assert x.shape == ref[0].shape and x.dtype == ref[0].dtype and y.dtype == ref[1].dtype
    for (a, la), (b, lb) in zip(*runs, strict=True):  # the same generator seed: the same batches
        assert torch.equal(a, b) and torch.equal(la, lb)
    plain = T.Compose(
        [T.RandomResizedCrop(32, scale=(0.5, 1.0)), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    torch.manual_seed(3)
    unaugmented = _batches(DataLoader(datasets.ImageFolder(folder, plain), batch_size=8, shuffle=True))
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(runs[0], unaugmented, strict=True))


def test_reference_script_mixup_cutmix_collate_gets_torchs_input(folder):
    """torchvision's reference script mixes in the collate_fn: it receives the default-collated batch."""
    cutmix_or_mixup = v2.RandomChoice([v2.CutMix(num_classes=3), v2.MixUp(num_classes=3)])

    def collate(batch):
        return cutmix_or_mixup(*tud.default_collate(batch))

    tf = T.Compose(
        [
            T.RandomResizedCrop(32),
            T.RandomHorizontalFlip(),
            T.TrivialAugmentWide(),
            T.PILToTensor(),
            T.ConvertImageDtype(torch.float),
            T.Normalize(MEAN, STD),
            T.RandomErasing(0.1),
        ]
    )
    loader = DataLoader(
        datasets.ImageFolder(folder, tf), batch_size=8, shuffle=True, collate_fn=collate, drop_last=True
    )
    for x, y in loader:
        assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32
        assert y.shape == (8, 3) and torch.allclose(y.sum(1), torch.ones(8))  # soft labels


@pytest.mark.parametrize("api", [T, v2], ids=["v1", "v2"])
def test_random_affine_compiles_after_the_crop_with_torchvisions_parameters(api):
    spec = _pipeline(
        api.Compose(
            [
                api.RandomResizedCrop(64),
                api.RandomHorizontalFlip(),
                api.RandomAffine(
                    degrees=15,
                    translate=(0.1, 0.2),
                    scale=(0.9, 1.1),
                    shear=(-5, 5, -2, 2),
                    fill=[1, 2, 3],
                    center=(3, 4),
                ),
                api.ColorJitter(0.4, 0.4, 0.4),
                api.PILToTensor(),
            ]
        )
    )
    a = spec.affine
    assert isinstance(a, ft.RandomAffine) and spec.geometry.flip == 0.5 and len(spec.ops) == 1
    assert (a.degrees, a.translate, a.scale, a.shear) == ((-15.0, 15.0), (0.1, 0.2), (0.9, 1.1), (-5.0, 5.0, -2.0, 2.0))
    assert (a.interpolation, a.fill, a.center) == ("nearest", (1, 2, 3), (3.0, 4.0))
    bilinear = _pipeline(
        api.Compose(
            [api.Resize(40), api.CenterCrop(32), api.RandomAffine(10, interpolation=T.InterpolationMode.BILINEAR)]
        )
    )
    assert bilinear.affine.interpolation == "bilinear" and bilinear.affine.fill == (0, 0, 0)


@pytest.mark.parametrize(
    ("ops", "why"),
    [
        ([T.RandomAffine(10), T.RandomResizedCrop(32)], "before the crop"),
        ([T.RandomResizedCrop(32), T.ColorJitter(0.4), T.RandomAffine(10)], "after a colour op"),
        ([T.RandomResizedCrop(32), T.RandomAffine(10), T.RandomHorizontalFlip()], "after RandomAffine"),
        ([T.RandomCrop(32, padding=4), T.RandomAffine(10)], "RandomCrop"),
        ([T.RandomResizedCrop(32), T.RandomAffine(10), T.RandomAffine(5)], "second RandomAffine"),
    ],
)
def test_random_affine_the_engine_cannot_order_exactly_stays_per_sample(ops, why):
    plan = compile_transform(T.Compose([*ops, T.PILToTensor()]))
    assert plan.rest and why in plan.stop, plan.stop


def test_fixed_random_affine_through_the_loader_is_torchvisions_on_the_same_crop(folder):
    """Fixed parameters make RandomAffine deterministic: nearest (torchvision's default) picks the
    resized crop's pixels torchvision's F.affine picks; bilinear interpolates once instead of twice."""
    fixed = dict(degrees=(20, 20), translate=None, scale=(0.9, 0.9), shear=(6, 6, -3, -3), fill=(10, 200, 30))
    plain = T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()])
    crops = _fast(DataLoader(datasets.ImageFolder(folder, plain), batch_size=8))
    for mode, max_mean in ((T.InterpolationMode.NEAREST, 0.5), (T.InterpolationMode.BILINEAR, 6.0)):
        affine = T.RandomAffine(interpolation=mode, **fixed)
        tf = T.Compose([T.Resize(40), T.CenterCrop(32), affine, T.PILToTensor()])
        assert "all in the engine" in compile_transform(tf).describe()
        got = _fast(DataLoader(datasets.ImageFolder(folder, tf), batch_size=8))
        for (crop, la), (b, lb) in zip(crops, got, strict=True):
            assert torch.equal(la, lb)
            ref = torch.stack([TF.pil_to_tensor(affine(TF.to_pil_image(c))) for c in crop])
            diff = (ref.int() - b.int()).abs().float()
            assert diff.mean() <= max_mean, (mode, diff.mean())
            filled_ref = (ref == torch.tensor(fixed["fill"]).view(1, 3, 1, 1)).all(1)
            filled = (b == torch.tensor(fixed["fill"]).view(1, 3, 1, 1)).all(1)
            assert (filled_ref != filled).float().mean() < 0.02
