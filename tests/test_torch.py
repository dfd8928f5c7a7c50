"""Device stage (torch): fastload.torch.DataLoader against torch's own DataLoader on torchvision datasets.

Every test builds the same dataset, transform and sampler for both loaders and compares what comes
out: structure after collation, dtypes, shapes, targets, the order of the samples, and pixels within
the documented tolerance (mean absolute difference in normalized units, see ``TOL_*``).
"""

import inspect
import random
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")

import torch.utils.data as tud
import torchvision.transforms.functional as TF
from torchvision import datasets
from torchvision import transforms as T
from torchvision.transforms import v2

from fastload.decode import active_backend
from fastload.torch import DataLoader, compile_transform
from fastload.transforms import sample_params

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
# Mean absolute difference to torchvision's own pipeline, normalized units (1 grey level ~ 0.017).
TOL_EVAL = 0.02
TOL_TRAIN = 0.02


def eval_tf(size=64, resize=72):
    return T.Compose([T.Resize(resize), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])


def eval_tf_v2(size=64, resize=72):
    return v2.Compose(
        [
            v2.Resize(resize),
            v2.CenterCrop(size),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def train_tf(size=64):
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return str(tiny_folder)


def batches(loader):
    return [[x.clone(), y.clone()] for x, y in loader]


def assert_close_batches(ours, theirs, tol):
    assert len(ours) == len(theirs)
    for (x, y), (rx, ry) in zip(ours, theirs, strict=False):
        assert x.dtype == rx.dtype and x.shape == rx.shape
        assert y.dtype == ry.dtype == torch.int64
        assert torch.equal(y, ry)
        assert (x.double() - rx.double()).abs().mean().item() < tol


# --- the signature, attributes and errors are torch's ----------------------------------------


def test_is_a_torch_dataloader_with_torchs_signature():
    ours = inspect.signature(DataLoader.__init__).parameters
    theirs = inspect.signature(tud.DataLoader.__init__).parameters
    for name, p in theirs.items():
        assert name in ours, name
        assert (ours[name].kind, ours[name].default) == (p.kind, p.default), name
    assert list(ours)[: len(theirs)] == list(theirs)
    extras = [p for n, p in ours.items() if n not in theirs]
    assert extras and all(p.kind is p.KEYWORD_ONLY for p in extras)
    assert issubclass(DataLoader, tud.DataLoader)


def test_defaults_and_attributes_equal_torchs(folder):
    ds = datasets.ImageFolder(folder, eval_tf())
    ours, theirs = DataLoader(ds), tud.DataLoader(ds)
    for attr in (
        "batch_size",
        "drop_last",
        "num_workers",
        "pin_memory",
        "timeout",
        "prefetch_factor",
        "persistent_workers",
        "in_order",
        "generator",
        "worker_init_fn",
        "collate_fn",
    ):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert ours.dataset is ds
    assert type(ours.sampler) is tud.SequentialSampler and type(ours.batch_sampler) is tud.BatchSampler
    assert len(ours) == len(theirs) == len(ds)
    assert type(DataLoader(ds, batch_size=7, shuffle=True).sampler) is tud.RandomSampler
    with pytest.raises(ValueError, match="should not be set"):
        ours.batch_size = 3


BAD_ARGS = [
    dict(num_workers=-1),
    dict(timeout=-1),
    dict(prefetch_factor=2),
    dict(num_workers=1, prefetch_factor=-1),
    dict(persistent_workers=True),
    dict(shuffle=True, sampler=[0, 1]),
    dict(batch_sampler=[[0]], batch_size=2),
    dict(batch_sampler=[[0]], drop_last=True),
    dict(batch_size=None, drop_last=True),
    dict(multiprocessing_context="spawn"),
    dict(batch_size=0),
    dict(batch_size=-3),
    dict(drop_last="yes"),
]


@pytest.mark.parametrize("kwargs", BAD_ARGS, ids=lambda k: ",".join(k))
def test_validation_errors_are_torchs(folder, kwargs):
    ds = datasets.ImageFolder(folder, eval_tf())
    with pytest.raises(Exception) as theirs:
        tud.DataLoader(ds, **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        DataLoader(ds, **kwargs)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(device="cpu", devices=["cpu"]), "either device"),
        (dict(devices=[]), "non-empty"),
        (dict(device="cuda"), "CUDA"),
        (dict(num_threads=0), "num_threads"),
        (dict(prefetch=0), "prefetch"),
        (dict(on_error="ignore"), "on_error"),
        (dict(seed=-1), "seed"),
        (dict(shuffle="global"), "OrderSampler"),
        (dict(normalize=(MEAN, STD)), "fastload transform op"),
        (dict(transform=T.ToTensor()), "its own transform"),
        (dict(memory_format=torch.preserve_format), "memory_format"),
        (dict(copy=1), "copy"),
    ],
)
def test_bad_extras_are_clear_value_errors(folder, kwargs, match):
    ds = datasets.ImageFolder(folder, eval_tf())
    with pytest.raises(ValueError, match=match):
        DataLoader(ds, **kwargs)


