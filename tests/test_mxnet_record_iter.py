"""fastload.mxnet.ImageRecordIter against mx.io.ImageRecordIter on the same .rec: outputs, files, aliases, protocol.

The images here are exactly ``data_shape`` in size, so MXNet's centre crop takes the whole image and
fastload's geometry is the identity too: what is compared is decoding, labels, normalization,
dtypes, grayscale, index files, image lists and mean images, batch for batch.
"""

from __future__ import annotations

import io
import os
import shutil
import warnings

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
from PIL import Image

import fastload.mxnet as fm

N = 24
SIDE = 16
SHAPE = (3, SIDE, SIDE)


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(100 + i)
    # Smooth gradients plus a little noise: JPEG-friendly, so decoders agree closely.
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    base = np.stack([x * 12 + i * 3, y * 10 + 40, (x + y) * 6 + i * 5], axis=-1)
    pixels = np.clip(base + rng.integers(0, 8, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=95)
    return buf.getvalue()


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    """A .rec written by MXNet; record i has id 1000 + i and labels (i % 4, i % 3) (two per record)."""
    root = tmp_path_factory.mktemp("record_iter")
    path = str(root / "data.rec")
    writer = mx.recordio.MXIndexedRecordIO(str(root / "data.idx"), path, "w")
    for i in range(N):
        header = mx.recordio.IRHeader(0, [float(i % 4), float(i % 3)], 1000 + i, 0)
        writer.write_idx(i, mx.recordio.pack(header, _jpeg(i)))
    writer.close()
    one = str(root / "one.rec")
    writer = mx.recordio.MXIndexedRecordIO(str(root / "one.idx"), one, "w")
    for i in range(N):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i % 4), 1000 + i, 0), _jpeg(i)))
    writer.close()
    return {"root": root, "multi": path, "single": one}


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _epoch(it):
    return [(b.data[0].asnumpy(), b.label[0].asnumpy(), b.pad) for b in it]


def _theirs(**kwargs):
    kwargs.setdefault("verbose", False)
    kwargs.setdefault("preprocess_threads", 1)
    return mx.io.ImageRecordIter(**kwargs)


def _mine(cls=None, **kwargs):
    return _quiet(cls or fm.ImageRecordIter, **kwargs)


def _compare(mine, theirs, atol, mean_tol):
    a, b = _epoch(mine), _epoch(theirs)
    assert len(a) == len(b)
    diffs = []
    for (d1, l1, p1), (d2, l2, p2) in zip(a, b, strict=False):
        assert d1.dtype == d2.dtype and d1.shape == d2.shape
        np.testing.assert_array_equal(l1, l2)
        assert p1 == p2
        diff = np.abs(d1.astype(np.float64) - d2.astype(np.float64))
        diffs.append(diff)
    diff = np.concatenate([d.ravel() for d in diffs])
    assert diff.max() <= atol, diff.max()
    assert diff.mean() <= mean_tol, diff.mean()
    return diff


@pytest.mark.parametrize(
    ("dtype", "extra", "atol"),
    [
        ("float32", {}, 1.0),
        ("float32", dict(mean_r=123.68, mean_g=116.78, mean_b=103.94, std_r=58.4, std_g=57.1, std_b=57.4), 1.0 / 57),
        ("float32", dict(mean_r=100, scale=1 / 255), 1.0 / 255),
        ("uint8", {}, 1),
        ("uint8", dict(mean_r=100, std_r=3), 1),  # ignored for uint8, as MXNet does
        ("int8", dict(mean_r=100.4, mean_g=60, mean_b=20, std_r=3, scale=2), 1),  # pixel - round(mean), saturated
    ],
)
def test_outputs_match_mxnet_batch_for_batch(rec, dtype, extra, atol):
    common = dict(path_imgrec=rec["single"], data_shape=SHAPE, batch_size=10, dtype=dtype, **extra)
    theirs = _theirs(path_imgidx=rec["single"][:-4] + ".idx", **common)
    mine = _mine(**common)
    assert mine.provide_data[0].dtype == np.dtype(dtype).type
    # Both decode with libjpeg-turbo's default IDCT and upsampling: measured identical here (max 0).
    diff = _compare(mine, theirs, atol=atol, mean_tol=atol / 20)
    if dtype == "int8":
        assert (np.concatenate([d.ravel() for d, _, _ in _epoch(_mine(**common))]) == 127).any()  # saturation ran
    assert diff.size == 3 * 10 * 3 * SIDE * SIDE  # round_batch: 3 full batches


