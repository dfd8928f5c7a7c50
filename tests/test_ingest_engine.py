"""The streamed pack's native input side: ``frame_buffers`` (images in memory) and ``walk_tar`` (tar headers).

Both are fast paths with the Python code as the authority: the engine must frame exactly the bytes
the Python path frames and take the same pass/convert decision on every image, and walk exactly the
members the Python tar reader reads (names, offsets, data, problems, errors), leaving to Python
whatever it does not vouch for. Checked on good, damaged, magic-word-holding and non-JPEG images,
on every tar form ``tarfile`` writes and on hand-made odd headers, and on randomly damaged inputs.
"""

from __future__ import annotations

import io
import random
import struct
import tarfile

import numpy as np
import pytest
from ingest_inputs import folder_entries, records, write_parquet, write_tars
from test_framing import _variants, _with_comment

from fastload.pack import convert
from fastload.pack.convert import ConvertOptions
from fastload.pack.convert_batch import convert_buffers
from fastload.pack.framing import BufferPool, FramedBatch
from fastload.pack.options import ShardFormat
from fastload.pack.packer import pack_folder
from fastload.pack.tar_stream import ChunkPool, TarError, TarReader
from fastload.records import recordio
from fastload.records.folder_tree import SourceItem

from conftest import make_jpeg, requires_engine

MAGIC = struct.pack("<I", recordio.MAGIC)
MAX_PIXELS = convert.DEFAULT_MAX_PIXELS


def _python_verdict(data: bytes, max_pixels: int = MAX_PIXELS) -> int:
    """What the engine must answer for ``data``, from the Python path's own checks (0: framed)."""
    try:
        info, ok = convert.cheap_info(data)
    except convert.BadImage:
        return -6
    if not ok:
        return -3
    assert info is not None
    if info.width * info.height > max_pixels:
        return -6
    return -4 if recordio.magic_positions(data) else 0


def _frame(images: list, max_pixels: int = MAX_PIXELS) -> tuple[list[int], bytes]:
    """``frame_buffers`` in both layouts: the verdicts and the framed bytes (the same either way)."""
    from fastload import _engine

    heads = [recordio.pack_header(float(i % 5), i) for i in range(len(images))]
    out = np.full(
        sum(recordio.framed_size(len(h) + len(d)) for h, d in zip(heads, images, strict=True)), 0xAB, np.uint8
    )
    framed, used = _engine.frame_buffers(images, heads, max_pixels, False, out)
    # Each framed record is what the Python framing writes for IRHeader + image, back to back.
    pos = 0
    for i, (n, data) in enumerate(zip(framed.tolist(), images, strict=True)):
        if n > 0:
            assert bytes(out[pos : pos + n]) == b"".join(bytes(c) for c in recordio.frame_parts(heads[i] + data))
            pos += n
    assert used == pos
    # Gathered: the buffer holds what goes between the images, which are not copied.
    between = np.full(sum(len(h) + 11 for h in heads), 0xAB, np.uint8)
    gathered, between_used = _engine.frame_buffers(images, heads, max_pixels, True, between)
    assert gathered.tolist() == framed.tolist()
    batch = FramedBatch(
        between.data[:between_used],
        gathered.tolist(),
        [len(h) + len(d) for h, d in zip(heads, images, strict=True)],
        [len(h) for h in heads],
        [len(d) for d in images],
        None,
        images=images,
    )
    assert b"".join(bytes(c) for c in batch.chunks) == bytes(out[:used]) and batch.nbytes == used
    return framed.tolist(), bytes(out[:used])


# ---------------------------------------------------------------- frame_buffers


@requires_engine
def test_frame_buffers_verdicts_and_bytes_match_the_python_path():
    files = _variants()
    base = files["plain.jpg"]
    for cut in range(0, len(base), 37):  # truncated anywhere, headers included
        files[f"cut{cut}.jpg"] = base[:cut]
    files["magic_in_scan.jpg"] = base[:-40] + MAGIC + base[-36:]  # aligned, inside the entropy data
    names = list(files)
    framed, _ = _frame([files[n] for n in names])
    for name, n in zip(names, framed, strict=True):
        want = _python_verdict(files[name])
        assert (n > 0) == (want == 0) and (n if n < 0 else 0) == want, (name, n, want)
    assert framed[names.index("magic_aligned.jpg")] == -4
    assert framed[names.index("magic_unaligned.jpg")] > 0


