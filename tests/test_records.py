"""The read API: open_dataset over fastload folders (RecordIO, LMDB), bare shards and image folders."""

from __future__ import annotations

import builtins
import json
import os
import threading
import time

import numpy as np
import pytest
from test_records_data import tiny_folder  # noqa: F401  (fixture)

from fastload.errors import CorruptRecordError, UserError
from fastload.pack.packer import pack_folder
from fastload.records import recordio
from fastload.records.dataset import open_dataset
from fastload.records.durable import write_json_atomic
from fastload.records.lmdb_shard import decode_key, encode_key, pack_value, unpack_value_header
from fastload.records.manifest import INDEX_NAME, MANIFEST_NAME, empty_index, write_index
from fastload.records.verify import verify_dataset


def _files_by_label(folder):
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    out = []
    for label, name in enumerate(classes):
        for root, dirs, files in os.walk(os.path.join(folder, name)):
            dirs.sort()
            out += [(os.path.join(root, f), label) for f in sorted(files)]
    return out


@pytest.fixture(scope="module", params=["recordio", "lmdb"])
def packed(request, tiny_folder, tmp_path_factory):
    out = str(tmp_path_factory.mktemp(request.param) / "ds")
    pack_folder(tiny_folder, out, format=request.param, shards=3, progress=False, workers=2)
    return request.param, out


def test_round_trip_bytes_and_labels(packed, tiny_folder):
    fmt, out = packed
    expected = _files_by_label(tiny_folder)
    with open_dataset(out) as ds:
        assert ds.kind == f"fastload-{fmt}" and len(ds) == len(expected) == 40
        assert ds.labels.dtype == np.float32 and ds.labels.shape == (40, 1) and ds.ids.dtype == np.uint64
        for i, (path, label) in enumerate(expected):
            assert bytes(ds.image(i)) == open(path, "rb").read()
            assert ds.labels[i, 0] == label and ds.ids[i] == i
            head = recordio.unpack_header(ds.payload(i))
            assert head.labels == (float(label),) and head.id == i
            assert bytes(ds.payload(i))[head.image_offset :] == bytes(ds.image(i))
        assert ds.locate(5).startswith("shard tiny-00000.") and ds.locate(39).endswith("record 13")
        assert ds.manifest["classes"] == {f"class_{k:03d}": k for k in range(4)}
        assert not ds.restart_indexed
        ds.will_need(range(len(ds)))
        ds.will_need([39, 0, 17])


def test_records_are_read_into_memory_the_caller_owns(packed):
    _fmt, out = packed
    with open_dataset(out) as ds:
        view = ds.image(3)
        assert isinstance(view, memoryview) and view.readonly
        assert isinstance(view.obj, bytes)  # read with pread, not a view of a mapping that could vanish
        assert not _mapped(out)  # nothing of the dataset is mapped into the process


def test_concurrent_reads(packed):
    _, out = packed
    with open_dataset(out) as ds:
        want = [bytes(ds.image(i)) for i in range(len(ds))]
        errors = []

        def reader(seed):
            try:
                rng = np.random.default_rng(seed)
                for i in rng.integers(0, len(ds), 400):
                    assert bytes(ds.image(int(i))) == want[i]
            except Exception as exc:
                errors.append(exc)

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors


def test_close_is_idempotent_and_final(packed):
    _, out = packed
    ds = open_dataset(out)
    view = ds.image(0)
    ds.close()
    ds.close()
    assert len(bytes(view)) > 0  # a view taken before close stays readable
    with pytest.raises(ValueError, match="closed"):
        ds.image(0)
    with pytest.raises(IndexError):
        open_dataset(out).image(1000)


def test_bare_shards_open_like_the_folder(packed):
    fmt, out = packed
    with open_dataset(out) as ds:
        manifest = ds.manifest
        start = 0
        for entry in manifest["shards"]:
            bare_path = os.path.join(out, entry["file"])
            with open_dataset(bare_path) as bare:
                assert bare.kind == fmt and len(bare) == entry["records"]
                for j in range(len(bare)):
                    assert bytes(bare.image(j)) == bytes(ds.image(start + j))
                    assert bare.ids[j] == ds.ids[start + j] and bare.labels[j, 0] == ds.labels[start + j, 0]
            start += entry["records"]
        if fmt == "recordio":  # the .idx is an accepted spelling too
            idx = os.path.join(out, manifest["shards"][0]["index_file"])
            assert len(open_dataset(idx)) == manifest["shards"][0]["records"]


