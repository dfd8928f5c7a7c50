"""``fastload pack`` from WebDataset tars: the tar reader, samples and labels, bad entries, equivalence with the folder pack."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile

import pytest
from ingest_inputs import folder_entries, image_bytes, manifest, records, write_tars
from test_pack import run_cli

from fastload.errors import UserError
from fastload.pack.packer import pack_folder
from fastload.pack.tar_stream import TarError, TarReader
from fastload.records.verify import verify_dataset

from conftest import make_jpeg, requires_engine

pytest.importorskip("webdataset")


def _members(data: bytes, chunk: int = 1 << 20, start: int = 0, **kw):
    return [
        (m.name, m.regular, None if m.data is None else bytes(m.data), m.problem)
        for m in TarReader(io.BytesIO(data[start:]).read, start=start, chunk=chunk, **kw)
    ]


def _tar(fmt: int, names: list[str], extra: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name in names:
            data = (name.encode() * 7)[: 700 + len(name)]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if extra:
            info = tarfile.TarInfo("a-dir")
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
            info = tarfile.TarInfo("link")
            info.type = tarfile.SYMTYPE
            info.linkname = "target"
            tf.addfile(info)
    return buf.getvalue()


# ---------------------------------------------------------------- the tar reader


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("chunk", [512, 1000, 1 << 20])
def test_tar_reader_reads_what_tarfile_writes(fmt, chunk):
    names = ["short.jpg", "p" * 120 + "/" + "n" * 90 + ".jpg", "0001.cls"]
    if fmt != tarfile.USTAR_FORMAT:
        names += ["x" * 150 + ".jpg", "ünï/cödé.json"]  # long names (GNU L / PAX path), UTF-8
    data = _tar(fmt, names)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        want = [(m.name, m.isreg(), tf.extractfile(m).read() if m.isreg() else None, None) for m in tf]
    assert _members(data, chunk) == want


def test_tar_reader_resumes_at_a_member_offset_with_global_headers():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tf:
        for i in range(6):
            info = tarfile.TarInfo(f"{i:03d}.jpg")
            info.size = 600 + i
            info.mtime = 1.5  # a float mtime: a PAX header per member, as webdataset writes them
            tf.addfile(info, io.BytesIO(bytes([i]) * info.size))
    data = buf.getvalue()
    reader = TarReader(io.BytesIO(data).read)
    members = list(reader)
    assert [m.name for m in members] == [f"{i:03d}.jpg" for i in range(6)]
    resumed = _members(data, start=members[3].offset, pax_global=dict(reader.pax_global))
    assert resumed == [(m.name, True, bytes(m.data), None) for m in members[3:]]


def test_tar_reader_reports_damage_with_its_offset():
    data = _tar(tarfile.USTAR_FORMAT, ["a.jpg", "b.jpg", "c.jpg"], extra=False)
    second = [m.offset for m in TarReader(io.BytesIO(data).read)][1]
    assert second == 1024  # a.jpg: its header and 35 bytes of data padded to a block
    bad = bytearray(data)
    bad[second + 10] ^= 0x55  # a byte of b.jpg's name: the checksum no longer matches
    reader = TarReader(io.BytesIO(bytes(bad)).read)
    it = iter(reader)
    assert next(it).name == "a.jpg"
    with pytest.raises(TarError, match=f"damaged tar header at byte {second} .checksum"):
        next(it)
    # Cut inside b.jpg's data: b.jpg comes out with its problem, then the archive ends.
    cut = _members(data[: second + 512 + 10])
    assert cut[0][0] == "a.jpg" and cut[1][:3] == ("b.jpg", True, None)
    assert cut[1][3] == "truncated tar: 10 of 35 bytes present"
    assert len(cut) == 2
    with pytest.raises(TarError, match="ends inside the header"):
        _members(data[: second + 100])
    big = _members(data, max_size=34)  # members larger than a record can hold: passed over unread
    assert [(n, d, p) for n, _, d, p in big] == [
        (n, None, "member of 35 bytes is larger than the 34-byte record limit") for n in ("a.jpg", "b.jpg", "c.jpg")
    ]
    sparse = bytearray(data[:512])  # a GNU sparse member: reported, never handed out as data
    sparse[156:157] = b"S"
    sparse[148:156] = b" " * 8
    sparse[148:156] = b"%06o\0 " % sum(sparse)
    out = _members(bytes(sparse) + data[512:])
    assert out[0][3] == "sparse tar member: not supported" and out[0][2] is None


# ---------------------------------------------------------------- packs


@pytest.fixture(scope="module")
def odd_inputs(odd_folder, tmp_path_factory):
    """The odd folder's images (grayscale, CMYK, PNG, truncated, empty, text) as tars of 5 samples."""
    entries, classes = folder_entries(odd_folder)
    folder = tmp_path_factory.mktemp("wds") / "odd-tars"
    write_tars(entries, folder, per_tar=5)
    return entries, classes, folder


