"""Soak: hundreds of create/iterate/close cycles and ten epochs keep threads, file descriptors and RSS bounded.

Bounds (stated here, checked below), after a warm-up that lets allocator pools and caches settle:

- threads: back to the count before the cycles (no producer thread outlives its loader);
- open file descriptors: back to the count before the cycles (shards, indexes, mmaps closed);
- RSS: grows by less than ``RSS_BOUND_MB`` over the cycles (one loader's ring here is ~3 MB, so
  rings kept alive by reference cycles until a full garbage collection -- what made
  ``fastload.torch.DataLoader`` grow from 242 to 455 MB over 200 cycles -- would exceed it).

A closed or dropped loader frees its ring at once, without a garbage-collection pass: checked
directly with the collector disabled.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref

import numpy as np
import pytest

from fastload.loader import Loader, LoaderConfig
from fastload.records.readahead import ReadOptions
from fastload.transforms import train

from conftest import join_threads, requires_torch

CYCLES = 200
WARMUP = 20
RSS_BOUND_MB = 24
SIZE = 128
BATCH = 16

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc (Linux)")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fastload_threads():
    return {t for t in threading.enumerate() if t.name.startswith("fastload")}


@pytest.fixture(autouse=True)
def earlier_threads():
    """fastload threads that exist before the test (a shared Pillow pool, other tests' leftovers)."""
    global _EARLIER
    _EARLIER = fastload_threads()
    return


_EARLIER = set()


def wait_for_no_fastload_threads(timeout=10.0) -> bool:
    """No fastload thread besides those that existed before the test (each one joined, with a deadline)."""
    left = join_threads(lambda t: t.name.startswith("fastload") and t not in _EARLIER, timeout)
    assert not left, f"threads left running: {left}"
    return True


@pytest.fixture(scope="module")
def packed(tiny_folder, tmp_path_factory):
    from fastload.pack.packer import pack_folder

    out = tmp_path_factory.mktemp("soak") / "packed"
    pack_folder(str(tiny_folder), str(out), progress=False, workers=1)
    return str(out)


def cfg(**kw):
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("transform", train(SIZE))
    kw.setdefault("num_threads", 2)
    return LoaderConfig(**kw)


def soak(make, iterate):
    """Run WARMUP then CYCLES create/iterate/close cycles; returns (threads, fds, rss) before and after."""
    for _ in range(WARMUP):
        loader = make()
        iterate(loader)
        loader.close()
    assert wait_for_no_fastload_threads()
    before = (threading.active_count(), open_fds(), rss_mb())
    peak = before[2]
    for k in range(CYCLES):
        loader = make()
        iterate(loader)
        loader.close()
        del loader
        if k % 10 == 0:
            peak = max(peak, rss_mb())
    assert wait_for_no_fastload_threads()
    after = (threading.active_count(), open_fds(), rss_mb())
    return before, after, max(peak, after[2])


def check(before, after, peak, what):
    assert after[0] == before[0], f"{what}: {after[0] - before[0]} thread(s) left over"
    assert after[1] == before[1], f"{what}: {after[1] - before[1]} file descriptor(s) left open"
    grown = peak - before[2]
    assert grown < RSS_BOUND_MB, f"{what}: RSS grew by {grown:.1f} MB over {CYCLES} cycles (bound {RSS_BOUND_MB} MB)"


def test_loader_create_iterate_close_cycles(packed):
    def iterate(loader):
        n = sum(b.size for b in loader)
        assert n == 40

    before, after, peak = soak(lambda: Loader(packed, cfg(shuffle="global")), iterate)
    check(before, after, peak, "fastload.Loader")


@requires_torch
def test_torch_dataloader_create_iterate_close_cycles(packed):
    pytest.importorskip("torch")
    from fastload.torch import DataLoader

    def make():
        return DataLoader(packed, batch_size=BATCH, transform=train(SIZE), num_threads=2, shuffle=True)

    def iterate(loader):
        n = 0
        for x, _y in loader:
            n += x.shape[0]
        assert n == 40

    before, after, peak = soak(make, iterate)
    check(before, after, peak, "fastload.torch.DataLoader")


@requires_torch
def test_ten_epochs_keep_one_thread_and_flat_memory(packed):
    pytest.importorskip("torch")
    from fastload.torch import DataLoader

    with DataLoader(packed, batch_size=BATCH, transform=train(SIZE), num_threads=2, shuffle=True) as loader:
        for x, _y in loader:  # epoch 0 warms up
            pass
        before = (open_fds(), rss_mb())
        seen_readers: set[threading.Thread] = set()
        seen_handovers: set[threading.Thread] = set()
        for epoch in range(1, 11):
            loader.set_epoch(epoch)
            n = 0
            for x, _y in loader:
                n += x.shape[0]
            assert n == 40
            mine = fastload_threads() - _EARLIER
            readers = {t for t in mine if t.name.startswith("fastload-read")}
            handovers = {t for t in mine if t.name.startswith("fastload-handover")}
            assert len(mine - readers - handovers) <= 1, "one producer thread per loader"
            assert len(handovers) <= 1, "one hand-over thread per loader"
            seen_handovers |= handovers
            # the read-ahead pool is the loader's, reused epoch after epoch, never one per epoch
            assert len(readers) <= ReadOptions().queue_depth, sorted(t.name for t in readers)
            seen_readers |= readers
        after = (open_fds(), rss_mb())
        s = loader.stats()
    assert after[0] == before[0]
    assert after[1] - before[1] < RSS_BOUND_MB
    assert s.ring_slots == 4 and s.fresh_batches == 0  # take-use-drop never grows the ring
    assert len(seen_readers) <= ReadOptions().queue_depth, "read threads are not replaced epoch after epoch"
    assert len(seen_handovers) <= 1, "the hand-over thread is not replaced epoch after epoch"
    assert wait_for_no_fastload_threads()


def test_a_closed_or_dropped_loader_frees_its_ring_without_garbage_collection(packed):
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        loader = Loader(packed, cfg())
        for batch in loader:
            pass
        del batch  # (a batch still held would keep its own slot, as it should)
        slot_memory = weakref.ref(loader.ring.slots[0].owners["images"])
        loader.close()
        assert slot_memory() is None, "close() kept the ring's memory"
        # Dropped without close(): freed by reference counting alone, and the thread stops.
        loader = Loader(packed, cfg())
        it = iter(loader)
        next(it)
        dropped = weakref.ref(loader)
        slot_memory = weakref.ref(loader.ring.slots[1].owners["images"])
        del loader, it
        assert dropped() is None, "a reference cycle keeps a dropped loader alive until a garbage collection"
        assert slot_memory() is None
        assert wait_for_no_fastload_threads()
    finally:
        if was_enabled:
            gc.enable()


@requires_torch
def test_a_dropped_torch_dataloader_is_freed_without_garbage_collection(packed):
    pytest.importorskip("torch")
    from fastload.torch import DataLoader

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        loader = DataLoader(packed, batch_size=BATCH, transform=train(SIZE), num_threads=2)
        for x, y in loader:
            pass
        del x, y
        slot_memory = weakref.ref(loader.loader.ring.slots[0].owners["images"])
        dropped = weakref.ref(loader)
        loader.close()
        del loader
        assert dropped() is None, "a reference cycle keeps a closed DataLoader alive until a garbage collection"
        assert slot_memory() is None
        assert wait_for_no_fastload_threads()
    finally:
        if was_enabled:
            gc.enable()


def test_a_kept_batch_outlives_its_closed_loader(packed):
    """Memory a user still holds stays valid after close (only that slot); the rest is freed."""
    loader = Loader(packed, cfg(shuffle="none"))
    batch = next(iter(loader))
    saved = batch.images.copy()
    others = [weakref.ref(s.owners["images"]) for s in loader.ring.slots if s.id != batch.slot]
    loader.close()
    del loader
    np.testing.assert_array_equal(batch.images, saved)
    assert all(r() is None for r in others)
