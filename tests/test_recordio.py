"""RecordIO framing, headers and MXNet interop in both directions (byte for byte)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from test_records_data import tiny_folder  # noqa: F401  (fixture)

from fastload.errors import CorruptRecordError
from fastload.records import recordio
from fastload.records.dataset import open_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M = struct.pack("<I", recordio.MAGIC)


def _framing_cases():
    rng = np.random.default_rng(7)
    cases = {f"len{n}": bytes(rng.integers(0, 255, n, dtype=np.uint8)) for n in range(9)}  # every padding
    cases.update(
        {
            "magic_only": M,
            "magic_at_start": M + b"abcdefg",
            "magic_at_end": b"abcdefgh" + M,
            "magic_at_end_unpadded": b"abcd" + M + b"xy",
            "magic_twice": b"0123" + M + b"4567" + M + b"89",
            "magic_adjacent": b"abcd" + M + M + b"efghi",
            "magic_adjacent_at_start": M + M + M,
            "magic_unaligned": b"ab" + M + b"cd" + b"x" + M,  # not at 4-byte offsets: no split
            "magic_in_tail": b"abcdefgh" + M[:3],
            "random_big_with_magic": rng.bytes(4096) + M + rng.bytes(1001) + M + rng.bytes(2),
            "header_like": recordio.pack_header(3.0, 17) + M + b"jpegbytes",
        }
    )
    return cases


def test_magic_positions_only_aligned():
    assert recordio.magic_positions(b"ab" + M + b"cd") == []
    assert recordio.magic_positions(b"abcd" + M + M) == [4, 8]
    assert recordio.magic_positions(b"abcdefgh" + M[:3]) == []


def test_framing_layout_by_hand():
    # Single record: magic, lrec = length, padding to 4.
    assert b"".join(map(bytes, recordio.frame_parts(b"abcde"))) == M + struct.pack("<I", 5) + b"abcde\0\0\0"
    # Split at the magic word: cflag 1 part, magic dropped, cflag 3 part, only the last padded.
    framed = b"".join(map(bytes, recordio.frame_parts(b"abcd" + M + b"xy")))
    assert framed == (M + struct.pack("<I", (1 << 29) | 4) + b"abcd" + M + struct.pack("<I", (3 << 29) | 2) + b"xy\0\0")


def test_byte_equal_with_mxnet_writer(tmp_path):
    mx = pytest.importorskip("mxnet")
    cases = _framing_cases()
    mx_rec = mx.recordio.MXIndexedRecordIO(str(tmp_path / "mx.idx"), str(tmp_path / "mx.rec"), "w")
    for key, payload in enumerate(cases.values()):
        mx_rec.write_idx(key, payload)
    mx_rec.close()
    with open(tmp_path / "fl.rec", "wb") as f:
        writer = recordio.RecordIOWriter(f)
        parts = [writer.write(payload, key)[1] for key, payload in enumerate(cases.values())]
    (tmp_path / "fl.idx").write_bytes(writer.idx_bytes())
    assert (tmp_path / "fl.rec").read_bytes() == (tmp_path / "mx.rec").read_bytes()
    assert (tmp_path / "fl.idx").read_bytes() == (tmp_path / "mx.idx").read_bytes()
    names = list(cases)
    assert parts[names.index("magic_twice")] == 3 and parts[names.index("magic_only")] == 2
    assert parts[names.index("magic_unaligned")] == 0

    # fastload reads MXNet's file (scan, and by offset), MXNet reads fastload's.
    shard = recordio.RecordIOShard(str(tmp_path / "mx.rec"))
    scanned = list(shard.scan())
    assert [bytes(shard.payload(o, n, p)) for o, n, p in scanned] == list(cases.values())
    keys, offsets = recordio.read_idx(str(tmp_path / "mx.idx"))
    assert offsets.tolist() == [o for o, _, _ in scanned] and keys.tolist() == list(range(len(cases)))
    whole = [o for o, _, p in scanned if p == 0]
    assert isinstance(shard.payload(whole[-1]), memoryview)  # zero-copy for whole records
    shard.close()
    reader = mx.recordio.MXIndexedRecordIO(str(tmp_path / "fl.idx"), str(tmp_path / "fl.rec"), "r")
    assert [reader.read_idx(k) for k in range(len(cases))] == list(cases.values())
    reader.close()


@pytest.mark.parametrize("labels", [3.0, 0.0, [1.0, 2.5, -4.0], [7.0]])
def test_header_matches_mx_pack(labels):
    mx = pytest.importorskip("mxnet")
    image = b"\xff\xd8fake-jpeg\xff\xd9"
    ours = recordio.pack_header(labels, 123456789012, 5) + image
    theirs = mx.recordio.pack(mx.recordio.IRHeader(0, labels, 123456789012, 5), image)
    assert ours == theirs
    head = recordio.unpack_header(ours)
    assert head.id == 123456789012 and head.id2 == 5
    assert list(head.labels) == ([labels] if isinstance(labels, float) else labels)
    assert ours[head.image_offset :] == image


def test_reader_rejects_damage(tmp_path):
    path = tmp_path / "x.rec"
    with open(path, "wb") as f:
        w = recordio.RecordIOWriter(f)
        w.write(b"a" * 100, 0)
        w.write(b"b" * 100, 1)
    data = path.read_bytes()
    shard = recordio.RecordIOShard(str(path))
    with pytest.raises(CorruptRecordError, match=r"bad magic.*record 1.*byte offset 4"):
        shard.payload(4, record=1)
    shard.close()
    path.write_bytes(data[:150])  # truncated inside the second record
    shard = recordio.RecordIOShard(str(path))
    with pytest.raises(CorruptRecordError, match=r"past the end.*x\.rec.*record 1.*byte offset 108"):
        shard.payload(108, 100, 0, record=1)
    with pytest.raises(CorruptRecordError):
        list(shard.scan())
    shard.close()


def _im2rec(args, cwd):
    script = os.path.join(os.path.dirname(pytest.importorskip("mxnet").__file__), "tools", "im2rec.py")
    if not os.path.exists(script):
        pytest.skip("im2rec.py not shipped with this mxnet")
    res = subprocess.run([sys.executable, script, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_fastload_reads_im2rec_and_packs_identically(tmp_path, tiny_folder):
    pytest.importorskip("mxnet")
    pytest.importorskip("cv2")
    prefix = str(tmp_path / "data")
    # The list im2rec's `--list --recursive` writes (its label = sorted class folder), in a shuffled
    # order; written here to save a second MXNet start-up.
    rels = sorted(
        os.path.relpath(os.path.join(d, f), tiny_folder)
        for d, _, fs in os.walk(tiny_folder)
        for f in fs
        if f.endswith(".JPEG")
    )
    classes = sorted({os.path.dirname(r) for r in rels})
    order = np.random.default_rng(0).permutation(len(rels))
    with open(prefix + ".lst", "w") as f:
        for i in order.tolist():
            f.write(f"{i}\t{float(classes.index(os.path.dirname(rels[i]))):f}\t{rels[i]}\n")
    _im2rec(["--pass-through", "--num-thread", "1", prefix, tiny_folder], tmp_path)
    lines = [line.split("\t") for line in open(prefix + ".lst").read().splitlines()]
    with open_dataset(prefix + ".rec") as ds:
        assert len(ds) == len(lines) > 0
        for i, (index, label, rel) in enumerate(lines):
            assert int(ds.ids[i]) == int(index)
            assert ds.labels[i, 0] == float(label)
            assert bytes(ds.image(i)) == open(os.path.join(tiny_folder, rel), "rb").read()
    # fastload packing the same .lst (pass-through) writes exactly im2rec's bytes.
    from fastload.pack.packer import pack_folder

    pack_folder(
        prefix + ".lst", str(tmp_path / "fl"), root=tiny_folder, shards=1, name="data", workers=2, progress=False
    )
    assert (tmp_path / "fl" / "data-00000.rec").read_bytes() == open(prefix + ".rec", "rb").read()
    assert (tmp_path / "fl" / "data-00000.idx").read_bytes() == open(prefix + ".idx", "rb").read()


def test_multilabel_lst_matches_im2rec_pack_label(tmp_path, tiny_folder):
    pytest.importorskip("mxnet")
    pytest.importorskip("cv2")
    files = sorted(
        os.path.relpath(os.path.join(d, f), tiny_folder)
        for d, _, fs in os.walk(tiny_folder)
        for f in fs
        if f.endswith(".JPEG")
    )[:12]
    lst = tmp_path / "multi.lst"
    lst.write_text(
        "".join(f"{100 + i}\t{i % 3}.000000\t{i * 0.5:f}\t-1.000000\t{rel}\n" for i, rel in enumerate(files))
    )
    _im2rec(["--pass-through", "--pack-label", "--num-thread", "1", str(tmp_path / "multi"), tiny_folder], tmp_path)
    from fastload.pack.packer import pack_folder

    pack_folder(str(lst), str(tmp_path / "fl"), root=tiny_folder, shards=1, name="multi", progress=False)
    assert (tmp_path / "fl" / "multi-00000.rec").read_bytes() == (tmp_path / "multi.rec").read_bytes()
    with open_dataset(str(tmp_path / "multi.rec")) as bare, open_dataset(str(tmp_path / "fl")) as ds:
        assert bare.label_width == ds.label_width == 3
        np.testing.assert_array_equal(bare.labels, ds.labels)
        np.testing.assert_array_equal(ds.ids, np.arange(100, 100 + len(files)))
        assert ds.labels[5].tolist() == [2.0, 2.5, -1.0]


def test_mxnet_reads_fastload_shards(tmp_path, tiny_folder):
    mx = pytest.importorskip("mxnet")
    from fastload.pack.packer import pack_folder

    res = pack_folder(tiny_folder, str(tmp_path / "out"), shards=2, progress=False, workers=2)
    expected = {}
    with open_dataset(str(tmp_path / "out")) as ds:
        for i in range(len(ds)):
            expected[int(ds.ids[i])] = (float(ds.labels[i, 0]), bytes(ds.image(i)))
    for entry in res.manifest["shards"]:
        rec = str(tmp_path / "out" / entry["file"])
        idx = str(tmp_path / "out" / entry["index_file"])
        reader = mx.recordio.MXIndexedRecordIO(idx, rec, "r")
        assert len(reader.keys) == entry["records"]
        for key in reader.keys:
            header, image = mx.recordio.unpack(reader.read_idx(key))
            assert (header.label, image) == expected[key]
            assert header.id == key
        reader.close()
        it = mx.io.ImageRecordIter(
            path_imgrec=rec,
            path_imgidx=idx,
            data_shape=(3, 24, 24),
            resize=24,
            batch_size=entry["records"],
            preprocess_threads=1,
            round_batch=False,
        )
        batch = next(iter(it))
        assert batch.data[0].shape == (entry["records"], 3, 24, 24)
        labels = sorted(batch.label[0].asnumpy().tolist())
        assert labels == sorted(expected[k][0] for k in mx.recordio.MXIndexedRecordIO(idx, rec, "r").keys)


def test_framing_header_and_payload_without_concatenation():
    cases = _framing_cases()
    heads = [b"", recordio.pack_header(1.0, 5), M * 6, recordio.pack_header([1.0, 2.0], recordio.MAGIC), b"abc"]
    for head in heads:
        for payload in cases.values():
            joined = recordio.frame_parts(head + payload)
            split = recordio.FramedRecord(payload, head)
            assert b"".join(map(bytes, split.chunks)) == b"".join(map(bytes, joined))
            assert split.size == sum(len(c) for c in joined)


def _jpeg_with_magic(color, magic_count):
    """A valid JPEG whose comment segment puts the magic word at 4-byte-aligned payload offsets."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (24, 24), color).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    # Payload = 24-byte IRHeader + JPEG; the COM body starts at JPEG offset 6, payload offset 30.
    body = b"ab" + M * magic_count + b"xyz"
    return data[:2] + b"\xff\xfe" + struct.pack(">H", len(body) + 2) + body + data[2:]


