"""Why the batch ring's producer waits, counted by reason: back-pressure (the consumer is slower), a slot
not back yet, a device fence. A slot whose batch the consumer dropped is free at once (reference
counts), a consumer that keeps batches gets slots before the producer would wait, and fences are
waited for with the fence's own host wait, never a sleep loop. Counters and events, no timings."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fake_dataset import FakeDataset

from fastload.batch import HELD_BATCHES, WAIT_REASONS, BatchRing
from fastload.loader import Loader, LoaderConfig
from fastload.transforms import train


def _ring(num_slots=4, **kw):
    kw.setdefault("ahead", num_slots - HELD_BATCHES)
    return BatchRing({"x": ((2,), np.int64)}, num_slots=num_slots, **kw)


def _produce(ring, stop, out, count):
    for _ in range(count):
        slot = ring.acquire(stop)
        if slot is None:
            return
        out.append(ring.lease(slot))


def test_a_dropped_batch_frees_its_slot_at_once_without_a_wait():
    ring = _ring(num_slots=3, ahead=3, max_extra_slots=0)
    stop = threading.Event()
    batches = []
    _produce(ring, stop, batches, 3)
    for b in batches:
        ring.taken(b.slot, b._generation)
    # Every slot is held by the consumer; dropping one batch is what frees a slot, at once.
    del batches[0]
    slot = ring.acquire(stop)
    assert slot is not None and slot.id == 0
    assert ring.waits == dict.fromkeys(WAIT_REASONS, 0)


def test_back_pressure_is_counted_as_a_consumer_wait_and_ends_when_a_batch_is_taken():
    events = []
    waiting = threading.Event()

    def on_wait(reason, t0, t1):
        events.append((reason, t1 >= t0))
        waiting.set()

    # A short poll: a blocked producer reports a wait span at least every 10 ms.
    ring = _ring(num_slots=4, on_wait=on_wait, poll=0.01)
    stop = threading.Event()
    queued = []
    _produce(ring, stop, queued, 2)  # `ahead` (2) batches wait for the consumer
    got = []
    producer = threading.Thread(target=_produce, args=(ring, stop, got, 1))
    producer.start()
    assert waiting.wait(timeout=30)  # it cannot go on before the consumer takes a batch
    assert got == []
    ring.taken(queued[0].slot, queued[0]._generation)  # the consumer takes one: the producer goes on
    producer.join(timeout=30)
    assert not producer.is_alive() and len(got) == 1
    assert ring.waits == {"consumer": 1, "slot": 0, "fence": 0}
    assert events and all(reason == "consumer" and ordered for reason, ordered in events)
    assert ring.wait_seconds["consumer"] > 0 and ring.wait_seconds["slot"] == 0


def test_a_consumer_keeping_batches_gets_a_new_slot_instead_of_a_wait():
    ring = _ring(num_slots=4, max_extra_slots=3)
    stop = threading.Event()
    kept = []
    for _ in range(6):  # each batch taken and kept: the consumer holds more than HELD_BATCHES
        got = []
        _produce(ring, stop, got, 1)
        ring.taken(got[0].slot, got[0]._generation)
        kept.append(got[0])
    assert len(ring.slots) == 6 and ring.extra_slots == 2
    assert ring.waits == dict.fromkeys(WAIT_REASONS, 0)
    assert all(b.intact for b in kept)


class _QueryOnly:
    def __init__(self):
        self.done = False
        self.queries = 0

    def query(self):
        self.queries += 1
        return self.done


class _Synchronizing(_QueryOnly):
    def __init__(self):
        super().__init__()
        self.synchronized = 0

    def synchronize(self):
        self.synchronized += 1
        self.done = True


def test_a_pending_fence_is_waited_for_with_its_synchronize():
    fence = _Synchronizing()
    events = []
    ring = _ring(num_slots=3, ahead=3, max_extra_slots=0, on_wait=lambda *e: events.append(e[0]))
    stop = threading.Event()
    b = []
    _produce(ring, stop, b, 3)
    for x in b:
        ring.taken(x.slot, x._generation)
    b[0].add_fence(fence)
    del b[0]
    slot = ring.acquire(stop)
    assert slot is not None and slot.id == 0
    assert fence.synchronized == 1 and fence.queries <= 2  # asked, then waited for: no polling
    assert ring.waits["fence"] == 1 and events == ["fence"]


def test_a_free_slot_without_pending_fences_goes_first():
    fence = _Synchronizing()
    ring = _ring(num_slots=4, ahead=4, max_extra_slots=0)
    stop = threading.Event()
    b = []
    _produce(ring, stop, b, 4)
    for x in b:
        ring.taken(x.slot, x._generation)
    b[0].add_fence(fence)  # the oldest free slot is fenced, the next one is not
    del b[0]
    del b[0]
    slot = ring.acquire(stop)
    assert slot is not None and slot.id == 1
    assert fence.synchronized == 0 and ring.waits["fence"] == 0


def test_a_query_only_fence_still_completes_and_stop_ends_the_wait():
    fence = _QueryOnly()
    ring = _ring(num_slots=3, ahead=3, max_extra_slots=0, poll=0.01)
    stop = threading.Event()
    b = []
    _produce(ring, stop, b, 3)
    for x in b:
        ring.taken(x.slot, x._generation)
    b[0].add_fence(fence)
    del b[0]
    got = []
    producer = threading.Thread(target=_produce, args=(ring, stop, got, 1))
    producer.start()
    fence.done = True
    producer.join(timeout=30)
    assert not producer.is_alive() and len(got) == 1 and got[0].slot == 0

    fence2 = _QueryOnly()
    got[0].add_fence(fence2)
    ring.taken(got[0].slot, got[0]._generation)
    del got[0]
    producer = threading.Thread(target=_produce, args=(ring, stop, got, 1))
    producer.start()
    stop.set()
    ring.wake()
    producer.join(timeout=30)
    assert not producer.is_alive() and got == []
    assert ring.waits["fence"] >= 1


@pytest.mark.parametrize("keep", [0, 5])
def test_the_loader_reports_back_pressure_apart_from_slot_waits(keep):
    ds = FakeDataset(64)
    config = LoaderConfig(batch_size=4, transform=train(16), num_threads=1, shuffle="none", prefetch=2)
    with Loader(ds, config) as loader:
        ring = loader.ring
        backpressure = threading.Event()
        report = ring._on_wait  # the loader's: into its stats

        def on_wait(reason, t0, t1):
            report(reason, t0, t1)
            if reason == "consumer":
                backpressure.set()

        ring._on_wait = on_wait
        it = iter(loader)
        kept = [next(it)]
        # The producer runs `prefetch` batches ahead of a consumer that has stopped: back-pressure.
        assert backpressure.wait(timeout=60)
        for b in it:
            if len(kept) < keep:
                kept.append(b)
        stats = loader.stats()
        assert ring.waits["consumer"] >= 1 and stats.seconds["wait_consumer"] > 0
        assert ring.waits["slot"] == 0 and ring.waits["fence"] == 0
        assert stats.seconds["wait_slot"] == 0
        assert all(b.intact for b in kept)
        if keep:
            assert ring.extra_slots > 0  # kept batches grew the ring; no wait for them


def test_a_wait_that_began_before_reset_stats_counts_from_the_reset():
    import time

    from fastload.stats import Stage, StageTimer

    timer = StageTimer()
    start = time.perf_counter()
    timer.reset()
    reset_at = timer._since
    timer.add(Stage.WAIT_CONSUMER, start, reset_at + 0.5)
    assert timer.snapshot().seconds["wait_consumer"] == pytest.approx(0.5)
    timer.add(Stage.WAIT_SLOT, start, start + 1e-9)  # entirely before the reset
    assert timer.snapshot().seconds["wait_slot"] == 0.0
