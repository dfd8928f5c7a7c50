"""A streamed pack killed at any moment (kill -9 included) and rerun gives what an uninterrupted run gives."""

from __future__ import annotations

import glob
import json
import os
import signal

import pytest
from ingest_inputs import folder_entries, write_parquet, write_tars
from test_pack import _kill_after, _start_pack, run_cli

from fastload.errors import UserError
from fastload.pack import shard_writer
from fastload.pack.packer import pack_folder
from fastload.pack.wds_source import WdsSource
from fastload.records.dataset import open_dataset
from fastload.records.manifest import MANIFEST_NAME

from conftest import wait_until

pytest.importorskip("webdataset")


class _Crash(BaseException):
    """Stands in for the process dying (not an Exception: nothing may catch it)."""


def _same_dataset(a, b):
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    for name in os.listdir(a):
        x, y = open(os.path.join(a, name), "rb").read(), open(os.path.join(b, name), "rb").read()
        if name == MANIFEST_NAME:
            mx, my = json.loads(x), json.loads(y)
            mx.pop("created"), my.pop("created")
            assert mx == my
        else:
            assert x == y, name


@pytest.fixture(scope="module")
def named_tars(tiny_folder, tmp_path_factory):
    """The tiny folder as 5 tars whose labels are class names (numbered as first seen)."""
    entries, classes = folder_entries(tiny_folder)
    entries = entries[::2] + entries[1::2]  # classes first seen out of sorted order
    folder = tmp_path_factory.mktemp("resume") / "named"
    write_tars(entries, folder, per_tar=8, label="name", classes=[f"cls-{c}" for c in reversed(classes)])
    return folder


@pytest.mark.parametrize("compressed", [False, True])
def test_a_crash_after_some_shards_resumes_where_they_end(named_tars, tmp_path, monkeypatch, compressed):
    if compressed:  # a .tar.gz resumes by decompressing up to the recorded offset
        import gzip

        folder = tmp_path / "gz"
        folder.mkdir()
        for tar in sorted(named_tars.iterdir()):
            (folder / (tar.name + ".gz")).write_bytes(gzip.compress(tar.read_bytes()))
        named_tars = folder
    opts = dict(progress=False, workers=2, shard_size=60_000)
    ref = pack_folder(str(named_tars), str(tmp_path / "ref"), **opts)
    assert len(ref.manifest["shards"]) >= 5 and len(ref.manifest["classes"]) == 3
    real_finish, finished = shard_writer.ShardSink.finish, []

    def crashing_finish(self, end, cursor=None):
        done = real_finish(self, end, cursor)
        finished.append(done)
        if len(finished) == 3:
            raise _Crash()
        return done

    monkeypatch.setattr(shard_writer.ShardSink, "finish", crashing_finish)
    out = tmp_path / "out"
    with pytest.raises(_Crash):
        pack_folder(str(named_tars), str(out), **opts)
    monkeypatch.undo()
    with pytest.raises(UserError, match="unfinished pack"):
        open_dataset(str(out))
    cursor = finished[2].cursor
    assert cursor["source"]["tar"] >= 1 and cursor["labels"]["names"]  # where the third shard ends
    opened = []
    real_reader = WdsSource.samples

    def watched(self, position, cur):
        opened.append((position, cur))
        return real_reader(self, position, cur)

    monkeypatch.setattr(WdsSource, "samples", watched)
    res = pack_folder(str(named_tars), str(out), **opts)
    assert res.resumed_shards == 3 and res.processed == ref.written - finished[2].end
    assert opened == [(finished[2].end, cursor["source"])]  # reading started where the shard ended
    _same_dataset(out, tmp_path / "ref")


