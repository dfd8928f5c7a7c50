"""Records read ahead as coalesced extents, in parallel (fastload.records.readahead), checked as Dataset.image checks."""

from __future__ import annotations

import itertools
import json
import os
import threading

import numpy as np
import pytest
from test_records_data import tiny_folder  # noqa: F401  (fixture)

from fastload.errors import CorruptRecordError
from fastload.order import EpochOrder, OrderSpec, window_starts
from fastload.pack.packer import pack_folder
from fastload.records import recordio
from fastload.records.dataset import open_dataset
from fastload.records.manifest import MANIFEST_NAME
from fastload.records.readahead import ReadAhead, ReadOptions, coalesce


def _i64(*values):
    return np.asarray(values, dtype=np.int64)


def test_coalesce_merges_neighbours_within_the_gap_and_splits_long_runs():
    shard = _i64(0, 0, 0, 0, 1, 0)
    start = _i64(0, 100, 250, 1000, 0, 100)  # the last one repeats the second
    end = _i64(100, 200, 300, 1100, 50, 200)
    run_of, r_sh, r_st, r_en = coalesce(shard, start, end, gap=50, max_read=1 << 20)
    # 0-100, 100-200 (adjacent) and 250-300 (a 50-byte gap) are one run; 1000-1100 is far; shard 1 apart.
    assert r_sh.tolist() == [0, 0, 1] and r_st.tolist() == [0, 1000, 0] and r_en.tolist() == [300, 1100, 50]
    assert run_of.tolist() == [0, 0, 0, 1, 2, 0]
    # No gap allowed: 200-250 breaks the run.
    _, _, r_st, r_en = coalesce(shard, start, end, gap=0, max_read=1 << 20)
    assert r_st.tolist() == [0, 250, 1000, 0] and r_en.tolist() == [200, 300, 1100, 50]
    # max_read cuts at record boundaries; an extent longer than it is a run of its own.
    run_of, _, r_st, r_en = coalesce(_i64(0, 0, 0, 0), _i64(0, 10, 20, 30), _i64(10, 20, 30, 100), gap=0, max_read=25)
    assert r_st.tolist() == [0, 20, 30] and r_en.tolist() == [20, 30, 100] and run_of.tolist() == [0, 0, 1, 2]
    assert coalesce(_i64(), _i64(), _i64(), gap=0, max_read=1)[1].size == 0


@pytest.fixture(scope="module", params=["recordio", "lmdb"])
def packed(request, tiny_folder, tmp_path_factory):
    out = str(tmp_path_factory.mktemp(f"ra-{request.param}") / "ds")
    pack_folder(tiny_folder, out, format=request.param, shards=3, progress=False, workers=2)
    return out


def _spec(n, shuffle, shard_starts=None, **kw):
    return OrderSpec(
        num_records=n, batch_size=8, shuffle=shuffle, seed=3, block_size=4, window=2, shard_starts=shard_starts, **kw
    )


@pytest.mark.parametrize("shuffle", ["global", "block", "shard", "none"])
def test_every_record_of_an_epoch_matches_dataset_image(packed, shuffle):
    with open_dataset(packed) as ds:
        spec = _spec(len(ds), shuffle, tuple(ds.shard_starts.tolist()) if shuffle == "shard" else None)
        order = EpochOrder(spec, 1)
        seq = np.concatenate([order[k] for k in range(len(order))])
        with ReadAhead(ds, ReadOptions(queue_depth=3, budget=256 << 10, gap=8 << 10, max_read=64 << 10)) as ra:
            ra.begin(seq, window_starts(spec, 1))
            assert ra.coalescing
            got = []
            for k in range(len(order)):
                views, errors = ra.records(k * 8, k * 8 + len(order[k]))
                assert not errors
                got += [bytes(v) for v in views]
            counters = ra.counters()
        assert got == [bytes(ds.image(int(i))) for i in seq]
        assert counters.records == len(seq) and counters.direct == 0
        if shuffle in ("none", "block"):
            assert counters.reads < len(seq) / 2  # neighbours came in one read


def test_the_budget_bounds_what_is_read_ahead(packed):
    with open_dataset(packed) as ds:
        seq = np.arange(len(ds), dtype=np.int64)
        sizes = ds.extents(seq)[2] - ds.extents(seq)[1]
        budget = int(sizes.max()) * 6
        with ReadAhead(ds, ReadOptions(queue_depth=2, budget=budget, gap=0)) as ra:
            ra.begin(seq)
            ra.wait(0, 1)
            assert 0 < ra._inflight <= budget  # two groups of half the budget at most
            assert ra._planned < len(seq)
            for p in range(len(seq)):
                ra.records(p, p + 1)
                assert ra._inflight <= budget + int(sizes.max())
            assert ra._planned == len(seq)


