"""Kept batches stay intact for fastload.mxnet's iterators; CSR inputs are checked before MXNet sees them.

``[b.data[0] for b in it]`` (NDArrayIter's own docstring idiom), ``list(it)``, a metric computed on the
previous batch: batches the consumer keeps must never be overwritten by later ones, for
``NDArrayIter`` (dense and CSR), ``ImageRecordIter`` (every dtype) and ``PrefetchingIter``.
"""

from __future__ import annotations

import gc
import io
import warnings

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
sp = pytest.importorskip("scipy.sparse")
from PIL import Image

import fastload.mxnet as fm
from fastload.batch import BatchRing
from fastload.errors import KeptBatchesWarning
from fastload.mxnet.placement import pinned_allocator, wrap_view

from conftest import wait_for_returns


def _rec(tmp_path, n=40, side=12):
    path = str(tmp_path / "kept.rec")
    writer = mx.recordio.MXIndexedRecordIO(str(tmp_path / "kept.idx"), path, "w")
    for i in range(n):
        pixels = np.random.default_rng(i).integers(0, 256, (side, side, 3)).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i % 5), i, 0), buf.getvalue()))
    writer.close()
    return path


def _dense(a):
    return a.asscipy().toarray() if getattr(a, "stype", "default") == "csr" else a.asnumpy()


def _reference_and_kept(make, epochs=3):
    """Batches read at once (the reference) and the same batches kept until the end."""
    ref, kept = [], []
    it = make()
    for _ in range(epochs):
        for b in it:
            ref.append([_dense(a) for a in b.data + b.label])
        it.reset()
    it.close()
    it = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KeptBatchesWarning)
        for _ in range(epochs):
            kept.extend([b.data + b.label for b in it])
            it.reset()
    return ref, kept, it


def _changed(ref, kept):
    assert len(ref) == len(kept)
    return sum(
        1
        for r, k in zip(ref, kept, strict=False)
        if any(not np.array_equal(a, _dense(b)) for a, b in zip(r, k, strict=False))
    )


def test_ndarrayiter_kept_batches_stay_intact_dense_and_csr():
    x = np.arange(32 * 8 * 6, dtype=np.float32).reshape(32 * 8, 6)
    csr = sp.random(32 * 8, 40, density=0.2, format="csr", dtype=np.float32, random_state=3)
    y = np.arange(32 * 8, dtype=np.float32)
    for data in (x, {"dense": x, "sparse": csr}):
        ref, kept, it = _reference_and_kept(lambda: fm.NDArrayIter(data, y, batch_size=8, shuffle=True, seed=1))  # noqa: B023
        assert _changed(ref, kept) == 0  # the audit measured 27 of 32 changed before leases
        assert len(it.ring.slots) <= it.ring.base_slots + it.ring.max_extra_slots  # bounded
        it.close()
    # The docstring idiom, with the warning once the ring reached its bound.
    it = fm.NDArrayIter(x, y, batch_size=8)
    with pytest.warns(KeptBatchesWarning):
        arrays = [b.data[0] for b in it]
    np.testing.assert_array_equal(np.concatenate([a.asnumpy() for a in arrays]), x)
    assert it.ring.fresh_batches > 0


def test_ndarrayiter_usual_loop_recycles_the_same_slots():
    x = np.arange(400, dtype=np.float32).reshape(100, 4)
    it = fm.NDArrayIter(x, batch_size=5, prefetch=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KeptBatchesWarning)
        for _ in range(3):
            for b in it:
                b.data[0].wait_to_read()
            it.reset()
    assert it.ring.extra_slots == 0 and it.ring.fresh_batches == 0
    it.close()


