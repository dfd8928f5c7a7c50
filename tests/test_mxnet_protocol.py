"""The DataIter protocol on fastload.mxnet's iterators, MXNet's wrappers around them, and test_io-style cases.

MXNet 1.9.1's tests/python/unittest/test_io.py was read for what it checks (test_NDArrayIter with its
_test_last_batch_handle / _test_shuffle / _test_corner_case, test_NDArrayIter_csr); the cases below
exercise the same behaviour with fastload's classes, written for this repository.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
sp = pytest.importorskip("scipy.sparse")
from PIL import Image

import fastload.mxnet as fm


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    root = tmp_path_factory.mktemp("protocol")
    path = str(root / "p.rec")
    writer = mx.recordio.MXIndexedRecordIO(str(root / "p.idx"), path, "w")
    for i in range(22):
        pixels = np.random.default_rng(i).integers(0, 256, (10, 10, 3)).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i % 3), 70 + i, 0), buf.getvalue()))
    writer.close()
    return path


def _image_iter(rec, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fm.ImageRecordIter(path_imgrec=rec, data_shape=(3, 10, 10), batch_size=5, dtype="uint8", **kw)


def _makers(rec):
    x = np.arange(23 * 4, dtype=np.float32).reshape(23, 4)
    y = np.arange(23, dtype=np.float32)
    csr = sp.random(23, 30, density=0.2, format="csr", dtype=np.float32, random_state=5)
    return {
        "ndarray": lambda: fm.NDArrayIter(x, y, batch_size=5),
        "csr": lambda: fm.NDArrayIter({"a": csr, "b": x}, y, batch_size=5, last_batch_handle="discard"),
        "image": lambda: _image_iter(rec),
        "prefetching": lambda: fm.PrefetchingIter(fm.NDArrayIter(x, y, batch_size=5)),
    }


def _as_list(a):
    return a if isinstance(a, list) else [a]


def _dense(a):
    return a.asscipy().toarray() if getattr(a, "stype", "default") == "csr" else a.asnumpy()


def _snapshot(data, label, pad, index):
    return (
        [_dense(a) for a in _as_list(data)],
        [_dense(a) for a in ([] if label is None else _as_list(label))],
        pad,
        None if index is None else np.asarray(index).tolist(),
    )


def _same(a, b):
    assert len(a) == len(b)
    for (d1, l1, p1, i1), (d2, l2, p2, i2) in zip(a, b, strict=False):
        assert p1 == p2 and i1 == i2
        for u, v in zip(d1 + l1, d2 + l2, strict=False):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("kind", ["ndarray", "csr", "image", "prefetching"])
def test_pull_api_gives_what_next_gives(rec, kind):
    make = _makers(rec)[kind]
    it = make()
    assert it.default_bucket_key is None
    by_next = [_snapshot(b.data, b.label, b.pad, b.index) for b in it]

    def again(it):
        it.reset()
        if kind != "image":
            return it
        # round_batch: the next epoch starts after the records the last batch borrowed (as MXNet's),
        # so the pull API is compared with a fresh iterator's first epoch.
        it.close()
        return make()

    it = again(it)
    pulled = []
    while it.iter_next():
        pulled.append(_snapshot(it.getdata(), it.getlabel(), it.getpad(), it.getindex()))
    _same(pulled, by_next)
    assert not it.iter_next()  # still at the end
    it = again(it)
    through_dunder = []
    while True:
        try:
            b = it.__next__()
        except StopIteration:
            break
        through_dunder.append(_snapshot(b.data, b.label, b.pad, b.index))
    _same(through_dunder, by_next)
    it.reset()
    first = it.__next__()
    assert first.provide_data == it.provide_data and first.provide_label == it.provide_label
    it.close()
    fresh = make()
    with pytest.raises(RuntimeError, match="iter_next"):
        fresh.getdata()
    fresh.close()


def test_getters_follow_the_wrapped_mxnet_class(rec):
    # MXNet's C++ iterators (behind ImageRecordIter) return one array; its Python iterators a list.
    it = _image_iter(rec)
    assert it.iter_next()
    assert isinstance(it.getdata(), mx.nd.NDArray) and isinstance(it.getlabel(), mx.nd.NDArray)
    theirs = mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 10, 10), batch_size=5, dtype="uint8", verbose=False)
    assert theirs.iter_next() and isinstance(theirs.getdata(), mx.nd.NDArray)
    nd = fm.NDArrayIter(np.zeros((4, 2), np.float32), batch_size=2)
    assert nd.iter_next() and isinstance(nd.getdata(), list)
    it.close()


class _FirstTwo(fm.NDArrayIter):
    """A subclass that stops after two batches by overriding iter_next, and doubles the data."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.count = 0

    def reset(self):
        super().reset()
        self.count = 0

    def iter_next(self):
        if self.count == 2:
            return False
        self.count += 1
        return super().iter_next()

    def getdata(self):
        return [a * 2 for a in super().getdata()]


