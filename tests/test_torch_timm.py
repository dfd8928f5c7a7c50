"""timm on the engine: its ImageDataset (folder and tar readers), the transforms of
``timm.data.create_transform`` compiled into the engine's Pipeline, and the batches of
``timm.data.create_loader`` with ``torch.utils.data.DataLoader`` pointed at ``fastload.torch.DataLoader``.

The engine draws its own randomness; the tests replay what it drew through timm's own objects (its
RandAugment / AutoAugment / AugMix with their ``random`` and ``np.random`` answering the engine's
draws, its crop through torchvision's functional resize) and compare the results: byte for byte for
the policies (both sides run Pillow's arithmetic on the same crop), within the pixel tolerance of the
other tests for the crops (the engine decodes and resizes in its own code).
"""

from __future__ import annotations

import io
import math
import os
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
timm_data = pytest.importorskip("timm.data")

import torch.utils.data as tud
import torchvision.transforms.functional as TF
from PIL import Image, ImageOps
from timm.data import ImageDataset, create_loader, create_transform
from timm.data import auto_augment as aa
from timm.data.loader import fast_collate
from timm.data.mixup import FastCollateMixup
from timm.data.random_erasing import RandomErasing as TimmRandomErasing
from timm.data.transforms import RandomResizedCropAndInterpolation

import fastload.transforms as ft
from fastload.decode import DecodeOptions, decode_batch
from fastload.records.file_records import FileRecords, TarMemberRecords
from fastload.torch import DataLoader, compile_transform
from fastload.torch.datasets import resolve_source
from fastload.transforms.timm_policy import BICUBIC, BILINEAR, TimmAugMix, TimmAutoAugment, TimmRandAugment

from conftest import requires_engine

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TOL = 0.02  # mean absolute difference to the replayed reference, normalized units


@pytest.fixture(scope="module")
def folder(realistic_folder):
    return str(realistic_folder)


def _fast(loader):
    """Every batch (cloned), asserting that nothing fell back to per-sample Python."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = [tuple(t.clone() for t in batch) for batch in loader]
    assert not [w for w in caught if "fastload" in str(w.message)], [str(w.message) for w in caught]
    return out


# --- the dataset -----------------------------------------------------------------------------


def test_image_folder_reader_is_read_as_files_in_timms_order(folder):
    ds = ImageDataset(folder)
    source = resolve_source(ds)
    assert isinstance(source.records, FileRecords) and source.holder is ds
    assert source.records.paths == [p for p, _ in ds.reader.samples]
    assert source.records.labels[:, 0].astype(int).tolist() == [t for _, t in ds.reader.samples]


def _tars(root: Path, folder: str) -> dict[str, Path]:
    """The realistic folder as timm's three tar layouts: one tar, a folder of tars, tars inside a tar."""
    files = sorted(Path(folder).rglob("*.JPEG"))
    one = root / "one.tar"
    with tarfile.open(one, "w") as tf:
        for f in files:
            tf.add(f, arcname=f"{f.parent.name}/{f.name}")
    per_class = root / "per_class"
    per_class.mkdir()
    for cls in sorted({f.parent.name for f in files}):
        with tarfile.open(per_class / f"{cls}.tar", "w") as tf:
            for f in files:
                if f.parent.name == cls:
                    tf.add(f, arcname=f.name)
    nested = root / "nested.tar"
    with tarfile.open(nested, "w") as outer:
        for cls in sorted({f.parent.name for f in files}):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as inner:
                for f in files:
                    if f.parent.name == cls:
                        inner.add(f, arcname=f"{cls}/{f.name}")
            info = tarfile.TarInfo(f"{cls}.tar")
            info.size = buf.tell()
            buf.seek(0)
            outer.addfile(info, buf)
    return {"one": one, "per_class": per_class, "nested": nested}


