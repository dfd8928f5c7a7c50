"""The read-ahead's automatic byte budget: a few batches from the page cache, more only while reads fall behind."""

from __future__ import annotations

import dataclasses
import threading
import weakref
from concurrent.futures import wait

import numpy as np
import pytest
from fake_dataset import FakeDataset
from test_records_data import tiny_folder  # noqa: F401  (fixture)

from fastload.records.readahead import AUTO_FLOOR, FLOOR_BATCHES, NO_WINDOW_BUDGET, ReadAhead, ReadOptions

_KB = 1 << 10


class _Spaced:
    """``n`` records of ``size`` bytes, ``size + space`` apart in one shard: each record is a read of its own
    (the space is wider than the default ``gap``).

    A read of a record in batch ``k`` (of the sequence given to :meth:`gate`) blocks until
    ``release(k)``; without a gate every read returns at once.
    """

    def __init__(self, n: int, size: int, space: int = 128 * _KB) -> None:
        self.size, self.stride = size, size + space
        self.start = np.arange(n, dtype=np.int64) * self.stride
        self._batch_of: dict[int, int] | None = None
        self._open: list[threading.Event] = []

    def gate(self, seq: np.ndarray, batch: int) -> None:
        self._batch_of = {int(i): p // batch for p, i in enumerate(seq.tolist())}
        self._open = [threading.Event() for _ in range(-(-len(seq) // batch))]

    def release(self, *batches: int) -> None:
        for k in batches or range(len(self._open)):
            self._open[k].set()

    def extents(self, idx):
        idx = np.asarray(idx, dtype=np.int64)
        return np.zeros(len(idx), dtype=np.int64), self.start[idx], self.start[idx] + self.size

    def read_extent(self, shard, start, end):
        i = start // self.stride
        if self._batch_of is not None:
            assert self._open[self._batch_of[i]].wait(60)
        return i.to_bytes(8, "little") * ((end - start) // 8)

    def image_from(self, i, data):
        return data


def _settle(ra: ReadAhead) -> None:
    """Wait for every read issued so far (what the page cache gives: reads done before they are needed)."""
    wait([r.future for g in ra._groups for r in g.reads])


def test_from_the_page_cache_the_budget_stays_at_four_batches():
    bs, size = 64, 64 * _KB  # 4 MiB batches: a floor of 16 MiB, above the 8 MiB minimum
    ds = _Spaced(1024, size)
    seq = np.random.default_rng(0).permutation(1024).astype(np.int64)
    with ReadAhead(ds) as ra:
        ra.begin(seq)
        assert ra.ceiling == NO_WINDOW_BUDGET
        for p in range(0, len(seq), bs):
            views, errors = ra.records(p, p + bs)
            assert not errors
            assert [int.from_bytes(bytes(v[:8]), "little") for v in views] == seq[p : p + bs].tolist()
            assert ra.budget == ra.floor == FLOOR_BATCHES * bs * size > AUTO_FLOOR
            assert ra._inflight <= ra.budget
            _settle(ra)
        counters = ra.counters()
    assert counters.grown == 0 and counters.budget == FLOOR_BATCHES * bs * size
    assert counters.records == len(seq) and counters.direct == 0


@pytest.mark.parametrize(("threads", "batches"), [(1, FLOOR_BATCHES), (8, FLOOR_BATCHES), (16, 8), (32, 16)])
def test_the_floor_is_one_batch_per_two_decode_threads_beyond_four(threads, batches):
    """Many decode threads finish a batch before the page cache gives the next two: the floor holds more."""
    bs, size = 64, 64 * _KB
    ds = _Spaced(4096, size)
    seq = np.arange(4096, dtype=np.int64)
    with ReadAhead(ds, decode_threads=threads) as ra:
        ra.begin(seq)
        for p in range(0, 4 * bs, bs):
            views, errors = ra.records(p, p + bs)
            assert not errors and len(views) == bs
            _settle(ra)
        assert ra.budget == ra.floor == min(ra.ceiling, batches * bs * size)
        assert ra._inflight <= ra.budget
    with ReadAhead(ds, ReadOptions(budget=24 << 20), decode_threads=threads) as ra:
        assert ra.floor == ra.budget == 24 << 20  # an explicit budget is kept as it is


@pytest.mark.parametrize("explicit", [None, 24 << 20])
def test_reads_behind_the_decode_double_the_automatic_budget(explicit):
    bs, size = 64, 64 * _KB
    ds = _Spaced(1024, size)
    seq = np.random.default_rng(1).permutation(1024).astype(np.int64)
    ds.gate(seq, bs)
    ra = ReadAhead(ds, ReadOptions(budget=explicit))
    try:
        ra.begin(seq)
        ds.release(0, 1)
        floor = explicit or FLOOR_BATCHES * bs * size  # the floor: known from the first batch waited for
        for k in (0, 1):
            # A cold start's first reads, and those issued with the batch before: waited for, not behind.
            assert not ra.records(k * bs, (k + 1) * bs)[1]
            assert ra.budget == floor and ra._inflight <= ra.budget
        # Batch 2 was issued with batch 0 (two batches ahead) and is not read yet: the decode waits for
        # the device. (interrupt() ends the wait at once; the budget grew when it began.)
        for k, expect in ((2, 2 * floor), (3, 4 * floor)):
            ra.interrupt()
            assert not ra.wait(k * bs, (k + 1) * bs)
            ra.resume()
            assert ra.budget == (explicit or expect) and ra._inflight <= ra.budget
            assert ra.counters().grown == (0 if explicit else k - 1)
        ds.release()
        got = []
        for p in range(2 * bs, len(seq), bs):
            views, errors = ra.records(p, p + bs)
            assert not errors and ra._inflight <= ra.budget
            got += [int.from_bytes(bytes(v[:8]), "little") for v in views]
        assert got == seq[2 * bs :].tolist()
        assert explicit is None or ra.budget == explicit
    finally:
        ds.release()
        ra.close()


def test_a_cold_start_reads_what_the_first_batch_waits_for_alone():
    # The next groups would share the device with the first batch's reads: issued once those are done.
    bs, size = 64, 64 * _KB
    ds = _Spaced(1024, size)
    seq = np.random.default_rng(2).permutation(1024).astype(np.int64)
    ds.gate(seq, bs)
    ra = ReadAhead(ds)
    try:
        ra.begin(seq)
        ra.interrupt()
        assert not ra.wait(0, bs)
        ra.resume()
        assert [(g.p0, g.p1) for g in ra._groups] == [(0, 2 * bs)]  # half the floor: the first batch's group
        ds.release(0, 1)
        assert not ra.records(0, bs)[1]
        assert [(g.p0, g.p1) for g in ra._groups] == [(0, 2 * bs), (2 * bs, 4 * bs)]
        ds.release()
        views, errors = ra.records(bs, len(seq))
        assert not errors and [int.from_bytes(bytes(v[:8]), "little") for v in views] == seq[bs:].tolist()
    finally:
        ds.release()
        ra.close()


def test_the_next_group_is_issued_as_soon_as_a_batch_is_handed_out():
    # The bytes handed out leave the budget at once: the next group's reads run beside the decode of
    # the batch just handed out, not from when the next batch is asked for.
    bs, size = 64, 64 * _KB  # 4 MiB batches: a floor of 16 MiB, groups of two batches
    ds = _Spaced(1024, size)
    seq = np.random.default_rng(3).permutation(1024).astype(np.int64)
    with ReadAhead(ds) as ra:
        ra.begin(seq)
        assert not ra.records(0, bs)[1]
        assert [(g.p0, g.p1) for g in ra._groups] == [(0, 2 * bs), (2 * bs, 4 * bs)]
        assert not ra.records(bs, 2 * bs)[1]  # the first group is handed out whole: the third is issued
        assert [(g.p0, g.p1) for g in ra._groups] == [(2 * bs, 4 * bs), (4 * bs, 6 * bs)]
        assert ra._inflight <= ra.budget


@pytest.mark.parametrize("queue_depth", [256, 16])
def test_a_group_of_few_reads_is_read_after_the_group_before_it(monkeypatch, queue_depth):
    # Two groups read at once share the device: the one needed first would be done later. A group of
    # at least queue_depth reads (128 here) is read first anyway: the next one's reads queue behind it.
    import fastload.records.readahead as readahead

    bs, size = 64, 64 * _KB
    ds = _Spaced(1024, size)
    seq = np.random.default_rng(4).permutation(1024).astype(np.int64)
    ds.gate(seq, bs)
    log: list[tuple[str, int]] = []
    lock = threading.Lock()
    read = ds.read_extent

    def logged(shard, start, end):
        batch = ds._batch_of[start // ds.stride] // 2  # the group: two batches
        with lock:
            log.append(("start", batch))
        data = read(shard, start, end)
        with lock:
            log.append(("end", batch))
        return data

    waited: list[list] = []
    real_wait = readahead.wait_all

    def recorded(futures):
        waited.append(list(futures))
        return real_wait(futures)

    monkeypatch.setattr(ds, "read_extent", logged)
    monkeypatch.setattr(readahead, "wait_all", recorded)
    # A fixed budget: groups of two batches throughout (the automatic one may grow here).
    ra = ReadAhead(ds, ReadOptions(queue_depth=queue_depth, budget=FLOOR_BATCHES * bs * size))
    try:
        ra.begin(seq)
        ds.release(0, 1)
        assert not ra.records(0, bs)[1]  # group 1 (batches 2-3) is issued, its reads gated
        assert (ra._groups[1].p0, ra._groups[1].p1) == (2 * bs, 4 * bs)  # a group: two batches (the log's unit)
        first = [r.future for r in ra._groups[1].reads]
        assert not ra.records(bs, 2 * bs)[1]  # group 2 is issued while group 1 is still being read
        ds.release()
        assert not ra.records(2 * bs, 6 * bs)[1]
    finally:
        ds.release()
        ra.close()
    if queue_depth < len(first):
        assert not any(set(w) & set(first) for w in waited)  # group 2 queued behind group 1 instead
        return
    # Group 2's reads waited for every read of group 1 (all gated when group 2 was issued), and each
    # group's reads started after the last read of the group before it ended.
    assert any(set(w) == set(first) for w in waited)
    groups = sorted({g for _, g in log})
    assert groups[:3] == [0, 1, 2]
    for g in groups[1:]:
        ended = max(i for i, e in enumerate(log) if e == ("end", g - 1))
        assert min(i for i, e in enumerate(log) if e == ("start", g)) > ended


class _Shards:
    """1,600 records of 64-128 KB in 8 shards (plans only: reads return nothing)."""

    def __init__(self):
        rng = np.random.default_rng(0)
        sizes = rng.integers(64 * _KB, 128 * _KB, 1600)
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


@pytest.mark.parametrize("windows", [[0, 800], []], ids=["two windows", "no windows"])
@pytest.mark.parametrize("gap", [64 * _KB, 1 << 20])
def test_the_small_budget_cuts_a_window_only_where_its_parts_cost_little_more(gap, windows):
    # 1,600 records from all 8 shards in two shuffle windows of 800 (or in a global order: the
    # epoch is the window); batches of 128 records (~12 MB).
    ds = _Shards()
    seq = np.random.default_rng(1).permutation(1600).astype(np.int64)
    sizes = ds.end[seq] - ds.start[seq]
    with ReadAhead(ds, ReadOptions(gap=gap)) as ra:
        ra.begin(seq, windows)
        ra.wait(0, 128)
        groups = [(g.p0, g.p1) for g in ra._groups]
        if gap == 1 << 20:
            # Few IOPS: a part of the window is read through the gaps its other records fill, at
            # about the cost of the whole window. The budget holds the window (or grows to its
            # ceiling): read once, whole.
            if windows:
                assert ra.budget == min(ra.ceiling, 2 * int(sizes[:800].sum())) > ra.floor
                assert groups[0] == (0, 800)
            else:
                assert ra.budget == ra.ceiling == NO_WINDOW_BUDGET
                assert sizes[: groups[0][1]].sum() > NO_WINDOW_BUDGET // 2 - int(sizes.max())
            assert ra.counters().grown == 1
        else:
            # A part costs about its own bytes: the window is read in parts of half the floor.
            assert ra.budget == ra.floor == FLOOR_BATCHES * int(sizes[:128].sum())
            assert groups[-1][1] < 800 and ra.counters().grown == 0
            assert ra._inflight <= ra.budget


class _Tracked(bytearray):
    """A read's buffer, counted while alive."""


class _PaddedRecords(FakeDataset):
    """FakeDataset's JPEGs as records of 256 KB each (the image, then padding), read as byte extents."""

    record = 256 * _KB

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.lock = threading.Lock()
        self.live = 0  # bytes of read buffers alive
        self.most = 0

    def extents(self, idx):
        idx = np.asarray(idx, dtype=np.int64)
        return np.zeros(len(idx), dtype=np.int64), idx * self.record, (idx + 1) * self.record

    def read_extent(self, shard, start, end):
        buf = _Tracked(end - start)
        for i in range(start // self.record, end // self.record):
            blob = self._blobs[i]
            at = i * self.record - start
            buf[at : at + len(blob)] = blob
        with self.lock:
            self.live += len(buf)
            self.most = max(self.most, self.live)
        weakref.finalize(buf, self._dead, len(buf))
        return buf

    def _dead(self, n: int) -> None:
        with self.lock:
            self.live -= n

    def image_from(self, i, data):
        return data[: len(self._blobs[i])]


def test_the_loader_frees_each_batchs_read_buffers_once_decoded():
    # Three epochs of 40 MB of records through an 8 MiB budget (batches of 4 MB): the read buffers
    # alive at any time stay within a few groups, however many epochs run (none is kept once its
    # batch is decoded).
    from fastload.loader import Loader, LoaderConfig
    from fastload.transforms import Resize

    ds = _PaddedRecords(160)
    budget = 8 << 20
    config = LoaderConfig(
        batch_size=16,
        transform=Resize(size=(16, 16)),
        num_threads=1,
        shuffle="global",
        seed=2,
        read_options=ReadOptions(budget=budget),
    )
    seen = []
    with Loader(ds, config) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:
                seen.append(batch.indices.copy())
                with ds.lock:
                    live = ds.live
                assert live <= 3 * budget
        reader = loader._pipeline.reads._reader
        assert reader.planned - reader._origin <= 2 * len(ds)  # the plan of the epochs before is forgotten
    assert sum(len(s) for s in seen) == 3 * len(ds)
    assert ds.most <= 3 * budget < 3 * len(ds) * ds.record / 4
    assert ds.live == 0  # closed: every buffer freed


def test_a_plan_extended_epoch_after_epoch_forgets_the_released_positions():
    bs = 16
    ds = _Spaced(256, 4 * _KB)
    rng = np.random.default_rng(3)
    with ReadAhead(ds) as ra:
        epochs = [rng.permutation(256).astype(np.int64) for _ in range(6)]
        ra.begin(epochs[0])
        got = []
        for e, seq in enumerate(epochs):
            base = e * 256
            for p in range(base, base + 256, bs):
                views, errors = ra.records(p, p + bs)
                assert not errors
                got += [int.from_bytes(bytes(v[:8]), "little") for v in views]
                if p == base + 256 - 2 * bs and e + 1 < len(epochs):
                    ra.extend(epochs[e + 1])  # the next epoch, planned before this one ends
                    assert ra.planned == base + 512
                    assert len(ra._seq) <= 2 * 256  # this epoch and the next: the ones before are forgotten
        assert got == np.concatenate(epochs).tolist()
        with pytest.raises(ValueError, match="released"):
            ra.records(0, bs)


@pytest.mark.parametrize("fmt", ["recordio", "lmdb"])
def test_large_reads_go_into_memory_mapped_for_them_alone(tiny_folder, tmp_path, monkeypatch, fmt):
    import mmap

    from fastload.errors import CorruptRecordError
    from fastload.loader import Loader, LoaderConfig
    from fastload.pack.packer import pack_folder
    from fastload.records import readahead
    from fastload.records.dataset import open_dataset
    from fastload.transforms import Resize

    out = str(tmp_path / "ds")
    pack_folder(tiny_folder, out, format=fmt, shards=2, progress=False, workers=1)
    monkeypatch.setattr(readahead, "_MAPPED_READ", 1)  # every read, however small
    with open_dataset(out) as ds:
        seq = np.arange(len(ds), dtype=np.int64)
        shard, start, end = ds.extents(seq)
        for s in np.unique(shard).tolist():
            lo, hi = int(start[shard == s].min()), int(end[shard == s].max())
            buf = bytearray(hi - lo)
            ds.read_extent_into(s, lo, memoryview(buf))
            assert bytes(buf) == ds.read_extent(s, lo, hi)
            with pytest.raises(CorruptRecordError, match="ends at byte"):
                ds.read_extent_into(s, hi, memoryview(bytearray(ds.shards[s].size)))  # past the end
        with ReadAhead(ds, ReadOptions(gap=1 << 20)) as ra:
            ra.begin(seq[::-1].copy())
            views, errors = ra.records(0, len(ds))
            assert not errors and [bytes(v) for v in views] == [bytes(ds.image(int(i))) for i in seq[::-1]]
            assert all(isinstance(v.obj, mmap.mmap) for v in views)
        # Decoded from those mappings, the batches are those read one by one.
        config = LoaderConfig(batch_size=8, transform=Resize(size=(16, 16)), num_threads=1, shuffle="global")
        got = []
        for reads in (ReadOptions(), None):
            with Loader(ds, dataclasses.replace(config, read_options=reads)) as loader:
                got.append([(b.indices.copy(), b.images.copy()) for b in loader])
        for (ia, xa), (ib, xb) in zip(*got, strict=True):
            np.testing.assert_array_equal(ia, ib)
            np.testing.assert_array_equal(xa, xb)
    with pytest.raises(ValueError, match="closed"):
        ds.read_extent_into(0, 0, memoryview(bytearray(1)))
