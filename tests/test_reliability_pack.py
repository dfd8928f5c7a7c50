"""Packing hostile or careless source trees: FIFOs, symlink loops, oversized files, decompression
bombs, and Ctrl-C at any point.

Every per-file failure goes through ``--on-error`` (skipped and listed in the manifest with its
reason, or the pack stops naming the file), in every mode: pass-through framed by the engine or by
Python, ``--resize``, ``--restart-index``, LMDB. Scenarios that hung the previous code run in a
subprocess with a timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastload.errors import CorruptDatasetError, UserError
from fastload.pack.packer import pack_folder
from fastload.records.dataset import open_dataset
from fastload.records.manifest import MANIFEST_NAME
from fastload.records.verify import verify_dataset

from conftest import HAVE_ENGINE, make_jpeg, wait_until

BOMB_SIDE = 60000


def _bomb() -> bytes:
    """A small, valid JPEG whose frame header claims 60000 x 60000 pixels (3.6 gigapixels)."""
    data = bytearray(make_jpeg(48, 32, seed=3))
    pos = 2
    while True:
        marker, seglen = data[pos + 1], struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if marker == 0xC0:
            data[pos + 5 : pos + 9] = struct.pack(">HH", BOMB_SIDE, BOMB_SIDE)
            return bytes(data)
        pos += 2 + seglen


def _hostile_tree(tiny_folder: Path, root: Path, *, big: bool = True) -> Path:
    src = root / "src"
    shutil.copytree(tiny_folder, src)
    os.mkfifo(src / "class_000" / "aa_fifo.jpg")  # first in the walk; a pack that opens it blocks forever
    os.symlink("..", src / "class_001" / "loop")  # back to the root: a directory symlink loop
    os.symlink("../class_000", src / "class_002" / "again")  # a directory already walked
    os.symlink("missing.jpg", src / "class_002" / "broken.jpg")
    (src / "class_001" / "bomb.jpg").write_bytes(_bomb())
    if big:  # 2 GB, JPEG-headed, sparse: larger than a RecordIO record can hold
        with open(src / "class_000" / "huge.jpg", "wb") as f:
            f.write(make_jpeg(32, 32, seed=5)[:600])
            f.truncate(2 << 30)
    return src


def _skipped(out: Path) -> dict[str, str]:
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    return {os.path.basename(s["path"]): s["reason"] for s in manifest["skipped"]}


MODES = {
    "engine": {},
    "python": {},
    "resize": {"resize": 40},
    "restart": {"restart_index": True},
    "lmdb": {"format": "lmdb"},
}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_bad_source_file_goes_through_on_error_in_every_mode(tiny_folder, tmp_path, monkeypatch, mode):
    if mode in ("engine", "restart") and not HAVE_ENGINE:
        pytest.skip("needs the C++ engine")
    if mode == "python":
        monkeypatch.setenv("FASTLOAD_PACK_FRAMING", "python")
    src = _hostile_tree(tiny_folder, tmp_path)
    out = tmp_path / "out"
    result = pack_folder(str(src), str(out), progress=False, workers=2, **MODES[mode])
    skipped = _skipped(out)
    assert result.written == 40
    assert "not a regular file" in skipped["aa_fifo.jpg"] and "FIFO" in skipped["aa_fifo.jpg"]
    assert "larger than" in skipped["huge.jpg"] and "record limit" in skipped["huge.jpg"]
    assert f"{BOMB_SIDE}x{BOMB_SIDE}" in skipped["bomb.jpg"] and "max_pixels" in skipped["bomb.jpg"]
    assert "symlink loop" in skipped["loop"] and "already walked" in skipped["again"]
    assert skipped["broken.jpg"] == "broken symlink"
    assert len(skipped) == 6 and result.manifest["counts"]["skipped"] == 6
    with open_dataset(str(out)) as ds:
        assert len(ds) == 40  # each real image once: nothing through the loop or the second name
    assert verify_dataset(str(out)).ok
    # --on-error fail stops at the first of them, naming it.
    with pytest.raises(UserError, match=r"(aa_fifo|loop|again|broken|bomb|huge).*on_error='raise'"):
        pack_folder(str(src), str(tmp_path / "strict"), progress=False, workers=2, on_error="fail", **MODES[mode])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_cli_pack_of_a_hostile_tree_finishes(tiny_folder, tmp_path):
    """The scenario that hung forever (a FIFO named x.jpg), end to end, under a timeout."""
    src = _hostile_tree(tiny_folder, tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "fastload", "pack", str(src), str(tmp_path / "out"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "skipped 6" in res.stdout and "Traceback" not in res.stderr


def test_bomb_limit_is_an_option(tiny_folder, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_folder, src)
    (src / "class_000" / "wide.jpg").write_bytes(make_jpeg(300, 200, seed=4))
    out = pack_folder(str(src), str(tmp_path / "a"), progress=False, max_pixels=300 * 200 - 1)
    assert "above max_pixels=59999" in _skipped(tmp_path / "a")["wide.jpg"] and out.written == 40
    assert pack_folder(str(src), str(tmp_path / "b"), progress=False, max_pixels=300 * 200).written == 41


def _wait_for(predicate, timeout: float = 60.0) -> bool:
    """What the pack does is seen in /proc and its work folder, which notify nobody: the shared polling wait."""
    return bool(wait_until(predicate, timeout=timeout, what="the pack to reach the moment to interrupt"))


def _partial_bytes(out: Path) -> int:
    """The size of the largest shard being written in OUT's work folder (0 if none yet)."""
    staging = out / ".fastload-staging"
    try:
        return max((p.stat().st_size for p in staging.iterdir() if p.name.endswith(".partial")), default=0)
    except OSError:
        return 0