@requires_engine
def test_frame_buffers_takes_views_and_bounds_declared_pixels():
    a, b = make_jpeg(40, 30, seed=1), make_jpeg(33, 21, seed=2)
    blob = bytearray(b"xx" + a + b"y" + b)
    view = memoryview(blob)
    # Views of one buffer (what a tar chunk or an Arrow column hands out), at unaligned offsets.
    framed, data = _frame([view[2 : 2 + len(a)], view[3 + len(a) :]])
    assert all(n > 0 for n in framed)
    assert data == b"".join(
        b"".join(bytes(c) for c in recordio.frame_parts(recordio.pack_header(float(i), i) + d))
        for i, d in enumerate((a, b))
    )
    assert _frame([a, b], max_pixels=40 * 30 - 1)[0][0] == -6
    assert _frame([a, b], max_pixels=40 * 30)[0][0] > 0


@requires_engine
def test_frame_buffers_arguments():
    from fastload import _engine

    a = make_jpeg(24, 24, seed=7)
    head = recordio.pack_header(1.0, 0)
    need = recordio.framed_size(len(head) + len(a))
    framed, used = _engine.frame_buffers([a, a], [head, b"12345"], MAX_PIXELS, False, np.empty(2 * need, np.uint8))
    assert framed.tolist() == [need, -5] and used == need  # a head that is not whole words: Python's
    with pytest.raises(ValueError, match="one entry per image"):
        _engine.frame_buffers([a], [head, head], MAX_PIXELS, False, np.empty(need, np.uint8))
    with pytest.raises(ValueError, match=f"needs {need}"):
        _engine.frame_buffers([a], [head], MAX_PIXELS, False, np.empty(need - 1, np.uint8))
    with pytest.raises(ValueError, match=f"needs {len(head) + 11}"):
        _engine.frame_buffers([a], [head], MAX_PIXELS, True, np.empty(len(head) + 10, np.uint8))
    with pytest.raises(ValueError, match="writable"):
        _engine.frame_buffers([a], [head], MAX_PIXELS, False, bytes(need))
    with pytest.raises(ValueError, match="max_pixels"):
        _engine.frame_buffers([a], [head], 0, False, np.empty(need, np.uint8))
    with pytest.raises(ValueError, match=r"images\[0\]"):
        _engine.frame_buffers(["not bytes"], [head], MAX_PIXELS, False, np.empty(need, np.uint8))
    for gather in (False, True):
        assert _engine.frame_buffers([], [], MAX_PIXELS, gather, np.empty(0, np.uint8))[1] == 0


@requires_engine
def test_frame_buffers_fuzz_damaged_jpegs():
    rng = random.Random(29)
    bases = [make_jpeg(30 + i, 20 + 2 * i, seed=i, progressive=i % 2 == 1) for i in range(4)]
    images = []
    for _ in range(300):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 4)):
            if not data:
                break
            what = rng.random()
            if what < 0.5:  # a flipped byte, mostly in the headers the walk reads
                pos = rng.randrange(min(len(data), 700) if rng.random() < 0.8 else len(data))
                data[pos] = rng.randrange(256)
            elif what < 0.7:
                del data[rng.randrange(len(data)) :]
            elif what < 0.85:  # the magic word somewhere
                pos = rng.randrange(len(data) + 1)
                data[pos:pos] = MAGIC
            else:
                data += bytes(rng.randrange(4))
        images.append(bytes(data))
    framed, _ = _frame(images)
    for data, n in zip(images, framed, strict=True):
        want = _python_verdict(data)
        assert (n if n < 0 else 0) == want, (n, want)
    assert {-3, -4} <= set(framed) and sum(n > 0 for n in framed) > 30  # every verdict was reached


def _entries(out) -> list[tuple]:
    """A converted batch's per-record facts: kind, reason, bytes read, the written record, checksum."""
    if isinstance(out, FramedBatch):
        out = out.entries()
    return [
        (
            c.kind,
            c.reason,
            nread,
            None if p is None else b"".join(bytes(x) for x in p.record.chunks),
            None if p is None else (p.length, p.data_offset, p.checksum),
        )
        for c, nread, p in out
    ]