def test_subclasses_overriding_iter_next_and_getters_are_obeyed():
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    it = _FirstTwo(x, batch_size=4)
    got = [b.data[0].asnumpy() for b in it]
    assert len(got) == 2
    np.testing.assert_array_equal(np.concatenate(got), x[:8] * 2)
    it.reset()
    assert len(list(it)) == 2


@pytest.mark.parametrize("size", [3, 11])
def test_mx_resize_iter_wraps_fastload_iterators(size):
    x = np.arange(23 * 4, dtype=np.float32).reshape(23, 4)
    y = np.arange(23, dtype=np.float32)
    mine = mx.io.ResizeIter(fm.NDArrayIter(x, y, batch_size=5), size)
    theirs = mx.io.ResizeIter(mx.io.NDArrayIter(x, y, batch_size=5), size)
    assert mine.provide_data == theirs.provide_data and mine.default_bucket_key is None
    for _ in range(2):
        a = [_snapshot(b.data, b.label, b.pad, None) for b in mine]
        b = [_snapshot(b.data, b.label, b.pad, None) for b in theirs]
        assert len(a) == size
        _same(a, b)
        mine.reset()
        theirs.reset()


def test_mx_resize_iter_over_image_record_iter_for_dist_sync(rec):
    """common/fit.py wraps the training iterator in ResizeIter(train, epoch_size) for dist_sync."""
    it = mx.io.ResizeIter(_image_iter(rec, shuffle=True), 7)  # 5 batches per epoch: wraps into the next
    for _ in range(2):
        batches = list(it)
        assert len(batches) == 7 and all(b.data[0].shape == (5, 3, 10, 10) for b in batches)
        it.reset()


def test_mx_prefetching_iter_wraps_fastload_iterators(rec):
    x = np.arange(22 * 2, dtype=np.float32).reshape(22, 2)

    def direct():
        return (
            [_snapshot(b.data, b.label, b.pad, None) for b in _image_iter(rec, round_batch=False)],
            [_snapshot(b.data, b.label, b.pad, None) for b in fm.NDArrayIter(x, batch_size=5)],
        )

    # round_batch=False: every epoch has the same pad, which mx.io.PrefetchingIter requires of the
    # iterators it joins (with round_batch, MXNet's epochs differ after the first).
    images, arrays = direct()
    it = mx.io.PrefetchingIter(
        [_image_iter(rec, round_batch=False), fm.NDArrayIter(x, batch_size=5)],
        rename_data=[{"data": "img"}, {"data": "arr"}],
    )
    assert [d.name for d in it.provide_data] == ["img", "arr"]
    for _ in range(3):  # MXNet's threads call next(); reset() comes from this thread
        got = [(_dense(b.data[0]), _dense(b.data[1]), b.label[0].asnumpy()) for b in it]
        assert len(got) == len(images) == len(arrays)
        for (img, arr, lab), (d1, l1, _, _), (d2, _, _, _) in zip(got, images, arrays, strict=False):
            np.testing.assert_array_equal(img, d1[0])
            np.testing.assert_array_equal(lab, l1[0])
            np.testing.assert_array_equal(arr, d2[0])
        it.reset()
        images, arrays = direct()
    # mx.io.PrefetchingIter's threads refer to it, so it is never collected: stop them as its __del__
    # would, then close fastload's iterators (their producers would otherwise run on).
    it.started = False
    for event in it.data_taken:
        event.set()
    for thread in it.prefetch_threads:
        thread.join()
    for inner in it.iters:
        inner.close()