def _partial_written(out: Path) -> bool:
    return _partial_bytes(out) > 0


def _running_pack(proc: subprocess.Popen) -> bool:
    """True once the child has exec'd the pack command.

    Between fork and exec the child still runs the parent's interpreter, whose SIGINT handler only
    sets a flag that the exec then discards: a signal sent then is lost and the pack runs to the end.
    """
    try:
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[1:4] == [b"-m", b"fastload", b"pack"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
@pytest.mark.parametrize("moment", ["starting", "converting", "writing", "later"])
def test_ctrl_c_stops_a_pack_at_any_stage(tiny_folder, tmp_path, moment):
    src = _hostile_tree(tiny_folder, tmp_path, big=False)
    # Enough work to interrupt (a few seconds): 6,000 more names (hard links) for the tiny images, resized.
    files = sorted(
        Path(d) / f
        for d, _, names in os.walk(src)
        for f in names
        if f.lower().endswith((".jpg", ".jpeg"))
        and f != "bomb.jpg"
        and (Path(d) / f).is_file()
        and not (Path(d) / f).is_symlink()
    )
    for k in range(6000):
        os.link(files[k % len(files)], src / f"class_00{k % 3}" / f"copy{k:05d}.jpg")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fastload", "pack", str(src), str(out), "--resize", "48", "--workers", "1", "--quiet"]
    # As in a terminal: a process started in the background (CI runners, `cmd &`) inherits SIGINT
    # ignored, and Python then never installs its KeyboardInterrupt handler.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Each moment is a state of the pack seen from outside, waited for with a deadline.
        assert _wait_for(lambda: _running_pack(proc))
        if moment == "starting":  # the interpreter's start-up, the imports and the walk of the tree
            pass
        elif moment == "converting":  # the converter threads at work (the first files include the FIFO)
            assert _wait_for(lambda: (out / ".fastload-staging").is_dir())
        elif moment == "writing":
            assert _wait_for(lambda: _partial_written(out))
        else:  # well into the shard: about a tenth of the images written
            assert _wait_for(lambda: _partial_bytes(out) > 500_000)
        assert proc.poll() is None, "the pack ended before it could be interrupted"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        latency = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"SIGINT while {moment}: exited {proc.returncode} after {latency * 1000:.0f} ms")
    if moment == "starting":  # maybe before the command's own handler exists: the interpreter's exit
        assert proc.returncode in (130, -signal.SIGINT, 1), stderr[-2000:]
    else:
        assert proc.returncode == 130 and "interrupted" in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert not (out / MANIFEST_NAME).exists()
    if moment == "later":  # the same command then finishes the pack
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        with open_dataset(str(out)) as ds:
            assert len(ds) == 6040


