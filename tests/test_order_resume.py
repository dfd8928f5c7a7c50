"""Order stage, resumed: positions counted in samples restore under any world size, batch size or depth.

The remaining-set math of :mod:`fastload.order` and the state of :mod:`fastload.position`, and
``fastload.torch.OrderSampler`` driven as in-process ranks by the shared resume matrix
(``resume_matrix``): every shuffle mode, more and fewer ranks, two and three resumes in one epoch,
checkpoints before the first and after the last batch, ``drop_last`` and ``even`` both ways.
"""

from __future__ import annotations

import collections
import itertools
import json

import numpy as np
import pytest
from resume_matrix import Job, LoaderPath, check_epoch, play, roundtrip

from fastload.errors import ResumeStateError
from fastload.order import EpochOrder, OrderSpec, num_batches, remaining_sequence, share_length
from fastload.position import Position, make_state, read_state

SHARDS = (0, 9, 10, 31, 40, 52, 60, 61, 77, 90, 101)


def _spec(n, rank, world, batch, mode="global", even="pad", drop_last=False):
    return OrderSpec(
        num_records=n,
        batch_size=batch,
        shuffle=mode,
        seed=11,
        rank=rank,
        world_size=world,
        even=even,
        drop_last=drop_last,
        block_size=4,
        window=2,
        shard_starts=SHARDS if mode == "shard" else None,
    )


# --- the remaining-set math --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "global", "block", "shard"])
def test_random_layout_sequences_hand_out_every_record_once_plus_padding(mode):
    n = SHARDS[-1]
    rng = np.random.default_rng(0)
    for _ in range(150):
        position, seen, worlds = Position(3), collections.Counter(), 0
        depths = int(rng.integers(1, 4))
        for depth in range(depths + 1):
            world, batch = int(rng.integers(1, 9)), int(rng.integers(1, 7))
            orders = [position.order(_spec(n, r, world, batch, mode)) for r in range(world)]
            assert len({len(o) for o in orders}) == 1 and len({len(o.share) for o in orders}) == 1
            worlds += world
            final = depth == depths or len(orders[0]) == 0
            take = len(orders[0]) if final else int(rng.integers(0, len(orders[0]) + 1))
            for o in orders:
                for k in range(take):
                    seen.update(o[k].tolist())
            history, _ = position.plan(world)
            samples = orders[0].position(take)
            if final or samples == len(orders[0].share):
                break
            position = Position.at(3, history, world, samples)
        assert set(seen) == set(range(n))
        assert sum(seen.values()) - n <= worlds


def test_same_world_continues_the_share_with_any_batch_size():
    spec = _spec(101, 2, 4, 8)
    whole = EpochOrder(spec, 5)
    position = Position.at(5, (), 4, whole.position(3))
    for batch in (8, 5, 13):
        resumed = position.order(_spec(101, 2, 4, batch))
        np.testing.assert_array_equal(resumed.share, whole.share)
        np.testing.assert_array_equal(np.concatenate([resumed[k] for k in range(len(resumed))]), whole.share[24:])
        assert len(resumed) == num_batches(len(whole.share) - 24, batch, False)


def test_remaining_keeps_the_sequence_order_and_the_state_stays_small():
    spec = _spec(1000, 0, 1, 10)
    seq = remaining_sequence(spec, 0, [(4, 30), (3, 17)])
    assert len(seq) == 1000 - 4 * 30 - 3 * 17
    whole = EpochOrder(spec, 0).share
    where = np.empty(1000, np.int64)
    where[whole] = np.arange(1000)
    assert np.all(np.diff(where[seq]) > 0)
    state = make_state("x", Position(0, ((4, 30), (3, 17))), {"records": 1000})
    assert len(json.dumps(state)) < 400


def test_a_layout_larger_than_what_remains_gives_every_rank_equal_padded_batches():
    n = 20
    position = Position.at(0, (), 2, 9)  # 2 x 9 of 10 handed out: 2 records left
    orders = [position.order(_spec(n, r, 7, 3)) for r in range(7)]
    assert {len(o) for o in orders} == {1} and {len(o[0]) for o in orders} == {1}
    got = collections.Counter(int(o[0][0]) for o in orders)
    first = set().union(*(set(EpochOrder(_spec(n, r, 2, 3), 0).share[:9].tolist()) for r in range(2)))
    assert set(got) == set(range(n)) - first


def test_a_pair_claiming_more_than_its_layout_holds_is_refused():
    with pytest.raises(ResumeStateError, match="10 each"):
        Position.at(0, (), 2, 11).order(_spec(20, 0, 3, 4))
    with pytest.raises(ValueError, match="offset"):
        EpochOrder(_spec(20, 0, 2, 4), 0, offset=11)


# --- the state ----------------------------------------------------------------------------------