@pytest.mark.parametrize(("dtype", "channels"), [("uint8", 3), ("float32", 3), ("int8", 3), ("uint8", 1)])
def test_imagerecorditer_kept_batches_stay_intact(tmp_path, dtype, channels):
    rec = _rec(tmp_path)

    def make():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fm.ImageRecordIter(
                path_imgrec=rec,
                data_shape=(channels, 12, 12),
                batch_size=4,
                dtype=dtype,
                shuffle=True,
                prefetch_buffer=1,
                mean_r=10,
            )

    ref, kept, it = _reference_and_kept(make)
    assert _changed(ref, kept) == 0  # the audit measured 10 of 16 changed before
    it.close()


def test_prefetchingiter_kept_batches_stay_intact(tmp_path):
    rec = _rec(tmp_path)
    x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)

    def make():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            images = fm.ImageRecordIter(
                path_imgrec=rec, data_shape=(3, 12, 12), batch_size=4, dtype="uint8", prefetch_buffer=1
            )
        return fm.PrefetchingIter([images, fm.NDArrayIter(x, batch_size=4, prefetch=1)], prefetch=2)

    ref, kept, it = _reference_and_kept(make, epochs=2)
    assert _changed(ref, kept) == 0
    it.close()


def test_previous_batch_is_intact_while_the_next_is_read(tmp_path):
    """Module.fit calls update_metric on a batch after asking for the next one."""
    rec = _rec(tmp_path, n=24)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = fm.ImageRecordIter(
            path_imgrec=rec, data_shape=(3, 12, 12), batch_size=4, dtype="uint8", prefetch_buffer=1, shuffle=True
        )
    expected = [b.data[0].asnumpy().copy() for b in it]
    it.reset()
    it.reset()
    it.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = fm.ImageRecordIter(
            path_imgrec=rec, data_shape=(3, 12, 12), batch_size=4, dtype="uint8", prefetch_buffer=1, shuffle=True
        )
    prev = it.next()
    for k in range(1, len(expected)):
        cur = it.next()
        np.testing.assert_array_equal(prev.data[0].asnumpy(), expected[k - 1])
        prev = cur


def test_wrapped_view_holds_the_lease_through_pending_engine_reads():
    """The MXNet 1.9.1 call that keeps the slot alive: mx.nd.from_numpy(view, zero_copy=True)."""
    ring = BatchRing({"x": ((4, 3), np.float32)}, num_slots=3, allocator=pinned_allocator)
    stop = __import__("threading").Event()
    slot = ring.acquire(stop)
    slot.arrays["x"][:] = 1.0
    batch = ring.lease(slot)
    ring.taken(slot.id, slot.generation)
    nd = wrap_view(batch.fields["x"])
    assert batch.fields["x"].flags.writeable  # the caller's view stays writable
    del batch
    gc.collect()
    assert ring.held_count() == 1  # the NDArray alone keeps the lease
    # An engine operation reading the batch that cannot run before a slow product (seconds) is done.
    big = mx.nd.ones((2000, 2000))
    slow_zero = mx.nd.dot(mx.nd.dot(mx.nd.dot(big, big), big), big).sum() * 0
    pending = mx.nd.broadcast_add(nd, slow_zero.reshape((1, 1)))
    del nd
    gc.collect()
    assert ring.held_count() == 1  # the pending operation keeps the lease
    np.testing.assert_array_equal(pending.asnumpy(), np.ones((4, 3)))
    # MXNet frees the view on an engine thread once the operations reading it have run: wait for
    # every engine operation, then for the lease's return on the ring's queue.
    gc.collect()
    mx.nd.waitall()
    assert wait_for_returns(ring, lambda r: r._held_locked() == 0, 5), "the lease never came back"
    assert ring.held_count() == 0
    ring.close()


# --- CSR inputs are checked before MXNet or the gather sees them ---------------------------------


def _bad_scipy(value_at=None):
    m = sp.random(10, 50, density=0.2, format="csr", dtype=np.float32, random_state=0)
    if value_at is not None:
        m.indices[3] = value_at  # scipy checks on construction only: a mutated matrix slips through
    return m


