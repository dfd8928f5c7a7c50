"""Device stage (torch), elastic resume: ``fastload.torch.DataLoader`` with ``OrderSampler`` restores a
position under another world size, batch size, worker, thread or prefetch count; torch's samplers
refuse another world size by name; ``seed=`` makes ``shuffle=True`` reproducible across processes.

In-process ranks through the shared resume matrix (``resume_matrix``); the records' labels are their
indices (``FakeDataset(label_width=2)``), so each batch says which samples it holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

import torch.utils.data as tud
from fake_dataset import FakeDataset
from resume_matrix import IteratedPath, Job, check_epoch, play, roundtrip

from fastload.errors import ResumeStateError
from fastload.order import share_length
from fastload.torch import DataLoader, OrderSampler
from fastload.transforms import eval_transform

N = 53
SHARDS = (0, 9, 10, 24, 31, 45, 53)


class ShardedFake(FakeDataset):
    shard_starts = SHARDS


@pytest.fixture(scope="module")
def data():
    return ShardedFake(N, label_width=2)


class DataLoaderRanks(IteratedPath):
    """``DataLoader(sampler=OrderSampler(rank=, world_size=))``; each job another worker / thread / prefetch count."""

    def __init__(self, data, mode: str, drop_last: bool = False) -> None:
        self.name = f"DataLoader+OrderSampler({mode}, drop_last={drop_last})"
        self.data, self.mode, self.drop_last, self.records = data, mode, drop_last, len(data)
        self.opened = 0

    def open(self, rank, world, batch):
        self.opened += 1
        job = self.opened // 7  # changes every few ranks: workers 0..2, prefetch 1..3
        sampler = OrderSampler(
            self.data, shuffle=self.mode, seed=3, rank=rank, world_size=world, window=2, block_size=4
        )
        loader = DataLoader(
            self.data,
            batch_size=batch,
            sampler=sampler,
            drop_last=self.drop_last,
            transform=eval_transform(8, resize=10),
            num_workers=job % 3,
            prefetch=1 + job % 3,
            seed=9,
        )
        return {"loader": loader, "it": None}

    def start_pass(self, h):
        # Every process of a DDP job seeds torch alike, so every rank draws the same base_seed
        # for a pass (and saves the same state).
        torch.manual_seed(0)

    def ids(self, batch):
        _, labels = batch
        return labels[:, 0].to(torch.int64).numpy().copy()


JOBS = {
    "4-to-3": [Job(4, 4, 2), Job(3, 4)],
    "3-to-5": [Job(3, 4, 2), Job(5, 4)],
    "same-world": [Job(2, 4, 3), Job(2, 4)],
    "three-resumes": [Job(4, 3, 1), Job(2, 5, 2), Job(5, 2, 1), Job(3, 4)],
    "batch-size": [Job(2, 6, 2), Job(2, 4)],
    "before-first-batch": [Job(4, 4, 0), Job(3, 4)],
    "world-beyond-what-remains": [Job(2, 6, 4), Job(9, 3)],
    "set-epoch-after": [Job(4, 4, 2), Job(3, 4, set_epoch="after")],
    "no-set-epoch": [Job(4, 4, 1), Job(3, 4, set_epoch="none")],
}


@pytest.mark.parametrize("mode", ["none", "global", "block", "shard"])
@pytest.mark.parametrize("jobs", sorted(JOBS))
def test_dataloader_matrix(data, mode, jobs):
    path = DataLoaderRanks(data, mode)
    check_epoch(path, play(path, 1, JOBS[jobs], after=1), 1)


def test_dataloader_matrix_drop_last(data):
    path = DataLoaderRanks(data, "global", drop_last=True)
    check_epoch(path, play(path, 0, [Job(4, 3, 2), Job(3, 4, 1), Job(2, 5)]), 0)


@pytest.mark.parametrize("drop_last", [False, True])
def test_checkpoint_after_the_last_batch_starts_the_next_epoch(data, drop_last):
    path = DataLoaderRanks(data, "shard", drop_last=drop_last)
    share = share_length(N, 4, "pad")
    length = share // 4 if drop_last else -(-share // 4)
    played = play(path, 0, [Job(4, 4, length), Job(3, 4)], after=1)
    assert all(len(rank) > 0 for rank in played.batches[1])  # never a pass with no step
    check_epoch(path, played, 0, finished_in=0)


def test_the_resumed_pass_is_exact_pixels_included(data):
    """Same world size: the resumed pass's batches are the uninterrupted run's, augmentation included."""

    def make():
        sampler = OrderSampler(data, seed=1, rank=1, world_size=2)
        return DataLoader(data, batch_size=4, sampler=sampler, transform=eval_transform(8, resize=10), seed=5)

    whole = [(x.clone(), y.clone()) for x, y in make()]
    first = make()
    it = iter(first)
    done = [tuple(t.clone() for t in next(it)) for _ in range(2)]
    state = roundtrip(first.state_dict())
    first.close()
    second = make()
    second.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in second]
    assert len(done) + len(rest) == len(whole)
    for (x, y), (rx, ry) in zip(done + rest, whole, strict=True):
        assert torch.equal(x, rx) and torch.equal(y, ry)


def test_torch_samplers_refuse_another_world_size_naming_order_sampler(data):
    def make(world):
        sampler = tud.DistributedSampler(data, num_replicas=world, rank=0, seed=2)
        return DataLoader(data, batch_size=4, sampler=sampler, transform=eval_transform(8, resize=10))

    saver = make(4)
    it = iter(saver)
    next(it)
    state = roundtrip(saver.state_dict())
    saver.close()
    same = make(4)
    same.load_state_dict(state)  # the same world size: exact, by replay
    assert len(list(same)) == len(saver) - 1
    with pytest.raises(ResumeStateError, match=r"world size 4.*has 3.*OrderSampler"):
        make(3).load_state_dict(state)


def test_dataloader_state_is_plain_data_and_checked(data):
    tf = eval_transform(8, resize=10)
    loader = DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3), transform=tf)
    it = iter(loader)
    next(it)
    state = roundtrip(loader.state_dict())
    text = json.dumps(state)
    assert "Tensor" not in type(state).__name__ and len(text) < 40_000
    with pytest.raises(ResumeStateError, match="damaged"):
        loader.load_state_dict({**state, "explicit": 5})
    with pytest.raises(ResumeStateError, match="batch_size: saved 4 != now 5"):
        DataLoader(data, batch_size=5, shuffle=True, generator=torch.Generator(), transform=tf).load_state_dict(state)


# --- seed=: the order of shuffle=True --------------------------------------------------------------

ORDER = textwrap.dedent("""
    import json, sys
    import torch
    from fake_dataset import FakeDataset
    from fastload.torch import DataLoader
    from fastload.transforms import eval_transform

    torch.manual_seed(int(sys.argv[1]))  # another global RNG in every process: seed= must not depend on it
    data = FakeDataset(30, label_width=2)
    out = {}
    for name, kwargs in json.loads(sys.argv[2]).items():
        if kwargs.pop("generator", None) is not None:
            kwargs["generator"] = torch.Generator().manual_seed(7)
        loader = DataLoader(data, batch_size=4, shuffle=True, transform=eval_transform(8, resize=10), **kwargs)
        epochs = [[int(i) for _, y in loader for i in y[:, 0].tolist()] for _ in range(2)]
        loader.set_epoch(0)
        epochs.append([int(i) for _, y in loader for i in y[:, 0].tolist()])
        out[name] = epochs
    print(json.dumps(out))
