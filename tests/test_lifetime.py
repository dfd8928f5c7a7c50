"""Batch lifetime: leases on ring slots, what keeps them alive, growth, fences, the release hook, kept batches."""

from __future__ import annotations

import gc
import logging
import threading
import warnings

import numpy as np
import pytest
from fake_dataset import FakeDataset

import fastload.batch as batch_mod
import fastload.errors as errors
import fastload.loader as loader_mod
from fastload.batch import HELD_BATCHES, BatchRing, Layout
from fastload.decode import decode_batch
from fastload.loader import Loader, LoaderConfig
from fastload.transforms import train

from conftest import join_threads, requires_mxnet, requires_torch, wait_for_returns, watch_prefetch, watch_ring

SIZE = 16


def cfg(**kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("transform", train(SIZE))
    kw.setdefault("num_threads", 2)
    kw.setdefault("shuffle", "none")
    return LoaderConfig(**kw)


def small_ring(num_slots=3, **kw):
    fields = batch_mod.image_fields(batch_size=2, image_size=(2, 2), layout=Layout.NHWC, label_width=1)
    return BatchRing(fields, num_slots=num_slots, **kw)


def fill_and_lease(ring, stop=None, value=0):
    slot = ring.acquire(stop or threading.Event())
    for array in slot.arrays.values():
        array[...] = value
    return ring.lease(slot, rows=2)


def returned(ring, slot_id, timeout=5.0):
    """Whether ``slot_id`` comes back to the free list within ``timeout`` (woken by each lease's return)."""
    return wait_for_returns(ring, lambda r: slot_id in r._free, timeout)


def still_leased(ring, slot_id):
    with ring._lock:
        ring._drain_locked()
        return slot_id not in ring._free


def collect(mx=None):
    """Run the collector; with MXNet, also wait for every engine operation (and the deletions they hold back)."""
    gc.collect()
    if mx is not None:
        mx.nd.waitall()


# --- what keeps a lease alive -------------------------------------------------------------------


def _numpy_derivatives(v):
    return [v[1:], v[:, 1:][0], np.asarray(v), v.view(np.uint8), v.reshape(-1), v.T]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda v: v[1:], id="slice"),
        pytest.param(lambda v: v[:, 1:][0], id="slice-of-slice"),
        pytest.param(lambda v: np.asarray(v), id="asarray"),
        pytest.param(lambda v: v.view(np.uint8), id="view-dtype"),
        pytest.param(lambda v: v.reshape(-1), id="reshape"),
        pytest.param(lambda v: v.T, id="transpose"),
    ],
)
def test_numpy_views_keep_the_lease(make):
    ring = small_ring()
    batch = fill_and_lease(ring)
    slot = batch.slot
    derived = make(batch.images)
    del batch
    collect()
    assert still_leased(ring, slot), "a numpy view of the batch did not keep the slot"
    del derived
    assert returned(ring, slot)


def test_copies_do_not_keep_the_lease():
    ring = small_ring()
    batch = fill_and_lease(ring, value=7)
    slot = batch.slot
    copies = [batch.images.copy(), np.array(batch.labels), batch.copy()]
    del batch
    assert returned(ring, slot)
    assert int(copies[0].max()) == 7 and copies[2].slot == -1


@requires_torch
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda t, v: t.from_numpy(v), id="from_numpy"),
        pytest.param(lambda t, v: t.from_numpy(v)[1:].permute(0, 3, 1, 2), id="slice-permute"),
        pytest.param(lambda t, v: t.from_numpy(v).numpy(), id="numpy-round-trip"),
        pytest.param(lambda t, v: t.as_tensor(v), id="as_tensor"),
        pytest.param(lambda t, v: t.from_numpy(v).untyped_storage(), id="storage"),
    ],
)
def test_torch_zero_copy_tensors_keep_the_lease(make):
    torch = pytest.importorskip("torch")
    ring = small_ring()
    batch = fill_and_lease(ring)
    slot = batch.slot
    tensor = make(torch, batch.images)
    del batch
    collect()
    assert still_leased(ring, slot)
    del tensor
    assert returned(ring, slot)