def _tar_member(tar: str, name: str) -> str:
    return f"{tar}:{name}"


def test_tars_pack_like_the_folder(odd_folder, odd_inputs, tmp_path):
    entries, _classes, folder = odd_inputs
    ref = pack_folder(str(odd_folder), str(tmp_path / "ref"), progress=False, workers=2)
    res = pack_folder(str(folder), str(tmp_path / "wds"), progress=False, workers=2, shard_size=40_000)
    assert records(tmp_path / "wds") == records(tmp_path / "ref")  # same image bytes and labels, same order
    assert res.converted == ref.converted == {"cmyk": 1, "grayscale": 1, "png": 1}
    assert len(res.manifest["shards"]) > 1 and verify_dataset(str(tmp_path / "wds"), decode=True).ok
    # The bad entries are the folder's bad files, named by tar and member.
    folder_bad = {os.path.basename(p): r for p, r in ref.skipped}
    index = {name: i for i, (name, _, _) in enumerate(entries)}
    named = {}
    for path, reason in res.skipped:
        tar, member = path.rsplit(":", 1)
        i = int(member.split(".")[0])
        assert tar == str(folder / f"train-{i // 5:06d}.tar")
        named[entries[i][0]] = reason
    assert named == folder_bad and len(named) == 3
    assert {s["path"] for s in res.manifest["skipped"]} == {p for p, _ in res.skipped}
    m = res.manifest
    assert m["source"]["kind"] == "wds" and m["source"]["tars"] == 4 and m["source"]["label_key"] == "cls"
    assert m["classes"] is None  # integer labels: kept as they are
    assert index  # (entries are in the folder pack's order)


def test_one_tar_a_brace_pattern_and_gzip(odd_inputs, tmp_path):
    _entries, _, folder = odd_inputs
    whole = pack_folder(str(folder), str(tmp_path / "all"), progress=False)
    single = pack_folder(str(folder / "train-000001.tar"), str(tmp_path / "one"), progress=False)
    assert records(tmp_path / "one") == records(tmp_path / "all")[4 : 4 + single.written]
    pattern = str(folder / "train-{000000..000003}.tar")
    pack_folder(pattern, str(tmp_path / "brace"), progress=False)
    assert records(tmp_path / "brace") == records(tmp_path / "all")
    gz = tmp_path / "gz"
    gz.mkdir()
    for tar in sorted(folder.iterdir()):
        (gz / (tar.name + ".gz")).write_bytes(gzip.compress(tar.read_bytes()))
    res = pack_folder(str(gz), str(tmp_path / "gz-out"), progress=False)
    assert records(tmp_path / "gz-out") == records(tmp_path / "all")
    assert res.manifest["name"] == "gz" and whole.manifest["name"] == "odd-tars"
    with pytest.raises(UserError, match=r"train-000004.tar: cannot read \(No such file"):
        pack_folder(str(folder / "train-{000000..000009}.tar"), str(tmp_path / "x"), progress=False)


