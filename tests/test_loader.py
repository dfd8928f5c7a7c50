"""Loader stage: ring ownership, prefetch lifecycle, resume, bad records, stats, ImageFolder."""

import _thread
import gc
import json
import logging
import signal
import threading
import time
import traceback

import numpy as np
import pytest
from fake_dataset import FakeDataset, jpeg_bytes

from fastload.batch import BatchRing, Layout, image_fields
from fastload.decode import decode_batch
from fastload.errors import DecodeError, KeptBatchesWarning, LoaderClosed
from fastload.loader import Loader, LoaderConfig
from fastload.order import EpochOrder
from fastload.prefetch import Producer
from fastload.transforms import eval_transform, train

from conftest import join_threads, watch_prefetch, watch_ring

SIZE = 16


def cfg(**kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("transform", train(SIZE))
    kw.setdefault("num_threads", 2)
    return LoaderConfig(**kw)


def producer_threads():
    return [t for t in threading.enumerate() if t.name.startswith(("fastload-loader", "fastload-test"))]


def no_producer_left(timeout=10.0):
    """Joins the producer threads: True once none is left (False at the deadline)."""
    return not join_threads(lambda t: t.name.startswith(("fastload-loader", "fastload-test")), timeout)


def run_epoch(loader):
    return [(b.indices.copy(), b.labels.copy(), b.images.copy()) for b in loader]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (ia, la, xa), (ib, lb, xb) in zip(a, b, strict=False):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(xa, xb)


@pytest.fixture(scope="module")
def ds():
    return FakeDataset(61)


# --- basics -------------------------------------------------------------------------------------


def test_epoch_covers_dataset_with_right_shapes_and_labels(ds):
    with Loader(ds, cfg(shuffle="global", layout="NHWC", copy=True)) as loader:
        assert len(loader) == 8
        batches = list(loader)  # copies: safe to keep
        assert len(batches) == 8 and batches[-1].size == 61 - 7 * 8
        idx = np.concatenate([b.indices for b in batches])
        assert sorted(idx.tolist()) == list(range(61))
        assert not np.array_equal(idx, np.arange(61))
        b = batches[0]
        assert b.images.shape == (8, SIZE, SIZE, 3) and b.images.dtype == np.uint8
        assert b.labels.shape == (8, 1) and b.labels.dtype == np.float32
        np.testing.assert_array_equal(b.labels[:, 0], ds.labels[b.indices, 0])


def test_pixels_match_decode_engine_called_directly(ds):
    t = train(SIZE)
    with Loader(ds, cfg(shuffle="none", transform=t, seed=5)) as loader:
        loader.set_epoch(3)
        b = next(iter(loader))
        ref = np.empty((8, 3, SIZE, SIZE), np.uint8)
        decode_batch([ds.image(i) for i in range(8)], ref, t, seed=5, epoch=3, indices=np.arange(8, dtype=np.int64))
        np.testing.assert_array_equal(b.images, ref)


def test_read_ahead_hints_follow_the_order(ds):
    # Without read options: records read one by one, the OS hinted `read_ahead` batches ahead.
    ds = FakeDataset(40)
    with Loader(ds, cfg(shuffle="global", read_ahead=2, prefetch=1, read_options=None)) as loader:
        watch = watch_ring(loader.ring)
        batches = [b.indices.copy() for b in loader]
        watch.wait_idle()  # the producer has run on into epoch 1 (as far as the ring lets it)
        next_epoch = EpochOrder(loader.order_spec, 1)
        stream = loader._stream
        first = next(iter(loader))
        assert loader._stream is stream, "the next pass continues the running producer"
        np.testing.assert_array_equal(first.indices, next_epoch[0])
    hinted = [h.tolist() for h in ds.will_need_calls]
    assert hinted[: len(batches)] == [b.tolist() for b in batches], "each batch hinted once, in decode order"
    assert hinted[len(batches)] == next_epoch[0].tolist()


def test_repeated_iteration_advances_epochs_and_set_epoch(ds):
    with Loader(ds, cfg(shuffle="global")) as loader:
        e0 = run_epoch(loader)
        e1 = run_epoch(loader)
        assert loader.epoch == 2
        loader.set_epoch(0)
        assert_same_batches(run_epoch(loader), e0)
        assert not np.array_equal(e0[0][0], e1[0][0])


def test_break_then_iterate_replays_the_epoch_and_stops_thread(ds):
    with Loader(ds, cfg(shuffle="global")) as loader:
        full = run_epoch(loader)
        loader.set_epoch(0)
        for k, _b in enumerate(loader):
            if k == 2:
                break
        again = run_epoch(loader)
        assert_same_batches(again, full)
    assert not producer_threads()


# --- resume ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop_after", [0, 3, 7, 8, 11])
def test_resume_equals_uninterrupted_run(ds, stop_after):
    """stop_after counts batches over two epochs of 8; 8 is exactly the epoch boundary."""
    config = cfg(shuffle="block", block_size=5, window=2, seed=11)
    with Loader(ds, config) as loader:
        reference = run_epoch(loader) + run_epoch(loader)
    with Loader(ds, config) as first:
        taken = 0
        while taken < stop_after:
            for _b in first:
                taken += 1
                if taken == stop_after:
                    break
        state = first.state_dict()
    assert json.loads(json.dumps(state)) == state
    with Loader(ds, config) as second:
        second.load_state_dict(state)
        resumed = []
        while len(resumed) < 16 - stop_after:
            resumed += run_epoch(second)
    assert_same_batches(resumed, reference[stop_after:])


def test_state_at_epoch_end_points_to_next_epoch(ds):
    with Loader(ds, cfg()) as loader:
        run_epoch(loader)
        state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, [])