@requires_mxnet
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda mx, v: mx.nd.from_numpy(v, zero_copy=True), id="from_numpy"),
        pytest.param(lambda mx, v: mx.nd.from_numpy(v, zero_copy=True)[1:2], id="slice"),
        pytest.param(lambda mx, v: mx.nd.from_numpy(v, zero_copy=True).reshape((-1,)), id="reshape"),
    ],
)
def test_mxnet_zero_copy_ndarrays_keep_the_lease(make):
    mx = pytest.importorskip("mxnet")
    ring = small_ring()
    batch = fill_and_lease(ring)
    slot = batch.slot
    nd = make(mx, batch.slot_view("images"))
    assert nd.context == mx.cpu(0)  # MXNet's DLPack import takes CPU or GPU memory, not cpu_pinned
    del batch
    collect(mx)
    assert still_leased(ring, slot)
    del nd
    assert returned(ring, slot)


def _register_gate_op(mx):
    """An MXNet custom operator that waits for a threading.Event: an engine operation held open.

    Returns its name, the gate that lets it finish and an event set once it runs (reading its input).
    """
    gate, running = threading.Event(), threading.Event()

    class Gate(mx.operator.CustomOp):
        def forward(self, is_train, req, in_data, out_data, aux):
            running.set()
            gate.wait(30)
            self.assign(out_data[0], req[0], in_data[0] + 0)

        def backward(self, *args):  # pragma: no cover - forward only
            pass

    class GateProp(mx.operator.CustomOpProp):
        def __init__(self):
            super().__init__(need_top_grad=False)

        def list_arguments(self):
            return ["data"]

        def list_outputs(self):
            return ["out"]

        def infer_shape(self, in_shape):
            return in_shape, in_shape, []

        def create_operator(self, ctx, shapes, dtypes):
            return Gate()

    name = f"fastload_test_gate_{id(gate)}"
    mx.operator.register(name)(GateProp)
    return name, gate, running


@requires_mxnet
def test_mxnet_engine_operation_still_queued_keeps_the_lease():
    """The numpy view is released by MXNet only after the last queued operation reading it has run."""
    mx = pytest.importorskip("mxnet")
    op_type, gate, running = _register_gate_op(mx)
    ring = BatchRing({"x": ((4, 6), np.float32)}, num_slots=3)
    released_on = []

    class RecordingQueue:
        def __init__(self, q):
            self.q = q

        def put(self, item):
            released_on.append(threading.current_thread())
            self.q.put(item)

        def __getattr__(self, name):
            return getattr(self.q, name)

    ring._returns = RecordingQueue(ring._returns)
    slot = ring.acquire(threading.Event())
    slot.arrays["x"][...] = 7
    batch = ring.lease(slot)
    nd = mx.nd.from_numpy(batch.x, zero_copy=True)
    pending = mx.nd.Custom(nd, op_type=op_type)  # an engine operation reading the batch, held open
    try:
        del nd, batch
        collect()
        assert running.wait(30), "the engine never ran the operation reading the batch"
        assert still_leased(ring, slot.id), "the lease died while an engine operation still read the batch"
    finally:
        gate.set()
    np.testing.assert_array_equal(pending.asnumpy(), np.full((4, 6), 7, np.float32))
    assert returned(ring, slot.id)
    # Released by one of MXNet's engine threads, not the consumer: the release path must not block.
    assert released_on and released_on[0] is not threading.main_thread()


# --- release path: any thread, never blocking -------------------------------------------------------


def test_release_never_takes_the_ring_lock():
    """A lease that dies on a thread holding the ring's lock (a GC pass inside ring code) does not deadlock."""
    ring = small_ring()
    batch = fill_and_lease(ring)
    slot = batch.slot
    done = threading.Event()

    def drop_while_holding_the_lock():
        nonlocal batch
        with ring._lock:
            batch = None  # the finalizer runs here, with the (non-reentrant) lock held
        done.set()

    t = threading.Thread(target=drop_while_holding_the_lock)
    t.start()
    t.join(5)
    assert done.is_set(), "dropping a batch while holding the ring's lock deadlocked"
    assert returned(ring, slot)