def test_bare_rec_without_idx_is_scanned(tmp_path):
    payloads = [recordio.pack_header(float(k), 10 + k) + os.urandom(37 + k) for k in range(6)]
    payloads[2] = recordio.pack_header([1.0, 2.0], 12) + b"\0" * 4 + recordio._MAGIC_BYTES + b"jpeg"
    with open(tmp_path / "a.rec", "wb") as f:
        w = recordio.RecordIOWriter(f)
        for k, p in enumerate(payloads):
            w.write(p, k)
    with open_dataset(str(tmp_path / "a.rec")) as ds:
        # The width most records carry; the record with two labels is a bad record (not padded).
        assert len(ds) == 6 and ds.label_width == 1
        assert ds.ids.tolist() == [10, 11, 12, 13, 14, 15]
        assert bytes(ds.payload(2))[32:] == b"\0" * 4 + recordio._MAGIC_BYTES + b"jpeg"  # split record reassembled
        with pytest.raises(CorruptRecordError, match=r"carries 2 label\(s\), the shard's records carry 1.*record 2"):
            ds.image(2)
        assert ds.labels[3, 0] == 3.0 and np.isnan(ds.labels[2, 0])
        assert bytes(ds.payload(4)) == payloads[4]
    payloads[2] = recordio.pack_header(2.0, 12) + b"\0" * 4 + recordio._MAGIC_BYTES + b"jpeg"
    with open(tmp_path / "b.rec", "wb") as f:
        w = recordio.RecordIOWriter(f)
        for k, p in enumerate(payloads):
            w.write(p, k)
    with open_dataset(str(tmp_path / "b.rec")) as ds:
        assert bytes(ds.image(2)) == b"\0" * 4 + recordio._MAGIC_BYTES + b"jpeg" and ds.labels[2, 0] == 2.0