def test_pin_memory_without_cuda_warns_like_torch(folder):
    ds = datasets.ImageFolder(folder, eval_tf())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, _ = next(iter(DataLoader(ds, batch_size=4, pin_memory=True)))
        next(iter(tud.DataLoader(ds, batch_size=4, pin_memory=True)))
    messages = [str(w.message) for w in caught if "pin_memory" in str(w.message)]
    assert len(messages) == 2 and messages[0] == messages[1]
    assert x.shape == (4, 3, 64, 64)


# --- outputs equal torch's -------------------------------------------------------------------


@pytest.mark.parametrize("make", [eval_tf, eval_tf_v2], ids=["v1", "v2"])
def test_eval_pipeline_equals_torchvision(folder, make):
    ds = datasets.ImageFolder(folder, make())
    ours = batches(DataLoader(ds, batch_size=16, num_workers=2))
    theirs = batches(tud.DataLoader(ds, batch_size=16))
    assert isinstance(next(iter(DataLoader(ds, batch_size=16))), list)
    assert_close_batches(ours, theirs, TOL_EVAL)
    assert ours[-1][0].shape[0] == len(ds) % 16


def test_uint8_pipeline_and_float16_dtype(folder):
    ds = datasets.ImageFolder(folder, v2.Compose([v2.Resize(72), v2.CenterCrop(64), v2.PILToTensor()]))
    ours, theirs = batches(DataLoader(ds, batch_size=8)), batches(tud.DataLoader(ds, batch_size=8))
    assert ours[0][0].dtype == torch.uint8
    assert_close_batches(ours, theirs, 1.0)  # grey levels
    half = datasets.ImageFolder(
        folder, T.Compose([T.Resize(72), T.CenterCrop(64), T.PILToTensor(), T.ConvertImageDtype(torch.float16)])
    )
    ours, theirs = batches(DataLoader(half, batch_size=8)), batches(tud.DataLoader(half, batch_size=8))
    assert ours[0][0].dtype == torch.float16 and float(ours[0][0].max()) <= 1.0
    assert_close_batches(ours, theirs, 0.01)


