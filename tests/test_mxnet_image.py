"""fastload.mxnet.ImageRecordIter: MXNet argument mapping, pinned/per-context batches, parts, Module.fit, dist_sync."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
from PIL import Image

import fastload.mxnet as fm
import fastload.transforms as transforms
from fastload.decode import decode_batch
from fastload.transforms import MXNetDefaultAugment

VENV_PY = sys.executable
MX_TOOLS = os.path.join(os.path.dirname(mx.__file__), "tools")
N_IMAGES = 60


def _image(i: int) -> bytes:
    """Class i % 3 is red, green or blue dominated: visually distinct, so accuracy is reachable."""
    rng = np.random.default_rng(i)
    h, w = 40 + (i % 5) * 4, 48 - (i % 3) * 4
    pixels = rng.integers(0, 90, (h, w, 3))
    pixels[..., i % 3] += 150
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mxnet_image")
    folder = root / "folder"
    for i in range(N_IMAGES):
        cls = folder / f"class{i % 3}"
        cls.mkdir(parents=True, exist_ok=True)
        (cls / f"img{i:03d}.jpg").write_bytes(_image(i))
    # A .rec written by MXNet's own MXIndexedRecordIO (labels = class, id = i).
    writer = mx.recordio.MXIndexedRecordIO(str(root / "mx.idx"), str(root / "mx.rec"), "w")
    for i in range(N_IMAGES):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i % 3), i, 0), _image(i)))
    writer.close()
    return root


def _rec(data_dir) -> str:
    return str(data_dir / "mx.rec")


def _collect(it):
    out = []
    for b in it:
        out.append((b.data[0].asnumpy(), b.label[0].asnumpy(), b.pad, np.asarray(b.index).copy()))
    return out


def test_reads_mxnet_rec_into_pinned_float_batches(data_dir):
    it = fm.ImageRecordIter(
        path_imgrec=_rec(data_dir),
        path_imgidx=str(data_dir / "mx.idx"),
        data_shape=(3, 24, 24),
        batch_size=16,
        resize=30,
    )
    assert it.provide_data == [mx.io.DataDesc("data", (16, 3, 24, 24), np.float32, "NCHW")]
    assert it.provide_label[0].name == "softmax_label" and it.provide_label[0].shape == (16,)
    batches, labels = [], []
    for b in it:
        # The data are the ring's pinned slot, zero-copy (MXNet labels such arrays cpu(0)); labels are copies.
        assert b.data[0].context == mx.cpu() and b.label[0].context == mx.cpu_pinned()
        assert b.data[0].dtype == np.float32 and b.data[0].shape == (16, 3, 24, 24)
        batches.append(b)
        # Read now: only the current and previous batch are guaranteed intact (the producer runs
        # on into the next epoch and may refill older slots).
        labels.append(b.label[0].asnumpy())
    assert len(batches) == 4 and batches[-1].pad == 4
    ids = np.concatenate([np.asarray(b.index)[: 16 - b.pad] for b in batches])
    assert sorted(ids.tolist()) == list(range(N_IMAGES))
    # round_batch (MXNet's default): the last batch is completed with the epoch's first records.
    np.testing.assert_array_equal(np.asarray(batches[-1].index)[12:], [0, 1, 2, 3])
    labels = np.concatenate(labels)
    np.testing.assert_array_equal(labels[:N_IMAGES], np.arange(N_IMAGES) % 3)
    it.close()


def test_uint8_is_the_raw_decode_and_float_normalization_matches_mxnet_formula(data_dir):
    common = dict(path_imgrec=_rec(data_dir), data_shape=(3, 20, 20), batch_size=8, resize=24)
    raw = fm.ImageRecordIter(dtype="uint8", **common).next()
    assert raw.data[0].dtype == np.uint8
    expected = np.empty((8, 3, 20, 20), np.uint8)
    from fastload.records.dataset import open_dataset

    with open_dataset(_rec(data_dir)) as ds:
        decode_batch(
            [ds.image(i) for i in range(8)],
            expected,
            MXNetDefaultAugment(data_shape=(3, 20, 20), resize=24),
            seed=0,
            epoch=0,
            indices=np.arange(8, dtype=np.int64),
        )
    np.testing.assert_array_equal(raw.data[0].asnumpy(), expected)
    norm = fm.ImageRecordIter(
        mean_r=120, mean_g=110, mean_b=100, std_r=50, std_g=60, std_b=70, scale=0.5, **common
    ).next()
    mean = np.array([120, 110, 100], np.float32).reshape(1, 3, 1, 1)
    std = np.array([50, 60, 70], np.float32).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(norm.data[0].asnumpy(), (expected - mean) / std * 0.5, rtol=1e-5, atol=1e-5)
    # As MXNet: uint8 output is the raw pixels, whatever mean/std/scale say (one warning names them).
    ignored = fm.ImageRecordIter(dtype="uint8", scale=1 / 255, mean_r=3, **common).next()
    np.testing.assert_array_equal(ignored.data[0].asnumpy(), expected)


def test_arguments_are_lenient_and_errors_are_mxnet_errors(data_dir):
    common = dict(path_imgrec=_rec(data_dir), data_shape=(3, 20, 20), batch_size=8)
    # Unknown arguments: ignored with one warning naming them (MXNet's own test_io passes `and_mirror`).
    with pytest.warns(fm.UnknownArgumentWarning, match="and_mirror"):
        it = fm.ImageRecordIter(and_mirror=False, **common)
    assert it.next().data[0].shape == (8, 3, 20, 20)
    it.close()
    # MXNet's error type for a bad path and a bad shape, naming the argument.
    with pytest.raises(mx.base.MXNetError, match="path_imgrec"):
        fm.ImageRecordIter(**dict(common, path_imgrec=str(data_dir / "missing.rec")))
    with pytest.raises(mx.base.MXNetError, match="path_imgidx"):
        fm.ImageRecordIter(path_imgidx=str(data_dir / "missing.idx"), **common)
    with pytest.raises(mx.base.MXNetError, match="data_shape"):
        fm.ImageRecordIter(**dict(common, data_shape=(5, 20, 20)))
    with pytest.raises(ValueError, match="label_width=2"):
        fm.ImageRecordIter(label_width=2, **common)
    # MXNet's no-op defaults and the values common/data.py always passes are accepted.
    fm.ImageRecordIter(
        max_rotate_angle=0,
        pad=0,
        fill_value=127,
        inter_method=1,
        verbose=False,
        ctx="gpu",
        min_random_scale=1,
        max_random_scale=1,
        min_aspect_ratio=None,
        **common,
    ).close()


def test_augmentation_arguments_reach_the_geometry(data_dir):
    common = dict(path_imgrec=_rec(data_dir), data_shape=(3, 20, 20), batch_size=8)
    it = fm.ImageRecordIter(
        random_resized_crop=True,
        min_random_area=0.08,
        max_random_area=1.0,
        min_aspect_ratio=0.75,
        max_aspect_ratio=4 / 3,
        rand_mirror=True,
        **common,
    )
    t = it.config.transform
    t = getattr(t, "geometry", t)  # a Pipeline when colour or normalization ops follow the geometry
    assert isinstance(t, transforms.MXNetDefaultAugment) and t.random_resized_crop and t.size == (20, 20)
    assert (t.min_random_area, t.min_aspect_ratio, t.max_aspect_ratio, t.rand_mirror) == (0.08, 0.75, 4 / 3, True)
    it.close()
    it = fm.ImageRecordIter(resize=32, mirror=True, **common)
    g = getattr(it.config.transform, "geometry", it.config.transform)
    assert isinstance(g, transforms.MXNetDefaultAugment) and g.resize == 32 and g.mirror
    mirrored = it.next().data[0].asnumpy()
    it.close()
    plain = fm.ImageRecordIter(resize=32, **common).next().data[0].asnumpy()
    np.testing.assert_array_equal(mirrored, plain[..., ::-1])


def test_ctx_list_places_slices_and_matches_the_pinned_batch(data_dir):
    common = dict(
        path_imgrec=_rec(data_dir),
        data_shape=(3, 20, 20),
        batch_size=12,
        shuffle=True,
        seed=3,
        random_resized_crop=True,
        min_random_area=0.3,
        rand_mirror=True,
    )
    pinned = fm.ImageRecordIter(**common)
    placed = fm.ImageRecordIter(ctx=[mx.cpu(0), mx.cpu(1)], work_load_list=[2, 1], **common)
    for _ in range(2):  # two epochs, through reset()
        for a, b in zip(pinned, placed, strict=False):
            parts = b.data[0]
            assert [p.context for p in parts] == [mx.cpu(0), mx.cpu(1)]
            assert [p.shape[0] for p in parts] == [8, 4]
            assert [p.context for p in b.label[0]] == [mx.cpu(0), mx.cpu(1)]
            np.testing.assert_array_equal(np.concatenate([p.asnumpy() for p in parts]), a.data[0].asnumpy())
        pinned.reset()
        placed.reset()


def test_epochs_reshuffle_and_crops_change(data_dir):
    it = fm.ImageRecordIter(
        path_imgrec=_rec(data_dir),
        data_shape=(3, 20, 20),
        batch_size=10,
        shuffle=True,
        random_resized_crop=True,
        min_random_area=0.2,
    )
    e0 = _collect(it)
    it.reset()
    e1 = _collect(it)
    assert len(e0) == len(e1) == 6
    ids0 = np.concatenate([b[3] for b in e0])
    ids1 = np.concatenate([b[3] for b in e1])
    assert sorted(ids0.tolist()) == sorted(ids1.tolist()) == list(range(N_IMAGES))
    assert ids0.tolist() != ids1.tolist()
    with pytest.raises(StopIteration):  # like MXNet: an exhausted epoch needs reset()
        it.next()


@pytest.mark.parametrize("how", ["part_index", "rank"])
def test_parts_cover_every_record_with_equal_batch_counts(data_dir, how):
    seen, counts = [], []
    for part in range(4):
        extra = dict(part_index=part, num_parts=4) if how == "part_index" else dict(rank=part, num_workers=4)
        it = fm.ImageRecordIter(
            path_imgrec=_rec(data_dir),
            data_shape=(3, 16, 16),
            batch_size=7,
            shuffle=True,
            seed=2,
            dtype="uint8",
            **extra,
        )
        batches = _collect(it)
        counts.append(len(batches))
        seen.extend(np.concatenate([b[3][: 7 - b[2]] for b in batches]).tolist())
        it.close()
    assert len(set(counts)) == 1
    assert set(seen) == set(range(N_IMAGES))


def test_reads_a_rec_made_by_im2rec(data_dir):
    pytest.importorskip("cv2")  # MXNet's im2rec.py needs OpenCV
    prefix = str(data_dir / "im2rec")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    subprocess.run(
        [VENV_PY, os.path.join(MX_TOOLS, "im2rec.py"), "--list", "--recursive", prefix, str(data_dir / "folder")],
        check=True,
        capture_output=True,
        env=env,
    )
    subprocess.run(
        [
            VENV_PY,
            os.path.join(MX_TOOLS, "im2rec.py"),
            "--pass-through",
            "--num-thread",
            "1",
            prefix,
            str(data_dir / "folder"),
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    it = fm.ImageRecordIter(
        path_imgrec=prefix + ".rec", path_imgidx=prefix + ".idx", data_shape=(3, 16, 16), batch_size=20, dtype="uint8"
    )
    batches = _collect(it)
    assert len(batches) == 3
    labels = np.concatenate([b[1] for b in batches])
    # im2rec --recursive labels by sorted sub-folder: class0, class1, class2 -> 0, 1, 2.
    assert sorted(np.bincount(labels.astype(int)).tolist()) == [20, 20, 20]
    # And the pixels: red/green/blue dominance follows the label.
    for images, lab, _, _ in batches:
        dominant = images.astype(np.float32).mean(axis=(2, 3)).argmax(axis=1)
        np.testing.assert_array_equal(dominant, lab.astype(int))


def test_reads_a_fastload_pack_folder(data_dir):
    packer = pytest.importorskip("fastload.pack.packer")
    out = data_dir / "packed"
    if not out.exists():
        packer.pack_folder(str(data_dir / "folder"), str(out), options=packer.PackOptions(shards=2, progress=False))
    it = fm.ImageRecordIter(path_imgrec=str(out), data_shape=(3, 16, 16), batch_size=20, dtype="uint8")
    batches = _collect(it)
    labels = np.concatenate([b[1] for b in batches])
    assert len(batches) == 3 and sorted(np.bincount(labels.astype(int)).tolist()) == [20, 20, 20]


def _small_net():
    data = mx.sym.var("data")
    net = mx.sym.Convolution(data, kernel=(3, 3), num_filter=8, name="conv")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.Pooling(net, global_pool=True, pool_type="avg", kernel=(1, 1))
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=3, name="fc")
    return mx.sym.SoftmaxOutput(net, mx.sym.var("softmax_label"), name="softmax")


def test_module_fit_on_two_contexts_reaches_accuracy(data_dir):
    mx.random.seed(0)
    np.random.seed(0)
    common = dict(
        path_imgrec=_rec(data_dir),
        data_shape=(3, 24, 24),
        batch_size=12,
        scale=1 / 255.0,
        mean_r=110,
        mean_g=110,
        mean_b=110,
    )
    train = fm.ImageRecordIter(shuffle=True, random_resized_crop=True, min_random_area=0.5, rand_mirror=True, **common)
    val = fm.ImageRecordIter(resize=28, **common)
    mod = mx.mod.Module(_small_net(), context=[mx.cpu(0), mx.cpu(1)])
    mod.fit(
        train,
        num_epoch=8,
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.5, "momentum": 0.9},
        initializer=mx.init.Xavier(),
    )
    acc = dict(mod.score(val, "acc"))["accuracy"]
    assert acc >= 0.9, acc
    train.close()
    val.close()


def test_gluon_loop_with_per_context_batches(data_dir):
    from mxnet import autograd, gluon

    mx.random.seed(1)
    ctxs = [mx.cpu(0), mx.cpu(1)]
    it = fm.ImageRecordIter(
        path_imgrec=_rec(data_dir),
        data_shape=(3, 24, 24),
        batch_size=12,
        shuffle=True,
        scale=1 / 255.0,
        mean_r=110,
        mean_g=110,
        mean_b=110,
        ctx=ctxs,
    )
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3, activation="relu"), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    metric = mx.metric.Accuracy()
    for epoch in range(8):
        it.reset()
        metric.reset()
        for batch in it:
            with autograd.record():
                outs = [net(x) for x in batch.data[0]]
                losses = [loss_fn(o, y) for o, y in zip(outs, batch.label[0], strict=False)]
            for loss in losses:
                loss.backward()
            trainer.step(it.batch_size)
            metric.update(batch.label[0], outs)
    assert metric.get()[1] >= 0.9, metric.get()
    it.close()


_DIST_WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import mxnet as mx
    sys.path.insert(0, {repo!r})
    import fastload.mxnet as fm
    kv = mx.kv.create("dist_sync")
    it = fm.ImageRecordIter(path_imgrec={rec!r}, data_shape=(3, 16, 16), batch_size=7, shuffle=True, seed=5,
                            dtype="uint8", kvstore=kv)
    kv.init(0, mx.nd.zeros((1,)))
    ids, steps = [], 0
    for batch in it:
        # A dist_sync push per batch: a worker with fewer batches would leave the other waiting forever.
        kv.push(0, mx.nd.ones((1,)))
        out = mx.nd.zeros((1,))
        kv.pull(0, out=out)
        out.wait_to_read()
        ids.extend(np.asarray(batch.index)[: 7 - batch.pad].tolist())
        steps += 1
    with open({out!r} + "." + str(kv.rank), "w") as f:
        json.dump({{"rank": kv.rank, "workers": kv.num_workers, "parts": [it.part_index, it.num_parts],
                    "steps": steps, "ids": ids}}, f)
""")