def test_load_state_dict_rejects_other_orders(ds):
    with Loader(ds, cfg(seed=1)) as a, Loader(ds, cfg(seed=2)) as b:
        with pytest.raises(ValueError, match="seed"):
            b.load_state_dict(a.state_dict())
        with pytest.raises(ValueError, match="not a fastload loader state"):
            b.load_state_dict({"epoch": 0})


# --- ring ownership ---------------------------------------------------------------------------------


class _Filled:
    backend, errors, ok, sliced, slice_fallbacks = "synthetic", {}, True, 0, 0


def pattern_decode(images, out, transform, **kw):
    """Pixels that are a function of the record index, without a decoder.

    For tests of the ring that check warnings: the Pillow path's per-thread ``catch_warnings`` (not
    thread-safe) can swallow a warning the consumer thread issues meanwhile.
    """
    for pos, i in enumerate(kw["indices"]):
        out[pos] = (int(i) * 37 + np.arange(out[pos].size).reshape(out[pos].shape)) % 251
    return _Filled()


def test_held_batch_is_never_overwritten_within_its_lifetime(monkeypatch):
    ds = FakeDataset(60)
    waits = watch_prefetch(monkeypatch)
    with Loader(ds, cfg(prefetch=2, shuffle="global", max_extra_slots=2), decode=pattern_decode) as loader:
        watch = watch_ring(loader.ring, waits)
        held = []  # (batch, saved copy)
        with pytest.warns(KeptBatchesWarning) as warned:
            for _epoch in range(2):  # kept across the epoch boundary too
                for b in loader:
                    held.append((b, b.images.copy(), b.indices.copy()))
                    # The producer has run ahead and refilled whatever it may.
                    watch.wait_idle()
                    for batch, images, indices in held:  # every batch kept so far
                        assert batch.intact
                        np.testing.assert_array_equal(batch.images, images)
                        np.testing.assert_array_equal(batch.indices, indices)
        assert {b.epoch for b, _, _ in held} == {0, 1}
        assert len(warned) == 1
        # The ring grew to its bound (4 + 2 slots), then batches came in fresh memory.
        s = loader.stats()
        assert s.ring_slots == 6 and s.fresh_batches > 0
        # (the producer may have made a few more, for the next epoch, waiting in the queue)
        assert 0 < sum(b.slot == -1 for b, _, _ in held) <= s.fresh_batches


def test_dropped_batches_are_recycled_without_growth():
    ds = FakeDataset(60)
    with Loader(ds, cfg(prefetch=2, shuffle="global")) as loader:
        watch = watch_ring(loader.ring)
        slots = set()
        for _epoch in range(3):
            for b in loader:
                slots.add(b.slot)
                watch.wait_idle()  # the producer has filled every slot it may: the ring is at its fullest
        s = loader.stats()
    assert slots == {0, 1, 2, 3} and s.ring_slots == 4 and s.fresh_batches == 0 and s.gc_runs == 0