FP = {"dataset": "index xxh3_128:00", "records": 100, "seed": 3, "shuffle": "global", "even": "pad"}


def test_state_round_trips_and_reads_back():
    state = make_state("k", Position(4, ((4, 12), (3, 5))), FP, extra=7)
    assert roundtrip(state) == state
    position, values = read_state(state, kind="k", fingerprint=FP, extra={"extra": int})
    assert position == Position(4, ((4, 12), (3, 5))) and values == {"extra": 7}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s.__setitem__("version", 3), "newer fastload"),
        (lambda s: s.__setitem__("version", 1), "older fastload"),
        (lambda s: s.__setitem__("kind", "other"), "state of 'other'"),
        (lambda s: s.pop("epoch"), "'epoch' is missing"),
        (lambda s: s.__setitem__("epoch", "2"), "'epoch' must be an int"),
        (lambda s: s.__setitem__("consumed", [[4, 0]]), r"consumed\[0\]"),
        (lambda s: s.__setitem__("consumed", [[4, 12, 1]]), r"consumed\[0\]"),
        (lambda s: s.__setitem__("consumed", 5), "'consumed' must be a list"),
        (lambda s: s.pop("order"), "'order'"),
        (lambda s: s.pop("extra"), "'extra' is missing"),
        (lambda s: s.__setitem__("extra", "7"), "'extra' must be int"),
        (lambda s: s.__setitem__("epoch", 5), "damaged"),
        (lambda s: s["consumed"][0].__setitem__(1, 13), "damaged"),
        (lambda s: s.pop("kind"), "not a fastload loader state"),
    ],
)
def test_damaged_and_foreign_states_name_what_is_wrong(change, match):
    state = make_state("k", Position(4, ((4, 12),)), FP, extra=7)
    change(state)
    with pytest.raises(ResumeStateError, match=match):
        read_state(state, kind="k", fingerprint=FP, extra={"extra": int})
    with pytest.raises(ValueError):  # also a ValueError, as the frameworks raise
        read_state(state, kind="k", fingerprint=FP, extra={"extra": int})


def test_another_order_names_every_field_that_differs():
    state = make_state("k", Position(1), FP)
    other = {**FP, "seed": 4, "dataset": "index xxh3_128:11"}
    with pytest.raises(ResumeStateError) as info:
        read_state(state, kind="k", fingerprint=other)
    assert "seed: saved 3 != now 4" in str(info.value) and "dataset: saved" in str(info.value)
    with pytest.raises(ResumeStateError, match="shuffle: saved 'global' != now 'block'"):
        read_state(state, kind="k", fingerprint={**FP, "shuffle": "block"})
    with pytest.raises(ResumeStateError, match="must be a dict"):
        read_state([1, 2], kind="k", fingerprint=FP)


# --- OrderSampler as in-process ranks ------------------------------------------------------------

torch = pytest.importorskip("torch")

from fastload.torch import OrderSampler


class Records:
    """What the sampler sees of a dataset: a length, ids, labels, shard starts."""

    def __init__(self, n: int, salt: int = 0) -> None:
        self.ids = np.arange(n, dtype=np.uint64) + salt
        self.labels = np.zeros((n, 1), np.float32)
        self.shard_starts = SHARDS if n == SHARDS[-1] else (0, n)

    def __len__(self) -> int:
        return len(self.ids)


class SamplerPath(LoaderPath):
    """``OrderSampler`` batched as torch's ``BatchSampler``, driven as fastload's DataLoader drives it.

    The whole pass's indices are drawn up front (a loader prefetching far ahead); the state counts
    the batches handed out, not the indices drawn.
    """

    def __init__(self, mode: str, n: int = SHARDS[-1], even: str = "pad", drop_last: bool = False) -> None:
        self.name = f"OrderSampler({mode}, even={even}, drop_last={drop_last})"
        self.mode, self.records, self.even, self.drop_last = mode, n, even, drop_last
        self.pads = even == "pad"
        self.data = Records(n)

    def open(self, rank, world, batch):
        sampler = OrderSampler(self.data, shuffle=self.mode, seed=5, rank=rank, world_size=world, even=self.even)
        sampler.window, sampler.block_size = 2, 4
        return {"sampler": sampler, "batch": batch, "pass": None, "taken": 0}

    def take(self, h, count):
        if h["pass"] is None:
            ids = np.asarray(list(iter(h["sampler"])), dtype=np.int64)
            b = h["batch"]
            full = len(ids) // b if self.drop_last else -(-len(ids) // b)
            h["pass"], h["taken"] = [ids[k * b : (k + 1) * b] for k in range(full)], 0
        batches = h["pass"]
        stop = len(batches) if count is None else min(len(batches), h["taken"] + count)
        out = batches[h["taken"] : stop]
        h["taken"] = stop
        if count is None:
            h["pass"] = None  # the pass ended: the next take() starts the next one
        return out

    def state(self, h):
        if h["pass"] is None:
            return h["sampler"].state_dict()
        handed = sum(len(b) for b in h["pass"][: h["taken"]])
        return h["sampler"].state_dict(handed_out=handed, finished=h["taken"] == len(h["pass"]))

    def load(self, h, state):
        h["sampler"].load_state_dict(state)
        h["pass"] = None

    def set_epoch(self, h, epoch):
        h["sampler"].set_epoch(epoch)
        h["pass"] = None


