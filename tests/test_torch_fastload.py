"""Device stage (torch): fastload's own datasets through fastload.torch, and fastload's extras.

A packed folder, an unpacked tree or ``fastload.open_dataset(...)`` works as the ``dataset``; the
``ImageDataset`` view returns what ``torchvision.datasets.ImageFolder`` would and also works with
torch's own DataLoader. The fastload-style extras (fastload transform ops, ``device``/``devices``
per-device copies, channels-last, ``normalize``/``dtype``) and ``OrderSampler`` keep working.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

import torch.utils.data as tud
from fake_dataset import FakeDataset
from torchvision import datasets
from torchvision import transforms as T

import fastload
from fastload.pack.packer import pack_folder
from fastload.torch import DataLoader, ImageDataset, OrderSampler, split_sizes
from fastload.transforms import CenterCrop, train

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
EVAL = CenterCrop(size=32, resize=40)


def eval_tf():
    return T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])


@pytest.fixture(scope="module")
def packed(tiny_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "tiny"
    pack_folder(str(tiny_folder), str(out), workers=1, progress=False)
    return str(out)


def batches(loader):
    return [[x.clone(), y.clone()] for x, y in loader]


def test_packed_path_with_torchvision_transform_equals_imagefolder(packed, tiny_folder):
    ref = batches(tud.DataLoader(datasets.ImageFolder(str(tiny_folder), eval_tf()), batch_size=16))
    for dataset in (packed, fastload.open_dataset(packed)):
        ours = batches(DataLoader(dataset, batch_size=16, transform=eval_tf(), num_workers=2))
        assert len(ours) == len(ref)
        for (x, y), (rx, ry) in zip(ours, ref, strict=False):
            assert x.dtype == torch.float32 and y.dtype == torch.int64 and torch.equal(y, ry)
            assert (x - rx).abs().mean() < 0.02


def test_packed_and_unpacked_give_the_same_pixels(packed, tiny_folder):
    a = batches(DataLoader(packed, batch_size=16, transform=EVAL))
    b = batches(DataLoader(str(tiny_folder), batch_size=16, transform=EVAL))
    assert a[0][0].dtype == torch.uint8 and a[0][0].shape == (16, 3, 32, 32)
    assert all(torch.equal(x, rx) and torch.equal(y, ry) for (x, y), (rx, ry) in zip(a, b, strict=False))


def test_image_dataset_view_is_what_imagefolder_returns(packed, tiny_folder):
    view = ImageDataset(packed)
    folder = datasets.ImageFolder(str(tiny_folder))
    assert len(view) == len(folder) and view.classes == folder.classes and view.class_to_idx == folder.class_to_idx
    assert view.targets == folder.targets
    for i in (0, 17, len(folder) - 1, -1):
        (img, t), (rimg, rt) = view[i], folder[i]
        assert type(t) is type(rt) is int and t == rt
        assert img.mode == rimg.mode == "RGB" and np.array_equal(np.asarray(img), np.asarray(rimg))
    with pytest.raises(IndexError):
        view[len(view)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_image_dataset_view_with_torchs_own_dataloader(packed, tiny_folder, num_workers):
    view = ImageDataset(packed, transform=eval_tf())
    folder = datasets.ImageFolder(str(tiny_folder), eval_tf())
    ours = batches(tud.DataLoader(view, batch_size=8, num_workers=num_workers))  # batches via __getitems__
    ref = batches(tud.DataLoader(folder, batch_size=8))
    for (x, y), (rx, ry) in zip(ours, ref, strict=False):
        assert torch.equal(y, ry) and x.shape == rx.shape and (x - rx).abs().mean() < 0.02
    # A transform that does not compile: per sample, exactly ImageFolder's pixels.
    gray = T.Compose([T.Grayscale(3), T.Resize((20, 20)), T.PILToTensor()])
    one = tud.DataLoader(ImageDataset(packed, transform=gray), batch_size=8)
    two = tud.DataLoader(datasets.ImageFolder(str(tiny_folder), gray), batch_size=8)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(one, two, strict=False))


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_image_dataset_in_spawned_workers_reopens_the_records(packed, context):
    """Spawned workers unpickle the view: its records reopen there (torch's spawn and forkserver)."""
    ours = batches(tud.DataLoader(ImageDataset(packed, transform=eval_tf()), batch_size=8))
    with fastload.open_dataset(packed) as records:  # a dataset the user opened and passes in
        spawned = tud.DataLoader(
            ImageDataset(records, transform=eval_tf()), batch_size=8, num_workers=2, multiprocessing_context=context
        )
        theirs = batches(spawned)
    assert len(ours) == len(theirs)
    for (x, y), (tx, ty) in zip(ours, theirs, strict=True):
        assert torch.equal(x, tx) and torch.equal(y, ty)


def test_fastload_op_dtype_normalize_and_channels_last(packed):
    with DataLoader(packed, batch_size=8, transform=EVAL) as plain:
        raw = batches(plain)[0][0]
    with DataLoader(packed, batch_size=8, transform=EVAL, normalize=(MEAN, STD)) as norm:
        x = batches(norm)[0][0]
    expected = (raw.double() / 255 - torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)) / torch.tensor(
        STD, dtype=torch.float64
    ).view(1, 3, 1, 1)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x.double(), expected, atol=1e-5, rtol=1e-5)
    with DataLoader(packed, batch_size=8, transform=EVAL, dtype=torch.float16) as half:
        h = batches(half)[0][0]
    assert h.dtype == torch.float16
    torch.testing.assert_close(h.float(), raw.float() / 255, atol=1e-3, rtol=1e-3)
    with DataLoader(packed, batch_size=8, transform=EVAL, channels_last=True) as cl:
        c = batches(cl)[0][0]
    assert c.is_contiguous(memory_format=torch.channels_last) and torch.equal(c, raw)