def test_kill_9_and_rerun_from_tars(named_tars, tmp_path):
    args = ["--resize", "48", "--shard-size", "20KB", "--workers", "1"]
    ref = str(tmp_path / "ref")
    run_cli("pack", str(named_tars), ref, "--quiet", *args, check=0)
    out = str(tmp_path / "out")
    staging = os.path.join(out, ".fastload-staging")
    killed = 0
    for done_files in (2, 4):
        rc = _kill_after(_start_pack(str(named_tars), out, *args), staging, done_files)
        if rc == -signal.SIGKILL:
            killed += 1
            assert not os.path.exists(os.path.join(out, MANIFEST_NAME))
    assert killed >= 1, "pack finished before it could be killed"
    kept = {
        os.path.basename(p)[: -len(".done.json")]: os.stat(p[: -len(".done.json")]).st_ino
        for p in glob.glob(os.path.join(staging, "*.done.json"))
    }
    res = run_cli("pack", str(named_tars), out, "--quiet", *args, check=0)
    assert f"resumed: {len(kept)} shard(s) kept" in res.stdout
    for name, inode in kept.items():  # completed shards were not rewritten
        assert os.stat(os.path.join(out, name)).st_ino == inode
    _same_dataset(out, ref)
    assert run_cli("verify", out, "--decode", check=0).stdout.startswith("OK")


def test_parquet_resumes_at_its_row(odd_folder, tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    entries, classes = folder_entries(odd_folder)
    path = write_parquet(entries, tmp_path / "in" / "p.parquet", classes, rows_per_group=3)
    opts = dict(progress=False, workers=2, shards=4)
    pack_folder(str(path), str(tmp_path / "ref"), **opts)
    real_finish, count = shard_writer.ShardSink.finish, []

    def crashing_finish(self, end, cursor=None):
        done = real_finish(self, end, cursor)
        count.append(cursor)
        if len(count) == 2:
            raise _Crash()
        return done

    monkeypatch.setattr(shard_writer.ShardSink, "finish", crashing_finish)
    with pytest.raises(_Crash):
        pack_folder(str(path), str(tmp_path / "out"), **opts)
    monkeypatch.undo()
    assert count[1]["source"] == {"file": 0, "row": 9}  # 4 shards of 19 rows: [0, 4), [4, 9), ...
    res = pack_folder(str(path), str(tmp_path / "out"), **opts)
    assert res.resumed_shards == 2
    _same_dataset(tmp_path / "out", tmp_path / "ref")


def test_ctrl_c_stops_a_streamed_pack_and_the_rerun_finishes(tiny_folder, tmp_path):
    import subprocess
    import sys

    entries, _ = folder_entries(tiny_folder)
    write_tars(entries * 40, tmp_path / "tars", per_tar=400)  # 1,600 samples: seconds of --resize work
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fastload", "pack", str(tmp_path / "tars"), str(out), "--resize", "48"]
    cmd += ["--workers", "1", "--quiet", "--shard-size", "100KB"]
    # As in a terminal (a background process inherits SIGINT ignored).
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        staging = out / ".fastload-staging"
        wait_until(
            lambda: glob.glob(str(staging / "*.done.json")) or proc.poll() is not None,
            timeout=60,
            what="a finished shard of the streamed pack",
        )
        assert proc.poll() is None, "the pack ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted" in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert not (out / MANIFEST_NAME).exists()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    with open_dataset(str(out)) as ds:
        assert len(ds) == 1600


def test_the_input_is_read_a_bounded_distance_ahead_of_the_writer(tiny_folder, tmp_path, monkeypatch):
    entries, _ = folder_entries(tiny_folder)
    write_tars(entries * 40, tmp_path / "tars", per_tar=800)  # 1,600 samples
    read, at_first_shard = [0], []
    real_samples = WdsSource.samples

    def counted(self, position, cursor):
        for sample in real_samples(self, position, cursor):
            read[0] += 1
            yield sample

    real_finish = shard_writer.ShardSink.finish

    def finish(self, end, cursor=None):
        at_first_shard.append(read[0])
        return real_finish(self, end, cursor)

    monkeypatch.setattr(WdsSource, "samples", counted)
    monkeypatch.setattr(shard_writer.ShardSink, "finish", finish)
    res = pack_folder(str(tmp_path / "tars"), str(tmp_path / "out"), progress=False, workers=1, shard_size=400_000)
    assert res.written == 1600 and len(res.manifest["shards"]) > 10
    # When the first shard (a few dozen samples) is written, the reader is at most its read-ahead
    # (4 lists of 64 per worker) plus the converters' window (4 batches of 32) ahead: not the input.
    assert at_first_shard[0] < 600, at_first_shard[:3]