@requires_engine
@pytest.mark.parametrize("width", [1, 3])
@pytest.mark.parametrize("gather", [False, True])
def test_convert_buffers_is_the_same_with_and_without_the_engine(monkeypatch, width, gather):
    monkeypatch.setattr("fastload.pack.framing.GATHER_MIN_BYTES", 0 if gather else 1 << 30)
    files = _variants()
    files["magic_scan.jpg"] = _with_comment(files["plain.jpg"], b"\0\0" + MAGIC + b"zz")
    files["many_pixels.jpg"] = make_jpeg(64, 64, seed=9)  # over max_pixels below: refused by its header
    limit = max(len(d) for d in files.values())
    good = [make_jpeg(20 + i, 16, seed=i) for i in range(5)]
    items: list[tuple[SourceItem, bytes | memoryview | None, str | None]] = []
    for i, (name, data) in enumerate(files.items()):
        labels = tuple(float(i + k) for k in range(width))
        items.append((SourceItem(i, name, labels), memoryview(data), None))
    items.append((SourceItem(len(items), "bad entry", (0.0,) * width), None, "no image member"))
    items.append((SourceItem(len(items), "too large", (0.0,) * width), make_jpeg(300, 300, seed=4), None))
    options = ConvertOptions(max_pixels=50 * 50)

    def run(engine: bool, batch):
        if engine:
            monkeypatch.delenv("FASTLOAD_PACK_FRAMING", raising=False)
        else:
            monkeypatch.setenv("FASTLOAD_PACK_FRAMING", "python")
        monkeypatch.setattr("fastload.pack.convert_batch.max_file_bytes", lambda w: limit)
        return _entries(convert_buffers(batch, options, ShardFormat.RECORDIO, width, BufferPool(keep=2)))

    assert run(True, items) == run(False, items)
    kinds = {e[0] for e in run(True, items)}
    assert {"pass", "grayscale", "cmyk", "png", None} <= kinds
    reasons = {e[1] for e in run(True, items)}
    assert any(r and "max_pixels" in r for r in reasons) and any(r and "record limit" in r for r in reasons)
    # A batch of good JPEGs is framed whole, as the Python framing frames it.
    whole = [(SourceItem(i, f"g{i}", (float(i),) * width), d, None) for i, d in enumerate(good)]
    monkeypatch.delenv("FASTLOAD_PACK_FRAMING", raising=False)
    framed = convert_buffers(whole, ConvertOptions(), ShardFormat.RECORDIO, width, BufferPool(keep=2))
    assert isinstance(framed, FramedBatch) and framed.complete
    assert (framed.buffer is None) == gather and len(framed.chunks) in (
        (2 * len(good), 2 * len(good) + 1) if gather else (1,)
    )
    assert run(True, whole) == run(False, whole)


@requires_engine
@pytest.mark.parametrize("gather", [False, True])
def test_streamed_packs_are_the_same_bytes_with_and_without_the_engine(odd_folder, tmp_path, monkeypatch, gather):
    monkeypatch.setattr("fastload.pack.framing.GATHER_MIN_BYTES", 0 if gather else 1 << 30)
    entries, classes = folder_entries(odd_folder)
    plain = make_jpeg(36, 28, seed=3)
    entries += [("magic.jpg", 1, _with_comment(plain, b"\0\0" + MAGIC + b"zz")), ("plain.jpg", 2, plain)]
    write_tars(entries, tmp_path / "tars", per_tar=4)
    write_parquet(entries, tmp_path / "pq" / "train.parquet", classes, rows_per_group=3)
    for src in ("tars", "pq"):
        outs = []
        for mode in ("", "python"):
            monkeypatch.setenv("FASTLOAD_PACK_FRAMING", mode)
            out = tmp_path / f"{src}-{mode or 'engine'}"
            res = pack_folder(str(tmp_path / src), str(out), progress=False, name="x", shard_size=60_000)
            outs.append(out)
            assert res.manifest["counts"]["written"] == len(entries) - len(res.manifest["skipped"])
        files = sorted(p.name for p in outs[0].iterdir() if p.suffix in (".rec", ".idx"))
        assert len(files) > 2
        for name in files:
            assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), (src, name)
        assert records(outs[0])[-2][1] == entries[-2][2]  # the magic-word record, split and joined again


# ---------------------------------------------------------------- walk_tar


def _read(data: bytes, walk: bool, chunk: int = 1 << 20, start: int = 0, **kw) -> tuple[list[tuple], str | None]:
    """The members a reader hands out (name, offset, size, regular, data, problem), and the error it ends with."""
    from fastload.pack.tar_stream import engine_walk

    reader = TarReader(
        io.BytesIO(data[start:]).read, start=start, chunk=chunk, walk=engine_walk() if walk else None, **kw
    )
    out = []
    try:
        for m in reader:
            out.append((m.name, m.offset, m.size, m.regular, None if m.data is None else bytes(m.data), m.problem))
    except TarError as exc:
        return out, str(exc)
    except Exception as exc:  # (damage the Python reader does not expect: both must fail alike)
        return out, f"{type(exc).__name__}: {exc}"
    return out, None


