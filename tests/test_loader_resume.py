"""Loader stage, resumed: ``fastload.Loader`` restores a position under any world size, batch size,
thread count or prefetch depth, driven as in-process ranks by the shared resume matrix."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fake_dataset import FakeDataset
from resume_matrix import IteratedPath, Job, check_epoch, play, roundtrip

from fastload.errors import ResumeStateError
from fastload.loader import Loader, LoaderConfig
from fastload.order import share_length
from fastload.transforms import eval_transform

N = 61
SHARDS = (0, 7, 8, 20, 33, 34, 50, 61)


class ShardedFake(FakeDataset):
    shard_starts = SHARDS


@pytest.fixture(scope="module")
def data():
    return ShardedFake(N)


def cfg(**kw):
    kw.setdefault("transform", eval_transform(8, resize=10))
    kw.setdefault("num_threads", 1)
    kw.setdefault("prefetch", 2)
    kw.setdefault("seed", 4)
    kw.setdefault("block_size", 4)
    kw.setdefault("window", 2)
    return LoaderConfig(**kw)


class LoaderRanks(IteratedPath):
    """``fastload.Loader`` with ``rank=`` / ``world_size=``; ids are ``batch.indices``."""

    def __init__(self, data, mode: str, even: str = "pad", drop_last: bool = False, **more) -> None:
        self.name = f"Loader({mode}, even={even}, drop_last={drop_last})"
        self.data, self.mode, self.even, self.drop_last, self.more = data, mode, even, drop_last, more
        self.records, self.pads = len(data), even == "pad"

    def open(self, rank, world, batch):
        config = cfg(
            batch_size=batch,
            shuffle=self.mode,
            rank=rank,
            world_size=world,
            even=self.even,
            drop_last=self.drop_last,
            **self.more,
        )
        return {"loader": Loader(self.data, config), "it": None}


JOBS = {
    "4-to-3": [Job(4, 4, 2), Job(3, 4)],
    "3-to-5": [Job(3, 4, 2), Job(5, 4)],
    "same-world": [Job(2, 4, 3), Job(2, 4)],
    "three-resumes": [Job(4, 3, 1), Job(2, 5, 2), Job(5, 2, 1), Job(3, 4)],
    "before-first-batch": [Job(4, 4, 0), Job(3, 4)],
    "world-beyond-what-remains": [Job(2, 6, 5), Job(9, 4)],
    "set-epoch-after": [Job(4, 4, 2), Job(3, 4, set_epoch="after")],
}


@pytest.mark.parametrize("mode", ["none", "global", "block", "shard"])
@pytest.mark.parametrize("jobs", sorted(JOBS))
def test_loader_matrix(data, mode, jobs):
    path = LoaderRanks(data, mode)
    check_epoch(path, play(path, 1, JOBS[jobs], after=1), 1)


@pytest.mark.parametrize(("even", "drop_last"), [("pad", True), ("drop", False)])
def test_loader_matrix_drop(data, even, drop_last):
    path = LoaderRanks(data, "global", even=even, drop_last=drop_last)
    check_epoch(path, play(path, 0, [Job(4, 3, 2), Job(3, 4, 1), Job(2, 5)]), 0)


@pytest.mark.parametrize("drop_last", [False, True])
def test_checkpoint_after_the_last_batch_starts_the_next_epoch(data, drop_last):
    path = LoaderRanks(data, "block", drop_last=drop_last)
    share = share_length(N, 4, "pad")
    length = share // 4 if drop_last else -(-share // 4)
    played = play(path, 0, [Job(4, 4, length), Job(3, 4)], after=1)
    assert (played.states[0]["epoch"], played.states[0]["consumed"]) == (1, [])
    check_epoch(path, played, 0, finished_in=0)


def test_threads_prefetch_and_batch_size_may_change(data):
    """Saved with 1 thread and prefetch 1, restored with 3 threads, prefetch 4 and another batch size."""
    with Loader(data, cfg(batch_size=4, shuffle="global", rank=1, world_size=2, prefetch=1)) as first:
        whole = [b.indices.copy() for b in first]
        first.set_epoch(0)
        it = iter(first)
        done = [next(it).indices.copy() for _ in range(3)]
        state = roundtrip(first.state_dict())
    for batch in (4, 6):
        with Loader(
            data, cfg(batch_size=batch, shuffle="global", rank=1, world_size=2, num_threads=3, prefetch=4)
        ) as again:
            again.load_state_dict(state)
            rest = [b.indices.copy() for b in again]
        np.testing.assert_array_equal(np.concatenate(done + rest), np.concatenate(whole))
        if batch == 4:
            assert [len(b) for b in rest] == [len(b) for b in whole[3:]]


def test_a_state_taken_while_the_producer_is_ahead_counts_what_was_handed_out(data):
    decoded = threading.Semaphore(0)

    def decode(*args, **kwargs):
        from fastload.decode import decode_batch

        result = decode_batch(*args, **kwargs)
        decoded.release()
        return result

    with Loader(data, cfg(batch_size=4, shuffle="global", prefetch=4), decode=decode) as loader:
        it = iter(loader)
        first = next(it)
        for _ in range(4):  # the producer has decoded 4 batches beyond the one handed out
            assert decoded.acquire(timeout=20)
        state = loader.state_dict()
        assert state["consumed"] == [[1, 4]] and len(first.indices) == 4
        it.close()


def test_set_epoch_keeps_a_loaded_position_of_that_epoch_only(data):
    with Loader(data, cfg(batch_size=4, shuffle="global")) as loader:
        loader.set_epoch(2)
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        it.close()
        loader.load_state_dict(state)
        loader.set_epoch(2)
        assert len(iter(loader)) == len(loader) - 2
        loader.load_state_dict(state)
        loader.set_epoch(3)
        assert len(iter(loader)) == len(loader) and loader.epoch == 3
        loader.load_state_dict(state)
        assert loader.epoch == 2


def test_a_state_of_another_order_or_a_damaged_one_is_refused(data):
    with Loader(data, cfg(batch_size=4, seed=1)) as a, Loader(data, cfg(batch_size=4, seed=2)) as b:
        it = iter(a)
        next(it)
        state = a.state_dict()
        it.close()
        with pytest.raises(ResumeStateError, match="seed: saved 1 != now 2"):
            b.load_state_dict(state)
        with Loader(FakeDataset(N - 1), cfg(batch_size=4, seed=1)) as c:
            with pytest.raises(ResumeStateError, match="records: saved 61 != now 60"):
                c.load_state_dict(state)
        with Loader(data, cfg(batch_size=4, seed=1, shuffle="block")) as d:
            with pytest.raises(ResumeStateError, match="shuffle: saved 'global' != now 'block'"):
                d.load_state_dict(state)
        with Loader(data, cfg(batch_size=4, seed=1)) as e:
            with pytest.raises(ResumeStateError, match="damaged"):
                e.load_state_dict({**state, "epoch": 3})
            with pytest.raises(ResumeStateError, match="'consumed' is missing"):
                e.load_state_dict({k: v for k, v in state.items() if k != "consumed"})
            with pytest.raises(ResumeStateError, match="newer fastload"):
                e.load_state_dict({**state, "version": 99})
