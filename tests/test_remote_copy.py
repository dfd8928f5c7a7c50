"""``fastload copy``: full and per-node copies, space check, resume after kill -9, from S3 too; ``fastload stage``,
its deprecated name."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from remote_fixtures import BUCKET, images_folder, packed_folder, requires_s3, s3_dataset, s3_server  # noqa: F401

from fastload.checksum import checksum_bytes
from fastload.errors import UserError
from fastload.order import OrderSpec, shards_read
from fastload.records.dataset import open_dataset
from fastload.records.manifest import MANIFEST_NAME
from fastload.records.remote.node_copy import CopyOptions, copy_dataset

from conftest import wait_until


def _same_records(a, b):
    with open_dataset(a) as x, open_dataset(b) as y:
        assert len(x) == len(y)
        assert all(bytes(x.image(i)) == bytes(y.image(i)) for i in range(len(x)))
        np.testing.assert_array_equal(x.labels, y.labels)


def _shard_files(folder: Path):
    return sorted(p.name for p in folder.iterdir() if p.suffix in (".rec", ".idx"))


def test_full_copy_is_a_dataset_and_a_rerun_copies_nothing(packed_folder, tmp_path):
    dest = tmp_path / "shm" / "train"
    result = copy_dataset(str(packed_folder), str(dest), CopyOptions(progress=False))
    assert result.complete and result.selected == result.shards == 8
    assert result.copied == 17  # 8 shards, 8 .idx files, the index
    _same_records(packed_folder, dest)
    assert _shard_files(dest) == _shard_files(packed_folder)
    again = copy_dataset(str(packed_folder), str(dest), CopyOptions(progress=False))
    assert again.copied == 0 and again.kept == 17


def test_node_share_follows_the_shard_order(packed_folder, tmp_path):
    manifest = json.loads((packed_folder / MANIFEST_NAME).read_text())
    starts = tuple(np.concatenate(([0], np.cumsum([s["records"] for s in manifest["shards"]]))).tolist())
    selected = []
    for node in range(2):
        opts = CopyOptions(node_rank=node, nnodes=2, nproc_per_node=2, seed=4, epochs=(0, 1), progress=False)
        result = copy_dataset(str(packed_folder), str(tmp_path / f"node{node}"), opts)
        spec = OrderSpec(
            num_records=starts[-1], batch_size=1, shuffle="shard", seed=4, world_size=4, shard_starts=starts
        )
        expected = shards_read(spec, [0, 1], range(node * 2, node * 2 + 2))
        files = {p.name for p in (tmp_path / f"node{node}").glob("*.rec")}
        assert files == {manifest["shards"][s]["file"] for s in expected}
        assert result.selected == len(expected) and not result.complete
        selected.append(files)
    assert selected[0] | selected[1] == {s["file"] for s in manifest["shards"]}
    # A single epoch's node share is about half the shards (plus the shard split at the cut).
    one = copy_dataset(
        str(packed_folder),
        str(tmp_path / "e0"),
        CopyOptions(node_rank=0, nnodes=2, nproc_per_node=2, seed=4, progress=False),
    )
    assert one.selected <= 8 // 2 + 1


def test_space_check_names_needed_and_available(packed_folder, tmp_path, monkeypatch):
    import fastload.records.remote.node_copy as node_copy_module

    real = os.statvfs

    class Tiny:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(
        node_copy_module.os, "statvfs", lambda p: Tiny() if str(p).startswith(str(tmp_path)) else real(p)
    )
    with pytest.raises(UserError, match=r"needs \d+ bytes .*40960 bytes .* available"):
        copy_dataset(str(packed_folder), str(tmp_path / "d"), CopyOptions(progress=False))
    assert not (tmp_path / "d" / MANIFEST_NAME).exists()
    assert not list((tmp_path / "d").glob("*.rec"))


def test_refuses_another_dataset_and_corrupt_sources(packed_folder, tiny_folder, tmp_path):
    from fastload.pack.packer import pack_folder

    other = tmp_path / "other"
    pack_folder(str(tiny_folder), str(other), shards=2, progress=False)
    dest = tmp_path / "d"
    copy_dataset(str(other), str(dest), CopyOptions(progress=False))
    with pytest.raises(UserError, match="holds another dataset"):
        copy_dataset(str(packed_folder), str(dest), CopyOptions(progress=False))
    copy_dataset(str(packed_folder), str(dest), CopyOptions(progress=False, overwrite=True))
    _same_records(packed_folder, dest)
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(packed_folder, broken)
    rec = sorted(broken.glob("*.rec"))[3]
    data = bytearray(rec.read_bytes())
    data[50] ^= 0xFF
    rec.write_bytes(bytes(data))
    with pytest.raises(UserError, match="checksum mismatch"):
        copy_dataset(str(broken), str(tmp_path / "d2"), CopyOptions(progress=False))
    assert not (tmp_path / "d2" / rec.name).exists()
    with pytest.raises(UserError, match="not a packed fastload dataset"):
        copy_dataset(str(tiny_folder), str(tmp_path / "d3"), CopyOptions(progress=False))


def _big_dataset(root: Path, shards: int, size: int) -> Path:
    """A dataset folder whose shards are random bytes (a copy only reads files and checksums)."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = []
    for k in range(shards):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        name = f"big-{k:05d}.rec"
        (root / name).write_bytes(data)
        entries.append({"file": name, "records": 1, "bytes": size, "checksum": checksum_bytes(data)})
    index = np.zeros(
        shards,
        dtype=[
            ("offset", "<u8"),
            ("id", "<u8"),
            ("shard", "<u4"),
            ("length", "<u4"),
            ("data_offset", "<u4"),
            ("parts", "<u4"),
            ("labels", "<f4", (1,)),
        ],
    )
    index["shard"] = np.arange(shards)
    np.save(root / "fastload-index.npy", index)
    idx_sum = checksum_bytes((root / "fastload-index.npy").read_bytes())
    manifest = {
        "format_version": 2,
        "format": "recordio",
        "name": "big",
        "records": shards,
        "label_width": 1,
        "shards": entries,
        "index": {"file": "fastload-index.npy", "checksum": idx_sum},
    }
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    return root