def test_release_and_fence_control_slot_reuse():
    class Fence:
        done = False

        def __init__(self):
            self.queried = threading.Event()  # the producer asked: it waits for this fence

        def query(self):
            self.queried.set()
            return self.done

    ds = FakeDataset(200)
    with Loader(ds, cfg(prefetch=1, batch_size=4)) as loader:  # 3 slots
        it = iter(loader)
        b0 = next(it)
        slot0 = b0.slot
        fence = Fence()
        b0.add_fence(fence)
        generation = loader.ring.slot_generation(slot0)
        del b0  # the lease is gone, but the fence is pending
        b1, b2 = next(it), next(it)  # held: only slot0 could be refilled
        assert fence.queried.wait(10), "the producer never waited for the fence"
        assert loader.ring.slot_generation(slot0) == generation, "refilled before its fence completed"
        fence.done = True
        b3 = next(it)  # only b0's slot was free: b3 could be made only after the fence completed
        assert b3.slot == slot0 and loader.ring.slot_generation(slot0) == generation + 1
        # release() gives a slot back before its arrays die.
        b1.release()
        b1.release()  # idempotent
        b4 = next(it)
        assert b4.slot == b1.slot and not b1.intact and b2.intact and b3.intact


def test_copy_option_hands_out_owned_batches(ds):
    with Loader(ds, cfg(copy=True, prefetch=1)) as loader:
        batches = list(loader)
    assert all(b.slot == -1 and b.intact for b in batches)
    with Loader(ds, cfg(prefetch=1)) as loader:
        ref = run_epoch(loader)
    assert_same_batches([(b.indices, b.labels, b.images) for b in batches], ref)


def test_allocator_is_used_for_every_buffer(ds):
    calls = []

    def allocator(shape, dtype):
        arr = np.zeros(shape, dtype)
        calls.append((shape, dtype))
        return arr, ("owner", arr)

    with Loader(ds, cfg(prefetch=2, layout="NCHW"), allocator=allocator) as loader:
        b = next(iter(loader))
        assert b.owners["images"][0] == "owner"
        assert np.shares_memory(b.images, b.owners["images"][1])
    assert len(calls) == 3 * 4
    assert ((8, 3, SIZE, SIZE), np.dtype(np.uint8)) in calls


def test_bad_allocator_is_refused(ds):
    with pytest.raises(ValueError, match="allocator returned"):
        Loader(ds, cfg(), allocator=lambda shape, dtype: (np.zeros(shape, np.float64), None))


def test_ring_needs_room_for_held_batches():
    with pytest.raises(ValueError, match="num_slots"):
        BatchRing(image_fields(batch_size=1, image_size=(2, 2), layout=Layout.NHWC, label_width=1), num_slots=2)


# --- prefetch lifecycle -------------------------------------------------------------------------------


def test_close_while_producer_is_blocked_on_a_full_ring(ds):
    loader = Loader(ds, cfg(prefetch=1))
    watch = watch_ring(loader.ring)
    it = iter(loader)
    next(it)
    watch.wait_idle()  # the producer has filled the free slot and waits for another
    assert producer_threads()
    t0 = time.perf_counter()
    loader.close()
    loader.close()  # idempotent
    assert time.perf_counter() - t0 < 5
    assert not producer_threads()  # close() joined it
    with pytest.raises(LoaderClosed, match="closed"):
        next(it)
    with pytest.raises(ValueError, match="closed"):  # LoaderClosed is a ValueError, as for closed files
        iter(loader)


def test_producer_exception_reaches_consumer_with_traceback(ds):
    def exploding_decode(images, out, transform, **kw):
        if int(kw["indices"][0]) >= 0 and exploding_decode.calls == 2:
            raise RuntimeError("engine exploded")
        exploding_decode.calls += 1
        return decode_batch(images, out, transform, **kw)

    exploding_decode.calls = 0
    with Loader(ds, cfg(), decode=exploding_decode) as loader:
        it = iter(loader)
        next(it), next(it)
        with pytest.raises(RuntimeError, match="engine exploded") as info:
            next(it)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "exploding_decode" in frames and "produce" in frames
    assert any("producer thread" in n for n in info.value.__notes__)
    assert not producer_threads()


def test_keyboard_interrupt_while_waiting_stops_the_producer(ds, monkeypatch):
    release = threading.Event()
    waits = watch_prefetch(monkeypatch)

    def slow_decode(images, out, transform, **kw):
        # No batch can arrive before the interrupt, however loaded the machine is.
        release.wait(3)
        return decode_batch(images, out, transform, **kw)

    # A process started in the background (CI runners, `cmd &`) inherits SIGINT ignored, and then
    # interrupt_main() does nothing: install Python's own handler for the test's duration.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    loader = Loader(ds, cfg(), decode=slow_decode)
    it = iter(loader)
    since = waits.mark()

    def interrupt_the_waiting_consumer():
        waits.wait("get", since, 10, "wait of the consumer for a batch")
        _thread.interrupt_main()

    interrupter = threading.Thread(target=interrupt_the_waiting_consumer)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(it)
    finally:
        release.set()
        interrupter.join()
        signal.signal(signal.SIGINT, previous)
    assert no_producer_left()
    assert not producer_threads()
    loader.close()


