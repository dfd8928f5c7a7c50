"""Loader lifecycle across threads: close() while a consumer waits, one pass at a time, handing a loader over."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from fake_dataset import FakeDataset

import fastload.errors as errors
from fastload.decode import decode_batch
from fastload.loader import Loader, LoaderConfig
from fastload.transforms import train

from conftest import HAVE_ENGINE, join_threads, requires_torch, watch_prefetch

SIZE = 16


@pytest.fixture(params=["engine", "pillow"])
def backend(request, monkeypatch):
    """Run on the C++ engine and on the Pillow path (FASTLOAD_DECODER=pillow)."""
    if request.param == "engine":
        if not HAVE_ENGINE:
            pytest.skip("the C++ engine is not built")
        monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    else:
        monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    return request.param


def cfg(**kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("transform", train(SIZE))
    kw.setdefault("num_threads", 2)
    kw.setdefault("shuffle", "none")
    return LoaderConfig(**kw)


def producer_threads():
    return [t for t in threading.enumerate() if t.name.startswith("fastload-loader")]


def no_producer_left(timeout=10.0):
    """Joins the producer threads: True once none is left (False at the deadline)."""
    return not join_threads(lambda t: t.name.startswith("fastload-loader"), timeout)


def raised(fn):
    """The exception ``fn()`` raises (None if it returns)."""
    try:
        fn()
    except BaseException as exc:
        return exc
    return None


def is_closed_error(exc):
    return isinstance(exc, errors.FastloadError) and type(exc).__name__ == "LoaderClosed"


def is_busy_error(exc):
    return isinstance(exc, errors.FastloadError) and type(exc).__name__ == "LoaderBusy"


class GatedDecode:
    """decode_batch that blocks (after ``free`` batches) until ``gate`` is set: a consumer then waits."""

    def __init__(self, free=0):
        self.gate = threading.Event()
        self.calls = 0
        self.free = free

    def __call__(self, images, out, transform, **kw):
        self.calls += 1
        if self.calls > self.free:
            self.gate.wait(30)
        return decode_batch(images, out, transform, **kw)


# --- close() from another thread ---------------------------------------------------------------------


def close_once_waiting(loader, waits):
    """A thread that closes ``loader`` once its consumer waits for a batch (a wait begun after this call)."""
    since = waits.mark()

    def close():
        waits.wait("get", since, 10, "wait of the consumer for a batch")
        loader.close()

    return threading.Thread(target=close, name="closer")


def test_close_from_another_thread_raises_loader_closed_in_the_waiting_consumer(backend, monkeypatch):
    ds = FakeDataset(40)
    waits = watch_prefetch(monkeypatch)
    decode = GatedDecode(free=1)
    loader = Loader(ds, cfg(), decode=decode)
    it = iter(loader)
    first = next(it)  # the next batch's decode is blocked: the consumer will wait
    assert first.size == 4
    closer = close_once_waiting(loader, waits)
    closer.start()
    t0 = time.monotonic()
    exc = raised(lambda: next(it))
    waited = time.monotonic() - t0
    decode.gate.set()
    closer.join()
    assert is_closed_error(exc), f"a consumer waiting while close() ran got {exc!r}"
    assert "closed" in str(exc) and isinstance(exc, ValueError)
    assert waited < 10
    # And after close: next() and iter() raise it too; nothing keeps running.
    assert is_closed_error(raised(lambda: next(it)))
    assert is_closed_error(raised(lambda: iter(loader)))
    assert no_producer_left()
    assert first.size == 4 and first.images.shape == (4, 3, SIZE, SIZE)  # a held batch is still readable


def test_a_for_loop_does_not_end_silently_when_another_thread_closes(backend):
    ds = FakeDataset(200)
    loader = Loader(ds, cfg(prefetch=1))
    seen = []
    closer = threading.Thread(target=loader.close, name="closer")

    def train_loop():
        for b in loader:
            if not seen:
                closer.start()  # another thread closes the loader while this loop runs
                closer.join(10)  # (this step lasts until it has)
            seen.append(b.number)

    exc = raised(train_loop)
    closer.join()
    assert is_closed_error(exc), f"the loop ended with {exc!r} after {len(seen)} of {len(loader)} batches"
    assert 0 < len(seen) < len(loader)
    assert no_producer_left()


def test_close_is_idempotent_from_many_threads_at_once():
    ds = FakeDataset(40)
    loader = Loader(ds, cfg(prefetch=1))
    it = iter(loader)
    next(it)
    barrier = threading.Barrier(4)
    failures = []

    def close():
        barrier.wait()
        exc = raised(loader.close)
        if exc is not None:
            failures.append(exc)

    threads = [threading.Thread(target=close) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not failures and loader.closed and no_producer_left()


@requires_torch
def test_torch_dataloader_close_from_another_thread(monkeypatch):
    pytest.importorskip("torch")
    from fastload.torch import DataLoader

    decode_gate, decoding = threading.Event(), threading.Event()
    waits = watch_prefetch(monkeypatch)
    ds = FakeDataset(40)
    loader = DataLoader(ds, batch_size=4, transform=train(SIZE), shuffle=False, num_threads=1, prefetch=1)
    it = iter(loader)
    next(it)
    # The consumer drains what was prefetched, then really waits on the producer: block its decode.
    real = loader.loader._driver._pipeline._decode

    def slow(*a, **kw):
        decoding.set()
        decode_gate.wait(30)
        return real(*a, **kw)

    loader.loader._driver._pipeline._decode = slow

    def close_once_the_consumer_waits():
        assert decoding.wait(10), "the producer never started the blocked decode"
        since = waits.mark()
        waits.wait("get", since, 10, "wait of the consumer for a batch")
        loader.close()

    closer = threading.Thread(target=close_once_the_consumer_waits, name="closer")
    closer.start()
    exc = raised(lambda: [next(it) for _ in range(20)])
    decode_gate.set()
    closer.join(30)
    assert is_closed_error(exc), repr(exc)
    assert no_producer_left()


# --- one pass at a time ---------------------------------------------------------------------------------


def test_a_second_thread_is_refused_while_a_pass_is_open(backend):
    ds = FakeDataset(40)
    with Loader(ds, cfg(shuffle="global", seed=1)) as loader:
        with Loader(ds, cfg(shuffle="global", seed=1, copy=True)) as ref_loader:
            reference = [b.indices.tolist() for b in ref_loader]
        a_has_started, b_has_checked = threading.Event(), threading.Event()
        a_batches, a_errors = [], []

        def consumer_a():
            try:
                for b in loader:
                    a_batches.append(b.indices.tolist())
                    if len(a_batches) == 1:
                        a_has_started.set()
                        b_has_checked.wait(10)
            except BaseException as exc:
                a_errors.append(exc)

        a = threading.Thread(target=consumer_a, name="consumer-A")
        a.start()
        assert a_has_started.wait(10)
        try:
            busy_iter = raised(lambda: iter(loader))
            a_iterator = loader._driver._pass.iterator()
            busy_next = raised(lambda: next(a_iterator))
            busy_epoch = raised(lambda: loader.set_epoch(3))
            busy_state = raised(lambda: loader.load_state_dict(loader.state_dict()))
            state = loader.state_dict()  # reading the position is fine from any thread
        finally:
            b_has_checked.set()
            a.join(20)
        for exc in (busy_iter, busy_next, busy_epoch, busy_state):
            assert is_busy_error(exc), f"another thread's operation during A's pass gave {exc!r}"
        assert "consumer-A" in str(busy_iter)
        assert (state["epoch"], state["consumed"]) == (0, [[1, 4]])  # one batch of 4 handed out
        # A got its whole epoch, exactly, undisturbed.
        assert not a_errors and a_batches == reference
        # Once A's pass is over, another thread may iterate (the next epoch).
        b_batches = []
        t = threading.Thread(target=lambda: b_batches.extend(b.indices.tolist() for b in loader))
        t.start()
        t.join(20)
        assert len(b_batches) == len(reference) and loader.epoch == 2


def test_a_dropped_or_orphaned_pass_does_not_block_other_threads(backend):
    ds = FakeDataset(40)
    with Loader(ds, cfg()) as loader:
        # A breaks out of its loop: the iterator is dropped, the pass is over.
        def breaks():
            for _ in loader:
                break

        t = threading.Thread(target=breaks)
        t.start()
        t.join(10)
        assert sum(1 for _ in loader) == len(loader)

        # A's thread ends while its iterator object lives on: the pass is orphaned, not open.
        kept = []
        t = threading.Thread(target=lambda: kept.append(iter(loader)) or next(kept[0]))
        t.start()
        t.join(10)
        assert len(kept) == 1
        assert sum(1 for _ in loader) == len(loader)
        # That old iterator, used later, just ends (its pass was replaced).
        assert isinstance(raised(lambda: next(kept[0])), StopIteration)


def test_same_thread_semantics_are_unchanged(backend):
    ds = FakeDataset(40)
    with Loader(ds, cfg(shuffle="global")) as loader:
        first = iter(loader)
        taken = [next(first).indices.tolist() for _ in range(2)]
        second = iter(loader)  # a new pass in the same thread ends the first one
        assert isinstance(raised(lambda: next(first)), StopIteration)
        again = [b.indices.tolist() for b in second]
        assert again[:2] == taken and len(again) == len(loader)
        loader.set_epoch(0)
        it = iter(loader)
        next(it)
        loader.set_epoch(0)  # ends the pass, same thread
        assert isinstance(raised(lambda: next(it)), StopIteration)


def test_iterating_a_loader_created_in_another_thread():
    """Ownership is per pass, not per loader: building in one thread and iterating in another is fine."""
    ds = FakeDataset(20)
    made = []
    t = threading.Thread(target=lambda: made.append(Loader(ds, cfg())))
    t.start()
    t.join(10)
    with made[0] as loader:
        assert sum(b.size for b in loader) == 20
        assert np.array_equal(np.sort(np.concatenate([b.indices for b in loader])), np.arange(20))