@pytest.mark.parametrize("layout", ["one", "per_class", "nested"])
def test_image_in_tar_reader_is_read_as_tar_members(folder, tmp_path, layout):
    from timm.data.readers.reader_image_in_tar import ReaderImageInTar

    root = _tars(tmp_path, folder)[layout]
    # A .tar root gets ReaderImageInTar from timm's create_reader; a folder of tars is given it.
    ds = ImageDataset(str(root), reader=None if root.suffix == ".tar" else ReaderImageInTar(str(root)))
    source = resolve_source(ds)
    assert isinstance(source.records, TarMemberRecords), source
    records = source.records
    try:
        assert len(records) == len(ds) == 24
        for i in range(len(ds)):
            f, target = ds.reader[i]
            assert bytes(records.image(i)) == f.read()  # the member's bytes, from its offset
            assert int(records.labels[i, 0]) == target
        assert records.locate(0).startswith(str(root))
    finally:
        records.close()
    with pytest.raises(Exception, match="member"):
        records.image(0)  # closed: a clear error naming the member


def test_timm_datasets_the_engine_cannot_read_say_why(folder):
    raw = ImageDataset(folder, load_bytes=True)
    assert "load_bytes" in resolve_source(raw)
    gray = ImageDataset(folder, input_img_mode="L")
    assert "input_img_mode='L'" in resolve_source(gray)

    class Custom(ImageDataset):
        def __getitem__(self, index):
            return super().__getitem__(index)

    assert "overrides __getitem__" in resolve_source(Custom(folder))


# --- what compiles ---------------------------------------------------------------------------


def _plan(**kwargs):
    return compile_transform(create_transform(64, **kwargs))


def test_create_transform_train_and_eval_compile_whole():
    train = _plan(is_training=True, interpolation="random", scale=(0.2, 1.0), hflip=0.3, vflip=0.1)
    assert not train.rest, train.stop
    geo = train.geometry
    assert geo == ft.RandomResizedCrop(
        size=64, scale=(0.2, 1.0), flip=0.3, vflip=0.1, interpolation=("bilinear", "bicubic")
    )
    (jitter,) = train.ops
    assert isinstance(jitter, ft.ColorJitter) and jitter.brightness == pytest.approx((0.6, 1.4))
    assert train.dtype == torch.float32 and train.mean == pytest.approx(MEAN) and train.std == pytest.approx(STD)
    prefetch = _plan(is_training=True, use_prefetcher=True, interpolation="bicubic")
    assert not prefetch.rest and prefetch.dtype == torch.uint8 and prefetch.is_tensor
    assert prefetch.geometry.interpolation == "bicubic"
    evaluation = _plan(is_training=False, crop_pct=0.875)
    assert not evaluation.rest and evaluation.geometry == ft.CenterCrop(size=64, resize=73)
    assert not _plan(is_training=False, use_prefetcher=True).rest


@pytest.mark.parametrize(
    ("config", "cls"),
    [
        ("rand-m9-mstd0.5-inc1", TimmRandAugment),
        ("rand-m7-n3-mstd101-tweights", TimmRandAugment),
        ("original-mstd0.5", TimmAutoAugment),
        ("v0r", TimmAutoAugment),
        ("augmix-m5-w4-d2", TimmAugMix),
    ],
)
def test_timms_policies_compile_with_their_parameters(config, cls):
    tf = create_transform(64, is_training=True, auto_augment=config, interpolation="bilinear", use_prefetcher=True)
    plan = compile_transform(tf)
    assert not plan.rest, plan.stop
    (policy,) = plan.ops
    assert isinstance(policy, cls)
    timm_policy = tf.transforms[2]
    first = timm_policy.policy[0][0] if cls is TimmAutoAugment else timm_policy.ops[0]
    assert policy.interpolation == "bilinear" and policy.fill == tuple(first.kwargs["fillcolor"])
    assert policy.magnitude_std == first.hparams.get("magnitude_std", 0.0)
    if cls is TimmRandAugment:
        assert policy.num_layers == timm_policy.num_layers
        assert [o[0] for o in policy.ops] == [o.name for o in timm_policy.ops]
        assert (policy.choice_weights is None) == (timm_policy.choice_weights is None)
    if cls is TimmAugMix:
        assert (policy.width, policy.depth, policy.translate_pct) == (4, 2, 0.3)


@pytest.mark.parametrize(("mode", "value"), [("const", 0.0), ("rand", "random_color"), ("pixel", "random")])
def test_random_erasing_modes_compile(mode, value):
    plan = _plan(is_training=True, re_prob=0.3, re_mode=mode)
    assert not plan.rest, plan.stop
    e = plan.erase
    assert e.p == 0.3 and e.scale == pytest.approx((0.02, 1 / 3)) and e.ratio == pytest.approx((0.3, 1 / 0.3))
    assert e.value == ((value,) if isinstance(value, float) else value)