def _header(name: bytes, size: int, kind: bytes = b"0", *, size_field: bytes | None = None, **fields: bytes) -> bytes:
    """One ustar header with a valid (unsigned) checksum; ``fields``: byte offset ``at_N`` -> bytes."""
    h = bytearray(512)
    h[: len(name)] = name
    h[100:108] = b"0000644\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    for key, value in fields.items():
        at = int(key.split("_")[1])
        h[at : at + len(value)] = value
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _member(name: bytes, data: bytes, kind: bytes = b"0", **kw) -> bytes:
    return _header(name, len(data), kind, **kw) + data + bytes(-len(data) % 512)


def _pax(records: dict[bytes, bytes], kind: bytes = b"x") -> bytes:
    body = b""
    for key, value in records.items():
        rec = b" " + key + b"=" + value + b"\n"
        n = len(rec) + 1
        while len(rec) + len(str(n)) != n:  # the length counts its own digits
            n = len(rec) + len(str(n))
        body += str(n).encode() + rec
    return _member(b"././@PaxHeader", body, kind)


def _odd_tars() -> dict[str, bytes]:
    """Tars of every form the reader knows: what tarfile writes and hand-made odd headers."""
    out = {}
    for fmt, label in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax")):
        buf = io.BytesIO()
        with tarfile.open(
            fileobj=buf, mode="w", format=fmt, pax_headers={"comment": "g"} if fmt == tarfile.PAX_FORMAT else None
        ) as tf:
            names = ["short.jpg", "p" * 120 + "/" + "n" * 90 + ".jpg", "0001.cls", "e"]
            if fmt != tarfile.USTAR_FORMAT:
                names += ["x" * 150 + ".jpg", "ünï/cödé.json"]
            for i, name in enumerate(names):
                data = (name.encode() * 9)[: 300 + 97 * i]
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1.5 + i
                tf.addfile(info, io.BytesIO(data))
            for kind, name in ((tarfile.DIRTYPE, "a-dir"), (tarfile.SYMTYPE, "link"), (tarfile.LNKTYPE, "hard")):
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, "short.jpg"
                tf.addfile(info)
        out[label] = buf.getvalue()
    jpg = b"\xff\xd8" + bytes(range(256)) * 3
    end = bytes(1024)
    out["handmade"] = (
        _member(b"a.jpg", jpg)
        + _pax({b"path": b"renamed/\xffodd.jpg", b"mtime": b"1.5"})
        + _member(b"ignored.jpg", jpg[:700])
        + _pax({b"size": b"300"})
        + _header(b"sized.jpg", 999)
        + jpg[:300]
        + bytes(212)
        + _member(b"old-dir/", b"", b"\0")
        + _member(b"contig.jpg", jpg, b"7")
        + _member(b"base256.jpg", jpg[:10], size_field=b"\x80" + bytes(10) + b"\x0a")
        + _member(b"spaced.jpg", jpg[:20], size_field=b"   24 \0     ")
        + _member(b"b.jpg", jpg[:5], at_345=b"prefix/dir")
        + _member(b"././@LongLink", b"long/" + b"n" * 200 + b".jpg\0", b"L")
        + _member(b"cut-name.jpg", jpg[:33])
        + _member(b"././@LongLink", b"target\0", b"K")
        + _member(b"sym", b"", b"2")
        + _pax({b"comment": b"global"}, b"g")
        + _member(b"after-global.jpg", jpg[:44])
        + _member(b"fifo", b"", b"6")
        + _member(b"last.jpg", jpg)
        + end
    )
    signed = bytearray(_member("sïgned.jpg".encode(), jpg[:50]))
    total = sum(b if b < 128 else b - 256 for i, b in enumerate(signed[:512]) if not 148 <= i < 156) + 256
    signed[148:156] = b"%06o\0 " % total  # an old archive's signed-byte checksum
    out["signed"] = bytes(signed) + _member(b"z.jpg", jpg) + end
    out["sparse-pax"] = _pax({b"GNU.sparse.size": b"10", b"path": b"s.jpg"}) + _header(b"s.jpg", 0) + end
    return out