def test_multi_device_split_with_cpu_devices(packed):
    devices = [torch.device("cpu")] * 3
    with (
        DataLoader(
            packed, batch_size=8, transform=EVAL, devices=devices, channels_last=True, normalize=(MEAN, STD)
        ) as multi,
        DataLoader(
            packed, batch_size=8, transform=EVAL, channels_last=True, device="cpu", normalize=(MEAN, STD)
        ) as single,
    ):
        for parts, (x, y) in zip(multi, single, strict=False):
            assert isinstance(parts, list) and len(parts) == 3
            assert [p[0].shape[0] for p in parts] == split_sizes(x.shape[0], 3)
            for xi, _ in parts:
                assert xi.device.type == "cpu" and xi.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(torch.cat([p[0] for p in parts]), x)
            assert torch.equal(torch.cat([p[1] for p in parts]), y)
        assert multi.stats().seconds["copy"] > 0


def test_split_sizes():
    assert split_sizes(10, 3) == [4, 3, 3]
    assert split_sizes(2, 4) == [1, 1, 0, 0]
    assert sum(split_sizes(257, 8)) == 257


def test_records_object_and_multi_label():
    ml = FakeDataset(10, label_width=2)
    with DataLoader(ml, batch_size=4, transform=train(16)) as loader:
        x, y = next(iter(loader))
    assert x.shape == (4, 3, 16, 16) and y.dtype == torch.float32 and y.shape == (4, 2)
    np.testing.assert_array_equal(y.numpy(), ml.labels[:4])


def test_oversized_batches_of_a_batch_sampler_are_joined(packed):
    class Bucketing(tud.Sampler):
        batch_size = 3  # what it claims; it yields larger batches too

        def __iter__(self):
            return iter([[0, 1, 2], list(range(3, 13)), [13, 14]])

        def __len__(self):
            return 3

    ours = batches(DataLoader(packed, batch_sampler=Bucketing(), transform=EVAL))
    whole = batches(DataLoader(packed, batch_size=15, transform=EVAL))[0]
    assert [x.shape[0] for x, _ in ours] == [3, 10, 2]
    assert torch.equal(torch.cat([x for x, _ in ours]), whole[0][:15])


