"""Pass-through packing's native framing (fastload._engine.frame_files) and the shard checksums.

The engine path must write exactly the bytes the Python path writes, take the same pass/convert
decision on every file, and leave whatever it cannot vouch for to the Python path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct

import numpy as np
import pytest
from PIL import Image

from fastload.pack import convert, shard_writer
from fastload.pack.framing import BufferPool
from fastload.pack.packer import pack_folder
from fastload.records import recordio
from fastload.records.durable import write_json_atomic
from fastload.records.manifest import FORMAT_VERSION, MANIFEST_NAME, read_manifest
from fastload.records.verify import verify_dataset

from conftest import make_jpeg, requires_engine

MAGIC = struct.pack("<I", recordio.MAGIC)


def _with_comment(jpeg: bytes, text: bytes) -> bytes:
    """The JPEG with a COM segment holding ``text`` right after SOI (text starts at byte 6)."""
    return jpeg[:2] + b"\xff\xfe" + struct.pack(">H", len(text) + 2) + text + jpeg[2:]


def _variants() -> dict:
    """File name -> bytes: plain JPEGs and every case the marker walk or the framing must notice."""
    base = make_jpeg(40, 30, seed=1)
    png = io.BytesIO()
    Image.new("RGB", (9, 7), (1, 2, 3)).save(png, "PNG")
    sof = base.index(b"\xff\xc0")
    return {
        "plain.jpg": base,
        "progressive.jpg": make_jpeg(33, 21, progressive=True, seed=2),
        "444.jpg": make_jpeg(17, 9, subsampling="4:4:4", seed=3),
        # The magic word at a 4-byte-aligned payload offset (IRHeader: 24 bytes): dmlc-core splits.
        "magic_aligned.jpg": _with_comment(base, b"\0\0" + MAGIC + b"zz"),
        "magic_unaligned.jpg": _with_comment(base, b"\0" + MAGIC + b"zzz"),
        "trailing_zeros.jpg": base + b"\0" * 10,
        "fill_bytes.jpg": base[:2] + b"\xff\xff" + base[2:],
        "grayscale.jpg": make_jpeg(20, 20, mode="L", seed=4),
        "cmyk.jpg": make_jpeg(20, 20, mode="CMYK", seed=5),
        "png_named.jpg": png.getvalue(),
        "truncated.jpg": base[: len(base) // 2],
        "no_eoi.jpg": base[:-2],
        "header_cut.jpg": base[: sof + 5],
        "twelve_bit.jpg": base[: sof + 4] + b"\x0c" + base[sof + 5 :],
        "lossless_sof.jpg": base[: sof + 1] + b"\xc3" + base[sof + 2 :],
        "zero_width.jpg": base[: sof + 7] + b"\0\0" + base[sof + 9 :],
        "empty.jpg": b"",
        "text.jpg": b"hello, not an image\n",
    }


@requires_engine
def test_frame_files_verdicts_match_the_python_marker_walk(tmp_path):
    from fastload import _engine

    files = _variants()
    base = files["plain.jpg"]
    for cut in range(0, len(base), 37):  # truncated anywhere, headers included
        files[f"cut{cut}.jpg"] = base[:cut]
    paths, sizes, heads = [], [], []
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        paths.append(os.fsencode(str(path)))
        sizes.append(len(data))
        heads.append(recordio.pack_header(3.0, len(heads)))
    buffer = np.empty(1 + sum(recordio.framed_size(len(h) + s) for h, s in zip(heads, sizes, strict=False)), np.uint8)
    framed, used = _engine.frame_files(paths, sizes, heads, buffer)
    pos = 0
    for (name, data), head, n in zip(files.items(), heads, framed.tolist(), strict=False):
        ok = bool(data) and convert.cheap_info(data)[1]
        if n >= 0:
            assert ok, name
            # Exactly what the Python framing writes for IRHeader + image.
            assert bytes(buffer[pos : pos + n]) == b"".join(bytes(c) for c in recordio.frame_parts(head + data)), name
            pos += n
        elif name == "magic_aligned.jpg":
            assert n == -4 and ok
        else:
            assert n == -3 and not ok, (name, n)
    assert used == pos
    assert framed.tolist()[list(files).index("magic_unaligned.jpg")] > 0


@requires_engine
def test_frame_files_leaves_changed_and_unreadable_files_to_python(tmp_path):
    from fastload import _engine

    data = make_jpeg(24, 24, seed=7)
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    p = os.fsencode(str(path))
    head = recordio.pack_header(1.0, 0)
    buf = np.full(1 << 16, 0xAB, np.uint8)
    framed, used = _engine.frame_files(
        [p, p, p, os.fsencode(str(tmp_path / "missing.jpg")), p],
        [len(data) - 1, len(data) + 1, len(data), 10, len(data)],
        [head, head, head, head, b"12345"],
        buf,
    )
    # Grown since stat, shrunk since stat, fine, unreadable, a head that is not whole words.
    assert framed.tolist()[:2] == [-2, -2]
    assert framed.tolist()[2] == recordio.framed_size(len(head) + len(data))
    assert framed.tolist()[3:] == [-1, -5]
    assert used == framed.tolist()[2]
    # The one record sits at the start of the caller's buffer, whatever the refused files left there.
    assert bytes(buf[:used]) == b"".join(bytes(c) for c in recordio.frame_parts(head + data))
    with pytest.raises(TypeError):
        _engine.frame_files([str(path)], [len(data)], [head], buf)
    with pytest.raises(ValueError, match="one entry per file"):
        _engine.frame_files([p], [len(data), 1], [head], buf)
    needed = 1 + recordio.framed_size(len(head) + len(data))
    with pytest.raises(ValueError, match=f"needs {needed}"):
        _engine.frame_files([p], [len(data)], [head], np.empty(needed - 1, np.uint8))
    with pytest.raises(ValueError, match="writable"):
        _engine.frame_files([p], [len(data)], [head], bytes(needed))
    framed, used = _engine.frame_files([p], [len(data)], [head], np.empty(needed, np.uint8))
    assert framed.tolist() == [needed - 1] and used == needed - 1


def test_buffer_pool_reuses_and_bounds():
    pool = BufferPool(keep=2)
    a = pool.take(10)
    assert a.nbytes >= 4 << 20  # small batches share one reusable size
    big = pool.take(9 << 20)
    assert big.nbytes == 9 << 20
    pool.give(a)
    pool.give(big)
    pool.give(np.empty(1, np.uint8))  # beyond `keep`: dropped
    assert pool.take(5 << 20) is big and pool.take(1) is a
    assert pool.take(1) is not a


def _folder(root, files: dict) -> str:
    # Odd files first (class_a), plain photos after: the later batches are all clean.
    for i, (name, data) in enumerate(sorted(files.items())):
        cls = root / ("class_" + ("bc"[i % 2] if name.startswith("photo") else "a"))
        cls.mkdir(parents=True, exist_ok=True)
        (cls / name).write_bytes(data)
    return str(root)


def _shard_bytes(out) -> dict:
    return {
        name: open(os.path.join(out, name), "rb").read()
        for name in sorted(os.listdir(out))
        if name.endswith((".rec", ".idx", ".npy"))
    }


@requires_engine
@pytest.mark.parametrize(
    "layout",
    [{"shards": 1}, {"shards": 3}, {"shards": 2}, {"shard_size": 60_000}],
    ids=["one-shard", "three-shards", "edge-inside-a-batch", "by-size"],
)
def test_engine_and_python_framing_pack_identical_datasets(tmp_path, monkeypatch, layout):
    # 74 files: batches of 32 are taken whole by the writer, or record by record where a shard
    # boundary (fixed edges or the size limit) falls inside one.
    files = _variants()
    for i in range(56):
        files[f"photo{i}.jpg"] = make_jpeg(30 + i % 20, 20 + i % 17, seed=10 + i)
    src = _folder(tmp_path / "src", files)
    monkeypatch.setenv("FASTLOAD_PACK_FRAMING", "python")
    ref = pack_folder(src, str(tmp_path / "py"), workers=2, progress=False, **layout)
    monkeypatch.delenv("FASTLOAD_PACK_FRAMING")
    whole = []
    add_framed = shard_writer.ShardSink.add_framed
    monkeypatch.setattr(
        shard_writer.ShardSink,
        "add_framed",
        lambda self, b, f, pool: (whole.append(len(b)), add_framed(self, b, f, pool)),
    )
    res = pack_folder(src, str(tmp_path / "engine"), workers=2, progress=False, **layout)
    assert whole and sum(whole) < len(files)  # batches taken whole and record by record both happened
    assert len(res.manifest["shards"]) == layout.get("shards", 2)
    assert _shard_bytes(tmp_path / "engine") == _shard_bytes(tmp_path / "py")
    for key in ("shards", "counts", "skipped", "records"):
        assert res.manifest[key] == ref.manifest[key]
    assert res.manifest["counts"]["converted"] == {"grayscale": 1, "cmyk": 1, "png": 1}
    # The split record went out in parts and reads back whole.
    ds = read_manifest(str(tmp_path / "engine"))
    assert ds["records"] == len(files) - 8  # truncated, no EOI, header cut, 12-bit, lossless, 0 width, empty, text
    assert verify_dataset(str(tmp_path / "engine"), decode=True).ok


@requires_engine
def test_lst_multilabel_packs_the_same_either_way(tmp_path, monkeypatch):
    root = tmp_path / "imgs"
    root.mkdir()
    lines = []
    for i in range(9):
        (root / f"{i}.jpg").write_bytes(make_jpeg(20 + i, 16, seed=30 + i))
        lines.append(f"{100 + i}\t{i % 2}\t{i * 0.5}\t{i}.jpg")
    lst = tmp_path / "data.lst"
    lst.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("FASTLOAD_PACK_FRAMING", "python")
    pack_folder(str(lst), str(tmp_path / "py"), root=str(root), progress=False)
    monkeypatch.delenv("FASTLOAD_PACK_FRAMING")
    pack_folder(str(lst), str(tmp_path / "engine"), root=str(root), progress=False)
    assert _shard_bytes(tmp_path / "engine") == _shard_bytes(tmp_path / "py")


def test_checksums_are_xxh3_and_version_1_manifests_still_verify(tiny_folder, tmp_path):
    out = str(tmp_path / "ds")
    pack_folder(str(tiny_folder), out, shards=2, progress=False)
    manifest = json.load(open(os.path.join(out, MANIFEST_NAME)))
    assert manifest["format_version"] == FORMAT_VERSION >= 2
    assert all(
        s["checksum"].startswith("xxh3_128:") and s["index_checksum"].startswith("xxh3_128:")
        for s in manifest["shards"]
    )
    # A dataset written by fastload with format_version 1 recorded SHA-256 hex digests.
    old = str(tmp_path / "old")
    shutil.copytree(out, old)

    def sha(name):
        return hashlib.sha256(open(os.path.join(old, name), "rb").read()).hexdigest()

    for s in manifest["shards"]:
        del s["checksum"], s["index_checksum"]
        s["sha256"], s["index_sha256"] = sha(s["file"]), sha(s["index_file"])
    manifest["index"] = {"file": manifest["index"]["file"], "sha256": sha(manifest["index"]["file"])}
    manifest["format_version"] = 1
    write_json_atomic(os.path.join(old, MANIFEST_NAME), manifest)
    assert verify_dataset(old).ok
    shard = os.path.join(old, manifest["shards"][1]["file"])
    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(shard, "wb").write(bytes(data))
    report = verify_dataset(old)
    assert not report.ok and any(
        "checksum differs" in p and manifest["shards"][1]["file"] in p for p in report.problems
    )