def test_dist_sync_two_workers_on_loopback(data_dir, repo_root):
    """A real dist_sync run on this machine: a scheduler, 1 server, 2 workers (tests/mxnet_clients/dist.py)."""
    clients = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_clients")
    sys.path.insert(0, clients)
    try:
        from dist import launch_local
    finally:
        sys.path.remove(clients)
    worker = data_dir / "dist_worker.py"
    out = str(data_dir / "dist_result")
    worker.write_text(_DIST_WORKER.format(repo=str(repo_root), rec=_rec(data_dir), out=out))
    codes, stderr = launch_local([VENV_PY, str(worker)], workers=2, servers=1, timeout=180)
    assert codes == [0, 0], stderr[-2000:]
    results = [json.loads(open(f"{out}.{r}").read()) for r in range(2)]
    assert sorted(r["parts"][0] for r in results) == [0, 1] and all(r["parts"][1] == 2 for r in results)
    assert results[0]["steps"] == results[1]["steps"] == 5  # ceil(ceil(60 / 2) / 7)
    assert set(results[0]["ids"]) | set(results[1]["ids"]) == set(range(N_IMAGES))
    assert not set(results[0]["ids"]) & set(results[1]["ids"])


def test_prefetching_iter_over_mxnet_cpp_iterator_keeps_batches_intact(data_dir):
    def make():
        return mx.io.ImageRecordIter(
            path_imgrec=_rec(data_dir),
            data_shape=(3, 16, 16),
            batch_size=8,
            resize=20,
            dtype="uint8",
            preprocess_threads=1,
            verbose=False,
        )

    # MXNet's C++ iterator carries round_batch overflow into the next epoch, so epochs differ:
    # compare epoch by epoch with a directly driven iterator.
    direct = make()
    expected = []
    for _ in range(2):
        expected.append([(d, l) for d, l, _, _ in _collect(direct)])
        direct.reset()
    with fm.PrefetchingIter(make(), prefetch=2) as it:
        for epoch in range(2):
            got = [(d, l) for d, l, _, _ in _collect(it)]
            assert len(got) == len(expected[epoch])
            for (d1, l1), (d2, l2) in zip(got, expected[epoch], strict=False):
                np.testing.assert_array_equal(d1, d2)
                np.testing.assert_array_equal(l1, l2)
            it.reset()