def test_train_pipeline_replayed_through_torchvision(folder):
    """Random crops / flips: replay the engine's sampled boxes through torchvision's functional API."""
    ds = datasets.ImageFolder(folder, train_tf())
    loader = DataLoader(ds, batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(5))
    it = iter(loader)
    plan = compile_transform(ds.transform)
    order = list(tud.RandomSampler(ds, generator=torch.Generator().manual_seed(5)))
    # The sampler draws from the loader's generator after the iterator's base seed, as in torch.
    g = torch.Generator().manual_seed(5)
    torch.empty((), dtype=torch.int64).random_(generator=g)
    order = list(tud.RandomSampler(ds, generator=g))
    diffs, flips = [], 0
    pos = 0
    for x, y in it:
        for k in range(x.shape[0]):
            i = order[pos]
            pos += 1
            img = ds.loader(ds.samples[i][0])
            p = sample_params(
                img.width, img.height, plan.geometry, seed=it.base_seed & ((1 << 63) - 1), epoch=0, index=i
            )
            ref = TF.resized_crop(img, int(p.y0), int(p.x0), int(p.y1 - p.y0), int(p.x1 - p.x0), [64, 64])
            if p.flip:
                ref = TF.hflip(ref)
                flips += 1
            ref = TF.normalize(TF.to_tensor(ref), MEAN, STD)
            assert int(y[k]) == ds.targets[i]
            diffs.append((x[k] - ref).abs().mean().item())
    assert pos == len(ds)
    assert 0 < flips < len(ds)
    assert np.mean(diffs) < TOL_TRAIN


def test_custom_collate_gets_what_torch_gives(folder):
    ds = datasets.ImageFolder(folder, eval_tf())
    seen = {}

    def collate(samples):
        seen.setdefault("ours" if "ours" not in seen else "theirs", samples)
        return tud.default_collate(samples)

    next(iter(DataLoader(ds, batch_size=4, collate_fn=collate)))
    next(iter(tud.DataLoader(ds, batch_size=4, collate_fn=collate)))
    ours, theirs = seen["ours"], seen["theirs"]
    assert type(ours) is type(theirs) is list and len(ours) == len(theirs) == 4
    for (a, ta), (b, tb) in zip(ours, theirs, strict=False):
        assert type(a) is type(b) and a.shape == b.shape and a.dtype == b.dtype
        assert type(ta) is type(tb) is int and ta == tb


def test_v2_collate_gets_tv_tensor_images(folder):
    from torchvision import tv_tensors

    ds = datasets.ImageFolder(folder, eval_tf_v2())
    got = []
    next(iter(DataLoader(ds, batch_size=3, collate_fn=lambda s: got.append(s) or tud.default_collate(s))))
    next(iter(tud.DataLoader(ds, batch_size=3, collate_fn=lambda s: got.append(s) or tud.default_collate(s))))
    assert type(got[0][0][0]) is type(got[1][0][0]) is tv_tensors.Image


def test_no_auto_collation_batch_size_none(folder):
    ds = datasets.ImageFolder(folder, eval_tf())
    ours = list(DataLoader(ds, batch_size=None))
    theirs = list(tud.DataLoader(ds, batch_size=None))
    assert len(ours) == len(theirs) == len(ds)
    for (x, y), (rx, ry) in zip(ours, theirs, strict=False):
        assert x.shape == rx.shape == (3, 64, 64) and type(y) is type(ry) and y == ry


def test_subset_and_target_transform(folder):
    ds = datasets.ImageFolder(folder, eval_tf(), target_transform=lambda t: t * 10)
    sub = tud.Subset(ds, [5, 1, 30, 7, 2])
    assert_close_batches(batches(DataLoader(sub, batch_size=2)), batches(tud.DataLoader(sub, batch_size=2)), TOL_EVAL)


# --- samplers --------------------------------------------------------------------------------