def test_extend_continues_into_the_next_sequence(packed):
    with open_dataset(packed) as ds:
        a = np.arange(len(ds), dtype=np.int64)
        b = a[::-1].copy()
        with ReadAhead(ds, ReadOptions(budget=1 << 30)) as ra:
            ra.begin(a)
            ra.extend(b, [0, 10])
            views, errors = ra.records(len(a) - 2, len(a) + 3)
            assert not errors and ra.planned == 2 * len(a)
            assert [bytes(v) for v in views] == [
                bytes(ds.image(int(i))) for i in np.concatenate([a, b])[-2 - len(a) : 3 + len(a)]
            ]


def test_a_damaged_record_fails_alone_and_names_shard_and_record(tiny_folder, tmp_path):
    out = str(tmp_path / "ds")
    pack_folder(tiny_folder, out, shards=2, name="ds", progress=False)
    manifest = json.load(open(os.path.join(out, MANIFEST_NAME)))
    shard = os.path.join(out, manifest["shards"][1]["file"])
    _keys, offsets = recordio.read_idx(os.path.join(out, manifest["shards"][1]["index_file"]))
    with open(shard, "r+b") as f:  # a flipped byte inside record 4's image: the checksum catches it
        f.seek(int(offsets[4]) + 200)
        byte = f.read(1)
        f.seek(int(offsets[4]) + 200)
        f.write(bytes([byte[0] ^ 0xFF]))
    first = manifest["shards"][0]["records"]
    with open_dataset(out) as ds, ReadAhead(ds, ReadOptions(gap=1 << 20)) as ra:
        seq = np.arange(len(ds), dtype=np.int64)
        ra.begin(seq)
        views, errors = ra.records(0, len(ds))
        assert list(errors) == [first + 4]
        assert "checksum mismatch" in errors[first + 4] and "ds-00001.rec" in errors[first + 4]
        assert "record 4" in errors[first + 4]
        for i in range(len(ds)):
            if i != first + 4:
                assert bytes(views[i]) == bytes(ds.image(i))
        assert ra.counters().reads <= 2  # one run per shard, the damage inside one of them


def test_a_shard_truncated_after_opening_keeps_the_records_before_the_cut(tiny_folder, tmp_path):
    out = str(tmp_path / "ds")
    pack_folder(tiny_folder, out, shards=2, name="ds", progress=False)
    manifest = json.load(open(os.path.join(out, MANIFEST_NAME)))
    shard = os.path.join(out, manifest["shards"][1]["file"])
    _keys, offsets = recordio.read_idx(os.path.join(out, manifest["shards"][1]["index_file"]))
    first = manifest["shards"][0]["records"]
    with open_dataset(out) as ds, ReadAhead(ds, ReadOptions(gap=1 << 20)) as ra:
        expected = [bytes(ds.image(i)) for i in range(len(ds))]
        os.truncate(shard, int(offsets[5]) + 10)  # records 0-4 of shard 1 stay whole
        ra.begin(np.arange(len(ds), dtype=np.int64))
        views, errors = ra.records(0, len(ds))
        bad = sorted(errors)
        assert bad == list(range(first + 5, len(ds)))
        assert all("ds-00001.rec" in errors[i] and "truncated" in errors[i] for i in bad)
        assert f"record {len(ds) - first - 1}" in errors[len(ds) - 1]
        assert [bytes(v) for v in views[: first + 5]] == expected[: first + 5]
        assert ra.counters().direct >= len(ds) - first  # the failed run was redone record by record


def test_bad_labels_are_refused_like_dataset_image(tiny_folder, tmp_path):
    from fastload.records.manifest import INDEX_NAME, load_index, write_index

    out = str(tmp_path / "ds")
    pack_folder(tiny_folder, out, shards=2, name="ds", progress=False)
    path = os.path.join(out, INDEX_NAME)
    index = load_index(path, 1, 40)
    index["labels"][2, 0] = 99  # not a class of this 4-class dataset
    write_index(path, index)
    with open_dataset(out) as ds, ReadAhead(ds) as ra:
        ra.begin(np.arange(4, dtype=np.int64))
        views, errors = ra.records(0, 4)
        assert list(errors) == [2] and "not a class number" in errors[2] and "record 2" in errors[2]
        with pytest.raises(CorruptRecordError, match="not a class number"):
            ds.image(2)
        assert bytes(views[3]) == bytes(ds.image(3))