@pytest.mark.parametrize(
    ("label", "key", "want_classes"),
    [
        ("json", "json.label", None),
        ("json", "json.class_name", {"c": 0, "a": 1, "b": 2}),
        ("name", None, {"c": 0, "a": 1, "b": 2}),
    ],
)
def test_label_keys(jpeg_bytes, tmp_path, label, key, want_classes):
    names = ["c", "a", "b"]
    entries = [(f"{i}.jpg", [0, 1, 0, 2, 1][i], jpeg_bytes(32, 24, seed=i)) for i in range(5)]
    write_tars(entries, tmp_path / "in", per_tar=3, label=label, classes=names)
    res = pack_folder(str(tmp_path / "in"), str(tmp_path / "out"), progress=False, label_key=key)
    got = [labels for labels, _ in records(tmp_path / "out")]
    assert got == [(float(c),) for _, c, _ in entries]  # first-seen order c, a, b matches the indices here
    assert res.manifest["classes"] == want_classes
    assert res.manifest["source"]["label_key"] == (key or "cls")


def test_image_key_label_lists_and_unlabeled(tmp_path):
    import webdataset as wds

    tar = tmp_path / "multi.tar"
    with wds.TarWriter(str(tar)) as sink:
        for i in range(4):
            sink.write(
                {
                    "__key__": f"s{i}",
                    "jpg": make_jpeg(30, 20, seed=i),
                    "seg.png": image_bytes("L", "PNG", (30, 20)),
                    "json": {"scores": [i, 0.5, -1.0]},
                }
            )
    res = pack_folder(str(tar), str(tmp_path / "a"), progress=False, label_key="json.scores")
    assert [labels for labels, _ in records(tmp_path / "a")] == [(float(i), 0.5, -1.0) for i in range(4)]
    assert res.manifest["label_width"] == 3
    res = pack_folder(str(tar), str(tmp_path / "b"), progress=False, image_key="seg.png", label_key="none")
    assert res.converted == {"png": 4}
    assert {labels for labels, _ in records(tmp_path / "b")} == {(0.0,)}
    with pytest.raises(UserError, match="neither a cls member nor a json label"):
        pack_folder(str(tar), str(tmp_path / "c"), progress=False)


def test_bad_entries_are_named_by_tar_and_member(tmp_path):
    import webdataset as wds

    good = make_jpeg(40, 30, seed=1)
    (tmp_path / "in").mkdir()
    tar = tmp_path / "in" / "bad.tar"
    with wds.TarWriter(str(tar)) as sink:
        sink.write({"__key__": "a", "jpg": good, "cls": 1})
        sink.write({"__key__": "b", "txt": "no image here", "cls": 1})  # no image member
        sink.write({"__key__": "c", "jpg": b"not a jpeg at all", "cls": 2})  # undecodable
        sink.write({"__key__": "d", "jpg": good})  # no label member
        sink.write({"__key__": "e", "jpg": good, "cls": "x" * 3})  # a class name where labels are numbers
        sink.write({"__key__": "f", "webp": image_bytes("RGB", "WEBP"), "cls": 0})
        sink.write({"__key__": "g", "jpg": image_bytes("CMYK", "JPEG"), "cls": 0})
    data = tar.read_bytes()
    cut = data.find(image_bytes("CMYK", "JPEG")) + 100
    (tmp_path / "in" / "cut.tar").write_bytes(data[:cut])  # cut inside g.jpg's data
    res = pack_folder(str(tmp_path / "in"), str(tmp_path / "out"), progress=False, input_format="wds")
    skipped = dict(res.skipped)
    t, c = str(tar), str(tmp_path / "in" / "cut.tar")
    assert skipped[f"{t}:b"].startswith("no image member (jpg, jpeg, png, webp; the sample has: cls, txt)")
    assert "not an image" in skipped[f"{t}:c.jpg"]
    assert skipped[f"{t}:d.jpg"] == "no cls member for the label"
    assert skipped[f"{t}:e.jpg"] == "label is a class name where the labels are numbers"
    assert skipped[f"{c}:g.jpg"].startswith("truncated tar: 100 of")
    assert res.converted == {"cmyk": 1, "webp": 2} and res.written == 3 + 2
    assert len(res.skipped) == 4 + 5  # the cut tar's last sample is its one more bad entry
    assert {s["path"] for s in res.manifest["skipped"]} == set(skipped)
    with pytest.raises(UserError, match=rf"{t}:b: no image member .*--on-error fail"):
        pack_folder(str(tar), str(tmp_path / "fail"), progress=False, on_error="fail")