def test_leases_released_from_many_threads_all_come_back():
    ring = BatchRing({"x": ((1,), np.int64)}, num_slots=16, max_extra_slots=0, ahead=16)
    stop = threading.Event()
    batches = []
    for _ in range(16):
        slot = ring.acquire(stop)
        batches.append(ring.lease(slot))
    holders = [[b] for b in batches]
    del batches
    barrier = threading.Barrier(8)

    def drop(group):
        barrier.wait()
        for h in group:
            h.clear()

    threads = [threading.Thread(target=drop, args=(holders[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert all(returned(ring, i) for i in range(16))
    assert ring.held_count() == 0


def test_batches_held_only_by_reference_cycles_are_collected_before_fresh_memory():
    """At its bound the ring runs one garbage collection: cycle-held batches come back."""
    ds = FakeDataset(80)
    threshold = gc.get_threshold()
    gc.set_threshold(10**9)  # the automatic collector never runs during this test (gc stays enabled)
    try:
        with Loader(ds, cfg(prefetch=1)) as loader:
            kept = 0
            for b in loader:
                cycle = [b]
                cycle.append(cycle)  # only the cycle refers to the batch once `b` moves on
                kept += 1
            del cycle, b
            s = loader.stats()
    finally:
        gc.set_threshold(*threshold)
    assert kept == 20
    assert s.gc_runs >= 1 and s.fresh_batches == 0, "cycle-held batches were not collected"
    assert s.ring_slots == 2 * (1 + HELD_BATCHES)


# --- kept batches: growth, fresh memory, one warning -------------------------------------------------


class _Filled:
    backend, errors, ok, sliced, slice_fallbacks = "synthetic", {}, True, 0, 0


def pattern_decode(images, out, transform, **kw):
    """Pixels that are a function of the record index, without a decoder.

    The tests that check warnings use it: the Pillow path's per-thread ``catch_warnings`` (not
    thread-safe) can swallow a warning the consumer thread issues meanwhile.
    """
    for pos, i in enumerate(kw["indices"]):
        out[pos] = (int(i) * 37 + np.arange(out[pos].size).reshape(out[pos].shape)) % 251
    return _Filled()


def _reference(ds, **kw):
    with Loader(ds, cfg(copy=True, **kw), decode=pattern_decode) as loader:
        return [(b.images, b.labels, b.indices) for b in loader]


def test_list_of_loader_keeps_every_batch_intact_with_one_warning(monkeypatch):
    ds = FakeDataset(72)
    reference = _reference(ds, shuffle="global")
    waits = watch_prefetch(monkeypatch)
    with Loader(ds, cfg(shuffle="global", prefetch=2), decode=pattern_decode) as loader:
        watch = watch_ring(loader.ring, waits)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kept = list(loader)
            again = list(loader)  # a second epoch kept too: still one warning per loader
        watch.wait_idle()  # the producer has run ahead as far as it can: it must not touch any kept batch
        s = loader.stats()
    assert len(kept) == 18 >= 16
    for b, (images, labels, indices) in zip(kept, reference, strict=False):
        np.testing.assert_array_equal(b.images, images)
        np.testing.assert_array_equal(b.labels, labels)
        np.testing.assert_array_equal(b.indices, indices)
    assert len({b.indices[0] for b in again}) == 18
    ours = [w for w in caught if issubclass(w.category, errors.KeptBatchesWarning)]
    assert len(ours) == 1 and "fresh" in str(ours[0].message)
    assert ours[0].filename == __file__, "the warning should point at the user's line"
    assert s.ring_slots == 2 * (2 + HELD_BATCHES)  # default bound: the ring at most doubles
    assert s.fresh_batches >= 36 - s.ring_slots
    slots = [b.slot for b in kept]
    assert len({x for x in slots if x >= 0}) == s.ring_slots and slots.count(-1) == 18 - s.ring_slots


def test_growth_bound_is_configurable_and_zero_goes_straight_to_fresh_memory():
    ds = FakeDataset(40)
    with pytest.warns(errors.KeptBatchesWarning):
        with Loader(ds, cfg(prefetch=1, max_extra_slots=0), decode=pattern_decode) as loader:
            kept = list(loader)
            s = loader.stats()
    assert s.ring_slots == 3 and len(kept) == 10
    assert [b.slot for b in kept].count(-1) == 10 - 3
    with pytest.raises(ValueError, match="max_extra_slots"):
        LoaderConfig(max_extra_slots=-1)


def test_keeping_a_few_batches_grows_the_ring_once_without_warning():
    """A metric on the previous batch, a batch kept for logging: a slot or two more, then steady."""
    ds = FakeDataset(200)
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.KeptBatchesWarning)
        with Loader(ds, cfg(prefetch=2)) as loader:
            watch = watch_ring(loader.ring)
            recent = []  # the current and the previous batch, as a metric on the previous batch keeps them
            first = None
            for b in loader:
                first = first if first is not None else (b, b.images.copy())
                recent = [*recent[-1:], b]
                watch.wait_idle()  # the producer has filled every slot it may before the next batch
            s = loader.stats()
    # Held at most: the first batch, the previous two and the one being taken (4), plus `prefetch`
    # (2) queued: 6 slots, 2 more than the base ring.
    assert s.ring_slots <= 2 + HELD_BATCHES + 2 and s.fresh_batches == 0
    np.testing.assert_array_equal(first[0].images, first[1])


def test_copy_true_still_hands_out_detached_batches():
    ds = FakeDataset(30)
    with Loader(ds, cfg(copy=True, prefetch=1)) as loader:
        kept = list(loader)
        s = loader.stats()
    assert all(b.slot == -1 for b in kept) and s.ring_slots == 3 and s.fresh_batches == 0


# --- fences and the release hook ---------------------------------------------------------------------


class FakeFence:
    def __init__(self):
        self.done = False
        self.queries = 0
        self.queried = threading.Event()  # the producer asked: it waits for this fence

    def query(self):
        self.queries += 1
        self.queried.set()
        return self.done


def test_release_hook_fences_hold_the_slot_until_they_complete():
    ds = FakeDataset(100)
    fences = []

    def hook():
        fence = FakeFence()
        fences.append(fence)
        return [fence]

    with Loader(ds, cfg(prefetch=1), release_hook=hook) as loader:  # 3 slots
        it = iter(loader)
        b0 = next(it)
        slot0, generation = b0.slot, loader.ring.slot_generation(b0.slot)
        del b0  # the hook runs now (on this thread) and fences the slot
        assert len(fences) == 1
        held = (next(it), next(it))  # held, so only slot0 could be refilled
        assert fences[0].queried.wait(10), "the producer never waited for the fence"
        assert loader.ring.slot_generation(slot0) == generation
        assert fences[0].queries > 0
        fences[0].done = True
        b3 = next(it)
        assert b3.slot == slot0 and loader.ring.slot_generation(slot0) == generation + 1
        assert all(b.intact for b in held)
        for f in fences:
            f.done = True


def test_a_failing_release_hook_is_reported_once_and_does_not_stall(caplog):
    ds = FakeDataset(40)

    def hook():
        raise RuntimeError("no device")

    with caplog.at_level(logging.WARNING, logger="fastload.batch"):
        with Loader(ds, cfg(prefetch=1), release_hook=hook) as loader:
            n = sum(1 for _ in loader) + sum(1 for _ in loader)
    assert n == 20
    messages = [r.getMessage() for r in caplog.records if "release hook" in r.getMessage()]
    assert len(messages) == 1 and "no device" in messages[0]


@requires_torch
def test_torch_release_hook_records_an_event_per_initialized_device(monkeypatch):
    torch = pytest.importorskip("torch")
    import fastload.torch as ft

    recorded = []

    class Event:
        def record(self, stream):
            recorded.append(stream)

    assert ft.cuda_release_fences() == []  # CUDA not initialized here: nothing recorded
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda d: d != 1, raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d: f"stream-of-{d}")
    monkeypatch.setattr(torch.cuda, "Event", Event)
    events = ft.cuda_release_fences()
    assert len(events) == 2 and recorded == ["stream-of-0", "stream-of-2"]  # device 1 has no context


@requires_torch
def test_torch_loader_waits_for_the_hook_events_before_refilling(monkeypatch):
    """The user's own non_blocking copy: the event recorded when the batch dies fences the slot."""
    torch = pytest.importorskip("torch")
    import fastload.torch as ft

    events = []

    class Event:
        def __init__(self):
            self.done = False
            self.queried = threading.Event()  # the producer asked: it waits for this event
            events.append(self)

        def record(self, stream):
            pass

        def query(self):
            self.queried.set()
            return self.done

    ds = FakeDataset(100)
    with ft.DataLoader(ds, batch_size=4, transform=train(SIZE), shuffle=False, prefetch=1, num_threads=2) as loader:
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda d: True, raising=False)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda d: None)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        it = iter(loader)
        x0, y0 = next(it)
        ring = loader.loader.ring
        slot0 = next(s.id for s in ring.slots if s.leased and np.shares_memory(s.arrays["images"], x0.numpy()))
        generation = ring.slot_generation(slot0)
        del x0, y0  # a copy out of it may still be running: an event is recorded
        assert len(events) == 1
        held = (next(it), next(it))  # held, so only slot0 could be refilled
        assert events[0].queried.wait(10), "the producer never waited for the event"
        assert ring.slot_generation(slot0) == generation
        events[0].done = True
        next(it)
        assert ring.slot_generation(slot0) == generation + 1
        assert len(held) == 2
        for e in events:
            e.done = True