def test_an_image_folder_is_read_record_by_record_in_parallel(tiny_folder):
    with open_dataset(tiny_folder) as ds, ReadAhead(ds, ReadOptions(queue_depth=4)) as ra:
        seq = np.random.default_rng(0).permutation(len(ds)).astype(np.int64)
        ra.begin(seq)
        assert not ra.coalescing
        views, errors = ra.records(0, len(ds))
        assert not errors
        assert [bytes(v) for v in views] == [bytes(ds.image(int(i))) for i in seq]
        assert ra.counters().reads == len(ds)


def test_close_is_idempotent_and_final(packed):
    with open_dataset(packed) as ds:
        ra = ReadAhead(ds, ReadOptions(budget=1 << 12))
        ra.begin(np.arange(len(ds), dtype=np.int64))
        ra.wait(0, 4)
        ra.close()
        ra.close()
        with pytest.raises(ValueError, match="closed"):
            ra.records(0, 1)


def test_options_are_validated():
    for bad in ({"queue_depth": 0}, {"budget": 0}, {"gap": -1}, {"max_read": 0}, {"queue_depth": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ReadOptions(**bad)


def test_the_automatic_budget_follows_the_widest_window(packed):
    # The automatic budget grows up to this ceiling (from its floor: tests/test_readahead_budget.py).
    from fastload.records.readahead import AUTO_BUDGET, AUTO_FLOOR, NO_WINDOW_BUDGET

    with open_dataset(packed) as ds, ReadAhead(ds) as ra:
        seq = np.arange(len(ds), dtype=np.int64)
        ra.begin(seq)
        assert ra.ceiling == NO_WINDOW_BUDGET  # no windows: global or no shuffle
        assert ra.budget == ra.floor == AUTO_FLOOR  # nothing waited for yet, and never behind
        ra.begin(seq, [10, 30])
        sizes = ds.extents(seq)[2] - ds.extents(seq)[1]
        widest = max(sizes[:10].sum(), sizes[10:30].sum(), sizes[30:].sum())
        assert ra.ceiling == max(AUTO_BUDGET[0], min(AUTO_BUDGET[1], 2 * widest))
    with ReadAhead(ds, ReadOptions(budget=1000)) as fixed:
        assert fixed.budget == fixed.floor == fixed.ceiling == 1000


class _Extents:
    """A dataset of 1,600 records of 64-128 KB in 8 shards, for read plans (its reads return nothing)."""

    def __init__(self):
        rng = np.random.default_rng(0)
        sizes = rng.integers(64 << 10, 128 << 10, 1600)
        self.shard = np.repeat(np.arange(8), 200)
        self.start = np.zeros(1600, dtype=np.int64)
        for s in range(8):
            self.start[self.shard == s] = np.concatenate([[0], np.cumsum(sizes[self.shard == s])[:-1]])
        self.end = self.start + sizes

    def extents(self, idx):
        return self.shard[idx], self.start[idx], self.end[idx]

    def read_extent(self, shard, start, end):
        return b""

    def image_from(self, i, data):
        return data


@pytest.mark.parametrize("gap", [64 << 10, 1 << 20])
def test_a_cold_start_ramps_up_unless_reading_records_alone_costs_more(gap):
    # One shuffle window of all 8 shards, read from a cold start; the first batch is 128 records.
    ds = _Extents()
    seq = np.random.default_rng(1).permutation(1600).astype(np.int64)
    with ReadAhead(ds, ReadOptions(gap=gap, budget=1 << 30)) as ra:
        ra.begin(seq, [0])
        ra.wait(0, 128)
        groups = [(g.p0, g.p1, len(g.reads)) for g in ra._groups]
        assert groups[-1][1] == len(seq)  # the whole window is read ahead either way
        whole = len(coalesce(*ds.extents(seq), gap=gap, max_read=16 << 20)[1])
        if gap == 1 << 20:
            # Few IOPS: the records of a batch alone would cost more than the long runs around them.
            assert groups == [(0, len(seq), whole)]
        else:
            # The first group is the first batch (at least max_read bytes), the next twice its
            # bytes, ...; the rest of the window comes after them as before.
            assert len(groups) >= 3 and groups[0][0] == 0
            sizes = ds.end[seq] - ds.start[seq]
            first = int(np.searchsorted(np.cumsum(sizes), 16 << 20, side="right"))
            assert groups[0][1] == max(128, first)
            assert sizes[groups[1][0] : groups[1][1]].sum() <= 2 * sizes[: groups[0][1]].sum()
            assert all(a[1] == b[0] for a, b in itertools.pairwise(groups))
        # Caller-chosen batches (an extend after an empty begin) and the next epoch never ramp.
        ra.extend(seq, [0])
        ra.wait(len(seq), len(seq) + 128)
        assert [(g.p0, g.p1) for g in ra._groups][-1] == (len(seq), 2 * len(seq))


# --- through the loader ------------------------------------------------------------------------


def _epochs(path, read_options, epochs=2, **kw):
    from fastload.loader import Loader, LoaderConfig
    from fastload.transforms import Resize

    config = LoaderConfig(
        batch_size=kw.pop("batch_size", 6),
        transform=Resize(size=(16, 16)),
        num_threads=1,
        read_options=read_options,
        seed=kw.pop("seed", 4),
        **kw,
    )
    out = []
    with open_dataset(path) as ds, Loader(ds, config) as loader:
        for _ in range(epochs):
            out.append([(b.indices.copy(), b.labels.copy(), b.images.copy()) for b in loader])
        stats = loader.stats()
    return out, stats


@pytest.mark.parametrize(
    ("shuffle", "extra"),
    [
        ("global", {}),
        ("block", {"block_size": 4, "window": 2}),
        ("shard", {"window": 2}),
        ("none", {"round_batch": True}),
        ("block", {"drop_last": True, "block_size": 5, "window": 3}),
    ],
)
def test_the_loader_reads_ahead_the_same_batches_as_one_by_one(packed, shuffle, extra):
    ahead, stats = _epochs(packed, ReadOptions(queue_depth=3, budget=96 << 10, gap=8 << 10), shuffle=shuffle, **extra)
    plain, plain_stats = _epochs(packed, None, shuffle=shuffle, **extra)
    for ea, ep in zip(ahead, plain, strict=True):
        assert len(ea) == len(ep)
        for (ia, la, xa), (ip, lp, xp) in zip(ea, ep, strict=True):
            np.testing.assert_array_equal(ia, ip)
            np.testing.assert_array_equal(la, lp)
            np.testing.assert_array_equal(xa, xp)
    # The read-ahead's work shows in the stats, apart from decoding; the one-by-one path reads nothing ahead.
    assert stats.reads > 0 and stats.records_read > 0 and stats.bytes_read > 0
    assert "read_wait" in stats.seconds and stats.seconds["decode"] > 0 and 0.0 <= stats.io_bound <= 1.0
    assert plain_stats.reads == 0 and plain_stats.seconds["read_wait"] == 0.0
    if shuffle in ("block", "none"):
        assert stats.reads < stats.records_read  # neighbours came in one read
    assert "producer waited for storage" in stats.summary()


def test_resume_and_caller_chosen_batches_read_ahead_too(packed):
    from fastload.loader import Loader, LoaderConfig
    from fastload.transforms import Resize

    config = LoaderConfig(batch_size=6, transform=Resize(size=(16, 16)), num_threads=1, shuffle="block", block_size=4)
    with open_dataset(packed) as ds:
        with Loader(ds, config) as loader:
            it = iter(loader)
            next(it)
            next(it)
            state = loader.state_dict()
            rest = [b.indices.copy() for b in it]
        with Loader(ds, config) as loader:
            loader.load_state_dict(state)
            assert [b.indices.copy().tolist() for b in loader] == [r.tolist() for r in rest]
            chosen = [np.array([5, 1, 33, 2]), np.array([0, 39])]

            def batches(stop):
                yield from chosen

            got = [b.indices.copy().tolist() for b in loader.iterate_batches(batches, seed=1, epoch=0)]
            assert got == [c.tolist() for c in chosen]
            assert loader.stats().records_read >= 6


def test_a_stopping_loader_is_not_held_by_reads_in_flight(packed):
    # Closing while the producer waits for a read that does not finish: the producer thread is
    # woken and ends at once; close() then waits for the read itself, which is bounded.
    from fastload.loader import Loader, LoaderConfig
    from fastload.transforms import Resize

    with open_dataset(packed) as ds:
        release, started = threading.Event(), threading.Event()

        def stuck(real):
            def stuck_read(*args):
                started.set()
                release.wait(60)  # finishes only when the test lets it
                return real(*args)

            return stuck_read

        ds.read_extent = stuck(ds.read_extent)  # small reads
        ds.read_extent_into = stuck(ds.read_extent_into)  # large ones, into memory mapped for them
        config = LoaderConfig(batch_size=6, transform=Resize(size=(16, 16)), num_threads=1, shuffle="global")
        loader = Loader(ds, config)
        it = iter(loader)
        producer = loader._stream.producer._thread
        closer = threading.Thread(target=loader.close)
        try:
            assert started.wait(30)
            closer.start()
            producer.join(20)
            assert not producer.is_alive() and not release.is_set()
        finally:
            release.set()
            closer.join(60)
            loader.close()
        assert not closer.is_alive()
        with pytest.raises(Exception, match="closed"):
            next(it)


@pytest.mark.parametrize("fed", [False, True], ids=["epoch", "caller-chosen"])
def test_the_next_batch_is_handed_over_while_this_one_decodes(packed, fed):
    # Batch 0's decode returns only once batch 1's records were handed over: a producer that handed
    # them over after the decode (the engine's threads idle meanwhile) would not get there in time.
    from fastload.decode import decode_batch
    from fastload.loader import Loader, LoaderConfig
    from fastload.transforms import Resize

    handed_second = threading.Event()
    waited = []
    real_records = ReadAhead.records

    def records(self, start, stop):
        got = real_records(self, start, stop)
        if start > 0:
            handed_second.set()
        return got

    def decode(views, out, transform, **kw):
        if not waited:
            waited.append(handed_second.wait(30))
        return decode_batch(views, out, transform, **kw)

    config = LoaderConfig(batch_size=6, transform=Resize(size=(16, 16)), num_threads=1, shuffle="global")
    with open_dataset(packed) as ds, Loader(ds, config, decode=decode) as loader:
        ReadAhead.records = records
        try:
            if fed:
                chosen = [np.arange(0, 6), np.arange(6, 12), np.arange(12, 18)]
                batches = list(loader.iterate_batches(lambda stop: iter(chosen), seed=0, epoch=0))
                assert [b.indices.tolist() for b in batches] == [c.tolist() for c in chosen]
            else:
                assert sum(b.size for b in loader) == len(ds)
        finally:
            ReadAhead.records = real_records
        assert waited == [True]
        stats = loader.stats()
    assert stats.seconds["read"] > 0 and stats.seconds["read_wait"] >= 0.0


def test_a_failing_hand_over_reaches_the_consumer_with_its_traceback(packed):
    import traceback

    from fastload.loader import Loader, LoaderConfig
    from fastload.transforms import Resize

    real_records = ReadAhead.records

    def records(self, start, stop):
        if start > 0:
            raise RuntimeError("hand-over failed")
        return real_records(self, start, stop)

    config = LoaderConfig(batch_size=6, transform=Resize(size=(16, 16)), num_threads=1, shuffle="global")
    ReadAhead.records = records
    try:
        with open_dataset(packed) as ds, Loader(ds, config) as loader:
            it = iter(loader)
            first = next(it)
            assert first.size == 6
            with pytest.raises(RuntimeError, match="hand-over failed") as info:
                next(it)
            frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
            assert "records" in frames and "_epoch_reads" in frames  # the hand-over thread's frames
            del first
    finally:
        ReadAhead.records = real_records
    left = [t.name for t in threading.enumerate() if t.name.startswith("fastload-handover")]
    assert not left, left


@pytest.mark.parametrize(("world_size", "even"), [(1, "pad"), (3, "pad"), (3, "drop")])
def test_window_starts_cut_the_share_where_the_shuffle_windows_begin(world_size, even):
    n, bs, window = 103, 7, 3
    for rank in range(world_size):
        spec = OrderSpec(
            num_records=n,
            batch_size=5,
            shuffle="block",
            block_size=bs,
            window=window,
            seed=2,
            rank=rank,
            world_size=world_size,
            even=even,
        )
        share = EpochOrder(spec, 4).share
        starts = window_starts(spec, 4)
        assert np.all(np.diff(starts) > 0) and (starts.size == 0 or (starts[0] > 0 and starts[-1] < len(share)))
        bounds = [0, *starts.tolist(), len(share)]
        for lo, hi in itertools.pairwise(bounds):
            blocks = np.unique(share[lo:hi] // bs)
            assert len(blocks) <= window  # a window's records come from its `window` blocks only
    # Shard order: a window holds the records of at most `window` shards.
    starts_of = (*tuple(range(0, n, 10)), n)
    spec = OrderSpec(num_records=n, batch_size=5, shuffle="shard", shard_starts=starts_of, window=2, seed=1)
    share = EpochOrder(spec, 0).share
    bounds = [0, *window_starts(spec, 0).tolist(), len(share)]
    for lo, hi in itertools.pairwise(bounds):
        assert len(np.unique(np.searchsorted(starts_of, share[lo:hi], side="right"))) <= 2
    assert window_starts(OrderSpec(num_records=n, batch_size=5, shuffle="global"), 0).size == 0