@pytest.mark.skipif(not HAVE_ENGINE or not hasattr(os, "mkfifo"), reason="needs the C++ engine and mkfifo")
def test_engine_framing_never_blocks_on_a_fifo(tmp_path):
    """A file listed as regular and replaced by a FIFO before the engine opens it: refused at once."""
    import threading

    import numpy as np

    from fastload import _engine
    from fastload.records import recordio

    good = make_jpeg(40, 30, seed=1)
    (tmp_path / "a.jpg").write_bytes(good)
    os.mkfifo(tmp_path / "b.jpg")
    paths = [os.fsencode(str(tmp_path / n)) for n in ("a.jpg", "b.jpg")]
    heads = [recordio.pack_header(0.0, k) for k in range(2)]
    sizes = [len(good), len(good)]  # what a stat before the swap said
    buffer = np.empty(1 + sum(recordio.framed_size(len(h) + s) for h, s in zip(heads, sizes, strict=False)), np.uint8)
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(out=_engine.frame_files(paths, sizes, heads, buffer)), daemon=True
    )
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():  # unblock the engine's open so the thread can end, then fail
        with open(tmp_path / "b.jpg", "wb"):
            pass
        worker.join()
        pytest.fail("frame_files blocked opening a FIFO")
    framed, _ = result["out"]
    assert framed[0] > 0 and framed[1] < 0


@pytest.mark.parametrize("name", ["..", ".", "../keep.txt", "/etc/hostname"])
def test_overwrite_never_removes_outside_the_dataset(tiny_folder, tmp_path, name):
    """An old manifest (untrusted) naming '..' or a path elsewhere: replacing the dataset removes
    only its own files."""
    parent = tmp_path / "parent"
    out = parent / "out"
    parent.mkdir()
    (parent / "keep.txt").write_text("keep")
    pack_folder(str(tiny_folder), str(out), progress=False, workers=1)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    manifest["shards"][0]["file"] = name
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    pack_folder(str(tiny_folder), str(out), progress=False, workers=1, overwrite=True, name="again")
    assert (parent / "keep.txt").read_text() == "keep"
    with open_dataset(str(out)) as ds:
        assert len(ds) == 40


def test_damaged_manifest_in_the_work_folder_is_one_clear_error(tiny_folder, tmp_path):
    out = tmp_path / "out"
    pack_folder(str(tiny_folder), str(out), progress=False, workers=1)
    work_dir = out / ".fastload-staging"  # the pack's work folder, by its name on disk
    work_dir.mkdir()
    (work_dir / "plan.json").write_text(json.dumps({"fingerprint": "another command"}))
    (work_dir / MANIFEST_NAME).write_text(json.dumps({"shards": [{"file": "../../elsewhere"}]}))
    with pytest.raises(CorruptDatasetError, match=r"\.fastload-staging/fastload\.json: shards"):
        pack_folder(str(tiny_folder), str(out), progress=False, workers=1, overwrite=True, name="again")
    (work_dir / MANIFEST_NAME).write_text("{damaged")
    res = subprocess.run(
        [sys.executable, "-m", "fastload", "pack", str(tiny_folder), str(out), "--overwrite", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and "manifest in the work folder" in res.stderr, (
        res.stderr
    )


def test_a_damaged_dataset_in_out_is_replaced_with_overwrite(tiny_folder, tmp_path):
    out = tmp_path / "out"
    pack_folder(str(tiny_folder), str(out), progress=False, workers=1)
    (out / MANIFEST_NAME).write_text('{"format_version": 3, "records": "many"}')
    with pytest.raises(UserError, match="already holds a dataset.*--overwrite"):
        pack_folder(str(tiny_folder), str(out), progress=False, workers=1)
    assert pack_folder(str(tiny_folder), str(out), progress=False, workers=1, overwrite=True).written == 40