class EveryThird(tud.Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(list(range(0, self.n, 3)) + list(range(1, self.n, 3)))

    def __len__(self):
        return len(range(0, self.n, 3)) + len(range(1, self.n, 3))


def _samplers(ds):
    n = len(ds)
    return {
        "sequential": lambda: dict(sampler=tud.SequentialSampler(ds)),
        "random_generator": lambda: dict(sampler=tud.RandomSampler(ds, generator=torch.Generator().manual_seed(3))),
        "random_replacement": lambda: dict(
            sampler=tud.RandomSampler(ds, replacement=True, num_samples=25, generator=torch.Generator().manual_seed(4))
        ),
        "subset_random": lambda: dict(
            sampler=tud.SubsetRandomSampler(list(range(0, n, 2)), generator=torch.Generator().manual_seed(1))
        ),
        "weighted": lambda: dict(
            sampler=tud.WeightedRandomSampler(
                [1.0 + (i % 3) for i in range(n)], 30, generator=torch.Generator().manual_seed(2)
            )
        ),
        "distributed": lambda: dict(sampler=tud.DistributedSampler(ds, num_replicas=3, rank=1, seed=7)),
        "user": lambda: dict(sampler=EveryThird(n)),
        "batch_sampler": lambda: dict(batch_sampler=[[3, 1, 4], [1, 5, 9, 2, 6], [5]]),
    }


@pytest.mark.parametrize(
    "name",
    [
        "sequential",
        "random_generator",
        "random_replacement",
        "subset_random",
        "weighted",
        "distributed",
        "user",
        "batch_sampler",
    ],
)
def test_any_sampler_is_honoured_in_order(folder, name):
    ds = datasets.ImageFolder(folder, eval_tf())
    make = _samplers(ds)[name]
    a, b = make(), make()
    if "batch_sampler" not in a:
        a["batch_size"] = b["batch_size"] = 6
    ours = batches(DataLoader(ds, **a))
    theirs = batches(tud.DataLoader(ds, **b))
    assert_close_batches(ours, theirs, TOL_EVAL)


def test_distributed_sampler_set_epoch_changes_order(folder):
    ds = datasets.ImageFolder(folder, eval_tf())
    s1, s2 = tud.DistributedSampler(ds, num_replicas=2, rank=0), tud.DistributedSampler(ds, num_replicas=2, rank=0)
    ours, theirs = DataLoader(ds, batch_size=8, sampler=s1), tud.DataLoader(ds, batch_size=8, sampler=s2)
    for epoch in range(2):
        s1.set_epoch(epoch)
        s2.set_epoch(epoch)
        assert_close_batches(batches(ours), batches(theirs), TOL_EVAL)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_reproducible_and_rng_state_after_loop(folder, num_workers):
    ds = datasets.ImageFolder(folder, eval_tf())
    results = []
    for cls in (DataLoader, tud.DataLoader, DataLoader):
        torch.manual_seed(123)
        targets = [y.tolist() for _, y in cls(ds, batch_size=8, shuffle=True, num_workers=num_workers)]
        results.append((targets, torch.rand(4)))
    assert results[0][0] == results[1][0] == results[2][0]
    assert torch.equal(results[0][1], results[1][1])
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    ours = [y.tolist() for _, y in DataLoader(ds, batch_size=8, shuffle=True, generator=g1)]
    theirs = [y.tolist() for _, y in tud.DataLoader(ds, batch_size=8, shuffle=True, generator=g2)]
    assert ours == theirs and torch.equal(g1.get_state(), g2.get_state())


def test_random_ops_are_reproducible_and_change_per_epoch(folder):
    ds = datasets.ImageFolder(folder, train_tf())
    torch.manual_seed(0)
    loader = DataLoader(ds, batch_size=40)
    e0, e1 = batches(loader)[0][0], batches(loader)[0][0]
    torch.manual_seed(0)
    again = batches(DataLoader(ds, batch_size=40))[0][0]
    assert torch.equal(e0, again) and not torch.equal(e0, e1)
    fixed = DataLoader(ds, batch_size=40, seed=3)
    f0 = batches(fixed)[0][0]
    fixed.set_epoch(0)
    assert torch.equal(f0, batches(fixed)[0][0])


# --- what the engine cannot do ---------------------------------------------------------------


def test_uncompilable_op_runs_per_sample_with_one_warning(folder):
    tf = T.Compose([T.Resize(72), T.CenterCrop(64), T.Grayscale(3), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = datasets.ImageFolder(folder, tf)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader(ds, batch_size=8)
        ours = batches(loader) + batches(loader)
    msgs = [str(w.message) for w in caught if "fastload" in str(w.message)]
    if not msgs and active_backend() == "pillow":
        # fastload.decode's Pillow path silences PIL with warnings.catch_warnings() on its decode
        # threads, which swaps the process-wide filters and drops warnings raised meanwhile on
        # other threads (reported to the decode stage's owner).
        pytest.xfail("warning lost to the Pillow path's thread-unsafe warnings.catch_warnings()")
    assert len(msgs) == 1 and "Grayscale" in msgs[0] and "per sample" in msgs[0] and " ms " in msgs[0]
    theirs = batches(tud.DataLoader(ds, batch_size=8))
    assert_close_batches(ours, theirs + theirs, TOL_EVAL)
    assert torch.allclose(ours[0][0][:, 0], ours[0][0][:, 0])


def test_per_sample_rest_keeps_caller_rng_with_workers(folder):
    tf = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.RandomErasing(p=1.0)])
    ds = datasets.ImageFolder(folder, tf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        random.seed(0)
        a = batches(DataLoader(ds, batch_size=8, num_workers=2))
        after = (torch.rand(2), random.random())
        torch.manual_seed(0)
        random.seed(0)
        b = batches(DataLoader(ds, batch_size=8, num_workers=2))
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b, strict=False))
    torch.manual_seed(0)
    random.seed(0)
    for _ in tud.DataLoader(ds, batch_size=8, num_workers=2):
        pass
    assert torch.equal(after[0], torch.rand(2)) and after[1] == random.random()


