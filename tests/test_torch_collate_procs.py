"""A custom collate_fn with num_workers >= 2 runs in forked processes (fastload.torch.collate_procs).

Same values as on the caller's thread (same per-batch seeds), whatever the results hold: big tensors
through the shared output buffers, with those buffers all held, views of the input, errors.
"""

import pytest
import torch
import torch.utils.data as tud
from torchvision import datasets
from torchvision import transforms as T
from torchvision.transforms import v2

import fastload.torch.iteration as iteration
from fastload.torch import DataLoader

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return str(tiny_folder)


def augmented(size=160):
    # torchvision's reference recipe: 4 x 3 x 160 x 160 float32 batches are 1.2 MiB (output buffers)
    return T.Compose(
        [
            T.RandomResizedCrop(size),
            T.RandomHorizontalFlip(),
            T.TrivialAugmentWide(),
            T.PILToTensor(),
            T.ConvertImageDtype(torch.float),
            T.Normalize(MEAN, STD),
            T.RandomErasing(p=0.5),
        ]
    )


MIX = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=3), v2.CutMix(alpha=1.0, num_classes=3)])


def mix_collate(samples):
    return MIX(*tud.default_collate(samples))


def samples_collate(samples):
    return samples


def channels_last_collate(samples):
    images, targets = tud.default_collate(samples)
    return images.contiguous(memory_format=torch.channels_last), targets


def run(folder, collate, *, procs, keep, monkeypatch, workers=2):
    with monkeypatch.context() as m:
        if not procs:
            m.setattr(iteration, "_FORK", False)
        loader = DataLoader(
            datasets.ImageFolder(folder, augmented()),
            batch_size=4,
            shuffle=True,
            num_workers=workers,
            collate_fn=collate,
            generator=torch.Generator().manual_seed(0),
        )
        out = []
        for batch in loader:
            out.append(batch if keep else _clone(batch))
        assert loader._active is not None and loader._active._use_procs is procs
    return out


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(o) for o in obj)
    return obj


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.filterwarnings("ignore::fastload.errors.KeptBatchesWarning")  # the in-thread run keeps ring views
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("collate", [mix_collate, samples_collate, channels_last_collate])
def test_processes_give_the_callers_thread_values(folder, collate, keep, monkeypatch):
    """keep: every batch held (the 5 output buffers run out: the other 5 batches come through torch's pickling)."""
    ours = run(folder, collate, procs=True, keep=keep, monkeypatch=monkeypatch)
    theirs = run(folder, collate, procs=False, keep=keep, monkeypatch=monkeypatch)
    assert len(ours) == len(theirs) == 10
    assert _equal(ours, theirs)


def test_one_worker_and_default_collate_stay_on_the_callers_thread(folder, monkeypatch):
    run(folder, mix_collate, procs=False, keep=False, monkeypatch=monkeypatch, workers=1)
    loader = DataLoader(datasets.ImageFolder(folder, augmented()), batch_size=8, num_workers=2)
    next(iter(loader))
    assert loader._active is not None and not loader._active._use_procs


def test_a_collate_error_is_raised_at_its_batch_and_the_next_pass_runs(folder):
    calls = []

    def failing(samples):
        if len(samples) < 16:
            raise ValueError("the last batch")
        return tud.default_collate(samples)

    ds = datasets.ImageFolder(folder, augmented())
    loader = DataLoader(ds, batch_size=16, num_workers=2, collate_fn=failing)
    with pytest.raises(ValueError, match="the last batch"):
        for batch in loader:
            calls.append(batch[0].shape[0])
    assert calls == [16, 16]  # 40 images: the third batch has 8
    with pytest.raises(ValueError, match="the last batch"):  # a new pass runs, to the same batch
        assert sum(b[0].shape[0] for b in loader) == 32
    again = DataLoader(ds, batch_size=16, num_workers=2, collate_fn=tud.default_collate)
    assert sum(b[0].shape[0] for b in again) == 40


def test_a_collate_slower_than_timeout_raises_torchs_error(folder):
    import multiprocessing

    release = multiprocessing.get_context("fork").Event()  # inherited by the processes forked at the first batch

    def held(samples):
        release.wait()  # the work that outlasts the DataLoader's timeout, until the test lets it go
        return tud.default_collate(samples)

    loader = DataLoader(
        datasets.ImageFolder(folder, augmented()), batch_size=16, num_workers=2, collate_fn=held, timeout=0.5
    )
    try:
        with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.5 seconds"):
            next(iter(loader))
    finally:
        release.set()
    assert loader._active is None or loader._active._procs is None  # the pass closed its processes


def test_a_killed_collate_process_is_a_clear_error_and_the_next_pass_runs(folder):
    import os
    import signal

    parent = os.getpid()

    def dies(samples):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return tud.default_collate(samples)

    ds = datasets.ImageFolder(folder, augmented())
    loader = DataLoader(ds, batch_size=16, num_workers=2, collate_fn=dies)
    with pytest.raises(RuntimeError, match="collate process of the DataLoader exited unexpectedly"):
        list(loader)
    again = DataLoader(ds, batch_size=16, num_workers=2, collate_fn=tud.default_collate)
    assert sum(b[0].shape[0] for b in again) == 40