# --- image dtype -------------------------------------------------------------------------------------


def test_float_images_come_from_the_config_and_a_float_decoder():
    ds = FakeDataset(20)

    def float_decode(images, out, transform, **kw):
        assert out.dtype in (np.float32, np.float16)
        for pos, i in enumerate(kw["indices"]):
            out[pos] = float(i) + 0.5
        return decode_batch(
            [],
            np.empty((0, *out.shape[1:]), np.uint8),
            transform,
            seed=kw["seed"],
            epoch=kw["epoch"],
            indices=np.empty(0, np.int64),
        )

    with Loader(ds, cfg(image_dtype="float32"), decode=float_decode) as loader:
        assert loader.config.image_dtype == np.float32
        batches = list(loader)
    assert all(b.images.dtype == np.float32 for b in batches)
    for b in batches:
        np.testing.assert_array_equal(b.images[:, 0, 0, 0], b.indices + 0.5)
    with Loader(ds, cfg(image_dtype="float16"), decode=float_decode) as loader:
        assert next(iter(loader)).images.dtype == np.float16


def test_image_dtype_validation_and_transform_declaration():
    assert LoaderConfig().image_dtype == np.uint8
    with pytest.raises(ValueError, match="image_dtype"):
        LoaderConfig(image_dtype="int32")
    with pytest.raises(ValueError, match="image_dtype"):
        LoaderConfig(image_dtype="no such dtype")

    class Normalize:
        dtype = "float16"

    class Spec:
        normalize = Normalize()

    class Raw:
        normalize = None

    assert loader_mod.transform_image_dtype(Spec()) == np.float16
    assert loader_mod.transform_image_dtype(Raw()) is None
    assert loader_mod.transform_image_dtype(train(8)) is None


