"""fastload.mxnet arrays side: pinned views, NDArrayIter (dense + CSR) against mx.io.NDArrayIter, PrefetchingIter."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest

os.environ.setdefault("MXNET_STORAGE_FALLBACK_LOG_VERBOSE", "0")
mx = pytest.importorskip("mxnet")
sp = pytest.importorskip("scipy.sparse")

import fastload.mxnet as fm
from fastload.mxnet.array_iter import plan_epoch
from fastload.mxnet.array_sources import csr_take_rows
from fastload.mxnet.placement import numpy_view, pinned_empty, split_slices


def _batches(it, dense=True):
    out = []
    for b in it:
        data = [a.asnumpy() if dense or a.stype == "default" else a.asscipy().toarray() for a in b.data]
        label = [a.asnumpy() for a in b.label]
        out.append((data, label, b.pad))
    return out


def _assert_same(mine, ref):
    assert len(mine) == len(ref)
    for k, ((d1, l1, p1), (d2, l2, p2)) in enumerate(zip(mine, ref, strict=False)):
        assert p1 == p2, f"batch {k}: pad {p1} != {p2}"
        assert len(d1) == len(d2) and len(l1) == len(l2)
        for a, b in zip(d1 + l1, d2 + l2, strict=False):
            np.testing.assert_array_equal(a, b, err_msg=f"batch {k}")


# --- placement ---------------------------------------------------------------------------------


def test_numpy_view_is_zero_copy_over_pinned_memory():
    view, nd = pinned_empty((4, 3), "float32")
    assert nd.context == mx.cpu_pinned()
    view[:] = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(nd.asnumpy(), view)
    nd[1] = 7  # and the other way round: an engine write shows through the view
    nd.wait_to_read()
    assert (view[1] == 7).all()
    assert numpy_view(nd).__array_interface__["data"][0] == view.__array_interface__["data"][0]


def test_numpy_view_refuses_sparse():
    with pytest.raises(ValueError, match="dense"):
        numpy_view(mx.nd.sparse.zeros("csr", (2, 2)))


def test_split_slices_match_module_work_load_list():
    assert split_slices(10, 2, None) == [slice(0, 5), slice(5, 10)]
    assert split_slices(10, 2, [3, 1]) == [slice(0, 8), slice(8, 10)]
    with pytest.raises(ValueError, match="work_load_list"):
        split_slices(10, 3, [1, 1])


# --- NDArrayIter vs mx.io.NDArrayIter ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["pad", "discard", "roll_over"])
@pytest.mark.parametrize(("n", "bs"), [(22, 5), (20, 5), (3, 7)])
def test_dense_matches_mx_batch_for_batch(mode, n, bs):
    if mode == "roll_over" and bs > n:
        pytest.skip("MXNet's roll_over needs at least one full batch")
    x = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    y = np.arange(n, dtype=np.float32)
    ref = mx.io.NDArrayIter(x, y, batch_size=bs, last_batch_handle=mode)
    mine = fm.NDArrayIter(x, y, batch_size=bs, last_batch_handle=mode)
    assert mine.provide_data == ref.provide_data and mine.provide_label == ref.provide_label
    for _ in range(3):
        _assert_same(_batches(mine), _batches(ref))
        ref.reset()
        mine.reset()
    mine.close()


def test_dict_and_list_inputs_named_like_mx():
    x1 = np.random.rand(11, 3).astype(np.float32)
    x2 = np.random.rand(11, 2).astype(np.float64)
    y = mx.nd.array(np.arange(11))
    for data in ({"b": x1, "a": x2}, [x1, x2]):
        ref = mx.io.NDArrayIter(data, y, batch_size=4)
        mine = fm.NDArrayIter(data, y, batch_size=4)
        assert [d.name for d in mine.provide_data] == [d.name for d in ref.provide_data]
        assert [d.dtype for d in mine.provide_data] == [d.dtype for d in ref.provide_data]
        _assert_same(_batches(mine), _batches(ref))
        mine.close()


def test_no_label():
    mine = fm.NDArrayIter(np.zeros((5, 2), np.float32), batch_size=2)
    assert mine.provide_label == []
    assert all(b.label == [] for b in mine)


@pytest.mark.parametrize("kind", ["csrndarray", "scipy"])
def test_csr_matches_mx_discard_and_stays_sparse(kind):
    x = sp.random(37, 40, density=0.15, format="csr", dtype=np.float32, random_state=1)
    y = np.arange(37, dtype=np.float32)
    data = mx.nd.sparse.array(x) if kind == "csrndarray" else x
    ref = mx.io.NDArrayIter(mx.nd.sparse.array(x), y, batch_size=6, last_batch_handle="discard")
    mine = fm.NDArrayIter(data, y, batch_size=6, last_batch_handle="discard")
    batch = mine.next()
    assert batch.data[0].stype == "csr" and batch.data[0].context == mx.cpu_pinned()
    assert batch.data[0].shape == (6, 40)
    mine.reset()
    ref_batches = [([b.data[0].asnumpy()], [b.label[0].asnumpy()], b.pad) for b in ref]  # mx densifies
    _assert_same(_batches(mine, dense=False), ref_batches)


@pytest.mark.parametrize("mode", ["pad", "roll_over"])
def test_csr_pad_and_roll_over_match_dense_reference(mode):
    # MXNet refuses CSR outside 'discard'; fastload supports it, with the dense iterator's semantics.
    x = sp.random(23, 30, density=0.2, format="csr", dtype=np.float32, random_state=2)
    y = sp.random(23, 5, density=0.3, format="csr", dtype=np.float32, random_state=3)  # sparse labels
    ref = mx.io.NDArrayIter(x.toarray(), y.toarray(), batch_size=5, last_batch_handle=mode)
    mine = fm.NDArrayIter(x, y, batch_size=5, last_batch_handle=mode)
    for _ in range(3):
        got = [([b.data[0].asscipy().toarray()], [b.label[0].asscipy().toarray()], b.pad) for b in mine]
        _assert_same(got, _batches(ref))
        mine.reset()
        ref.reset()


def test_csr_take_rows_against_scipy():
    x = sp.random(50, 20, density=0.2, format="csr", dtype=np.float32, random_state=4)
    rows = np.array([7, 0, 49, 7, 13], dtype=np.int64)
    data, indices, indptr = csr_take_rows(x.indptr.astype(np.int64), x.indices, x.data, rows)
    got = sp.csr_matrix((data, indices, indptr), shape=(5, 20)).toarray()
    np.testing.assert_array_equal(got, x[rows].toarray())


def test_plan_epoch_roll_over_carries_leftover():
    share = np.arange(11)
    plan, carry = plan_epoch(share, 4, "roll_over", None)
    assert [p[1] for p in plan] == [0, 0] and carry.tolist() == [8, 9, 10]
    plan, carry = plan_epoch(share, 4, "roll_over", carry)
    assert plan[0][0].tolist() == [8, 9, 10, 0] and plan[0][1] == 3


# --- shuffle, parts, resume, placement -----------------------------------------------------------


def test_shuffle_is_seeded_and_reshuffles_per_epoch():
    x = np.arange(40, dtype=np.float32)[:, None]
    a = fm.NDArrayIter(x, batch_size=8, shuffle=True, seed=5)
    b = fm.NDArrayIter(x, batch_size=8, shuffle=True, seed=5)
    e0 = np.concatenate([d[0][0].ravel() for d in _batches(a)])
    assert sorted(e0.tolist()) == list(range(40)) and e0.tolist() != list(range(40))
    np.testing.assert_array_equal(e0, np.concatenate([d[0][0].ravel() for d in _batches(b)]))
    a.reset()
    e1 = np.concatenate([d[0][0].ravel() for d in _batches(a)])
    assert e1.tolist() != e0.tolist() and sorted(e1.tolist()) == list(range(40))


def test_parts_cover_the_data_with_equal_batch_counts():
    x = np.arange(103, dtype=np.float32)[:, None]
    seen, counts = [], []
    for part in range(3):
        it = fm.NDArrayIter(x, batch_size=10, shuffle=True, seed=1, part_index=part, num_parts=3)
        rows = [b.data[0].asnumpy().ravel()[: 10 - b.pad] for b in it]
        counts.append(len(rows))
        seen.extend(np.concatenate(rows).tolist())
    assert len(set(counts)) == 1
    assert set(seen) == set(range(103))


def test_rank_arguments_must_agree():
    x = np.zeros((10, 1), np.float32)
    with pytest.raises(ValueError, match="part_index"):
        fm.NDArrayIter(x, batch_size=2, part_index=3, num_parts=2)
    with pytest.raises(ValueError, match="says part"):
        fm.resolve_parts(part_index=1, num_parts=2, rank=0, num_workers=2)
    assert fm.resolve_parts(kvstore="local") == (0, 1)


def test_state_dict_resumes_mid_epoch_exactly():
    x = np.arange(50, dtype=np.float32)[:, None]
    full = fm.NDArrayIter(x, batch_size=7, shuffle=True, seed=3, last_batch_handle="roll_over")
    expected = _batches(full)
    full.reset()
    expected += _batches(full)

    it = fm.NDArrayIter(x, batch_size=7, shuffle=True, seed=3, last_batch_handle="roll_over")
    got = [_batches([it.next()])[0] for _ in range(4)]
    state = it.state_dict()
    it.close()
    resumed = fm.NDArrayIter(x, batch_size=7, shuffle=True, seed=99, last_batch_handle="roll_over")
    resumed.load_state_dict(state)
    got += _batches(resumed)
    resumed.reset()
    got += _batches(resumed)
    _assert_same(got, expected)


def test_ctx_list_places_each_slice_on_its_context():
    x = np.arange(60, dtype=np.float32).reshape(12, 5)
    y = np.arange(12, dtype=np.float32)
    it = fm.NDArrayIter(x, y, batch_size=8, ctx=[mx.cpu(0), mx.cpu(1)], work_load_list=[3, 1])
    b = it.next()
    parts = b.data[0]
    assert [p.context for p in parts] == [mx.cpu(0), mx.cpu(1)]
    assert [p.shape[0] for p in parts] == [6, 2]
    np.testing.assert_array_equal(np.concatenate([p.asnumpy() for p in parts]), x[:8])
    assert [p.context for p in b.label[0]] == [mx.cpu(0), mx.cpu(1)]
    sp_it = fm.NDArrayIter(sp.csr_matrix(x), y, batch_size=8, ctx=[mx.cpu(0), mx.cpu(1)])
    parts = sp_it.next().data[0]
    assert [(p.stype, p.context) for p in parts] == [("csr", mx.cpu(0)), ("csr", mx.cpu(1))]
    np.testing.assert_array_equal(np.concatenate([p.asnumpy() for p in parts]), x[:8])


def test_dense_batches_are_zero_copy_views_of_pinned_ring_slots():
    x = np.arange(200, dtype=np.float32).reshape(100, 2)
    it = fm.NDArrayIter(x, batch_size=10, prefetch=1)
    batch = it.next()
    # MXNet labels its zero-copy import cpu(0); the memory is a slot of the ring, allocated cpu_pinned.
    assert batch.data[0].context == mx.cpu()
    ptr = batch.data[0].asnumpy().__array_interface__["data"][0]
    slots = [numpy_view(s.owners["0"]).__array_interface__["data"][0] for s in it.ring.slots]
    assert all(s.owners["0"].context == mx.cpu_pinned() for s in it.ring.slots)
    from fastload.mxnet.placement import wrap_view

    data_ptr = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(batch.data[0].handle, ctypes.byref(data_ptr)))
    assert data_ptr.value in slots and ptr not in slots  # asnumpy() copies, the batch array does not
    assert wrap_view(np.zeros(3, np.int8)).dtype == np.int8  # dtypes DLPack lacks are copied
    it.close()


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="last_batch_handle"):
        fm.NDArrayIter(np.zeros((4, 1)), batch_size=2, last_batch_handle="wrap")
    with pytest.raises(ValueError, match="same number of rows"):
        fm.NDArrayIter(np.zeros((4, 1)), np.zeros(5), batch_size=2)
    with pytest.raises(ValueError, match="coo"):
        fm.NDArrayIter(sp.coo_matrix(np.eye(3)), batch_size=2)


# --- PrefetchingIter -----------------------------------------------------------------------------


def test_prefetching_iter_yields_the_wrapped_batches():
    x = np.arange(30, dtype=np.float32).reshape(15, 2)
    ref = _batches(mx.io.NDArrayIter(x, np.arange(15), batch_size=4))
    with fm.PrefetchingIter(mx.io.NDArrayIter(x, np.arange(15), batch_size=4), prefetch=1) as it:
        for _ in range(2):
            _assert_same(_batches(it), ref)
            it.reset()


def test_prefetching_iter_combines_and_renames():
    a = mx.io.NDArrayIter(np.ones((8, 2), np.float32), batch_size=4)
    b = mx.io.NDArrayIter(np.zeros((8, 3), np.float32), batch_size=4)
    it = fm.PrefetchingIter([a, b], rename_data=[{"data": "a"}, {"data": "b"}])
    assert [d.name for d in it.provide_data] == ["a", "b"]
    batch = it.next()
    assert [d.shape for d in batch.data] == [(4, 2), (4, 3)]
    it.close()
    it.close()


class _Failing(mx.io.DataIter):
    def __init__(self):
        super().__init__(2)
        self.n = 0

    def next(self):
        self.n += 1
        if self.n == 2:
            raise KeyError("record 17 is broken")
        return mx.io.DataBatch(data=[mx.nd.zeros((2, 1))], label=[])


def test_prefetching_iter_forwards_exceptions_with_traceback():
    it = fm.PrefetchingIter(_Failing())
    it.next()
    with pytest.raises(KeyError, match="record 17") as info:
        it.next()
    # The producer thread's frame (the wrapped iterator's next) is in the re-raised traceback.
    assert any(entry.name == "next" and str(entry.path).endswith("test_mxnet.py") for entry in info.traceback)
    it.close()
    assert not any(t.name.startswith("fastload-prefetch") for t in threading.enumerate())


# --- training -----------------------------------------------------------------------------------


def test_module_fit_sparse_linear_model_on_two_contexts():
    rng = np.random.default_rng(0)
    n, features = 600, 1000
    labels = rng.integers(0, 2, n)
    rows, cols = [], []
    for i, c in enumerate(labels):
        k = 12
        own = rng.integers(0, 500, int(k * 0.8)) + 500 * c  # mostly features of the row's own class
        other = rng.integers(0, 500, k - len(own)) + 500 * (1 - c)
        cols.extend(np.unique(np.concatenate([own, other])).tolist())
        rows.extend([i] * len(np.unique(np.concatenate([own, other]))))
    x = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n, features))
    y = labels.astype(np.float32)
    train = fm.NDArrayIter(x, y, batch_size=50, shuffle=True, seed=0, last_batch_handle="discard")
    data = mx.sym.var("data", stype="csr")
    weight = mx.sym.var("weight", shape=(features, 2))
    bias = mx.sym.var("bias", shape=(2,))
    out = mx.sym.broadcast_add(mx.sym.sparse.dot(data, weight), bias)
    net = mx.sym.SoftmaxOutput(out, mx.sym.var("softmax_label"), name="softmax")
    mod = mx.mod.Module(net, data_names=["data"], label_names=["softmax_label"], context=[mx.cpu(0), mx.cpu(1)])
    mod.fit(train, num_epoch=4, optimizer="sgd", optimizer_params={"learning_rate": 0.5}, initializer=mx.init.Xavier())
    train.hard_reset()
    acc = dict(mod.score(train, "acc"))["accuracy"]
    assert acc >= 0.95, acc
    train.close()


def test_dense_slot_waits_for_engine_reads_before_refill():
    x = np.arange(400, dtype=np.float32).reshape(100, 4)
    it = fm.NDArrayIter(x, batch_size=5, prefetch=1)
    first = it.next()
    big = mx.nd.ones((900, 900))
    slow_zero = mx.nd.dot(mx.nd.dot(big, big), big).sum() * 0
    pending = mx.nd.broadcast_add(first.data[0], slow_zero.reshape((1, 1)))  # queued behind the slow product
    assert sum(1 for _ in it) == 19  # the ring (4 slots) wraps several times meanwhile
    np.testing.assert_array_equal(pending.asnumpy(), x[:5])
    it.close()


# --- bench/mxnet_iters.py sparse comparison ------------------------------------------------------


def test_bench_sparse_default_size_is_one_mxnet_accepts_and_oversize_is_refused_clearly():
    """Regression: a 10,240 x 250,000 comparison died inside MXNet (arrays of 2**31 - 1 elements or more)."""
    import inspect

    from bench.mxnet_iters import sparse_iters

    params = inspect.signature(sparse_iters).parameters
    rows, features = params["rows"].default, params["features"].default
    assert (rows, features) == (1024, 250_000)
    # MXNet checks the logical shape when the array is used, before any batch is densified.
    csr = mx.nd.sparse.csr_matrix(
        (np.ones(1, np.float32), np.zeros(1, np.int64), np.r_[0, np.ones(rows, np.int64)]), shape=(rows, features)
    )
    assert csr.shape == (rows, features)
    with pytest.raises(ValueError, match=r"2\*\*31"):
        sparse_iters(rows=256 * 40, features=250_000, repeats=1, warmup=0)
    # The comparison runs end to end (small feature count to keep the test fast).
    out = sparse_iters(rows=512, features=2_000, repeats=1, warmup=0)
    assert [r["name"] for r in out] == ["fastload.mxnet NDArrayIter (CSR)", "MXNet NDArrayIter (CSR)"]
    assert all(r["median"] > 0 for r in out)