@pytest.mark.parametrize(
    ("kwargs", "first_rest", "reason"),
    [
        (dict(is_training=True, auto_augment="3a"), "AutoAugment", "Desaturate"),
        (dict(is_training=True, re_prob=0.5, re_count=2), "RandomErasing", "boxes"),
        (dict(is_training=True, color_jitter_prob=0.5), "RandomApply", "not an op fastload compiles"),
        (dict(is_training=True, auto_augment="augmix-b1"), "AugMixAugment", "blended"),
    ],
)
def test_what_does_not_compile_stays_per_sample_with_a_reason(kwargs, first_rest, reason):
    plan = _plan(**kwargs)
    assert type(plan.rest[0]).__name__ == first_rest and reason in plan.stop, plan.stop


# --- the engine's draws replayed through timm's own objects ------------------------------------


class _Replay:
    """Stands in for ``random`` and ``np.random`` in timm.data.auto_augment: each call is answered
    with the engine's next draw, and must be the call timm makes at that point."""

    def __init__(self):
        self.queue: list[tuple[str, object]] = []

    def push(self, name, value):
        self.queue.append((name, value))

    def _take(self, name):
        want, value = self.queue.pop(0)
        assert want == name, f"timm called {name}, the replay expected {want}"
        return value

    def random(self):
        return self._take("random")

    def gauss(self, mu, sigma):
        return self._take("magnitude")

    def uniform(self, lo, hi):
        return self._take("magnitude")

    def choice(self, seq, *args, **kwargs):
        return self._take("choice")(seq)

    def dirichlet(self, alpha):
        return self._take("dirichlet")

    def beta(self, a, b):
        return self._take("beta")

    def randint(self, lo, hi):
        return self._take("randint")


class _NumpyShim:
    """timm.data.auto_augment's ``np`` with ``np.random`` replaced by the replay."""

    def __init__(self, replay):
        self.random = replay

    def __getattr__(self, name):
        return getattr(np, name)


class _ImageOpsPillowTwelve:
    """ImageOps with Pillow 12's posterize (0 bits: black), which timm's op relies on; Pillow 13 refuses it."""

    def __getattr__(self, name):
        return getattr(ImageOps, name)

    @staticmethod
    def posterize(image, bits):
        if bits <= 0:
            return image.point([0] * 256 * len(image.getbands()))
        return ImageOps.posterize(image, bits)


def _push_op(replay, op, draw, *, chain=False):
    """The calls timm's AugmentOp makes for one of the engine's draws, in its order."""
    if op.prob < 1.0:
        replay.push("random", 0.0 if draw.applied else 1.0)
    if not draw.applied:
        return
    if op.hparams.get("magnitude_std", 0) > 0:
        replay.push("magnitude", draw.level)
    if op.level_fn is not None and op.name in _NEGATED:
        replay.push("random", 1.0 if draw.negative else 0.0)
    if isinstance(op.kwargs["resample"], tuple) and draw.resample is not None:  # geometric ops only
        code = {BILINEAR: Image.Resampling.BILINEAR, BICUBIC: Image.Resampling.BICUBIC}[draw.resample]
        replay.push("choice", lambda seq, code=code: code)


_NEGATED = {
    "Rotate",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "TranslateXRel",
    "TranslateYRel",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
}


def _replay_policy(timm_policy, spec, params, image, monkeypatch):
    """timm's policy object run on ``image`` with its randomness answering the engine's draws."""
    replay = _Replay()
    monkeypatch.setattr(aa, "random", replay)
    monkeypatch.setattr(aa, "np", _NumpyShim(replay))
    monkeypatch.setattr(aa, "ImageOps", _ImageOpsPillowTwelve())
    if isinstance(spec, TimmRandAugment):
        picked = [timm_policy.ops[k] for k, _ in params["ops"]]
        replay.push("choice", lambda seq: picked)
        for (k, draw), op in zip(params["ops"], picked, strict=True):
            _push_op(replay, op, draw)
    elif isinstance(spec, TimmAutoAugment):
        sub = timm_policy.policy[params["policy"]]
        replay.push("choice", lambda seq: sub)
        for op, draw in zip(sub, params["steps"], strict=True):
            _push_op(replay, op, draw)
    else:
        replay.push("dirichlet", np.asarray(params["weights"], np.float64))
        replay.push("beta", params["m"])
        for chain in params["chains"]:
            if timm_policy.depth <= 0:
                replay.push("randint", len(chain))
            ops = [timm_policy.ops[k] for k, _ in chain]
            replay.push("choice", lambda seq, ops=ops: ops)
            for (_, draw), op in zip(chain, ops, strict=True):
                _push_op(replay, op, draw, chain=True)
    out = np.asarray(timm_policy(Image.fromarray(image)), dtype=np.uint8)
    assert not replay.queue, f"timm did not use every draw: {replay.queue[:3]}"
    return out