@pytest.mark.parametrize("bad", [10**6, -1, 50])
def test_csr_column_index_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match=rf"column index {bad} .*outside \[0, 50\)"):
        fm.NDArrayIter(_bad_scipy(bad), batch_size=2, last_batch_handle="discard")
    m = _bad_scipy()
    good = mx.nd.sparse.csr_matrix((m.data, m.indices, m.indptr), shape=m.shape)
    indices = m.indices.copy()
    indices[3] = bad
    if bad != 10**6:  # MXNet's own csr_matrix accepts -1 and 50 silently (10**6 crashes it)
        mxcsr = mx.nd.sparse.csr_matrix((m.data, indices, m.indptr), shape=m.shape)
        with pytest.raises(ValueError, match=rf"column index {bad} "):
            fm.NDArrayIter(mxcsr, batch_size=2)
    fm.NDArrayIter(good, batch_size=2).close()


def test_csr_structure_is_checked():
    m = sp.random(10, 50, density=0.2, format="csr", dtype=np.float32, random_state=0)
    base = (m.data, m.indices, m.indptr)

    def mx_csr(data, indices, indptr, shape=(10, 50)):
        arr = mx.nd.sparse.zeros("csr", shape)
        arr.indptr, arr.indices, arr.data = indptr, indices, data  # bypasses MXNet's construction
        return arr

    ptr = m.indptr.copy()
    ptr[4], ptr[5] = ptr[5], ptr[4] - 1
    with pytest.raises(ValueError, match="indptr decreases at row"):
        from fastload.mxnet.array_sources import check_csr

        check_csr("x", ptr, m.indices, len(m.data), (10, 50))
    with pytest.raises(ValueError, match="indptr has"):
        check_csr("x", m.indptr[:-1], m.indices, len(m.data), (10, 50))
    with pytest.raises(ValueError, match="ends at"):
        check_csr("x", m.indptr, m.indices[:-1], len(m.data) - 1, (10, 50))
    with pytest.raises(ValueError, match="starts at 3"):
        check_csr("x", m.indptr + 3, m.indices, len(m.data), (10, 50))
    unsorted = m.indices.copy()
    row = int(np.argmax(np.diff(m.indptr) >= 2))
    a = m.indptr[row]
    unsorted[a], unsorted[a + 1] = unsorted[a + 1], unsorted[a]
    with pytest.raises(ValueError, match=f"row {row} are not strictly increasing"):
        check_csr("x", m.indptr, unsorted, len(m.data), (10, 50))
    # scipy input in non-canonical form (unsorted, duplicates) is canonicalized, as scipy reads it.
    dup = sp.csr_matrix((np.array([1.0, 2.0, 3.0], np.float32), np.array([4, 1, 4]), np.array([0, 3, 3])), shape=(2, 5))
    it = fm.NDArrayIter(dup, batch_size=2)
    np.testing.assert_array_equal(it.next().data[0].asscipy().toarray(), dup.toarray())
    assert base  # the untouched matrix is still valid
    fm.NDArrayIter(m, batch_size=5).close()


def test_streamed_csr_damage_is_reported_when_read(tmp_path):
    from fastload.pack.arrays import ArraysPackConfig, pack_arrays

    x = sp.random(40, 30, density=0.3, format="csr", dtype=np.float32, random_state=1)
    sp.save_npz(tmp_path / "x.npz", x)
    out = tmp_path / "packed"
    pack_arrays(ArraysPackConfig(data={"x": str(tmp_path / "x.npz")}, out=str(out)))
    shard = next(out.glob("x-*.indices.npy"))
    idx = np.load(shard, mmap_mode="r+")
    idx[5] = 10**6
    idx.flush()
    del idx
    it = fm.NDArrayIter(str(out), batch_size=40)  # the indptr is fine: opening works
    with pytest.raises(ValueError, match=r"column index 1000000 .*outside \[0, 30\)"):
        it.next()  # the producer thread's check reaches the consumer
    it.close()