def test_custom_collate_with_workers_runs_with_one_intra_op_thread_as_in_a_worker(folder):
    """torch's worker loop runs the collate_fn with torch.set_num_threads(1); so does the engine path
    (in its collate processes, whose side effects stay there as in torch's workers), and the caller's
    thread count is back afterwards."""
    seen = []

    def collate(samples):
        seen.append(torch.get_num_threads())
        return tud.default_collate(samples), torch.get_num_threads()

    before = torch.get_num_threads()
    in_collate = []
    for _, threads in DataLoader(
        datasets.ImageFolder(folder, eval_tf()), batch_size=8, num_workers=2, collate_fn=collate
    ):
        in_collate.append(threads)
        assert torch.get_num_threads() == before
    assert in_collate and set(in_collate) == {1}
    assert not seen  # appended to in the collate processes, as in torch's worker processes
    for _ in DataLoader(datasets.ImageFolder(folder, eval_tf()), batch_size=8, num_workers=0, collate_fn=collate):
        pass
    assert set(seen) == {before}  # num_workers=0: in the caller's process, as torch


def test_other_datasets_use_torchs_machinery_with_one_message():
    data = tud.TensorDataset(torch.arange(10.0).view(10, 1), torch.arange(10))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader(data, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0))
    assert sum("torch's own DataLoader machinery" in str(w.message) for w in caught) == 1
    theirs = list(tud.DataLoader(data, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0)))
    ours = list(loader)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ours, theirs, strict=False))
    assert len(ours) == len(theirs) == 4
    with pytest.raises(ValueError, match="device"):
        DataLoader(data, device="cpu")


def test_nothing_compilable_falls_back_to_torch(folder):
    ds = datasets.ImageFolder(folder, T.Compose([T.ColorJitter(0.3), T.Resize(72), T.CenterCrop(64), T.ToTensor()]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(0)
        ours = batches(DataLoader(ds, batch_size=8))
    assert any("nothing in ImageFolder's transform compiles" in str(w.message) for w in caught)
    torch.manual_seed(0)
    theirs = batches(tud.DataLoader(ds, batch_size=8))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ours, theirs, strict=False))