def test_grayscale_output_matches_mxnet(rec):
    common = dict(path_imgrec=rec["single"], data_shape=(1, SIDE, SIDE), batch_size=8, mean_r=10, std_r=2)
    mine = _mine(**common)
    assert mine.provide_data[0].shape == (8, 1, SIDE, SIDE)
    # MXNet decodes libjpeg's Y channel; fastload the BT.601 luma of its RGB decode, rounded: measured at most
    # 1 level apart (0.5% of the pixels).
    _compare(mine, _theirs(**common), atol=1.0 / 2, mean_tol=0.05 / 2)
    _compare(_mine(dtype="uint8", **common), _theirs(dtype="uint8", **common), atol=1, mean_tol=0.05)


def test_aliases_mean_what_they_mean_in_mxnet(rec):
    common = dict(path_imgrec=rec["single"], data_shape=SHAPE, batch_size=12)
    for mine_cls, their_cls, dtype in (
        (fm.ImageRecordUInt8Iter, mx.io.ImageRecordUInt8Iter, np.uint8),
        (fm.ImageRecordUInt8Iter_v1, mx.io.ImageRecordUInt8Iter_v1, np.uint8),
        (fm.ImageRecordInt8Iter, mx.io.ImageRecordInt8Iter, np.int8),
        (fm.ImageRecordIter_v1, mx.io.ImageRecordIter_v1, np.float32),
    ):
        mine = _mine(mine_cls, mean_r=50, **common)
        theirs = their_cls(verbose=False, preprocess_threads=1, mean_r=50, **common)
        assert mine.next().data[0].dtype == dtype
        mine.reset()
        _compare(mine, theirs, atol=1, mean_tol=0.05)
        assert isinstance(mine, fm.ImageRecordIter)


def test_label_width_and_an_image_list(rec, tmp_path):
    common = dict(path_imgrec=rec["multi"], data_shape=SHAPE, batch_size=8, dtype="uint8")
    mine, theirs = _mine(label_width=2, **common), _theirs(label_width=2, **common)
    assert mine.provide_label[0].shape == (8, 2)
    _compare(mine, theirs, atol=1, mean_tol=0.05)
    with pytest.raises(mx.base.MXNetError, match="label_width"):
        _mine(**common)  # MXNet: "label_width must be 1 unless an imglist is provided"
    # An im2rec list overrides the records' labels, by record id (lines in another order, 3 labels each).
    lst = tmp_path / "labels.lst"
    lines = [f"{1000 + i}\t{i * 10}\t{-i}\t{i % 2}\timg{i}.jpg" for i in reversed(range(N))]
    lst.write_text("\n".join(lines) + "\n")
    mine = _mine(path_imglist=str(lst), label_width=3, **common)
    theirs = _theirs(path_imglist=str(lst), label_width=3, **common)
    _compare(mine, theirs, atol=1, mean_tol=0.05)
    labels = np.concatenate(
        [b.label[0].asnumpy()[: 8 - b.pad] for b in _mine(path_imglist=str(lst), label_width=3, **common)]
    )
    np.testing.assert_array_equal(labels[:, 0], np.arange(N) * 10)
    lst.write_text("\n".join(lines[1:]) + "\n")  # record id 1023 has no line
    with pytest.raises(mx.base.MXNetError, match=r"path_imglist.*1023"):
        _mine(path_imglist=str(lst), label_width=3, **common)
    lst.write_text("1000\t1\n")
    with pytest.raises(mx.base.MXNetError, match="line 1"):
        _mine(path_imglist=str(lst), label_width=3, **common)