def _jpegs(folder, n=12):
    return [p.read_bytes() for p in sorted(Path(folder).rglob("*.JPEG"))[:n]]


def _decode(jpegs, spec, *, seed=7, epoch=2, size=64):
    out = np.zeros((len(jpegs), size, size, 3), np.uint8)
    res = decode_batch(
        jpegs, out, spec, seed=seed, epoch=epoch, indices=np.arange(len(jpegs)) + 100, threads=2, want_params=True
    )
    assert res.ok, res.errors
    return out, res


@requires_engine
@pytest.mark.parametrize(
    "config",
    [
        "rand-m9-mstd0.5-inc1",
        "rand-m9-mstd0.5",
        "rand-m10-n4-mstd101-mmax15",
        "rand-m7-n3-mstd0.5-tweights",
        "original-mstd0.5",
        "v0",
        "augmix-m5-w3-d2",
        "augmix-m3-mstd0.5-a0.5",
    ],
)
@pytest.mark.parametrize("interpolation", ["random", "bicubic"])
def test_policies_replayed_through_timms_objects_give_the_engines_bytes(folder, monkeypatch, config, interpolation):
    tf = create_transform(
        64, is_training=True, auto_augment=config, interpolation=interpolation, use_prefetcher=True, hflip=0.5
    )
    plan = compile_transform(tf)
    assert not plan.rest, plan.stop
    spec = plan.engine_transform()[0]
    (policy,) = spec.ops
    jpegs = _jpegs(folder)
    crops, _ = _decode(jpegs, ft.Pipeline(geometry=spec.geometry))
    full, res = _decode(jpegs, spec)
    timm_policy = tf.transforms[2]
    for i in range(len(jpegs)):
        want = _replay_policy(timm_policy, policy, res.op_params[i][0], crops[i], monkeypatch)
        np.testing.assert_array_equal(full[i], want, err_msg=f"{config} sample {i}")


def test_interpolation_random_draws_each_filter_and_replays_through_timms_crop(folder):
    tf = create_transform(64, is_training=True, interpolation="random", use_prefetcher=True, color_jitter=None)
    plan = compile_transform(tf)
    assert not plan.rest and plan.dtype == torch.uint8, plan.stop
    ds = ImageDataset(folder)
    ds.transform = tf
    # Without the DCT-domain downscale shortcut the engine's resize is Pillow's: the replay is exact
    # up to rounding, so a wrong filter choice would show.
    loader = DataLoader(ds, batch_size=8, shuffle=False, seed=3, decode_options=DecodeOptions(dct_scaling=False))
    batches = _fast(loader)
    geometry = plan.geometry
    used, diffs = set(), []
    for b, (x, y) in enumerate(batches):
        for k in range(x.shape[0]):
            i = 8 * b + k
            img = Image.open(ds.reader.samples[i][0]).convert("RGB")
            p = ft.sample_params(img.width, img.height, geometry, seed=3, epoch=0, index=i)
            used.add(p.interpolation)
            mode = {"bilinear": TF.InterpolationMode.BILINEAR, "bicubic": TF.InterpolationMode.BICUBIC}
            ref = TF.resized_crop(
                img, int(p.y0), int(p.x0), int(p.y1 - p.y0), int(p.x1 - p.x0), [64, 64], mode[p.interpolation]
            )
            if p.flip:
                ref = TF.hflip(ref)
            ref_t = TF.pil_to_tensor(ref)
            assert int(y[k]) == ds.reader.samples[i][1]
            diffs.append((x[k].double() - ref_t.double()).abs().mean().item() / 255 / 0.226)
    assert used == {"bilinear", "bicubic"}
    assert max(diffs) < 0.002