def test_image_iter_next_from_another_thread_continues_the_epoch(rec):
    import threading

    reference = [b.index.tolist() for b in _image_iter(rec, shuffle=True)]
    it = _image_iter(rec, shuffle=True)
    got = [it.next().index.tolist()]
    box = []
    t = threading.Thread(target=lambda: box.extend(b.index.tolist() for b in it))
    t.start()
    t.join()
    assert got + box == reference
    it.close()


# --- test_io.py-style NDArrayIter cases ------------------------------------------------------------


def _io_data(kind, image=False):
    if image:
        return mx.nd.random.uniform(0, 255, shape=(500, 1, 6, 6)), mx.nd.ones((500, 1))
    data = np.ones((1000, 2, 2)) if kind == "numpy" else mx.nd.ones((1000, 2, 2))
    labels = np.ones((1000, 1)) if kind == "numpy" else mx.nd.ones((1000, 1))
    for i in range(1000):
        data[i] = i / 100
        labels[i] = i / 100
    return data, labels


def _last_batch_handle_case(data, labels, image):
    counts = {"pad": 4 if image else 8, "discard": 3 if image else 7, "roll_over": 3 if image else 7}
    per_label = {"pad": (124, 100), "discard": (100, 96), "roll_over": (100, 96)}
    cache = None
    for mode in ("pad", "discard", "roll_over"):
        it = fm.NDArrayIter(data, labels, 128, False, last_batch_handle=mode)
        n, seen = 0, np.zeros(10, dtype=int)
        for batch in it:
            n += 1
            if isinstance(data, (list, dict)):
                assert len(batch.data) == 2
            if labels is not None and len(labels) and not image:
                label = batch.label[0].asnumpy().ravel()
                np.testing.assert_array_equal(batch.data[0].asnumpy()[:, 0, 0], label)
                np.add.at(seen, label.astype(int), 1)
            elif labels is None or not len(labels):
                assert not batch.label
            if mode == "pad" and n == counts["pad"]:
                cache = batch.data[0].asnumpy()
        assert n == counts[mode], mode
        if labels is not None and len(labels) and not image:
            assert (seen[0], seen[8]) == per_label[mode], mode
    it.reset()  # roll_over: the first batch of the next epoch is the rolled-over rows + the first ones
    np.testing.assert_array_equal(it.next().data[0].asnumpy(), cache)


@pytest.mark.parametrize("kind", ["NDArray", "numpy"])
@pytest.mark.parametrize("image", [False, True])
def test_ndarrayiter_last_batch_handle_as_test_io(kind, image):
    data, labels = _io_data(kind, image)
    _last_batch_handle_case(data, labels, image)
    _last_batch_handle_case([data, data], labels, image)
    _last_batch_handle_case([data, data], None, image)
    _last_batch_handle_case({"data1": data, "data2": data}, labels, image)
    _last_batch_handle_case(data, [], image)
    _last_batch_handle_case(data, None, image)