def test_damaged_tar_keeps_what_came_before(tmp_path):
    entries = [(f"{i}.jpg", i % 2, make_jpeg(30, 20, seed=i)) for i in range(6)]
    (path,) = write_tars(entries, tmp_path / "in", per_tar=6)
    data = bytearray(path.read_bytes())
    reader = TarReader(io.BytesIO(bytes(data)).read)
    fourth = next(m for m in reader if m.name.startswith("000003"))
    data[fourth.offset + 3] ^= 0x40  # damage the header of sample 3's first member
    path.write_bytes(bytes(data))
    res = pack_folder(str(path), str(tmp_path / "out"), progress=False)
    assert res.written == 3
    ((name, reason),) = res.skipped
    assert name == str(path) and f"damaged tar header at byte {fourth.offset}" in reason
    assert "the rest of this tar is skipped" in reason


def test_options_that_do_not_apply_are_refused(odd_inputs, tmp_path):
    _, _, folder = odd_inputs
    with pytest.raises(UserError, match="--shards needs the number of samples up front.*--shard-size"):
        pack_folder(str(folder), str(tmp_path / "a"), progress=False, shards=2)
    with pytest.raises(UserError, match="--shuffle needs the whole input listed up front"):
        pack_folder(str(folder), str(tmp_path / "b"), progress=False, shuffle=True)
    with pytest.raises(UserError, match="--image-column, --split do.es. not apply to wds input"):
        pack_folder(str(folder), str(tmp_path / "c"), progress=False, image_column="img", split="train")
    with pytest.raises(UserError, match="--label-key does not apply to folder input"):
        pack_folder(str(tmp_path), str(tmp_path / "d"), progress=False, input_format="folder", label_key="cls")
    with pytest.raises(UserError, match="no tar files"):
        empty = tmp_path / "empty"
        empty.mkdir()
        pack_folder(str(empty), str(tmp_path / "e"), progress=False, input_format="wds")


def test_resize_lmdb_and_restart_index_match_the_folder(odd_folder, odd_inputs, tmp_path):
    _, _, folder = odd_inputs
    for opts in ({"resize": 24, "quality": 80}, {"format": "lmdb"}):
        pack_folder(str(odd_folder), str(tmp_path / "ref"), progress=False, overwrite=True, **opts)
        pack_folder(str(folder), str(tmp_path / "wds"), progress=False, overwrite=True, **opts)
        assert records(tmp_path / "wds") == records(tmp_path / "ref")


@requires_engine
def test_restart_index_matches_the_folder(odd_folder, odd_inputs, tmp_path):
    _, _, folder = odd_inputs
    ref = pack_folder(str(odd_folder), str(tmp_path / "ref"), progress=False, restart_index=True)
    res = pack_folder(str(folder), str(tmp_path / "wds"), progress=False, restart_index=True)
    assert records(tmp_path / "wds") == records(tmp_path / "ref")
    assert res.manifest["restart_index"]["images"] == ref.manifest["restart_index"]["images"]