def test_random_erasing_replayed_through_timms_erase(folder, monkeypatch):
    """const mode: timm's own RandomErasing, its random draws answering the engine's box, gives the engine's tensor."""
    import timm.data.random_erasing as re_module

    tf = create_transform(64, is_training=True, re_prob=1.0, re_mode="const", color_jitter=None, hflip=0.0)
    spec = compile_transform(tf).engine_transform()[0]
    jpegs = _jpegs(folder, 8)
    out = np.zeros((8, 3, 64, 64), np.float32)
    res = decode_batch(jpegs, out, spec, seed=1, epoch=0, indices=np.arange(8), threads=2, want_params=True)
    plain = np.zeros_like(out)
    unerased = ft.Pipeline(geometry=spec.geometry, normalize=spec.normalize)
    decode_batch(jpegs, plain, unerased, seed=1, epoch=0, indices=np.arange(8), threads=2)
    erasing = tf.transforms[-1]
    assert isinstance(erasing, TimmRandomErasing)
    for i in range(8):
        box = res.output_params[i]["erase"]
        assert box["applied"]
        h, w = box["height"], box["width"]
        # timm: apply when random() <= p; box area = uniform * area, aspect = exp(uniform), corner randints
        sizes = iter([h * w / (64 * 64), math.log(h / w)])
        corner = iter([box["top"], box["left"]])
        monkeypatch.setattr(re_module.random, "random", lambda: 0.0)
        monkeypatch.setattr(re_module.random, "uniform", lambda lo, hi, sizes=sizes: next(sizes))
        monkeypatch.setattr(re_module.random, "randint", lambda lo, hi, corner=corner: next(corner))
        got = erasing(torch.from_numpy(plain[i].copy()))
        monkeypatch.undo()
        assert torch.equal(got, torch.from_numpy(out[i])), i


@pytest.mark.parametrize("mode", ["rand", "pixel"])
def test_random_erasing_random_fills_have_timms_shape(folder, mode):
    tf = create_transform(64, is_training=True, re_prob=1.0, re_mode=mode, color_jitter=None, hflip=0.0)
    spec = compile_transform(tf).engine_transform()[0]
    jpegs = _jpegs(folder, 8)
    out = np.zeros((8, 3, 64, 64), np.float32)
    res = decode_batch(jpegs, out, spec, seed=1, epoch=0, indices=np.arange(8), threads=2, want_params=True)
    values = []
    for i in range(8):
        box = res.output_params[i]["erase"]
        patch = out[i][:, box["top"] : box["top"] + box["height"], box["left"] : box["left"] + box["width"]]
        per_channel = patch.reshape(3, -1)
        if mode == "rand":  # one normal value per channel, the whole box
            assert (per_channel == per_channel[:, :1]).all()
            values += per_channel[:, 0].tolist()
        else:
            values += per_channel.ravel().tolist()
    assert abs(np.mean(values)) < 1.0 and 0.3 < np.std(values) < 2.0


# --- create_loader with the DataLoader swapped ---------------------------------------------------


def _create_loader(loader_cls, dataset, monkeypatch, **kwargs):
    monkeypatch.setattr(tud, "DataLoader", loader_cls)
    return create_loader(dataset, (3, 64, 64), 8, device=torch.device("cpu"), num_workers=2, **kwargs)


def test_create_loader_prefetcher_path_gets_fast_collates_batches(folder, monkeypatch):
    """timm's default: uint8 CHW samples, fast_collate's (uint8 NCHW, int64) tuple, the prefetcher normalizes."""
    ds = ImageDataset(folder)
    loader = _create_loader(DataLoader, ds, monkeypatch, is_training=False)
    assert type(loader.loader) is DataLoader and loader.loader.collate_fn is fast_collate
    raw = _fast(loader.loader)
    ours = [tuple(t.clone() for t in b) for b in loader]
    monkeypatch.undo()
    theirs_loader = create_loader(ds, (3, 64, 64), 8, device=torch.device("cpu"), num_workers=0, is_training=False)
    theirs_raw = [tuple(t.clone() for t in b) for b in theirs_loader.loader]
    for (x, y), (rx, ry) in zip(raw, theirs_raw, strict=True):
        assert x.dtype == rx.dtype == torch.uint8 and x.shape == rx.shape and x.is_contiguous()
        assert torch.equal(y, ry) and y.dtype == torch.int64
        assert (x.float() - rx.float()).abs().mean() < 2.0  # grey levels
    theirs = [tuple(t.clone() for t in b) for b in theirs_loader]
    for (x, y), (rx, ry) in zip(ours, theirs, strict=True):
        assert x.dtype == rx.dtype == torch.float32 and torch.equal(y, ry)
        assert (x - rx).abs().mean() < TOL * 2


