"""Order stage: determinism, coverage and equal shares per (seed, epoch, rank, world_size)."""

import itertools

import numpy as np
import pytest

from fastload.order import EpochOrder, Even, OrderSpec, Shuffle, epoch_permutation, rank_share


@pytest.mark.parametrize("shuffle", ["none", "global", "block"])
@pytest.mark.parametrize("n", [1, 7, 100, 257])
def test_permutation_is_a_permutation_and_deterministic(shuffle, n):
    a = epoch_permutation(n, shuffle, seed=3, epoch=2, block_size=8, window=3)
    b = epoch_permutation(n, shuffle, seed=3, epoch=2, block_size=8, window=3)
    assert a.dtype == np.int64
    np.testing.assert_array_equal(np.sort(a), np.arange(n))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shuffle", ["global", "block"])
def test_epochs_and_seeds_give_different_orders(shuffle):
    base = epoch_permutation(500, shuffle, seed=0, epoch=0, block_size=10, window=4)
    assert not np.array_equal(base, epoch_permutation(500, shuffle, seed=0, epoch=1, block_size=10, window=4))
    assert not np.array_equal(base, epoch_permutation(500, shuffle, seed=1, epoch=0, block_size=10, window=4))
    np.testing.assert_array_equal(epoch_permutation(500, "none", seed=5, epoch=9), np.arange(500))


def test_block_shuffle_keeps_reads_local():
    block, window, n = 16, 4, 1024
    order = epoch_permutation(n, "block", seed=1, epoch=0, block_size=block, window=window)
    span = block * window
    for lo in range(0, n, span):
        chunk = order[lo : lo + span]
        # A window draws from at most `window` distinct blocks...
        assert len(np.unique(chunk // block)) <= window
    # ...while the order of blocks is not the identity.
    firsts = order[::span] // block
    assert not np.all(np.diff(firsts) > 0)
    # and records inside a window are mixed, not block-sequential
    assert not np.all(np.diff(order[:span]) == 1)


@pytest.mark.parametrize(
    ("n", "world", "batch"), [(10, 3, 4), (101, 2, 8), (100, 4, 7), (5, 8, 2), (64, 1, 16), (1000, 7, 32)]
)
@pytest.mark.parametrize("shuffle", ["none", "global", "block"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_pad_shares_are_equal_and_cover_the_epoch(n, world, batch, shuffle, drop_last):
    counts, seen = set(), []
    for rank in range(world):
        spec = OrderSpec(
            num_records=n,
            batch_size=batch,
            shuffle=shuffle,
            seed=7,
            rank=rank,
            world_size=world,
            even="pad",
            drop_last=drop_last,
            block_size=5,
            window=2,
        )
        order = EpochOrder(spec, epoch=4)
        assert len(order) == EpochOrder.batches_per_epoch(spec)
        counts.add(len(order))
        batches = [order[k] for k in range(len(order))]
        assert all(1 <= len(b) <= batch for b in batches)
        if drop_last:
            assert all(len(b) == batch for b in batches)
        seen.append(np.concatenate(batches) if batches else np.zeros(0, np.int64))
    assert len(counts) == 1, "every rank must get the same number of batches"
    assert len({len(s) for s in seen}) == 1
    union = np.concatenate(seen)
    if not drop_last:
        assert set(union.tolist()) == set(range(n)), "pad covers every record"
        per_rank = -(-n // world)
        # only the padding repeats records
        assert len(union) - len(set(union.tolist())) == per_rank * world - n


@pytest.mark.parametrize(("n", "world"), [(101, 2), (100, 3), (7, 7), (9, 4)])
def test_drop_shares_are_disjoint_and_equal(n, world):
    shares = [
        rank_share(epoch_permutation(n, "global", seed=1, epoch=0), rank=r, world_size=world, even="drop")
        for r in range(world)
    ]
    assert {len(s) for s in shares} == {n // world}
    union = np.concatenate(shares)
    assert len(set(union.tolist())) == len(union) == (n // world) * world


def test_shares_are_contiguous_slices_of_one_permutation():
    perm = epoch_permutation(50, "global", seed=2, epoch=3)
    shares = [rank_share(perm, rank=r, world_size=3, even=Even.PAD) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate(shares)[:50], perm)
    np.testing.assert_array_equal(shares[2][-1:], perm[:1])  # the pad repeats the start


def test_order_is_a_pure_function_of_its_inputs():
    def run(seed, epoch, rank, world):
        spec = OrderSpec(num_records=333, batch_size=10, shuffle="global", seed=seed, rank=rank, world_size=world)
        order = EpochOrder(spec, epoch)
        return np.concatenate([order[k] for k in range(len(order))])

    for args in itertools.product([0, 9], [0, 1], [0, 1], [2]):
        np.testing.assert_array_equal(run(*args), run(*args))
    assert not np.array_equal(run(0, 0, 0, 2), run(0, 0, 1, 2))


def test_batch_index_out_of_range():
    order = EpochOrder(OrderSpec(num_records=10, batch_size=4), 0)
    assert len(order) == 3 and len(order[2]) == 2
    with pytest.raises(IndexError):
        order[3]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_records=0, batch_size=1), "num_records"),
        (dict(num_records=5, batch_size=0), "batch_size"),
        (dict(num_records=5, batch_size=1, rank=2, world_size=2), "rank"),
        (dict(num_records=5, batch_size=1, shuffle="random"), "shuffle"),
        (dict(num_records=5, batch_size=1, even="repeat"), "even"),
        (dict(num_records=5, batch_size=1, seed=-1), "seed"),
        (dict(num_records=3, batch_size=1, world_size=4, even="drop"), "even='drop'"),
    ],
)
def test_spec_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OrderSpec(**kwargs)


def test_enums_accept_names():
    spec = OrderSpec(num_records=5, batch_size=2, shuffle="block", even="drop")
    assert spec.shuffle is Shuffle.BLOCK and spec.even is Even.DROP