def test_mxnet_iterators_read_split_records(tmp_path):
    mx = pytest.importorskip("mxnet")
    images = [_jpeg_with_magic((200, 10 * k, 30), k % 3) for k in range(6)]
    folder = tmp_path / "src" / "cls"
    folder.mkdir(parents=True)
    for k, data in enumerate(images):
        (folder / f"{k}.jpg").write_bytes(data)
    from fastload.pack.packer import pack_folder

    res = pack_folder(str(tmp_path / "src"), str(tmp_path / "out"), shards=1, progress=False)
    with open_dataset(str(tmp_path / "out")) as ds:
        assert [bytes(ds.image(i)) for i in range(6)] == images
        assert int(np.count_nonzero(ds._parts)) == 4  # records 1, 2, 4, 5 were split by the writer
    entry = res.manifest["shards"][0]
    rec, idx = str(tmp_path / "out" / entry["file"]), str(tmp_path / "out" / entry["index_file"])
    reader = mx.recordio.MXIndexedRecordIO(idx, rec, "r")
    assert [mx.recordio.unpack(reader.read_idx(k))[1] for k in range(6)] == images
    reader.close()
    it = mx.io.ImageRecordIter(
        path_imgrec=rec, path_imgidx=idx, data_shape=(3, 24, 24), batch_size=6, preprocess_threads=1, round_batch=False
    )
    batch = next(iter(it))
    got = batch.data[0].asnumpy()
    for k in range(6):
        assert abs(float(got[k, 0].mean()) - 200) < 4 and abs(float(got[k, 1].mean()) - 10 * k) < 4