def test_state_dict_resumes_mid_epoch(data_dir):
    common = dict(
        path_imgrec=_rec(data_dir),
        data_shape=(3, 16, 16),
        batch_size=8,
        shuffle=True,
        seed=7,
        random_resized_crop=True,
        min_random_area=0.3,
        dtype="uint8",
    )
    full = fm.ImageRecordIter(**common)
    full.reset()  # resume across an epoch boundary too: epoch 1
    expected = _collect(full)
    it = fm.ImageRecordIter(**common)
    it.reset()
    got = [_collect([it.next()])[0] for _ in range(3)]
    state = it.state_dict()
    it.close()
    resumed = fm.ImageRecordIter(**common)
    resumed.load_state_dict(state)
    got += _collect(resumed)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=False):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[3], b[3])


def test_slot_is_not_refilled_while_engine_work_still_reads_it(data_dir):
    """The pinned-memory ownership rule: queued engine reads of a batch finish before its slot is reused."""
    it = fm.ImageRecordIter(
        path_imgrec=_rec(data_dir), data_shape=(3, 16, 16), batch_size=4, dtype="uint8", prefetch_buffer=1, shuffle=True
    )
    first = it.next()
    original = first.data[0].asnumpy().copy()
    # An engine op that reads the batch but cannot start before a slow matrix product finishes:
    # without the fence the producer would overwrite the slot first (the ring has only 3 slots).
    big = mx.nd.ones((900, 900))
    slow_zero = mx.nd.dot(mx.nd.dot(big, big), big).sum() * 0
    pending = mx.nd.broadcast_add(first.data[0].astype("float32"), slow_zero.reshape((1, 1, 1, 1)))
    rest = sum(1 for _ in it)
    assert rest == 14
    np.testing.assert_array_equal(pending.asnumpy(), original.astype(np.float32))
    it.close()