def test_index_file_anywhere_and_no_index(rec, tmp_path):
    elsewhere = tmp_path / "indexes" / "x.idx"
    elsewhere.parent.mkdir()
    shutil.copy(rec["single"][:-4] + ".idx", elsewhere)
    alone = tmp_path / "alone.rec"
    shutil.copy(rec["single"], alone)  # no .idx beside it: scanned
    common = dict(data_shape=SHAPE, batch_size=8, dtype="uint8")
    reference = _epoch(_mine(path_imgrec=rec["single"], **common))
    for kwargs in (dict(path_imgrec=rec["single"], path_imgidx=str(elsewhere)), dict(path_imgrec=str(alone))):
        got = _epoch(_mine(**kwargs, **common))
        for (d1, l1, _), (d2, l2, _) in zip(got, reference, strict=False):
            np.testing.assert_array_equal(d1, d2)
            np.testing.assert_array_equal(l1, l2)
    with pytest.raises(mx.base.MXNetError, match="path_imgidx"):
        _mine(path_imgrec=str(tmp_path / "indexes"), path_imgidx=str(elsewhere), **common)


def test_mean_image_is_computed_saved_and_used_as_mxnet_does(rec, tmp_path):
    common = dict(path_imgrec=rec["single"], data_shape=SHAPE, batch_size=8)
    mine_file, their_file = str(tmp_path / "mine.bin"), str(tmp_path / "theirs.bin")
    mine = _mine(mean_img=mine_file, **common)
    assert os.path.exists(mine_file)
    theirs = _theirs(mean_img=their_file, **common)  # MXNet computes its own file the same way
    a, b = mx.nd.load(mine_file), mx.nd.load(their_file)
    assert list(a) == list(b) == ["mean_img"]
    np.testing.assert_allclose(a["mean_img"].asnumpy(), b["mean_img"].asnumpy(), atol=1.0)
    pixels = np.stack([d for d, _, _ in _epoch(_mine(dtype="uint8", **common))]).astype(np.float64)
    np.testing.assert_allclose(a["mean_img"].asnumpy(), pixels.reshape(-1, *SHAPE)[:N].mean(axis=0), atol=1e-3)
    _compare(mine, theirs, atol=1, mean_tol=0.05)
    # Each reads the other's file.
    _compare(_mine(mean_img=their_file, **common), _theirs(mean_img=mine_file, **common), atol=1, mean_tol=0.05)
    # The mean image replaces mean_r/g/b (MXNet ignores them then); int8 subtracts it rounded.
    _compare(
        _mine(mean_img=mine_file, mean_r=77, dtype="int8", **common),
        _theirs(mean_img=mine_file, mean_r=77, dtype="int8", **common),
        atol=1,
        mean_tol=0.05,
    )
    with pytest.raises(mx.base.MXNetError, match="mean_img"):
        _mine(mean_img=mine_file, **dict(common, data_shape=(3, 8, 8)))  # another shape
    with pytest.raises(mx.base.MXNetError, match="folder"):
        _mine(mean_img=str(tmp_path / "nowhere" / "m.bin"), **common)
    (tmp_path / "junk.bin").write_bytes(b"not an ndarray file")
    with pytest.raises(mx.base.MXNetError, match="mean_img"):
        _mine(mean_img=str(tmp_path / "junk.bin"), **common)