def test_truncated_and_corrupted_shards_name_the_record(tiny_folder, tmp_path):
    out = str(tmp_path / "ds")
    pack_folder(tiny_folder, out, shards=2, name="ds", progress=False)
    manifest = json.load(open(os.path.join(out, MANIFEST_NAME)))
    shard = os.path.join(out, manifest["shards"][1]["file"])
    data = open(shard, "rb").read()
    open(shard, "wb").write(data[: len(data) // 2])
    with open_dataset(out) as ds:
        last = len(ds) - 1
        with pytest.raises(CorruptRecordError, match=r"ds-00001\.rec.*record 19.*byte offset \d+"):
            ds.image(last)
        bytes(ds.image(0))  # the intact shard still reads
    report = verify_dataset(out)
    assert not report.ok
    assert any("ds-00001.rec" in p and "truncated" in p for p in report.problems)
    assert any("shard ds-00001.rec record 19" in p for p in report.problems)
    # Bad magic at an indexed offset.
    open(shard, "wb").write(data)
    _keys, offsets = recordio.read_idx(os.path.join(out, manifest["shards"][1]["index_file"]))
    with open(shard, "r+b") as f:
        f.seek(int(offsets[4]))
        f.write(b"XXXX")
    with open_dataset(out) as ds:
        first = manifest["shards"][0]["records"]
        with pytest.raises(CorruptRecordError, match=r"bad magic.*ds-00001\.rec.*record 4.*byte offset"):
            ds.image(first + 4)
    report = verify_dataset(out)
    assert any("record 4" in p and "bad magic" in p for p in report.problems)
    assert any("checksum differs" in p for p in report.problems)


def test_open_reads_only_manifest_and_index(tmp_path, monkeypatch):
    # A million-record index over sparse shards: opening must not read the shards.
    n, shards = 1_000_000, 4
    index = empty_index(n, 1)
    index["shard"] = np.repeat(np.arange(shards), n // shards)
    per = n // shards
    index["offset"] = np.tile(np.arange(per, dtype=np.uint64) * 1024, shards)
    index["length"] = 1000
    index["data_offset"] = 24
    index["labels"][:, 0] = np.arange(n) % 1000
    index["id"] = np.arange(n)
    write_index(str(tmp_path / INDEX_NAME), index)
    entries = []
    for k in range(shards):
        path = tmp_path / f"big-{k:05d}.rec"
        with open(path, "wb") as f:
            f.truncate(per * 1024)  # sparse: all zeros, never read
        entries.append({"file": path.name, "records": per, "bytes": per * 1024, "sha256": "0" * 64})
    write_json_atomic(
        str(tmp_path / MANIFEST_NAME),
        {
            "format_version": 1,
            "format": "recordio",
            "name": "big",
            "records": n,
            "label_width": 1,
            "shards": entries,
            "index": {"file": INDEX_NAME},
            "restart_index": None,
        },
    )
    opened = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, *args, **kwargs):
        if not isinstance(file, int):  # an int is a descriptor os.open gave (recorded there)
            opened.append(os.path.basename(str(file)))
        return real_open(file, *args, **kwargs)

    def spy_os_open(path, *args, **kwargs):
        opened.append(os.path.basename(str(path)))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    t0 = time.perf_counter()
    ds = open_dataset(str(tmp_path))
    elapsed = time.perf_counter() - t0
    monkeypatch.undo()
    print(f"open_dataset of a 1,000,000-record index: {elapsed * 1000:.0f} ms")
    # Shards are opened (no read); the zeros would fail any framing check if read.
    with ds:
        assert len(ds) == n and ds.labels[999_999, 0] == 999 and ds.ids[123_456] == 123_456
        with pytest.raises(CorruptRecordError, match=r"bad magic.*big-00003\.rec.*record 1"):
            ds.image(3 * per + 1)
    assert MANIFEST_NAME in opened and INDEX_NAME in opened


def test_lmdb_layout():
    assert encode_key(1) < encode_key(2) < encode_key(10) < encode_key(256)  # byte order = record order
    assert decode_key(encode_key(123456789)) == 123456789
    value = pack_value([1.5, 2.0], 77, b"jpeg")
    head = unpack_value_header(value)
    assert head.labels == (1.5, 2.0) and head.id == 77 and value[head.image_offset :] == b"jpeg"
    assert value[:4] == b"FLDB" and len(value) == 16 + 8 + 4
    with pytest.raises(ValueError, match="magic"):
        unpack_value_header(b"XXXX" + value[4:])


def test_imagefolder_dataset(tiny_folder):
    expected = _files_by_label(tiny_folder)
    with open_dataset(tiny_folder) as ds:
        assert ds.kind == "imagefolder" and len(ds) == len(expected)
        for i in (0, 17, 39):
            assert bytes(ds.image(i)) == open(expected[i][0], "rb").read()
            assert ds.labels[i, 0] == expected[i][1] and ds.locate(i) == expected[i][0]
        assert recordio.unpack_header(ds.payload(3)).labels == (float(expected[3][1]),)
        ds.will_need([0, 1])


def test_open_dataset_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        open_dataset(str(tmp_path / "missing"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UserError, match="not a dataset"):
        open_dataset(str(tmp_path / "notes.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no class sub-folders"):
        open_dataset(str(tmp_path / "empty"))
    (tmp_path / "unfinished" / ".fastload-staging").mkdir(parents=True)
    with pytest.raises(UserError, match="unfinished pack"):
        open_dataset(str(tmp_path / "unfinished"))


def test_bare_rec_with_damaged_header_is_named(tmp_path):
    with open(tmp_path / "d.rec", "wb") as f:
        w = recordio.RecordIOWriter(f)
        for k in range(3):
            w.write(recordio.pack_header(float(k), k) + b"x" * 40, k)
    (tmp_path / "d.idx").write_bytes(w.idx_bytes())
    data = bytearray((tmp_path / "d.rec").read_bytes())
    data[w.offsets[1] + 8 : w.offsets[1] + 12] = b"\xff\xff\xff\xff"  # flag: 4 billion labels
    (tmp_path / "d.rec").write_bytes(bytes(data))
    # The damaged record is a bad record (named when read); the others still read.
    with open_dataset(str(tmp_path / "d.rec")) as ds:
        with pytest.raises(CorruptRecordError, match=r"more labels than the record holds.*d\.rec.*record 1"):
            ds.image(1)
        assert bytes(ds.image(2)) == b"x" * 40 and ds.labels[2, 0] == 2.0
    (tmp_path / "d.rec").write_bytes(bytes(data[: w.offsets[2] + 20]))
    with open_dataset(str(tmp_path / "d.rec")) as ds:
        with pytest.raises(CorruptRecordError, match=r"runs past the end.*d\.rec.*record 2"):
            ds.image(2)
    report = verify_dataset(str(tmp_path / "d.rec"))
    assert any("record 1" in p and "more labels" in p for p in report.problems)
    assert any("record 2" in p and "truncated" in p for p in report.problems)


def _mapped(folder: str) -> list[str]:
    """This process's mappings of files inside ``folder`` (from /proc/self/maps)."""
    real = os.path.realpath(folder)
    with open("/proc/self/maps") as fh:
        return [line.split()[-1] for line in fh if line.rstrip().endswith(tuple(os.listdir(real))) and real in line]


def test_reading_maps_nothing_and_close_releases_the_files(tiny_folder, tmp_path):
    for fmt in ("recordio", "lmdb"):
        out = tmp_path / fmt
        pack_folder(tiny_folder, str(out), format=fmt, progress=False, workers=1)
        fds_before = len(os.listdir("/proc/self/fd"))
        with open_dataset(str(out)) as ds:
            before = [bytes(ds.image(i)) for i in range(len(ds))]
            assert not _mapped(str(out))
            assert [bytes(ds.image(i)) for i in range(len(ds))] == before
            views = [ds.image(i) for i in range(3)]
        assert len(os.listdir("/proc/self/fd")) == fds_before  # close() closed every shard
        assert [bytes(v) for v in views] == before[:3]  # bytes handed out stay valid after close