def test_dropped_iterator_and_loader_do_not_leak_threads(ds):
    loader = Loader(ds, cfg(prefetch=1))
    it = iter(loader)
    next(it)
    del it, loader
    gc.collect()
    assert no_producer_left(5)
    assert not producer_threads()


def test_producer_unit_bounded_and_stoppable(monkeypatch):
    waits = watch_prefetch(monkeypatch)
    produced = []

    def produce(stop):
        i = 0
        while not stop.is_set():
            produced.append(i)
            yield i
            i += 1

    p = Producer(produce, maxsize=2, name="fastload-test")
    assert [p.get() for _ in range(3)] == [0, 1, 2]
    # Blocked on its full queue: the generator is not resumed until a put succeeds.
    waits.wait("put", waits.mark(), 10, "put of the producer on its full queue")
    assert len(produced) <= 3 + 2 + 1  # queue bound + the item being put
    p.close()
    p.close()
    assert not p.alive


# --- bad records -------------------------------------------------------------------------------------


def test_skip_fills_batches_deterministically_and_logs_once(caplog):
    ds = FakeDataset(50, bad={3, 4, 20}, unreadable={33})
    config = cfg(shuffle="global", batch_size=8)
    with caplog.at_level(logging.WARNING, logger="fastload.loader"), Loader(ds, config) as loader:
        e0 = run_epoch(loader)
        loader.set_epoch(0)
        e0_again = run_epoch(loader)
        stats = loader.stats()
    assert_same_batches(e0, e0_again)
    assert [len(i) for i, _, _ in e0] == [8] * 6 + [2]
    used = np.concatenate([i for i, _, _ in e0])
    assert not set(used.tolist()) & {3, 4, 20, 33}
    # 3 -> 5 (4 is bad too), 4 -> 5, 20 -> 21, 33 -> 34: substitutes are the next good records
    assert np.count_nonzero(used == 5) == 3 and np.count_nonzero(used == 21) == 2
    assert stats.skipped == 8  # 4 bad records, 2 epochs
    for i, labels, _ in e0:
        np.testing.assert_array_equal(labels[:, 0], ds.labels[i, 0])
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4, messages
    assert any("shard fake-00000.rec record 33" in m for m in messages)


def test_skip_substitute_pixels_are_the_substitutes_own():
    ds = FakeDataset(20, bad={2})
    t = eval_transform(SIZE, resize=SIZE + 2)
    with Loader(ds, cfg(shuffle="none", batch_size=4, transform=t)) as loader:
        b = next(iter(loader))
        assert b.indices.tolist() == [0, 1, 3, 3]
        np.testing.assert_array_equal(b.images[2], b.images[3])


def test_raise_names_the_sample_and_its_location():
    ds = FakeDataset(30, bad={17})
    with Loader(ds, cfg(shuffle="none", on_error="raise")) as loader:
        with pytest.raises(DecodeError, match=r"sample 17.*fake-00000.rec record 17"):
            run_epoch(loader)
    assert not producer_threads()


def test_a_run_of_bad_records_is_an_error():
    ds = FakeDataset(12, bad=set(range(2, 12)) | {0})
    with Loader(ds, cfg(shuffle="none", batch_size=4, max_substitutes=5)) as loader:
        with pytest.raises(DecodeError, match="no decodable record"):
            run_epoch(loader)


# --- stats and trace -------------------------------------------------------------------------------------


def test_stats_and_chrome_trace(ds, tmp_path):
    path = tmp_path / "trace.json"
    with Loader(ds, cfg(trace_path=str(path))) as loader:
        for _b in loader:
            time.sleep(0.01)  # a "training step": consumer time the stats must count (not a wait)
        s = loader.stats()
    assert s.batches == 8 and s.images == 61 and s.wall > 0.07
    assert 0 <= s.input_bound <= 1 and s.images_per_s > 0
    assert s.seconds["decode"] > 0 and s.backend in ("pillow", "libjpeg-turbo")
    assert "images/s" in s.summary()
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"read", "decode", "wait_data"} <= names


def test_input_bound_fraction_tracks_who_is_slower(ds):
    def slow_decode(images, out, transform, **kw):
        time.sleep(0.03)  # a slow loader on purpose: what input_bound must see (not a wait)
        return decode_batch(images, out, transform, **kw)

    with Loader(ds, cfg(), decode=slow_decode) as loader:
        run_epoch(loader)
        slow_loader = loader.stats().input_bound
    with Loader(ds, cfg(prefetch=1)) as loader:
        for _ in loader:
            time.sleep(0.05)  # a slow model on purpose: what input_bound must see (not a wait)
        slow_model = loader.stats().input_bound
    assert slow_loader > 0.5 > slow_model


