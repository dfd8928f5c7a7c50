"""Device stage (torch): DataLoader tensors, on-device conversion, multi-device split with CPU devices."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fastload.loader import Loader, LoaderConfig  # noqa: E402
from fastload.torch import DataLoader, pinned_allocator, split_sizes  # noqa: E402
from fastload.transforms import train  # noqa: E402

from fake_dataset import FakeDataset, jpeg_bytes  # noqa: E402

SIZE = 16
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def ds():
    return FakeDataset(37)


def make(ds, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("transform", train(SIZE))
    kw.setdefault("num_threads", 2)
    return DataLoader(ds, **kw)


def reference(ds, **kw):
    """The core loader's batches (copies) for the same order."""
    config = LoaderConfig(batch_size=8, transform=train(SIZE), num_threads=2, copy=True, **kw)
    with Loader(ds, config) as loader:
        return list(loader)


def test_defaults_uint8_nchw_int64_labels(ds):
    with make(ds) as loader:
        assert len(loader) == 5
        out = [(x.clone(), y.clone()) for x, y in loader]
    ref = reference(ds, shuffle="global")
    assert len(out) == 5
    for (x, y), b in zip(out, ref):
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, SIZE, SIZE) and x.is_contiguous()
        assert y.dtype == torch.int64 and y.shape == (b.size,)
        np.testing.assert_array_equal(x.numpy(), b.images)
        np.testing.assert_array_equal(y.numpy(), b.labels[:, 0].astype(np.int64))


def test_channels_last_is_same_pixels_without_transpose(ds):
    with make(ds, shuffle=False, channels_last=True) as cl, make(ds, shuffle=False) as plain:
        x_cl, _ = next(iter(cl))
        x, _ = next(iter(plain))
        assert x_cl.shape == x.shape
        assert x_cl.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(x_cl, x)


def test_multi_label_is_float(ds):
    ml = FakeDataset(10, label_width=2)
    with make(ml, shuffle=False) as loader:
        _, y = next(iter(loader))
    assert y.dtype == torch.float32 and y.shape == (8, 2)
    np.testing.assert_array_equal(y.numpy(), ml.labels[:8])


def test_normalize_and_dtype_on_device(ds):
    with make(ds, shuffle=False, device="cpu", normalize=(MEAN, STD), dtype=torch.float32) as loader:
        x, _ = next(iter(loader))
    with make(ds, shuffle=False) as loader:
        raw, _ = next(iter(loader))
        raw = raw.clone()
    expected = (raw.double() / 255 - torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)) / \
        torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x.double(), expected, atol=1e-5, rtol=1e-5)
    with make(ds, shuffle=False, device="cpu", dtype=torch.float16) as loader:
        h, _ = next(iter(loader))
    assert h.dtype == torch.float16 and float(h.max()) <= 1.0
    torch.testing.assert_close(h.float(), raw.float() / 255, atol=1e-3, rtol=1e-3)


def test_multi_device_split_with_cpu_devices(ds):
    devices = [torch.device("cpu")] * 3
    with make(ds, shuffle=True, devices=devices, channels_last=True, normalize=(MEAN, STD)) as multi, \
            make(ds, shuffle=True, channels_last=True, device="cpu", normalize=(MEAN, STD)) as single:
        slot_ptrs = {int(s.owners["images"].data_ptr()) for s in multi.loader.ring.slots}
        slot_bytes = multi.loader.ring.slots[0].images.nbytes
        for parts, (x, y) in zip(multi, single):
            assert isinstance(parts, list) and len(parts) == 3
            assert [p[0].shape[0] for p in parts] == split_sizes(x.shape[0], 3)
            for xi, yi in parts:
                assert xi.device.type == "cpu" and xi.is_contiguous(memory_format=torch.channels_last)
                ptr = xi.data_ptr()
                assert not any(p <= ptr < p + slot_bytes for p in slot_ptrs), "slices must be copies, not ring views"
            torch.testing.assert_close(torch.cat([p[0] for p in parts]), x)
            assert torch.equal(torch.cat([p[1] for p in parts]), y)
        s = multi.stats()
        assert s.seconds["copy"] > 0


def test_split_sizes():
    assert split_sizes(10, 3) == [4, 3, 3]
    assert split_sizes(2, 4) == [1, 1, 0, 0]
    assert sum(split_sizes(257, 8)) == 257


def test_cpu_views_follow_the_ring_and_copy_option(ds):
    with make(ds, shuffle=False, prefetch=1) as loader:
        x, _ = next(iter(loader))
        ring_ptrs = [s.owners["images"].data_ptr() for s in loader.loader.ring.slots]
        assert x.data_ptr() in ring_ptrs  # zero-copy view of a slot
    with make(ds, shuffle=False, copy=True) as loader:
        x, _ = next(iter(loader))
        assert x.data_ptr() not in [s.owners["images"].data_ptr() for s in loader.loader.ring.slots]


def test_state_dict_resume_and_set_epoch(ds):
    with make(ds) as loader:
        run = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            run += [(x.clone(), y.clone()) for x, y in loader]
    with make(ds) as first:
        it = iter(first)
        for _ in range(7):  # into the second epoch
            try:
                next(it)
            except StopIteration:
                it = iter(first)
                next(it)
        state = first.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 2)
    with make(ds) as second:
        second.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in second]
    assert len(rest) == 3
    for (x, y), (rx, ry) in zip(rest, run[7:]):
        assert torch.equal(x, rx) and torch.equal(y, ry)


def test_argument_validation(ds):
    with pytest.raises(ValueError, match="CUDA"):
        make(ds, device="cuda")
    with pytest.raises(ValueError, match="either device"):
        make(ds, device="cpu", devices=["cpu"])
    with pytest.raises(ValueError, match="dtype"):
        make(ds, dtype=torch.int32)
    with pytest.raises(ValueError, match="normalize"):
        make(ds, normalize=((0.5, 0.5), (1, 1)))
    with pytest.raises(ValueError, match="disagree"):
        make(ds, num_threads=2, num_workers=3)
    with pytest.raises(ValueError, match="shuffle"):
        make(ds, shuffle="sometimes")
    loader = DataLoader(ds, batch_size=8, transform=train(SIZE), num_workers=0)
    assert loader.loader.config.num_threads == 1
    loader.close()


def test_pinned_allocator_without_cuda():
    view, tensor = pinned_allocator((2, 3), np.dtype(np.float32))
    assert view.shape == (2, 3) and tensor.dtype == torch.float32
    assert not tensor.is_pinned()
    view[0, 0] = 5
    assert tensor[0, 0] == 5


def test_rank_and_world_size_arguments(ds):
    shares = []
    for rank in range(2):
        with make(ds, rank=rank, world_size=2, drop_last=False) as loader:
            shares.append(len(loader))
            assert loader.loader.config.rank == rank
    assert shares == [3, 3]


def test_image_folder_path(tmp_path):
    pytest.importorskip("fastload.records.imagefolder")
    for c in range(2):
        d = tmp_path / "imgs" / f"c{c}"
        d.mkdir(parents=True)
        for k in range(4):
            (d / f"{k}.jpg").write_bytes(jpeg_bytes(20, 24, 10 * c + k))
    with DataLoader(str(tmp_path / "imgs"), batch_size=3, transform=train(SIZE), shuffle=False) as loader:
        out = [(x.clone(), y.clone()) for x, y in loader]
    assert [x.shape[0] for x, _ in out] == [3, 3, 2]
    assert torch.cat([y for _, y in out]).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