MODES = ["none", "global", "block", "shard"]

JOBS = {
    "4-to-3": [Job(4, 4, 3), Job(3, 4)],
    "4-to-5": [Job(4, 4, 2), Job(5, 4)],
    "same-world": [Job(3, 4, 2), Job(3, 4, 1), Job(3, 4)],
    "three-resumes": [Job(4, 3, 2), Job(2, 5, 3), Job(5, 2, 1), Job(3, 4)],
    "batch-size": [Job(2, 8, 2), Job(2, 3)],
    "before-first-batch": [Job(4, 4, 0), Job(3, 5)],
    "world-beyond-what-remains": [Job(2, 10, 5), Job(9, 4)],
    "set-epoch-after": [Job(4, 4, 2), Job(3, 4, set_epoch="after")],
    "no-set-epoch": [Job(4, 4, 2), Job(6, 4, set_epoch="none")],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("jobs", sorted(JOBS))
def test_sampler_matrix(mode, jobs):
    path = SamplerPath(mode)
    check_epoch(path, play(path, 2, JOBS[jobs], after=2), 2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("even", "drop_last"), [("pad", True), ("drop", False), ("drop", True)])
def test_sampler_matrix_drop(mode, even, drop_last):
    path = SamplerPath(mode, even=even, drop_last=drop_last)
    check_epoch(path, play(path, 1, [Job(4, 3, 4), Job(3, 5, 1), Job(5, 2)]), 1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_checkpoint_after_the_last_batch_starts_the_next_epoch(mode, drop_last):
    path = SamplerPath(mode, drop_last=drop_last)
    length = (
        -(-share_length(path.records, 4, "pad") // 4) if not drop_last else share_length(path.records, 4, "pad") // 4
    )
    played = play(path, 0, [Job(4, 4, length), Job(3, 4)], after=1)
    assert played.states[0]["epoch"] == 1 and played.states[0]["consumed"] == []
    assert all(len(rank) > 0 for rank in played.batches[1])  # never a pass with no step
    check_epoch(path, played, 0, finished_in=0)


def test_any_ranks_state_is_the_same_and_a_standalone_sampler_counts_what_it_yielded():
    data = Records(50)
    samplers = [OrderSampler(data, seed=1, rank=r, world_size=2) for r in range(2)]
    its = [iter(s) for s in samplers]
    for it in its:
        list(itertools.islice(it, 7))
    states = [s.state_dict() for s in samplers]
    assert states[0] == states[1] and states[0]["consumed"] == [[2, 7]]
    resumed = OrderSampler(data, seed=1, rank=0, world_size=1)
    resumed.load_state_dict(states[1])
    assert resumed.epoch == 0 and len(list(resumed)) == 50 - 14


def test_set_epoch_to_another_epoch_drops_the_loaded_position():
    data = Records(40)
    s = OrderSampler(data, seed=1, rank=0, world_size=2)
    it = iter(s)
    list(itertools.islice(it, 5))
    state = s.state_dict()
    other = OrderSampler(data, seed=1, rank=0, world_size=3)
    other.load_state_dict(state)
    other.set_epoch(1)
    assert len(list(other)) == share_length(40, 3, "pad")
    other.load_state_dict(state)
    other.set_epoch(0)  # the saved epoch: kept
    assert len(list(other)) == share_length(40 - 10, 3, "pad")


def test_sampler_refuses_another_dataset_seed_or_mode():
    data = Records(60)
    s = OrderSampler(data, seed=1, world_size=1, rank=0)
    list(itertools.islice(iter(s), 3))
    state = s.state_dict()
    with pytest.raises(ResumeStateError, match="seed: saved 1 != now 2"):
        OrderSampler(data, seed=2, world_size=1, rank=0).load_state_dict(state)
    with pytest.raises(ResumeStateError, match="shuffle: saved 'global' != now 'block'"):
        OrderSampler(data, shuffle="block", seed=1, world_size=1, rank=0).load_state_dict(state)
    with pytest.raises(ResumeStateError, match="dataset: saved"):
        OrderSampler(Records(60, salt=1), seed=1, world_size=1, rank=0).load_state_dict(state)
    with pytest.raises(ResumeStateError, match="records: saved 60 != now 61"):
        OrderSampler(Records(61), seed=1, world_size=1, rank=0).load_state_dict(state)