def test_cli_packs_tars_and_verify_passes(odd_inputs, tmp_path):
    _, _, folder = odd_inputs
    out = str(tmp_path / "ds")
    res = run_cli("pack", str(folder), out, "--quiet", "--shard-size", "50KB", "--workers", "2", check=0)
    assert "packed 16 records into" in res.stdout and "skipped 3" in res.stdout
    assert f"skipped {folder}/train-000" in res.stdout
    assert run_cli("verify", out, "--decode", check=0).stdout.startswith("OK")
    res = run_cli("pack", str(folder), str(tmp_path / "x"), "--shards", "2", check=2)
    assert "--shard-size" in res.stderr and "Traceback" not in res.stderr
    help_text = run_cli("pack", "--help", check=0).stdout
    for flag in ("--input-format", "--image-key", "--label-key", "--image-column", "--label-column", "--split"):
        assert flag in help_text
    assert "first-seen order" in help_text and "sorted order" in help_text
    m = manifest(out)
    assert m["counts"]["found"] == 19 and m["counts"]["written"] == 16
    shutil.rmtree(out)
    assert json.dumps(m)  # (JSON-able)


def test_whole_batches_are_framed_as_the_engine_frames_files(tiny_folder, tmp_path):
    entries, _ = folder_entries(tiny_folder)
    write_tars(entries, tmp_path / "tars", per_tar=16)
    pack_folder(str(tiny_folder), str(tmp_path / "ref"), progress=False, name="x", shard_size=150_000)
    res = pack_folder(str(tmp_path / "tars"), str(tmp_path / "wds"), progress=False, name="x", shard_size=150_000)
    assert res.manifest["counts"]["passed_through"] == 40 and len(res.manifest["shards"]) > 2
    for name in os.listdir(tmp_path / "ref"):
        if name.endswith((".rec", ".idx", ".npy")):
            assert (tmp_path / "wds" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name


def test_frame_buffers_leaves_records_to_split_to_the_record_path():
    from fastload.pack.framing import BufferPool, frame_buffers
    from fastload.records import recordio
    from fastload.records.folder_tree import SourceItem

    pool = BufferPool(keep=2)
    jpgs = [make_jpeg(20 + i, 16, seed=i) for i in range(3)]
    items = [(SourceItem(i, f"m{i}", (float(i),)), data) for i, data in enumerate(jpgs)]
    whole = frame_buffers(items, 1, pool)
    want = b"".join(
        b"".join(bytes(c) for c in recordio.FramedRecord(d, recordio.pack_header(float(i), i)).chunks)
        for i, d in enumerate(jpgs)
    )
    assert bytes(whole.data) == want and whole.complete
    magic = recordio.MAGIC.to_bytes(4, "little")
    split = jpgs[1][:8] + magic + jpgs[1][8:]  # the magic word at an aligned offset: a multi-part record
    assert frame_buffers([items[0], (items[1][0], split)], 1, pool) is None


def test_repeated_cls_texts_keep_their_labels_and_their_errors(tmp_path):
    """A cls text seen before gives the labels it gave then; a bad one is reported every time."""
    import webdataset as wds

    good = make_jpeg(24, 16, seed=3)
    tar = tmp_path / "names.tar"
    texts = ["dog", "cat", "dog", " cat\n", "7", "dog", "7", "cat"]
    with wds.TarWriter(str(tar)) as sink:
        for i, text in enumerate(texts):
            sink.write({"__key__": f"s{i}", "jpg": good, "cls": text})
    res = pack_folder(str(tar), str(tmp_path / "out"), progress=False)
    assert [labels for labels, _ in records(tmp_path / "out")] == [(0.0,), (1.0,), (0.0,), (1.0,), (0.0,), (1.0,)]
    assert res.manifest["classes"] == {"dog": 0, "cat": 1}
    assert dict(res.skipped) == {
        f"{tar}:s4.jpg": "label is a number where the labels are class names",
        f"{tar}:s6.jpg": "label is a number where the labels are class names",
    }
