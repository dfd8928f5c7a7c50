"""Order stage, shard-aware mode: subsets of shards per node and rank, reassigned per epoch, equal shares."""

import numpy as np
import pytest

from fastload.order import EpochOrder, OrderSpec, shard_sequence, shards_read, window_shuffle


def _starts(sizes):
    return tuple(np.concatenate(([0], np.cumsum(sizes))).tolist())


def _shard_of(starts, records):
    return np.searchsorted(np.asarray(starts), records, side="right") - 1


LAYOUTS = {
    "even": [10] * 12,
    "uneven": [7, 13, 1, 20, 9, 9, 4, 16],
    "with empty shards": [5, 0, 8, 0, 11, 3],
    "one shard": [37],
}


def _spec(starts, **kw):
    defaults = dict(
        num_records=starts[-1],
        batch_size=4,
        shuffle="shard",
        seed=3,
        rank=0,
        world_size=1,
        window=2,
        shard_starts=starts,
    )
    defaults.update(kw)
    return OrderSpec(**defaults)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("even", ["pad", "drop"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_equal_batches_and_every_record_once(layout, world, even, drop_last):
    starts = _starts(LAYOUTS[layout])
    n = starts[-1]
    if even == "drop" and n < world:
        pytest.skip("drop leaves nothing")
    lengths, shares = set(), []
    for rank in range(world):
        spec = _spec(starts, rank=rank, world_size=world, even=even, drop_last=drop_last)
        order = EpochOrder(spec, epoch=2)
        lengths.add(len(order))
        assert len(order) == EpochOrder.batches_per_epoch(spec)
        shares.append(order.share)
    assert len(lengths) == 1, "every rank must get the same number of batches"
    assert len({len(s) for s in shares}) == 1
    seen = np.concatenate(shares)
    if even == "pad":
        assert set(seen.tolist()) == set(range(n))
        assert len(seen) - n < world  # padding only makes the length divisible
    else:
        assert len(np.unique(seen)) == len(seen) and len(seen) == n - n % world


def test_pure_function_and_reassigned_per_epoch():
    starts = _starts([10] * 16)
    sets = []
    for epoch in range(4):
        spec = _spec(starts, rank=1, world_size=4)
        a, b = EpochOrder(spec, epoch).share, EpochOrder(spec, epoch).share
        np.testing.assert_array_equal(a, b)
        sets.append(frozenset(_shard_of(starts, a).tolist()))
    assert len(set(sets)) > 1, "a rank's shards must change from epoch to epoch"
    other_seed = EpochOrder(_spec(starts, rank=1, world_size=4, seed=4), 0).share
    assert not np.array_equal(other_seed, EpochOrder(_spec(starts, rank=1, world_size=4), 0).share)


@pytest.mark.parametrize("epoch", [0, 5])
def test_ranks_read_few_shards_and_nodes_share_only_cut_shards(epoch):
    sizes = [25] * 24
    starts = _starts(sizes)
    nnodes, local = 2, 3
    world = nnodes * local
    node_shards = []
    for node in range(nnodes):
        shards = set()
        for rank in range(node * local, (node + 1) * local):
            share = EpochOrder(_spec(starts, rank=rank, world_size=world, window=3), epoch).share
            mine = set(_shard_of(starts, share).tolist())
            # 600 records / 6 ranks = 100 records = 4 shards, plus at most one split shard at each end.
            assert len(mine) <= 100 // 25 + 2
            shards |= mine
        node_shards.append(shards)
        spec = _spec(starts, world_size=world, window=3)
        assert shards_read(spec, [epoch], range(node * local, (node + 1) * local)) == sorted(shards)
    assert len(node_shards[0] & node_shards[1]) <= 1, "only the shard at the cut between nodes is shared"
    assert node_shards[0] | node_shards[1] == set(range(24))
    # The node's shards are a contiguous run of this epoch's shard permutation.
    seq_shards = _shard_of(starts, shard_sequence(starts, seed=3, epoch=epoch))
    runs = list(dict.fromkeys(seq_shards.tolist()))
    first_node = [s for s in runs if s in node_shards[0]]
    assert first_node == runs[: len(first_node)]


def test_window_shuffle_mixes_only_within_windows():
    starts = _starts([8] * 10)
    spec = _spec(starts, window=3)
    share = EpochOrder(spec, 1).share
    shard_of = _shard_of(starts, share)
    seq_shards = list(dict.fromkeys(_shard_of(starts, shard_sequence(starts, seed=3, epoch=1)).tolist()))
    pos = 0
    for w in range(0, 10, 3):
        window = seq_shards[w : w + 3]
        count = sum(8 for _ in window)
        assert set(shard_of[pos : pos + count].tolist()) == set(window)
        pos += count
    assert not np.all(np.diff(share[:24]) == 1), "records inside a window are mixed"
    # window_shuffle keeps the multiset of each window
    rng = np.random.default_rng(0)
    seq = np.arange(20)
    out = window_shuffle(seq, seq // 5, 2, rng)
    assert sorted(out[:10].tolist()) == list(range(10)) and sorted(out[10:].tolist()) == list(range(10, 20))


def test_padding_comes_from_the_last_ranks_own_shards():
    starts = _starts([10] * 5)  # 50 records over 4 ranks: 2 padded
    last = EpochOrder(_spec(starts, rank=3, world_size=4, window=1), 0).share
    assert len(last) == 13
    counts = np.bincount(last, minlength=50)
    padded = np.flatnonzero(counts > 1)
    assert len(padded) == 2
    seq = shard_sequence(starts, seed=3, epoch=0)
    assert set(padded.tolist()) <= set(seq[-10:].tolist())


def test_shard_sequence_is_a_permutation_in_stored_order():
    starts = _starts([3, 0, 4, 2])
    seq = shard_sequence(starts, seed=1, epoch=0)
    assert sorted(seq.tolist()) == list(range(9))
    for s in range(4):
        mine = seq[_shard_of(starts, seq) == s]
        np.testing.assert_array_equal(mine, np.arange(starts[s], starts[s + 1]))


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="shard layout"):
        OrderSpec(num_records=10, batch_size=2, shuffle="shard")
    with pytest.raises(ValueError, match="shard_starts"):
        OrderSpec(num_records=10, batch_size=2, shuffle="shard", shard_starts=(0, 5, 9))
    with pytest.raises(ValueError, match="shard_starts"):
        OrderSpec(num_records=10, batch_size=2, shuffle="shard", shard_starts=(0, 6, 5, 10))
    from fastload.order import epoch_permutation

    with pytest.raises(ValueError, match="shard"):
        epoch_permutation(10, "shard", seed=0, epoch=0)


def test_order_sampler_shard_mode_is_the_loaders_shard_order():
    torch = pytest.importorskip("torch")  # noqa: F841
    from fastload.torch import OrderSampler

    starts = _starts([7, 3, 9, 5, 6])

    class Records:  # what the sampler reads of a fastload dataset
        shard_starts = starts

        def __len__(self):
            return int(starts[-1])

    n = int(starts[-1])
    for world in (1, 2, 3):
        seen = []
        for rank in range(world):
            sampler = OrderSampler(Records(), shuffle="shard", seed=4, rank=rank, world_size=world, window=2)
            for epoch in (0, 1):
                sampler.set_epoch(epoch)
                got = list(sampler)
                want = EpochOrder(_spec(starts, seed=4, rank=rank, world_size=world, window=2), epoch).share
                assert got == want.tolist() and len(got) == len(sampler)
                if epoch == 0:
                    seen.extend(got)
        assert set(seen) == set(range(n))  # every record each epoch, up to padding
    with pytest.raises(ValueError, match="shard_starts"):
        OrderSampler(list(range(10)), shuffle="shard")