@pytest.mark.parametrize("inputs", ["one", "list", "dict", "no_label"])
def test_ndarrayiter_idx_is_the_shuffled_order_as_test_io(inputs):
    data, labels = _io_data("numpy")
    data, labels = data[:60], labels[:60]
    shaped = {
        "one": (data, labels),
        "list": ([data, data], labels),
        "dict": ({"d1": data, "d2": data}, labels),
        "no_label": (data, None),
    }[inputs]
    plain = [b.data[0].asnumpy() for b in fm.NDArrayIter(*shaped, 1, False)]
    it = fm.NDArrayIter(*shaped, 1, True)
    idx = it.idx
    assert sorted(idx.tolist()) == list(range(60)) and idx.tolist() != list(range(60))
    for i, batch in enumerate(it):
        np.testing.assert_array_equal(batch.data[0].asnumpy(), plain[idx[i]])
    # MXNet's data attribute holds the inputs in idx order.
    _name, arr = it.data[0]
    np.testing.assert_array_equal(arr.asnumpy(), data[idx].astype(np.float32))
    it.reset()
    assert it.idx.tolist() != idx.tolist()  # reshuffled
    np.testing.assert_array_equal(it.data[0][1].asnumpy(), data[it.idx].astype(np.float32))
    if shaped[1] is not None:
        np.testing.assert_array_equal(it.label[0][1].asnumpy(), labels[it.idx].astype(np.float32))
    else:
        assert it.label == []


def test_ndarrayiter_cursor_and_num_data_as_mxnet():
    x = np.arange(10, dtype=np.float32)[:, None]
    for mode in ("pad", "discard", "roll_over"):
        mine, theirs = (
            fm.NDArrayIter(x, batch_size=4, last_batch_handle=mode),
            mx.io.NDArrayIter(x, batch_size=4, last_batch_handle=mode),
        )
        assert mine.num_data == theirs.num_data == 10
        for _ in range(3):
            assert mine.cursor == theirs.cursor
            while True:
                b1, b2 = next(mine, None), next(theirs, None)
                assert mine.cursor == theirs.cursor, mode
                if b1 is None or b2 is None:
                    assert b1 is b2 is None
                    break
                assert b1.pad == b2.pad
            mine.reset()
            theirs.reset()


def test_ndarrayiter_corner_case_batch_larger_than_data():
    it = fm.NDArrayIter(data=np.arange(10), batch_size=205, shuffle=False, last_batch_handle="pad")
    np.testing.assert_array_equal(
        it.next().data[0].asnumpy(), np.concatenate((np.tile(np.arange(10), 20), np.arange(5)))
    )


def test_ndarrayiter_csr_as_test_io():
    rng = np.random.default_rng(7)
    for _ in range(5):
        rows, cols = int(rng.integers(5, 15)), int(rng.integers(1, 20))
        batch_size = int(rng.integers(1, rows))
        csr = sp.random(rows, cols, density=0.3, format="csr", dtype=np.float32, random_state=int(rng.integers(99)))
        dns = csr.toarray()
        # MXNet raises NotImplementedError for CSR unless 'discard'; fastload's extension gives dense padding.
        with pytest.raises(NotImplementedError):
            mx.io.NDArrayIter({"data": mx.nd.sparse.array(csr)}, dns, batch_size)
        padded = [b.data[0].asscipy().toarray() for b in fm.NDArrayIter({"data": csr}, dns, batch_size)]
        dense = [b.data[0].asnumpy() for b in mx.io.NDArrayIter({"data": dns}, dns, batch_size)]
        assert len(padded) == len(dense) and all(np.array_equal(a, b) for a, b in zip(padded, dense, strict=False))
        for label in (dns, [], None):
            its = [
                fm.NDArrayIter({"data": csr}, label, batch_size, shuffle=True, last_batch_handle="discard"),
                fm.NDArrayIter(
                    {"csr_data": mx.nd.sparse.array(csr), "dns_data": dns},
                    label,
                    batch_size,
                    shuffle=True,
                    last_batch_handle="discard",
                ),
            ]
            for it in its:
                n = 0
                for batch in it:
                    n += 1
                    assert bool(batch.label) == (label is dns)
                assert n == rows // batch_size
                with pytest.raises(StopIteration):
                    it.next()
        it = fm.NDArrayIter(csr, csr, batch_size, last_batch_handle="discard")
        for k, batch in enumerate(it):
            np.testing.assert_allclose(batch.data[0].asnumpy(), dns[k * batch_size : (k + 1) * batch_size])