def test_bad_image_raises_naming_the_file_or_is_skipped(tmp_path, jpeg_bytes):
    for c in range(2):
        d = tmp_path / f"c{c}"
        d.mkdir()
        for k in range(4):
            (d / f"{k}.jpg").write_bytes(jpeg_bytes(90, 80, seed=k + 4 * c))
    (tmp_path / "c1" / "2.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    ds = datasets.ImageFolder(str(tmp_path), eval_tf())
    with pytest.raises(Exception, match="2.jpg"):
        list(DataLoader(ds, batch_size=4))
    out = batches(DataLoader(ds, batch_size=4, on_error="skip"))
    assert sum(x.shape[0] for x, _ in out) == 8


def test_timeout_raises_torchs_error(folder, monkeypatch):
    import time

    ds = datasets.ImageFolder(folder, eval_tf())
    loader = DataLoader(ds, batch_size=4, timeout=0.2)
    records = loader._source.records
    original = records.image
    monkeypatch.setattr(records, "image", lambda i: (time.sleep(2), original(i))[1])
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.2 seconds"):
        next(iter(loader))
    loader.close()


def test_superseded_iterator_says_so(folder):
    ds = datasets.ImageFolder(folder, eval_tf())
    loader = DataLoader(ds, batch_size=4)
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)
    assert next(second)[0].shape[0] == 4
    loader.close()
    with pytest.raises(ValueError, match="closed"):
        iter(loader)


def test_sampler_errors_reach_the_caller(folder):
    ds = datasets.ImageFolder(folder, eval_tf())
    with pytest.raises(IndexError) as theirs:
        next(iter(tud.DataLoader(ds, sampler=[0, len(ds)], batch_size=2)))
    loader = DataLoader(ds, sampler=[0, len(ds)], batch_size=2)
    with pytest.raises(IndexError, match=f"index {len(ds)}, out of range"):
        next(iter(loader))
    assert theirs.value is not None
    # Negative indices count from the end, as the dataset's list indexing does in torch.
    ours = batches(DataLoader(ds, sampler=[-1, 0], batch_size=2))
    ref = batches(tud.DataLoader(ds, sampler=[-1, 0], batch_size=2))
    assert_close_batches(ours, ref, TOL_EVAL)


def test_float_output_is_written_by_the_engine(folder):
    """ToTensor / ConvertImageDtype / Normalize compile into the engine's output stage: float slots."""
    for tf, dtype in (
        (eval_tf(), torch.float32),
        (
            T.Compose(
                [
                    T.Resize(72),
                    T.CenterCrop(64),
                    T.PILToTensor(),
                    T.ConvertImageDtype(torch.float16),
                    T.Normalize(MEAN, STD),
                ]
            ),
            torch.float16,
        ),
    ):
        ds = datasets.ImageFolder(folder, tf)
        loader = DataLoader(ds, batch_size=8)
        it = iter(loader)
        x, _ = next(it)
        assert it._convert is None  # no conversion pass in torch
        assert loader.loader.config.image_dtype == np.dtype(str(dtype).split(".")[1])
        assert x.dtype == dtype
        ring = [s.arrays["images"] for s in loader.loader.ring.slots]
        assert any(np.shares_memory(x.numpy(), a) for a in ring)  # zero-copy from the slot
        ref = next(iter(tud.DataLoader(ds, batch_size=8)))[0]
        assert (x.float() - ref.float()).abs().mean() < TOL_EVAL
        loader.close()


@pytest.mark.parametrize("mode", ["bicubic", "nearest"])
def test_other_interpolations_equal_torchvision(folder, mode):
    tf = T.Compose(
        [T.Resize(72, interpolation=T.InterpolationMode(mode)), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    ds = datasets.ImageFolder(folder, tf)
    loader = DataLoader(ds, batch_size=16)
    it = iter(loader)
    ours = [[x.clone(), y.clone()] for x, y in it]
    assert it.plan.geometry.interpolation == mode and not it.plan.rest
    assert_close_batches(ours, batches(tud.DataLoader(ds, batch_size=16)), TOL_EVAL * (3 if mode == "nearest" else 1))