# --- configuration -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(batch_size=0), "batch_size"),
        (dict(prefetch=0), "prefetch"),
        (dict(shuffle="yes"), "shuffle"),
        (dict(layout="CHW"), "layout"),
        (dict(on_error="ignore"), "on_error"),
        (dict(transform="train"), "transform"),
        (dict(rank=1, world_size=1), "rank"),
        (dict(num_threads=0), "num_threads"),
        (dict(copy="no"), "copy"),
        (dict(decode_options={"max_pixels": 1}), "decode_options"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoaderConfig(**kwargs)


def test_empty_epoch_is_refused():
    with pytest.raises(ValueError, match="no batches"):
        Loader(FakeDataset(5), cfg(batch_size=8, drop_last=True))


# --- real readers ----------------------------------------------------------------------------------------


def _write_image_folder(root, per_class=5, classes=3):
    for c in range(classes):
        d = root / f"class_{c}"
        d.mkdir(parents=True)
        for k in range(per_class):
            (d / f"img_{k}.jpg").write_bytes(jpeg_bytes(20 + k, 30 + c, 100 * c + k))
    (root / "class_1" / "img_2.jpg").write_bytes(b"truncated")


def test_image_folder_without_packing(tmp_path):
    pytest.importorskip("fastload.records.imagefolder")
    _write_image_folder(tmp_path / "images")
    with Loader(str(tmp_path / "images"), cfg(batch_size=4, shuffle="global")) as loader:
        batches = run_epoch(loader)
        s = loader.stats()
        dataset = loader.dataset
    assert dataset.closed if hasattr(dataset, "closed") else True
    assert len(batches) == 4
    idx = np.concatenate([i for i, _, _ in batches])
    labels = np.concatenate([lab[:, 0] for _, lab, _ in batches])
    # The producer may already be decoding the next epoch, which meets the bad file again.
    assert s.skipped >= 1 and len(idx) == 15
    np.testing.assert_array_equal(labels, idx // 5)  # labels follow the class folder


def test_memory_does_not_grow_over_epochs():
    psutil = pytest.importorskip("psutil")
    ds = FakeDataset(64)
    proc = psutil.Process()
    with Loader(ds, cfg(batch_size=16, transform=train(64))) as loader:
        run_epoch(loader)
        gc.collect()
        base = proc.memory_info().rss
        for _ in range(5):
            for _b in loader:
                pass
        gc.collect()
        grown = proc.memory_info().rss - base
    assert grown < 20 * 2**20, f"RSS grew by {grown / 2**20:.1f} MB over 5 epochs"


def test_packed_and_unpacked_give_the_same_batches(tmp_path):
    packer = pytest.importorskip("fastload.pack.packer")
    src = tmp_path / "images"
    for c in range(3):
        d = src / f"class_{c}"
        d.mkdir(parents=True)
        for k in range(6):
            (d / f"img_{k}.jpg").write_bytes(jpeg_bytes(30 + 3 * k, 40 - k, 10 * c + k))
    packer.pack_folder(str(src), str(tmp_path / "packed"), progress=False, workers=1)
    config = cfg(batch_size=5, shuffle="global", seed=4)
    with Loader(str(tmp_path / "packed"), config) as packed, Loader(str(src), config) as folder:
        assert packed.dataset.kind != folder.dataset.kind
        assert_same_batches(run_epoch(packed), run_epoch(folder))


def test_odd_image_folder_under_both_policies(odd_folder, odd_files, caplog):
    pytest.importorskip("fastload.records.imagefolder")
    with caplog.at_level(logging.WARNING, logger="fastload.loader"):
        with Loader(str(odd_folder), cfg(batch_size=4, shuffle="global")) as loader:
            batches = run_epoch(loader)
            s = loader.stats()
            n = len(loader.dataset)
    assert all(len(i) == 4 for i, _, _ in batches[:-1])
    assert sum(len(i) for i, _, _ in batches) == n  # bad records replaced, none dropped
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for kind in ("empty", "text"):
        assert str(odd_files[kind]) in logged
    for kind in ("grayscale", "cmyk", "progressive", "png"):
        assert str(odd_files[kind]) not in logged, f"{kind} must decode"
    assert s.skipped == len(caplog.records) >= 2
    with Loader(str(odd_folder), cfg(batch_size=4, shuffle="none", on_error="raise")) as loader:
        with pytest.raises(DecodeError, match=str(odd_folder)):
            run_epoch(loader)