def test_generic_fields():
    ring = BatchRing(
        {"dense": ((3, 5), np.float32), "csr_data": ((40,), np.float64), "row": ((3,), np.int32)}, num_slots=3
    )
    slot = ring.acquire(threading.Event())
    slot.arrays["dense"][...] = 1
    batch = ring.lease(slot, rows=2, sizes={"csr_data": 7})
    assert batch.dense.shape == (2, 5) and batch.csr_data.shape == (7,) and batch.row.shape == (2,)
    assert batch.slot_view("csr_data").shape == (40,) and batch.size == 2
    assert batch.images is None and set(batch.fields) == {"dense", "csr_data", "row"}
    with pytest.raises(AttributeError):
        batch.nothing
    sid = batch.slot
    del batch
    assert returned(ring, sid)


# --- adapters: list(loader) returns intact batches -----------------------------------------------------


@requires_torch
def test_torch_dataloader_list_returns_intact_batches():
    torch = pytest.importorskip("torch")
    from fastload.torch import DataLoader

    ds = FakeDataset(70)
    # Same order and crops for both loaders: shuffled by a seeded generator, crops keyed by seed=.
    common = dict(batch_size=4, transform=train(SIZE), shuffle=True, seed=3, num_threads=2)
    with DataLoader(ds, copy=True, generator=torch.Generator().manual_seed(3), **common) as loader:
        reference = [(x.clone(), y.clone()) for x, y in loader]
    with DataLoader(ds, generator=torch.Generator().manual_seed(3), **common) as loader:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kept = list(loader)
        # The pass over the sampler's batches is over: its producer ends, and nothing may have
        # touched a kept batch on its way out.
        assert not join_threads(lambda t: t.name.startswith("fastload-loader")), "the producer did not end"
    assert len(kept) == len(reference) == 18
    differing = sum(
        not (torch.equal(x, rx) and torch.equal(y, ry)) for (x, y), (rx, ry) in zip(kept, reference, strict=False)
    )
    assert differing == 0, f"{differing} of {len(kept)} kept batches were overwritten"


