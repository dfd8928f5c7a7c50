"""The torch adapter when the cores are shared: torchvision's MixUp/CutMix ``collate_fn`` beside a CPU
burner process never makes the producer wait on a slot the consumer has dropped, and per-sample
Python runs with one intra-op thread as in a torch worker. Asserted on the ring's counters and on
what the collate function saw, never on time."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
import torch.utils.data as tud
from torchvision import datasets
from torchvision import transforms as T
from torchvision.transforms import v2

import fastload.torch as ft
from bench.contention import burner

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _dataset(root):
    tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    return datasets.ImageFolder(str(root), tf)


def _mixup(classes):
    return v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes)])


def test_mixup_cutmix_collate_under_a_cpu_burner_never_waits_on_a_dropped_slot(tiny_folder):
    ds = _dataset(tiny_folder)
    classes = len(ds.classes)
    mix = _mixup(classes)
    threads_seen = []

    def collate_fn(batch):
        # Runs in the collate processes (num_workers >= 2): the thread count comes back with the batch.
        return *mix(*tud.default_collate(batch)), torch.get_num_threads()

    threads_before = torch.get_num_threads()
    held_after = []
    with ft.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, collate_fn=collate_fn) as dl:
        with burner():
            for _ in range(3):
                for x, y, threads in dl:
                    threads_seen.append(threads)
                    # The collated batch is a copy: nothing of the slot's batch is alive any more.
                    held_after.append(dl.loader.ring.held_count())
                    assert x.shape[1:] == (3, 32, 32) and y.shape == (x.shape[0], classes)
        ring, stats = dl.loader.ring, dl.stats()
        assert held_after and set(held_after) == {0}
        assert ring.waits["slot"] == 0 and ring.waits["fence"] == 0 and stats.seconds["wait_slot"] == 0
        assert ring.extra_slots == 0 and ring.fresh_batches == 0 and ring.gc_runs == 0
        assert stats.batches == 3 * len(dl)
    # As in a torch worker: one intra-op thread inside the collate, the caller's count restored.
    assert threads_seen and set(threads_seen) == {1}
    assert torch.get_num_threads() == threads_before


def test_a_collate_that_keeps_its_samples_gets_more_slots_not_a_wait(tiny_folder):
    ds = _dataset(tiny_folder)
    kept = collections.deque(maxlen=4)  # the last 4 batches' samples: views into their slots

    def collate_fn(batch):
        kept.append(batch)
        return tud.default_collate(batch)

    # One worker: the collate runs on the caller's thread, where its samples are views of ring slots
    # (with two or more it runs in processes, on copies: tests/test_torch_collate_procs.py).
    with ft.DataLoader(ds, batch_size=8, shuffle=True, num_workers=1, collate_fn=collate_fn) as dl:
        with burner():
            for _ in range(2):
                for _x, _y in dl:
                    pass
        ring = dl.loader.ring
        assert ring.held_count() == len(kept) == 4
        assert ring.extra_slots > 0
        assert ring.waits["slot"] == 0 and ring.waits["fence"] == 0


@pytest.mark.parametrize("num_workers", [0, 1])
def test_collate_sees_the_intra_op_threads_torch_gives_it(tiny_folder, num_workers):
    ds = _dataset(tiny_folder)

    def collate_fn(batch):
        return torch.tensor([torch.get_num_threads()])

    seen = {}
    for name, cls in (("torch", tud.DataLoader), ("fastload", ft.DataLoader)):
        dl = cls(ds, batch_size=8, num_workers=num_workers, collate_fn=collate_fn)
        seen[name] = [int(t) for t in dl]
        close = getattr(dl, "close", None)
        if close is not None:
            close()
    assert seen["fastload"] == seen["torch"]
    assert set(seen["torch"]) == ({1} if num_workers else {torch.get_num_threads()})