def test_cifar10rec_style_counts_every_label(rec):
    """MXNet's test_Cifar10Rec, on a small .rec: mean_img, a misspelt argument, every label counted."""
    it = _mine(
        path_imgrec=rec["single"],
        mean_img=str(rec["root"] / "cifar_mean.bin"),
        rand_crop=False,
        and_mirror=False,
        shuffle=False,
        data_shape=(3, 12, 12),
        batch_size=6,
        preprocess_threads=2,
        prefetch_buffer=1,
    )
    counts = np.zeros(4, dtype=int)
    for batch in it:
        assert np.isfinite(batch.data[0].asnumpy()).all()
        for label in batch.label[0].asnumpy():
            counts[int(label)] += 1
    np.testing.assert_array_equal(counts, [N // 4] * 4)


def test_image_iter_exception_style(rec):
    """MXNet's test_image_iter_exception: data_shape (5, 28, 28) raises MXNetError."""
    with pytest.raises(mx.base.MXNetError):
        it = _mine(
            path_imgrec=rec["single"],
            rand_crop=False,
            and_mirror=False,
            shuffle=False,
            data_shape=(5, 28, 28),
            batch_size=6,
            preprocess_threads=2,
            prefetch_buffer=1,
        )
        for _ in it:
            pass


def _augmented(rec, **extra):
    kwargs = dict(
        path_imgrec=rec["single"],
        data_shape=(3, 12, 12),
        batch_size=3,
        shuffle=False,
        random_resized_crop=True,
        min_random_area=0.3,
        max_aspect_ratio=0.3,
        rand_mirror=True,
        **extra,
    )
    return [b.data[0].asnumpy().astype(np.uint8) for b in _mine(**kwargs)]


def test_seed_augmentation_style(rec):
    """MXNet's test_ImageRecordIter_seed_augmentation with the augmentations this build runs."""
    a, b = _augmented(rec, seed_aug=3), _augmented(rec, seed_aug=3)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=False))
    c = _augmented(rec, seed_aug=4)
    assert len(c) == len(a) and not all(np.array_equal(x, y) for x, y in zip(a, c, strict=False))
    # seed_aug alone decides the draws: another order seed changes nothing without shuffle.
    d = _augmented(rec, seed_aug=3, seed=99)
    assert all(np.array_equal(x, y) for x, y in zip(a, d, strict=False))
    # No augmentation: the same seed_aug gives the same batches.
    plain = [
        [b.data[0].asnumpy() for b in _mine(path_imgrec=rec["single"], data_shape=SHAPE, batch_size=3, seed_aug=3)]
        for _ in range(2)
    ]
    assert all(np.array_equal(x, y) for x, y in zip(*plain, strict=False))


def test_float16_and_device_id(rec):
    common = dict(path_imgrec=rec["single"], data_shape=SHAPE, batch_size=8, mean_r=100, std_r=10)
    half = _mine(dtype="float16", **common).next().data[0]
    full = _mine(**common).next().data[0]
    assert half.dtype == np.float16 and half.context == mx.cpu()  # the pinned slot, zero-copy
    np.testing.assert_allclose(half.asnumpy(), full.asnumpy(), atol=0.05, rtol=1e-3)
    plain = _mine(device_id=-1, **common).next()
    assert plain.data[0].context == mx.cpu() and plain.label[0].context == mx.cpu()
    np.testing.assert_array_equal(plain.data[0].asnumpy(), full.asnumpy())


def test_shuffle_chunk_arguments_choose_a_block_shuffle_without_an_index(rec, tmp_path):
    alone = tmp_path / "alone.rec"
    shutil.copy(rec["single"], alone)
    common = dict(data_shape=SHAPE, batch_size=4, dtype="uint8", shuffle_chunk_size=1, shuffle_chunk_seed=7)
    it = _mine(path_imgrec=str(alone), **common)
    assert it.config.shuffle.value == "block" and it.config.block_size >= N  # 1 MB holds every tiny record
    ids = np.concatenate([b.index for b in it])
    assert sorted(ids.tolist()) == list(range(1000, 1000 + N))
    # With an index MXNet ignores the chunk arguments (it shuffles records), and so does fastload.
    indexed = _mine(path_imgrec=rec["single"], path_imgidx=rec["single"][:-4] + ".idx", shuffle=True, **common)
    assert indexed.config.shuffle.value == "global"


def test_round_batch_padding_is_decoded_by_the_loader_under_its_policy(tmp_path):
    """The repeated rows of round_batch come through the loader: bad records are skipped and counted."""
    path = str(tmp_path / "bad.rec")
    writer = mx.recordio.MXIndexedRecordIO(str(tmp_path / "bad.idx"), path, "w")
    for i in range(10):
        payload = b"this is not an image" if i == 0 else _jpeg(i)
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i), 1000 + i, 0), payload))
    writer.close()
    it = _mine(path_imgrec=path, data_shape=SHAPE, batch_size=4, dtype="uint8")
    batches = [(b.data[0].asnumpy(), b.index.tolist(), b.pad) for b in it]
    assert [pad for _, _, pad in batches] == [0, 0, 2]
    # Record 0 (id 1000) cannot be decoded: replaced by the next record in the first batch and in the
    # padding rows, which repeat the epoch's first records.
    assert batches[0][1] == [1001, 1001, 1002, 1003]
    assert batches[2][1] == [1008, 1009, 1001, 1001]
    np.testing.assert_array_equal(batches[2][0][2], batches[0][0][0])
    stats = it.stats()
    # (the producer may already have run on into the next epoch and met record 0 again)
    assert stats.skipped >= 2 and stats.images == 12 and stats.batches == 3