def test_create_loader_train_with_augmentation_runs_whole_in_the_engine(folder, monkeypatch):
    ds = ImageDataset(folder)
    loader = _create_loader(
        DataLoader,
        ds,
        monkeypatch,
        is_training=True,
        auto_augment="rand-m9-mstd0.5-inc1",
        re_prob=0.25,
        re_mode="pixel",
        interpolation="random",
    )
    assert "all in the engine" in compile_transform(ds.transform).describe()
    torch.manual_seed(0)
    batches = _fast(loader.loader)
    assert len(batches) == 3  # drop_last: 24 // 8
    for x, y in batches:
        assert x.dtype == torch.uint8 and x.shape == (8, 3, 64, 64) and y.dtype == torch.int64
    normalized = list(loader)
    assert all(x.dtype == torch.float32 for x, _ in normalized)


def test_fast_collate_mixup_runs_with_its_own_semantics_and_is_named(folder, monkeypatch):
    ds = ImageDataset(folder)
    mixup = FastCollateMixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=4)
    loader = _create_loader(DataLoader, ds, monkeypatch, is_training=True, collate_fn=mixup)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [tuple(t.clone() for t in b) for b in loader.loader]
        again = [tuple(t.clone() for t in b) for b in loader.loader]
    named = [w for w in caught if "FastCollateMixup" in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]
    for x, y in batches + again:
        assert x.dtype == torch.uint8 and x.shape == (8, 3, 64, 64)
        assert y.shape == (8, 4) and torch.allclose(y.sum(1), torch.ones(8))  # soft, smoothed targets


def test_worker_processes_are_not_needed_for_timms_seeding(folder, monkeypatch):
    """timm passes worker_init_fn (its worker seeding) and persistent_workers: kept, nothing to act on."""
    ds = ImageDataset(folder)
    loader = _create_loader(DataLoader, ds, monkeypatch, is_training=True, persistent_workers=True)
    assert loader.loader.worker_init_fn is not None and loader.loader.persistent_workers
    assert len(_fast(loader.loader)) == 3


def test_reference_crop_of_timms_transform_matches_its_class(folder):
    """RandomResizedCropAndInterpolation is torchvision's area / aspect sampling: the engine's box
    distribution and timm's agree (area fraction and aspect quartiles over many draws)."""
    crop = RandomResizedCropAndInterpolation(64, scale=(0.3, 1.0))
    img = Image.new("RGB", (400, 300))
    torch.manual_seed(0)
    import random

    random.seed(0)
    theirs = [crop.get_params(img, crop.scale, crop.ratio) for _ in range(3000)]
    geo = compile_transform(crop).geometry
    ours = [ft.sample_params(400, 300, geo, seed=0, epoch=0, index=i) for i in range(3000)]
    t_area = [h * w / 120000 for _, _, h, w in theirs]
    o_area = [(p.x1 - p.x0) * (p.y1 - p.y0) / 120000 for p in ours]
    assert np.quantile(t_area, [0.25, 0.5, 0.75]) == pytest.approx(np.quantile(o_area, [0.25, 0.5, 0.75]), abs=0.03)


def test_file_records_read_bytes_and_name_missing_files(tmp_path):
    a = tmp_path / "a.jpg"
    a.write_bytes(b"abc")
    records = FileRecords([str(a), str(tmp_path / "missing.jpg")], [0, 1])
    assert bytes(records.image(0)) == b"abc" and records.locate(1).endswith("missing.jpg")
    with pytest.raises(Exception, match="missing.jpg"):
        records.image(1)
    os.remove(a)