def test_order_sampler_shards_and_advances(monkeypatch):
    ds = list(range(101))
    shares = [list(OrderSampler(ds, shuffle=True, seed=1, rank=r, world_size=3)) for r in range(3)]
    assert [len(s) for s in shares] == [34] * 3 and set().union(*shares) == set(range(101))
    drop = [list(OrderSampler(ds, seed=1, rank=r, world_size=3, even="drop")) for r in range(3)]
    assert [len(s) for s in drop] == [33] * 3 and not set(drop[0]) & set(drop[1])
    s = OrderSampler(ds, shuffle="global", seed=2)
    e0, e1 = list(s), list(s)  # every iter() is the next epoch unless set_epoch says otherwise
    assert e0 != e1 and s.epoch == 1
    s.set_epoch(0)
    assert list(s) == e0
    assert list(OrderSampler(ds, shuffle=False)) == ds
    # Rank and world size are read when the epoch starts, not at construction.
    lazy = OrderSampler(ds, seed=1)
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 2)
    lazy.set_epoch(0)
    assert len(lazy) == 34 and list(lazy) == shares[2]
    assert isinstance(lazy, tud.DistributedSampler)


def test_order_sampler_with_the_loader_cut_short_advances_the_epoch(packed):
    view = ImageDataset(packed, transform=EVAL)
    loader = DataLoader(view, batch_size=4, sampler=OrderSampler(view, seed=0))
    first = next(iter(loader))[0].clone()  # pass 0 cut short
    assert loader.sampler.epoch == 0
    second = next(iter(loader))[0].clone()  # pass 1
    assert loader.sampler.epoch == 1 and not torch.equal(first, second)
    loader.set_epoch(0)
    again = next(iter(loader))[0]
    assert torch.equal(first, again) and len(loader) == 10


# --- kept batches stay intact (the ring's leases) ---------------------------------------------


def _kept_vs_copies(make_loader, passes=1):
    """``list(loader)`` (kept, zero-copy) against clones taken as each batch arrives."""
    import warnings

    from fastload.errors import KeptBatchesWarning

    loader = make_loader()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KeptBatchesWarning)
        kept, copies = [], []
        for _ in range(passes):
            for batch in loader:
                kept.append(batch)
                copies.append([t.clone() for t in batch])
    assert len(kept) >= 16
    bad = sum(
        not all(torch.equal(a, b) for a, b in zip(k, c, strict=False)) for k, c in zip(kept, copies, strict=False)
    )
    return bad, kept


@pytest.mark.parametrize("channels_last", [False, True])
def test_list_of_zero_copy_batches_stays_intact(packed, channels_last):
    bad, kept = _kept_vs_copies(
        lambda: DataLoader(packed, batch_size=2, transform=EVAL, channels_last=channels_last, prefetch=1)
    )
    assert bad == 0
    assert kept[0][0].dtype == torch.uint8


def test_kept_batches_across_passes_and_a_new_iter(packed):
    view = ImageDataset(packed, transform=EVAL)
    loader = DataLoader(view, batch_size=2, sampler=OrderSampler(view, seed=0), prefetch=1)
    first = next(iter(loader))  # a pass abandoned after one batch, its tensors kept
    copy = [t.clone() for t in first]
    bad, _ = _kept_vs_copies(lambda: loader, passes=2)
    assert bad == 0 and all(torch.equal(a, b) for a, b in zip(first, copy, strict=False))


def test_kept_batches_of_torchvision_uint8_pipeline(tiny_folder):
    ds = datasets.ImageFolder(str(tiny_folder), T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()]))
    bad, kept = _kept_vs_copies(lambda: DataLoader(ds, batch_size=2, num_workers=2, prefetch=1))
    assert bad == 0
    ref = list(tud.DataLoader(ds, batch_size=2))
    assert all(torch.equal(k[1], r[1]) for k, r in zip(kept, ref, strict=False))