def test_float_normalization_is_mxnets_float32_arithmetic(rec):
    from fastload.mxnet.image_iter import _HostNormalize

    mean = np.array([123.68, 116.779, 103.939], np.float32)
    std = np.array([58.393, 57.12, 57.375], np.float32)
    scale = np.float32(1 / 255)
    norm = _HostNormalize(mean.reshape(3, 1, 1), scale / std, "float32")
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16).repeat(3, axis=1)
    out = np.empty(pixels.shape, np.float32)
    norm(pixels, out)
    # iter_image_recordio_2.cc: (pixel - mean) * (contrast_scaled / std) + illumination_scaled / std, in float.
    mult = (np.float32(1) * scale) / std
    expected = (pixels.astype(np.float32) - mean.reshape(1, 3, 1, 1)) * mult.reshape(1, 3, 1, 1)
    np.testing.assert_array_equal(out, expected)
    # round_batch=False: the padding rows are what a zero pixel becomes.
    common = dict(path_imgrec=rec["single"], data_shape=SHAPE, batch_size=10, round_batch=False, mean_r=100, std_r=4)
    last = list(_mine(**common))[-1]
    tail = last.data[0].asnumpy()[10 - last.pad :]
    assert last.pad == 6
    np.testing.assert_array_equal(tail[:, 0], -25.0)
    np.testing.assert_array_equal(tail[:, 1:], 0.0)


def test_mean_image_is_mirrored_with_mirrored_images_as_mxnet(rec, tmp_path):
    mean = np.linspace(0, 255, SIDE, dtype=np.float32)[None, None, :].repeat(SIDE, 1).repeat(3, 0)  # left-right ramp
    path = str(tmp_path / "ramp.bin")
    mx.nd.save(path, {"mean_img": mx.nd.array(mean)})
    common = dict(path_imgrec=rec["single"], data_shape=SHAPE, batch_size=8, mean_img=path)
    _compare(_mine(mirror=True, **common), _theirs(mirror=True, **common), atol=1, mean_tol=0.05)
    _compare(_mine(**common), _theirs(**common), atol=1, mean_tol=0.05)
    gray = str(tmp_path / "ramp1.bin")
    mx.nd.save(gray, {"mean_img": mx.nd.array(mean[:1])})
    for extra in (dict(dtype="int8"), dict(data_shape=(1, SIDE, SIDE), mean_img=gray)):
        with pytest.raises(mx.base.MXNetError, match="mean_img with mirror"):
            _mine(**dict(common, rand_mirror=True, **extra))


@pytest.mark.parametrize(
    ("cores", "asked", "runs"), [(2, 4, 1), (2, 1, 1), (3, 4, 1), (16, 4, 4), (16, 12, 7), (64, 48, 31)]
)
def test_decode_threads_are_capped_as_mxnet_caps_preprocess_threads(monkeypatch, cores, asked, runs):
    from fastload.mxnet import arguments

    monkeypatch.setattr(arguments.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert arguments.decode_threads(asked) == runs


def test_decode_threads_on_this_machine_are_the_ones_mxnet_reports(rec, tmp_path):
    # MXNet's parser logs the thread count it settles on ("use N threads for decoding"), from C++:
    # read it from a child's stderr.
    import subprocess
    import sys

    script = (
        "import mxnet as mx\n"
        f"it = mx.io.ImageRecordIter(path_imgrec={rec['single']!r}, data_shape={SHAPE!r}, batch_size=4, "
        "preprocess_threads=64)\n"
        "next(iter(it))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stderr.splitlines() if "threads for decoding" in line)
    theirs = int(line.split("use ")[1].split(" threads")[0])
    it = _mine(path_imgrec=rec["single"], data_shape=SHAPE, batch_size=4, preprocess_threads=64)
    try:
        assert it.loader.config.num_threads == theirs
    finally:
        it.close()