def test_killed_copy_resumes(tmp_path):
    src = _big_dataset(tmp_path / "src", shards=24, size=16 << 20)
    dest = tmp_path / "dest"
    cmd = [sys.executable, "-m", "fastload", "copy", str(src), str(dest), "--threads", "1", "--quiet"]
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        wait_until(
            lambda: list(dest.glob("big-0000[1-9].rec")) or proc.poll() is not None,
            timeout=60,
            what="a second shard of the copy",
        )
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (dest / MANIFEST_NAME).exists(), "a killed copy must not look complete"
    done = list(dest.glob("*.rec"))
    assert 0 < len(done) < 24
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "already there" in result.stdout
    for k in range(24):
        assert (dest / f"big-{k:05d}.rec").read_bytes() == (src / f"big-{k:05d}.rec").read_bytes()
    assert not [p for p in dest.iterdir() if p.name.endswith(".part")]
    assert json.loads((dest / MANIFEST_NAME).read_text()) == json.loads((src / MANIFEST_NAME).read_text())


def test_cli_node_flags_and_torchrun_env(packed_folder, tmp_path):
    env = dict(os.environ, GROUP_RANK="1", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastload",
            "copy",
            str(packed_folder),
            str(tmp_path / "a"),
            "--seed",
            "4",
            "--epochs",
            "0-1",
            "--quiet",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "this node's" in out.stdout
    flags = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastload",
            "copy",
            str(packed_folder),
            str(tmp_path / "b"),
            "--node-rank",
            "1",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--seed",
            "4",
            "--epochs",
            "0,1",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert flags.returncode == 0, flags.stderr
    assert _shard_files(tmp_path / "a") == _shard_files(tmp_path / "b")
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastload",
            "copy",
            str(packed_folder),
            str(tmp_path / "c"),
            "--node-rank",
            "2",
            "--nnodes",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "node_rank=2" in bad.stderr and "Traceback" not in bad.stderr


@requires_s3
def test_copy_from_s3_full_and_per_node(s3_dataset, packed_folder, tmp_path):
    url, options = s3_dataset
    full = tmp_path / "full"
    result = copy_dataset(url, str(full), CopyOptions(storage_options=options, progress=False))
    assert result.complete
    _same_records(packed_folder, full)
    node = tmp_path / "node"
    part = copy_dataset(
        url,
        str(node),
        CopyOptions(node_rank=0, nnodes=2, nproc_per_node=1, seed=1, storage_options=options, progress=False),
    )
    assert not part.complete and 0 < part.selected < 8
    # The node's folder opens as a dataset; shards it does not hold come from the URL it records.
    with open_dataset(str(node), storage_options=options) as ds:
        assert ds.cache.folder == str(node)
        with open_dataset(packed_folder) as local:
            assert all(bytes(ds.image(i)) == bytes(local.image(i)) for i in range(len(local)))
        assert ds.remote_stats()["fetched"] == 8 - part.selected


def test_stage_is_a_deprecated_name_of_copy(packed_folder, tmp_path):
    """Scripts written for the command's former name keep working; it says once what to use instead."""
    dest = tmp_path / "d"
    cmd = [sys.executable, "-m", "fastload", "stage", str(packed_folder), str(dest), "--quiet"]
    old = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert old.returncode == 0, old.stderr
    assert old.stderr.splitlines() == ["fastload stage: deprecated name, use `fastload copy` (same arguments)"]
    assert "every shard" in old.stdout
    _same_records(packed_folder, dest)
    listing = subprocess.run([sys.executable, "-m", "fastload", "--help"], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and re.search(r"^\s+copy\s", listing.stdout, re.M)
    assert not re.search(r"[{,]stage[,}]|^\s+stage\s", listing.stdout, re.M)  # listed under its new name only
    bad = subprocess.run(
        [*cmd[:4], str(tmp_path / "nothing"), str(tmp_path / "e")], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "fastload stage: error:" in bad.stderr and "Traceback" not in bad.stderr