def _small_rec(root, n: int) -> str:
    """An MXNet-written .rec of ``n`` 12x12 JPEGs; record i has label i % 7 + 1 (never 0) and id 500 + i."""
    rec = str(root / f"small{n}.rec")
    writer = mx.recordio.MXIndexedRecordIO(str(root / f"small{n}.idx"), rec, "w")
    for i in range(n):
        pixels = np.random.default_rng(i).integers(0, 256, (12, 12, 3)).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i % 7 + 1), 500 + i, 0), buf.getvalue()))
    writer.close()
    return rec


@pytest.mark.parametrize("round_batch", [True, False])
@pytest.mark.parametrize(("n", "batch_size", "dtype"), [(48, 32, "float32"), (10, 4, "uint8")])
def test_last_partial_batch_matches_mxnet_batch_count_shapes_and_pad(tmp_path, n, batch_size, dtype, round_batch):
    """Regression: round_batch=False once turned the slot's never-written index rows into record ids."""
    rec = _small_rec(tmp_path, n)
    theirs = mx.io.ImageRecordIter(
        path_imgrec=rec,
        path_imgidx=rec[:-4] + ".idx",
        data_shape=(3, 8, 8),
        batch_size=batch_size,
        round_batch=round_batch,
        preprocess_threads=1,
    )
    references = []
    for _ in range(3):
        references.append([(b.data[0].shape, b.label[0].shape, b.pad, b.label[0].asnumpy()) for b in theirs])
        theirs.reset()
    reference = references[0]
    nbatches = -(-n // batch_size)
    missing = nbatches * batch_size - n
    assert len(reference) == nbatches
    labels = (np.arange(n) % 7 + 1).astype(np.float32)
    if round_batch:
        # MXNet completes the last batch with the first records and reports how many.
        assert reference[-1][2] == missing
        np.testing.assert_array_equal(
            np.concatenate([r[3] for r in reference]), np.concatenate([labels, labels[:missing]])
        )
    else:
        # Measured on MXNet 1.9.1: a full-size batch with pad=0 whose last rows are no records.
        assert reference[-1][2] == 0
    # A small ring (3 slots) and three epochs: every slot is refilled, so stale rows would show.
    mine = fm.ImageRecordIter(
        path_imgrec=rec,
        data_shape=(3, 8, 8),
        batch_size=batch_size,
        round_batch=round_batch,
        preprocess_threads=1,
        prefetch_buffer=1,
        dtype=dtype,
    )
    start = 0  # round_batch: where the epoch starts, after the records the previous one borrowed (as MXNet)
    first_pixels = None
    for epoch in range(3):
        got = _collect(mine)
        count = -(-(n - start) // batch_size)
        assert len(got) == count == len(references[epoch]) if round_batch else len(got) == nbatches
        missing = count * batch_size - (n - start)
        for k, ((data, label, pad, _), (data_shape, label_shape, _, _)) in enumerate(zip(got, reference, strict=False)):
            assert data.shape == data_shape and label.shape == label_shape
            assert pad == (missing if k == len(got) - 1 else 0)
        if first_pixels is None:
            first_pixels = got[0][0]
        images = np.concatenate([g[0][: batch_size - g[2]] for g in got])
        assert images.shape[0] == n - start
        np.testing.assert_array_equal(np.concatenate([g[1][: batch_size - g[2]] for g in got]), labels[start:])
        np.testing.assert_array_equal(
            np.concatenate([g[3][: batch_size - g[2]] for g in got]), 500 + np.arange(start, n)
        )
        data, label, pad, index = got[-1]
        real = batch_size - pad
        if round_batch:
            np.testing.assert_array_equal(label, references[epoch][-1][3])
            np.testing.assert_array_equal(index, np.concatenate([500 + np.arange(n - real, n), 500 + np.arange(pad)]))
            np.testing.assert_array_equal(data[real:], first_pixels[:pad])  # the first records' pixels
            start = pad
        else:
            np.testing.assert_array_equal(label[real:], 0)
            np.testing.assert_array_equal(data[real:], 0)
            np.testing.assert_array_equal(index, 500 + np.arange(n - real, n))
        mine.reset()
    mine.close()


def test_bench_counts_the_records_each_iterator_delivers(tmp_path):
    """Regression: with round_batch=False MXNet's padded last batch has pad=0, so rows - pad over-counted."""
    from bench.mxnet_iters import FastloadImageRunner, _MXImageRunner, _part_records

    n = 48
    rec = _small_rec(tmp_path, n)
    assert [_part_records(10, p, 3) for p in range(3)] == [4, 4, 2]
    assert [_part_records(10, p, 4) for p in range(4)] == [3, 3, 3, 1]
    common = dict(batch_size=32, size=8, threads=1, seed=0)
    for parts in (1, 2, 3):
        runner = _MXImageRunner(rec, parts=parts, limit=None, **common)
        assert runner.run() == n, f"MXNet, {parts} part(s)"
        runner.close()
    mine = FastloadImageRunner({"rec": rec, **common})
    assert mine.run()["images"] == n
    mine.limit = 1
    assert mine.run()["images"] == 32
    mine.close()
    (tmp_path / f"small{n}.idx").unlink()
    with pytest.raises(FileNotFoundError, match="idx"):
        _MXImageRunner(rec, parts=1, limit=None, **common)