""")

CASES = {
    "seed4": {"seed": 4},
    "seed5": {"seed": 5},
    "none": {},
    "gen4": {"seed": 4, "generator": 1},
    "gen8": {"seed": 8, "generator": 1},
}


def _orders(tmp_path, rng: int) -> dict[str, list[list[int]]]:
    script = tmp_path / "order.py"
    script.write_text(ORDER)
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, str(script), str(rng), json.dumps(CASES)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_seed_makes_the_shuffled_order_reproducible_across_processes(tmp_path):
    one, two = _orders(tmp_path, 1), _orders(tmp_path, 2)
    a = one["seed4"]
    assert a == two["seed4"]  # seed and epoch determine the order, whatever the process's RNG
    assert sorted(a[0]) == list(range(30)) and a[0] != a[1]  # the next epoch reshuffles
    assert a[2] == a[0]  # set_epoch(0) gives epoch 0's order again
    assert one["seed5"][0] != a[0]
    # Without seed= the order comes from torch's global RNG, as torch's DataLoader's.
    assert one["none"][0] != two["none"][0]
    # With a generator, the generator governs (seed= keys only the augmentation).
    assert one["gen4"] == two["gen8"] and one["gen4"][0] != a[0]


def test_seed_order_is_torch_random_sampler_with_a_seeded_generator(data):
    from fastload.torch.planning import order_seed

    loader = DataLoader(data, batch_size=5, shuffle=True, seed=11, transform=eval_transform(8, resize=10))
    assert isinstance(loader.sampler, tud.RandomSampler) and loader.generator is None
    got = [int(i) for _, y in loader for i in y[:, 0].tolist()]
    expected = torch.randperm(N, generator=torch.Generator().manual_seed(order_seed(11, 0))).tolist()
    assert got == expected
    # Resume mid-pass restores the same order (the generator state travels in the state).
    loader.set_epoch(3)
    it = iter(loader)
    first = [int(i) for i in next(it)[1][:, 0].tolist()]
    state = roundtrip(loader.state_dict())
    again = DataLoader(data, batch_size=5, shuffle=True, seed=11, transform=eval_transform(8, resize=10))
    again.load_state_dict(state)
    rest = [int(i) for _, y in again for i in y[:, 0].tolist()]
    whole = torch.randperm(N, generator=torch.Generator().manual_seed(order_seed(11, 3))).tolist()
    assert first + rest == whole
    assert np.array_equal(sorted(whole), np.arange(N))


def test_a_state_taken_while_indices_were_drawn_ahead_counts_the_batches_handed_out(data):
    sampler = OrderSampler(data, seed=2, rank=0, world_size=2)
    loader = DataLoader(data, batch_size=4, sampler=sampler, num_workers=2, prefetch=3, transform=eval_transform(8))
    it = iter(loader)  # with workers, torch's iterator draws prefetch_factor * num_workers batches at iter()
    next(it)
    assert sampler._iteration is not None and sampler._iteration.yielded > 4
    state = loader.state_dict()
    (order_state,) = [s["state_dict"] for s in state["samplers"] if s and "state_dict" in s]
    assert order_state["consumed"] == [[2, 4]]
    loader.close()
