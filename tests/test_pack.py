"""`fastload pack` / `info` / `verify`: odd files, bad input, overwrite, full disk, kill -9 and resume, the CLI."""

from __future__ import annotations

import errno
import glob
import io
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from test_records_data import REPO, odd_folder, tiny_folder  # noqa: F401  (fixtures)

from fastload.cli.sizes import parse_size
from fastload.errors import UserError
from fastload.pack import convert
from fastload.pack.options import PackOptions
from fastload.pack.packer import pack_folder
from fastload.records import recordio
from fastload.records.dataset import open_dataset
from fastload.records.manifest import INDEX_NAME, MANIFEST_NAME
from fastload.records.verify import verify_dataset

from conftest import make_jpeg, requires_engine, wait_until


def run_cli(*args, check=None):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run(
        [sys.executable, "-m", "fastload", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    if check is not None:
        assert res.returncode == check, (res.returncode, res.stdout, res.stderr)
    return res


def _odd_kinds(folder):
    entries = json.load(open(os.path.join(folder, "odd_files.json")))["files"]
    return {e["kind"]: os.path.join(folder, e["path"]) for e in entries}


# ---------------------------------------------------------------- conversion


def test_inspect_jpeg_reads_frame_and_detects_truncation():
    img = Image.new("RGB", (33, 17), (10, 200, 30))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, progressive=True)
    data = buf.getvalue()
    info = convert.inspect_jpeg(data)
    assert (info.width, info.height, info.components, info.progressive) == (33, 17, 3, True)
    assert convert.inspect_jpeg(b"\x89PNG\r\n\x1a\n....") is None
    with pytest.raises(convert.BadImage, match="truncated"):
        convert.inspect_jpeg(data[: len(data) - 40])
    with pytest.raises(convert.BadImage, match="truncated"):
        convert.inspect_jpeg(data[:30])
    # Valid colour JPEGs pass through untouched, with no decode.
    out = convert.convert_image(data, convert.ConvertOptions())
    assert out.data is data and out.kind == "pass"


def test_odd_files_converted_or_reported(odd_folder, tmp_path):
    kinds = _odd_kinds(odd_folder)
    res = pack_folder(odd_folder, str(tmp_path / "out"), progress=False, workers=2)
    skipped = dict(res.skipped)
    assert set(skipped) == {kinds["truncated"], kinds["empty"], kinds["text"]}
    assert "truncated" in skipped[kinds["truncated"]]
    assert "empty" in skipped[kinds["empty"]]
    assert "not an image" in skipped[kinds["text"]]
    assert res.converted == {"cmyk": 1, "grayscale": 1, "png": 1}
    assert res.written == 20 + 4
    manifest = res.manifest
    assert manifest["counts"]["skipped"] == 3 and manifest["counts"]["converted"] == res.converted
    assert {s["path"] for s in manifest["skipped"]} == set(skipped)
    with open_dataset(str(tmp_path / "out")) as ds:
        for i in range(len(ds)):
            img = Image.open(io.BytesIO(bytes(ds.image(i))))
            assert img.format == "JPEG" and img.mode == "RGB", ds.locate(i)
            img.load()
    # The progressive JPEG passes through byte for byte.
    progressive = open(kinds["progressive"], "rb").read()
    with open_dataset(str(tmp_path / "out")) as ds:
        assert any(bytes(ds.image(i)) == progressive for i in range(len(ds)))
    assert verify_dataset(str(tmp_path / "out"), decode=True).ok


def test_on_error_fail_names_the_file(odd_folder, tmp_path):
    with pytest.raises(UserError, match=r"n0\d+_\d+\.(JPEG|jpg): .*--on-error fail"):
        pack_folder(odd_folder, str(tmp_path / "out"), on_error="fail", progress=False)
    assert not os.path.exists(tmp_path / "out" / MANIFEST_NAME)


def test_resize_shorter_side(tiny_folder, tmp_path):
    res = pack_folder(tiny_folder, str(tmp_path / "out"), resize=32, quality=80, progress=False, format="lmdb")
    assert res.converted == {"resized": 40}
    with open_dataset(str(tmp_path / "out")) as ds:
        for i in range(len(ds)):
            img = Image.open(io.BytesIO(bytes(ds.image(i))))
            assert min(img.size) == 32 and img.mode == "RGB"


@requires_engine
def test_engine_resize_encode_matches_the_decode_path(monkeypatch):
    """One engine call re-encodes a batch: the engine's resize, encoded as Pillow encodes it at q95."""
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    from fastload import decode
    from fastload.transforms import Resize

    images = [
        make_jpeg(403, 351, seed=1),
        make_jpeg(257, 300, subsampling="4:4:4", seed=2),
        make_jpeg(640, 480, seed=3),
        make_jpeg(301, 211, progressive=True, seed=4),
    ]
    fn = convert._engine_resize_encode()
    assert fn is not None
    encoded = fn(images, 128, 95)
    for data, jpeg in zip(images, encoded, strict=False):
        info = convert.inspect_jpeg(data)
        w, h = convert._resized_size(info.width, info.height, 128)
        got = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
        assert got.shape == (h, w, 3)
        ref = np.empty((1, h, w, 3), np.uint8)
        res = decode.decode_batch([data], ref, Resize(size=(h, w)), seed=0, epoch=0, indices=[0], threads=1)
        assert res.ok
        # Same pixels in, same libjpeg defaults (4:2:0, baseline, standard tables): Pillow's encode
        # of the engine's resized pixels decodes the same (bit-identical with equal libjpeg-turbo
        # builds; a tolerance for Pillow's bundled copy).
        buf = io.BytesIO()
        Image.fromarray(ref[0]).save(buf, "JPEG", quality=95)
        pillow = np.asarray(Image.open(buf).convert("RGB"))
        assert np.abs(got.astype(int) - pillow.astype(int)).mean() < 0.25
        assert abs(len(jpeg) - buf.tell()) < 0.05 * buf.tell()


@requires_engine
def test_engine_resize_encode_reports_bad_images_without_crashing(monkeypatch):
    monkeypatch.delenv("FASTLOAD_DECODER", raising=False)
    from fastload import decode

    good = make_jpeg(200, 150, seed=5)
    png = io.BytesIO()
    Image.new("RGB", (20, 10)).save(png, "PNG")
    bad = [b"", good[: len(good) // 3], png.getvalue(), b"\xff\xd8\xff" + bytes(100), good]
    out = decode._engine.resize_encode_batch(bad, 64, 90, 2, decode._native_options(decode.DecodeOptions()))
    assert [s == 0 for s, _, _ in out] == [False, False, False, False, True]
    assert all(msg for s, msg, _ in out if s != 0)
    assert [d is not None for d in decode.resize_encode_batch(bad, shorter=64, quality=90)] == [False] * 4 + [True]
    with pytest.raises(ValueError, match="quality"):
        decode.resize_encode_batch([good], shorter=64, quality=101)
    # With the Pillow decoder forced, the engine call refuses and the converter uses Pillow.
    monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    with pytest.raises(RuntimeError, match="FASTLOAD_DECODER"):
        decode.resize_encode_batch([good], shorter=64, quality=90)
    assert convert.convert_images([good], convert.ConvertOptions(resize=64))[0].kind == "resized"
    # The per-image converter still decides for what the engine refused: PNG is converted, the
    # truncated JPEG is either decoded by Pillow or skipped with its reason.
    results = convert.convert_images(bad[1:], convert.ConvertOptions(resize=64))
    assert results[1].kind == "resized" and results[3].kind == "resized"
    assert all((r.data is None) == (r.reason is not None) for r in results)


# ---------------------------------------------------------------- sources, order, shards


def test_shuffle_is_seeded_and_keeps_labels(tiny_folder, tmp_path):
    a = pack_folder(tiny_folder, str(tmp_path / "a"), shuffle=True, seed=1, progress=False)
    b = pack_folder(tiny_folder, str(tmp_path / "b"), shuffle=True, seed=1, name="tiny", progress=False)
    c = pack_folder(tiny_folder, str(tmp_path / "c"), shuffle=True, seed=2, progress=False)
    plain = open_dataset(tiny_folder)
    with open_dataset(a.out) as da, open_dataset(b.out) as db, open_dataset(c.out) as dc:
        assert da.ids.tolist() == db.ids.tolist() != dc.ids.tolist()
        assert sorted(da.ids.tolist()) == list(range(40)) and da.ids.tolist() != list(range(40))
        for i in range(len(da)):
            k = int(da.ids[i])
            assert bytes(da.image(i)) == bytes(plain.image(k)) and da.labels[i, 0] == plain.labels[k, 0]
    for name in os.listdir(a.out):
        if name != MANIFEST_NAME:
            assert open(os.path.join(a.out, name), "rb").read() == open(os.path.join(b.out, name), "rb").read()


def test_shard_count_and_size(tiny_folder, tmp_path):
    res = pack_folder(tiny_folder, str(tmp_path / "n"), shards=7, progress=False)
    counts = [s["records"] for s in res.manifest["shards"]]
    assert len(counts) == 7 and sum(counts) == 40 and max(counts) - min(counts) <= 1
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(tiny_folder, "*", "*")))
    res = pack_folder(tiny_folder, str(tmp_path / "s"), shard_size=total // 4, progress=False)
    sizes = [s["bytes"] for s in res.manifest["shards"]]
    assert 4 <= len(sizes) <= 5 and sum(s["records"] for s in res.manifest["shards"]) == 40
    assert max(sizes[:-1]) <= total // 4
    assert parse_size("512MB") == 512 << 20 and parse_size("1.5k") == 1536 and parse_size("64KiB") == 65536
    assert parse_size("1000") == 1000
    with pytest.raises(UserError, match="shard-size"):
        parse_size("lots")


def test_lst_source_with_root_and_bad_lines(tiny_folder, tmp_path):
    files = sorted(glob.glob(os.path.join(tiny_folder, "*", "*.JPEG")))[:5]
    lst = tmp_path / "x.lst"
    lst.write_text(
        "".join(f"{50 + i}\t{i}\t{i * 2}\t{os.path.relpath(f, tiny_folder)}\n" for i, f in enumerate(files))
        + "\n99\t1\t2\tmissing/file.JPEG\n"
    )
    res = pack_folder(str(lst), str(tmp_path / "out"), root=tiny_folder, format="lmdb", progress=False)
    assert res.written == 5 and res.skipped[0][1].startswith("cannot read")
    with open_dataset(str(tmp_path / "out")) as ds:
        assert ds.label_width == 2 and ds.ids.tolist() == [50, 51, 52, 53, 54]
        assert ds.labels[3].tolist() == [3.0, 6.0] and ds.manifest["classes"] is None
        assert bytes(ds.image(4)) == open(files[4], "rb").read()
        p = recordio.unpack_header(ds.payload(3))
        assert p.flag == 2 and p.labels == (3.0, 6.0)
    bad = tmp_path / "bad.lst"
    bad.write_text("0\t1\ta.jpg\n1\t1\t2\tb.jpg\n")
    with pytest.raises(UserError, match=r"bad\.lst:2: 2 labels, earlier lines have 1"):
        pack_folder(str(bad), str(tmp_path / "o2"), root=tiny_folder, progress=False)
    bad.write_text("zero\t1\ta.jpg\n")
    with pytest.raises(UserError, match=r"bad\.lst:1: index must be an integer"):
        pack_folder(str(bad), str(tmp_path / "o2"), progress=False)


# ---------------------------------------------------------------- bad input and output


def test_bad_inputs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        pack_folder(str(tmp_path / "nope"), str(tmp_path / "out"), progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no class sub-folders"):
        pack_folder(str(tmp_path / "empty"), str(tmp_path / "out"), progress=False)
    (tmp_path / "empty" / "cat").mkdir()
    (tmp_path / "empty" / "cat" / "readme.txt").write_text("x")
    with pytest.raises(UserError, match="no images found"):
        pack_folder(str(tmp_path / "empty"), str(tmp_path / "out"), progress=False)
    (tmp_path / "empty.lst").write_text("\n")
    with pytest.raises(UserError, match="the list is empty"):
        pack_folder(str(tmp_path / "empty.lst"), str(tmp_path / "out"), progress=False)
    (tmp_path / "bad" / "cat").mkdir(parents=True)
    (tmp_path / "bad" / "cat" / "a.jpg").write_bytes(b"")
    with pytest.raises(UserError, match="none of the 1 files is a decodable image"):
        pack_folder(str(tmp_path / "bad"), str(tmp_path / "out2"), progress=False)
    with pytest.raises(UserError, match="shards=0"):
        pack_folder(str(tmp_path / "bad"), str(tmp_path / "out3"), shards=0)


def test_unwritable_out(tiny_folder, tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match="exists and is not a folder"):
        pack_folder(tiny_folder, str(tmp_path / "afile"), progress=False)
    with pytest.raises(UserError, match="cannot create the output folder"):
        pack_folder(tiny_folder, str(tmp_path / "afile" / "out"), progress=False)
    with pytest.raises(UserError, match="inside the source folder"):
        pack_folder(tiny_folder, os.path.join(tiny_folder, "packed"), progress=False)


def test_existing_dataset_refused_then_overwritten(tiny_folder, tmp_path):
    out = str(tmp_path / "out")
    pack_folder(tiny_folder, out, shards=3, name="old", progress=False)
    before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
    # Same command again: nothing to do. Different options: refused.
    assert pack_folder(tiny_folder, out, shards=3, name="old", progress=False).up_to_date
    with pytest.raises(UserError, match="already holds a dataset.*--overwrite"):
        pack_folder(tiny_folder, out, shards=2, name="new", progress=False)
    assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == before
    res = pack_folder(tiny_folder, out, shards=2, name="new", overwrite=True, progress=False)
    names = sorted(os.listdir(out))
    assert names == sorted(
        [MANIFEST_NAME, INDEX_NAME, "new-00000.rec", "new-00000.idx", "new-00001.rec", "new-00001.idx"]
    )
    assert res.manifest["name"] == "new" and verify_dataset(out).ok


def test_full_disk_is_one_clear_error_and_keeps_the_old_dataset(tiny_folder, tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    pack_folder(tiny_folder, out, shards=2, progress=False)
    before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
    calls = {"n": 0}
    real = recordio.RecordIOWriter._write

    def failing_write(self, chunk):
        calls["n"] += 1
        if calls["n"] > 30:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, chunk)

    monkeypatch.setattr(recordio.RecordIOWriter, "_write", failing_write)
    with pytest.raises(UserError, match=r"^no space left on device while writing .*tiny-0000\d\.rec$"):
        pack_folder(tiny_folder, out, shards=4, overwrite=True, progress=False)
    monkeypatch.undo()
    # The old dataset is intact and still complete; no partial shard is left behind.
    for name, data in before.items():
        assert open(os.path.join(out, name), "rb").read() == data
    assert not glob.glob(os.path.join(out, ".fastload-staging", "*.partial"))
    assert verify_dataset(out).ok
    # Once space is back, the same command finishes the job.
    res = pack_folder(tiny_folder, out, shards=4, overwrite=True, progress=False)
    assert len(res.manifest["shards"]) == 4 and verify_dataset(out).ok


def test_short_writes_and_small_flushes_give_the_same_bytes(tiny_folder, tmp_path, monkeypatch):
    from fastload.pack import shard_writer

    ref = pack_folder(tiny_folder, str(tmp_path / "ref"), shards=2, progress=False)
    real_writev = os.writev
    calls = {"n": 0}

    def short_writev(fd, buffers):
        # The kernel may write less than asked: at most 1000 bytes per call, resumed by the writer.
        calls["n"] += 1
        return real_writev(fd, [memoryview(b"".join(bytes(b) for b in buffers))[:1000]])

    monkeypatch.setattr(os, "writev", short_writev)
    monkeypatch.setattr(shard_writer.GatherFile, "_MAX_BYTES", 5000)  # many gathered batches per shard
    monkeypatch.setattr(shard_writer, "_WRITEBACK_STEP", 1)  # start writeback after every batch
    res = pack_folder(tiny_folder, str(tmp_path / "short"), shards=2, progress=False)
    monkeypatch.undo()
    assert calls["n"] > 40
    assert [s["checksum"] for s in res.manifest["shards"]] == [s["checksum"] for s in ref.manifest["shards"]]
    for entry in ref.manifest["shards"]:
        for name in (entry["file"], entry["index_file"]):
            assert open(tmp_path / "short" / name, "rb").read() == open(tmp_path / "ref" / name, "rb").read()
    assert verify_dataset(str(tmp_path / "short")).ok


def test_restart_index_without_engine_is_a_user_error(tiny_folder, tmp_path, monkeypatch):
    import fastload.engine as engine_loader

    # As in an install without the extension: the one loader has no engine, and says why.
    monkeypatch.setattr(engine_loader, "_engine", None)
    monkeypatch.setattr(engine_loader, "_reason", "fastload._engine is not available (not built)")
    with pytest.raises(UserError, match="--restart-index needs the C\\+\\+ engine"):
        pack_folder(tiny_folder, str(tmp_path / "o"), restart_index=True, progress=False)
    with pytest.raises(UserError, match="verify=True only applies"):
        pack_folder(tiny_folder, str(tmp_path / "o"), verify=True, progress=False)


def test_restart_index_with_engine_is_lossless(odd_folder, tmp_path):
    pytest.importorskip("fastload._engine")
    out = str(tmp_path / "ri")
    res = pack_folder(odd_folder, out, restart_index=True, verify=True, progress=False)
    meta = res.manifest["restart_index"]
    assert meta is not None and meta["verified"] == "all"  # "sample" without verify=True
    assert meta["images"] + res.manifest["counts"]["not_restart_indexed"] == res.written
    plain = str(tmp_path / "plain")
    pack_folder(odd_folder, plain, progress=False)
    with open_dataset(out) as ds, open_dataset(plain) as ref:
        assert ds.restart_indexed and not ref.restart_indexed and len(ds) == len(ref)
        for i in range(len(ds)):
            a = np.asarray(Image.open(io.BytesIO(bytes(ds.image(i)))).convert("RGB"))
            b = np.asarray(Image.open(io.BytesIO(bytes(ref.image(i)))).convert("RGB"))
            assert np.array_equal(a, b), ds.locate(i)


def test_pack_options_are_validated():
    with pytest.raises(ValueError, match="quality"):
        PackOptions(quality=0)
    with pytest.raises(ValueError, match="name"):
        PackOptions(name="../evil")
    with pytest.raises(ValueError):
        PackOptions(format="zip")


# ---------------------------------------------------------------- kill -9 and resume


def _start_pack(src, out, *extra):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "fastload", "pack", src, out, "--quiet", *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_after(proc, staging, done_files):
    def finished_shards():
        return len(glob.glob(os.path.join(staging, "*.done.json"))) >= done_files

    try:
        # Files another process writes notify nobody: the shared polling wait, with its deadline.
        wait_until(lambda: finished_shards() or proc.poll() is not None, timeout=60, what="a finished shard")
    except AssertionError:
        proc.kill()
        proc.wait()
        raise AssertionError("pack made no progress") from None
    if finished_shards():
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode


@pytest.mark.parametrize("fmt", ["recordio", "lmdb"])
def test_kill_and_resume_equals_uninterrupted(tiny_folder, tmp_path, fmt):
    args = ["--resize", "640", "--quality", "90", "--shard-size", "600KB", "--workers", "1", "--format", fmt]
    ref = str(tmp_path / "ref")
    run_cli("pack", tiny_folder, ref, "--quiet", *args, check=0)
    out = str(tmp_path / "out")
    staging = os.path.join(out, ".fastload-staging")
    killed = 0
    for done_files in (1, 3):
        rc = _kill_after(_start_pack(tiny_folder, out, *args), staging, done_files)
        if rc == -signal.SIGKILL:
            killed += 1
            assert not os.path.exists(os.path.join(out, MANIFEST_NAME))  # never looks complete
            with pytest.raises(UserError, match="unfinished pack"):
                open_dataset(out)
    assert killed >= 1, "pack finished before it could be killed"
    kept = {
        os.path.basename(p)[: -len(".done.json")]: os.stat(p[: -len(".done.json")]).st_ino
        for p in glob.glob(os.path.join(staging, "*.done.json"))
    }
    res = run_cli("pack", tiny_folder, out, "--quiet", *args, check=0)
    assert f"resumed: {len(kept)} shard(s) kept" in res.stdout
    for name, inode in kept.items():  # completed shards were not rewritten
        assert os.stat(os.path.join(out, name)).st_ino == inode
    assert not os.path.exists(staging)
    assert sorted(os.listdir(out)) == sorted(os.listdir(ref))
    for name in os.listdir(ref):
        if name.endswith(".lmdb"):
            name = os.path.join(name, "data.mdb")
        a, b = open(os.path.join(ref, name), "rb").read(), open(os.path.join(out, name), "rb").read()
        if name == MANIFEST_NAME:
            ma, mb = json.loads(a), json.loads(b)
            ma.pop("created"), mb.pop("created")
            assert ma == mb
        else:
            assert a == b, name
    assert len(json.loads(open(os.path.join(out, MANIFEST_NAME)).read())["shards"]) > 3


# ---------------------------------------------------------------- CLI


def test_cli_pack_info_verify(odd_folder, tmp_path):
    out = str(tmp_path / "ds")
    res = run_cli("pack", odd_folder, out, "--shards", "2", "--workers", "2", check=0)
    assert "packed 24 records into 2 recordio shard(s)" in res.stdout
    assert "skipped 3" in res.stdout and "converted cmyk 1, grayscale 1, png 1" in res.stdout
    assert "images/s" in res.stdout and "MB/s" in res.stdout
    res = run_cli("info", out, check=0)
    assert "records:       24" in res.stdout and "odd-00001.rec" in res.stdout
    info = json.loads(run_cli("info", out, "--json", check=0).stdout)
    assert info["records"] == 24 and info["restart_index"] is None
    res = run_cli("info", check=0)
    assert res.stdout.startswith("decoder:")
    res = run_cli("info", os.path.join(out, "odd-00000.rec"), check=0)
    first = info["shards"][0]["records"]
    assert "kind:          recordio" in res.stdout and f"records:       {first}\n" in res.stdout
    assert run_cli("verify", out, "--decode", check=0).stdout.startswith("OK")
    # Corrupt one byte inside a record of the second shard.
    manifest = json.load(open(os.path.join(out, MANIFEST_NAME)))
    shard = os.path.join(out, manifest["shards"][1]["file"])
    _, offsets = recordio.read_idx(os.path.join(out, manifest["shards"][1]["index_file"]))
    with open(shard, "r+b") as f:
        f.seek(int(offsets[2]) + 8)
        f.write(b"\x07")  # the IRHeader flag: now announces 7 labels
    res = run_cli("verify", out, check=1)
    assert "BAD shard odd-00001.rec: checksum differs" in res.stdout
    assert "BAD shard odd-00001.rec record 2:" in res.stdout
    assert res.stdout.rstrip().splitlines()[-1].startswith("FAILED")


def test_cli_user_errors_have_no_traceback(tiny_folder, tmp_path):
    res = run_cli("pack", str(tmp_path / "missing"), str(tmp_path / "o"), check=2)
    assert res.stderr.strip() == f"fastload pack: error: {tmp_path / 'missing'}: no such file or directory"
    out = str(tmp_path / "ds")
    run_cli("pack", tiny_folder, out, "--quiet", "--shards", "1", check=0)
    res = run_cli("pack", tiny_folder, out, "--quiet", "--shards", "2", check=2)
    assert "already holds a dataset" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = run_cli("pack", tiny_folder, out, "--shards", "1", "--shard-size", "1MB", check=2)
    assert "not both" in res.stderr
    res = run_cli("verify", str(tmp_path / "nothing"), check=2)
    assert "no such file" in res.stderr and "Traceback" not in res.stderr


def test_two_packs_never_write_the_same_folder(tiny_folder, tmp_path):
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running pack holds
        res = run_cli("pack", tiny_folder, str(out), "--quiet", check=2)
        assert "another fastload pack is writing to this folder" in res.stderr
    finally:
        os.close(fd)
    run_cli("pack", tiny_folder, str(out), "--quiet", check=0)


class _Crash(BaseException):
    """Stands in for the process dying (not an Exception: nothing may catch it)."""


@pytest.mark.parametrize("rerun", ["same", "other"])
def test_crash_while_moving_into_place(tiny_folder, tmp_path, monkeypatch, rerun):
    out = str(tmp_path / "out")
    pack_folder(tiny_folder, out, shards=2, name="a", progress=False)
    real_replace, moves = os.replace, []

    def crashing_replace(src, dst, *args, **kwargs):
        src_s = str(src)
        if ".fastload-staging" in src_s and ".fastload-staging" not in str(dst) and src_s.endswith(".rec"):
            moves.append(src_s)
            if len(moves) == 2:
                raise _Crash()
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", crashing_replace)
    with pytest.raises(_Crash):
        pack_folder(tiny_folder, out, shards=3, name="b", overwrite=True, progress=False)
    monkeypatch.undo()
    assert not os.path.exists(os.path.join(out, MANIFEST_NAME))  # mixed files never look complete
    with pytest.raises(UserError, match="unfinished pack"):
        open_dataset(out)
    if rerun == "same":
        res = pack_folder(tiny_folder, out, shards=3, name="b", overwrite=True, progress=False)
        want = "b"
    else:
        # Another command first completes the interrupted move (the dataset in the work folder is complete),
        # then refuses to replace it without --overwrite.
        with pytest.raises(UserError, match="already holds a dataset"):
            pack_folder(tiny_folder, out, shards=1, name="c", progress=False)
        assert json.load(open(os.path.join(out, MANIFEST_NAME)))["name"] == "b" and verify_dataset(out).ok
        res = pack_folder(tiny_folder, out, shards=1, name="c", overwrite=True, progress=False)
        want = "c"
    assert res.manifest["name"] == want and verify_dataset(out).ok
    shards = {f for f in os.listdir(out) if f.endswith((".rec", ".idx"))}
    assert shards == {e[k] for e in res.manifest["shards"] for k in ("file", "index_file")}