@requires_engine
@pytest.mark.parametrize("chunk", [512, 1000, 4096, 1 << 20])
def test_walk_tar_reads_what_the_python_reader_reads(chunk):
    for name, data in _odd_tars().items():
        engine, python = _read(data, True, chunk), _read(data, False, chunk)
        assert engine == python, name
        assert python[1] is None and python[0], name
        if name == "handmade":
            got = {m[0]: m for m in python[0]}
            assert "renamed/\udcffodd.jpg" in got and got["sized.jpg"][2] == 300
            assert "prefix/dir/b.jpg" in got and "old-dir" in got and got["base256.jpg"][2] == 10
    # Resumed at a member's offset, with the global headers in force there.
    data = _odd_tars()["pax"]
    reader = TarReader(io.BytesIO(data).read)
    members = list(reader)
    kw = {"pax_global": dict(reader.pax_global)}
    assert _read(data, True, chunk, members[3].offset, **kw) == _read(data, False, chunk, members[3].offset, **kw)
    assert _read(data, True, chunk, max_size=400) == _read(data, False, chunk, max_size=400)


@requires_engine
def test_walk_tar_stops_where_python_must_read():
    from fastload import _engine

    data = _odd_tars()["handmade"]
    names, rows, stop = _engine.walk_tar(data, 0, 100)
    # a.jpg, then the PAX-renamed member; the PAX size record's member; the old-style directory,
    # the contiguous file; then the base-256 size, which only the Python reader parses.
    assert names == ["a.jpg", "renamed/\udcffodd.jpg", "sized.jpg", "old-dir", "contig.jpg"]
    assert rows[:, 3].tolist() == [ord("0"), ord("0"), ord("0"), ord("5"), ord("7")]
    assert stop == rows[-1, 1] + 1024  # contig.jpg's data: 770 bytes, padded
    assert _engine.walk_tar(data, 0, 2)[0] == names[:2]
    assert _engine.walk_tar(data, stop, 100)[0] == []  # nothing taken: the stop is where it started
    assert _engine.walk_tar(bytes(1024), 0, 10)[2] == 0  # the end-of-archive block
    with pytest.raises(ValueError, match="outside"):
        _engine.walk_tar(data, len(data) + 1, 1)


@requires_engine
def test_walk_tar_fuzz_damaged_headers():
    rng = random.Random(7)
    tars = list(_odd_tars().values())
    outcomes = []
    for _ in range(400):
        data = bytearray(rng.choice(tars))
        for _ in range(rng.randint(1, 3)):
            if len(data) < 512:
                break
            block = rng.randrange(len(data) // 512)
            if rng.random() < 0.7:  # a header field: checksum, size, type, magic, name, prefix
                at = block * 512 + rng.choice([0, 5, 99, 124, 130, 135, 148, 150, 155, 156, 257, 262, 345, 400])
                data[at] = rng.choice([0, 32, ord("0"), ord("7"), ord("8"), ord("x"), ord("L"), 0x80, 0xFF])
            else:
                del data[rng.randrange(len(data)) :]
        if rng.random() < 0.5:  # a header with its checksum made right again: damage the walk must parse
            block = rng.randrange(max(1, len(data) // 512))
            h = data[block * 512 : block * 512 + 512]
            if len(h) == 512 and any(h):
                h[148:156] = b" " * 8
                h[148:156] = b"%06o\0 " % sum(h)
                data[block * 512 : block * 512 + 512] = h
        chunk = rng.choice([512, 1536, 1 << 20])
        engine = _read(bytes(data), True, chunk)
        assert engine == _read(bytes(data), False, chunk)
        outcomes.append(engine[1] is None)
    assert 0 < sum(outcomes) < len(outcomes)  # damage that was read through and damage that ended the read


def test_chunk_pool_reuses_a_chunk_once_no_view_of_it_is_left():
    pool = ChunkPool(keep=2)
    a = pool.take(1000)
    view = memoryview(a)[10:20]
    b = pool.take(1000)
    assert b is not a  # a view of a is alive
    del view
    assert pool.take(900) is a  # no view left: reused (a larger chunk serves a smaller read)
    keep_b = memoryview(b)
    keep_a = memoryview(a)
    c = pool.take(1000)
    assert c is not a and c is not b and len(pool._chunks) == 2  # all in use, the pool full: not kept
    del keep_a, keep_b
    assert pool.take(1000) is a
    assert pool.take(5000) not in (a, b)  # none large enough