@requires_mxnet
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_mxnet_image_record_iter_list_returns_intact_batches(tmp_path, dtype, monkeypatch):
    mx = pytest.importorskip("mxnet")
    import io

    from PIL import Image

    import fastload.mxnet as fm

    rec = str(tmp_path / "data.rec")
    writer = mx.recordio.MXIndexedRecordIO(str(tmp_path / "data.idx"), rec, "w")
    for i in range(70):
        pixels = np.random.default_rng(i).integers(0, 256, (20, 24, 3)).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i % 5), i, 0), buf.getvalue()))
    writer.close()
    common = dict(
        path_imgrec=rec,
        data_shape=(3, 8, 8),
        batch_size=4,
        shuffle=True,
        seed=2,
        dtype=dtype,
        rand_mirror=True,
        preprocess_threads=2,
        prefetch_buffer=2,
    )
    ref_it = fm.ImageRecordIter(**common)
    reference = [(b.data[0].asnumpy(), b.label[0].asnumpy(), list(b.index)) for b in ref_it]
    ref_it.close()
    waits = watch_prefetch(monkeypatch)
    it = fm.ImageRecordIter(**common)
    watch = watch_ring(it.loader.ring, waits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = list(it)
    watch.wait_idle()  # the producer has run ahead as far as it can: it must not touch any kept batch
    assert len(kept) == len(reference) == 18
    differing = 0
    for b, (data, label, index) in zip(kept, reference, strict=False):
        same = (
            np.array_equal(b.data[0].asnumpy(), data)
            and np.array_equal(b.label[0].asnumpy(), label)
            and list(b.index) == index
        )
        differing += not same
    assert differing == 0, f"{differing} of {len(kept)} kept batches were overwritten"
    it.close()
    # MXNet's docstring idiom keeps the data arrays only.
    it = fm.ImageRecordIter(**common)
    watch = watch_ring(it.loader.ring, waits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        datas = [b.data[0] for b in it]
    watch.wait_idle()
    assert all(np.array_equal(d.asnumpy(), ref[0]) for d, ref in zip(datas, reference, strict=False))
    it.close()


# --- interpreter shutdown ------------------------------------------------------------------------------

_EXIT_SCRIPT = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
from fake_dataset import FakeDataset
from fastload.loader import Loader, LoaderConfig
from fastload.transforms import train
ds = FakeDataset(40)
loader = Loader(ds, LoaderConfig(batch_size=4, transform=train(8), num_threads=2, prefetch=1,
                                 max_extra_slots=1))
kept = list(loader)              # kept batches, some in ring slots, some in fresh memory
it = iter(loader)
current = next(it)               # a pass left open, the producer running
{extra}
print("done", len(kept))
# exit without close(): leases die during interpreter shutdown
"""

_EXTRA = {
    "core": "",
    "torch": (
        "import torch\nfrom fastload.torch import DataLoader\n"
        "tl = DataLoader(ds, batch_size=4, transform=train(8), num_threads=2)\n"
        "tensors = [x for x, y in tl]\ntl_it = iter(tl)\nnext(tl_it)"
    ),
    "mxnet": (
        "import mxnet as mx\n"
        "views = [mx.nd.from_numpy(b.slot_view('images'), zero_copy=True) for b in kept if b.slot >= 0]\n"
        "pending = [v.astype('float32') * 2 for v in views]"
    ),
}


@pytest.mark.parametrize("kind", ["core", "torch", "mxnet"])
def test_batches_alive_at_interpreter_exit_end_quietly(kind, repo_root):
    import importlib.util
    import os
    import subprocess
    import sys

    if kind != "core" and importlib.util.find_spec(kind) is None:
        pytest.skip(f"{kind} is not installed")
    script = _EXIT_SCRIPT.format(tests=os.path.join(str(repo_root), "tests"), extra=_EXTRA[kind])
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done 10" in proc.stdout
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


_HANDOVER_AT_EXIT = """
import sys, threading
sys.path.insert(0, {tests!r})
from fake_dataset import FakeDataset
from fastload.loader import Loader, LoaderConfig
from fastload.loader import reading
from fastload.transforms import train

# The hand-over of the second batch never ends by itself: only a loader that does not wait for it
# at interpreter shutdown (when its daemon thread no longer runs) lets the process exit.
never = threading.Event()
real = reading._BatchReads.batch
def batch(self, k, indices):
    if k >= 1:
        never.wait()
    return real(self, k, indices)
reading._BatchReads.batch = batch
loader = Loader(FakeDataset(40), LoaderConfig(batch_size=4, transform=train(8), num_threads=1))
it = iter(loader)
first = next(it)
print("first", first.size, flush=True)
del first, it  # the pass ends (its producer stops); the hand-over of batch 1 stays in flight
# exit without close(): the loader is closed by its __del__ while the modules are torn down
"""


def test_a_hand_over_in_flight_does_not_hold_the_interpreter_exit(repo_root):
    import os
    import subprocess
    import sys

    script = _HANDOVER_AT_EXIT.format(tests=os.path.join(str(repo_root), "tests"))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=120)
    assert "first 4" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_loader_closed_during_interpreter_shutdown_does_not_wait_for_its_hand_over(monkeypatch):
    # A module's teardown may close a loader whose hand-over is still in flight: daemon threads
    # never run again then, so waiting for it would hang the exit.
    import sys

    from fastload.loader import reading

    never = threading.Event()
    real = reading._BatchReads.batch

    def batch(self, k, indices):
        if k >= 1:
            never.wait(60)
        return real(self, k, indices)

    monkeypatch.setattr(reading._BatchReads, "batch", batch)
    loader = Loader(FakeDataset(40), LoaderConfig(batch_size=4, transform=train(8), num_threads=1))
    it = iter(loader)
    first = next(it)
    del first, it  # the pass ends, its producer stops; batch 1's hand-over stays in flight
    monkeypatch.setattr(sys, "is_finalizing", lambda: True)
    closer = threading.Thread(target=loader.close)
    closer.start()
    closer.join(20)
    finished = not closer.is_alive()
    monkeypatch.undo()
    never.set()  # the hand-over ends, then its thread (close() asked it to)
    closer.join(60)
    assert finished, "close() waited for a hand-over that cannot run during shutdown"
    left = join_threads(lambda t: t.name == "fastload-handover", 30)
    assert not left, left
