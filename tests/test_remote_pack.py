"""Packing on a local Ray cluster (byte-identical to the local pack; a killed task is retried; a killed
run resumes) and packing to and from S3 (a real server on loopback)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from remote_fixtures import BUCKET, requires_s3, s3_server, upload_folder  # noqa: F401

from fastload.pack.packer import pack_folder
from fastload.records.dataset import open_dataset
from fastload.records.manifest import MANIFEST_NAME
from fastload.records.verify import verify_dataset
from tools.make_dataset import make_dataset

from conftest import wait_until

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def realistic(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ray-data") / "imgs"
    make_dataset(root, count=160, seed=7, classes=4, workers=2, odd=True)
    return root


def _files(folder: Path):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST_NAME}


def _assert_identical(a: Path, b: Path):
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs"
    ma, mb = (json.loads((x / MANIFEST_NAME).read_text()) for x in (a, b))
    for key in ("shards", "records", "counts", "skipped", "classes", "index", "restart_index"):
        assert ma[key] == mb[key], key
    for name in [p.name for p in a.iterdir() if p.is_dir()]:  # LMDB shards
        assert (a / name / "data.mdb").read_bytes() == (b / name / "data.mdb").read_bytes()


@pytest.mark.parametrize(
    "opts",
    [
        dict(shard_size=2 << 20),
        dict(shards=3, resize=64, shuffle=True, seed=3),
        dict(format="lmdb", shard_size=3 << 20),
    ],
    ids=["pass-through by size", "resize into 3 shards", "lmdb"],
)
def test_ray_pack_is_byte_identical_to_the_local_pack(ray_cluster, realistic, tmp_path, opts):
    from fastload.pack.ray_engine import pack_with_ray

    local = pack_folder(str(realistic), str(tmp_path / "local"), progress=False, **opts)
    result = pack_with_ray(str(realistic), str(tmp_path / "ray"), progress=False, items_per_task=32, **opts)
    assert result.ray.convert_tasks == -(-local.manifest["counts"]["found"] // 32)
    assert result.ray.write_tasks == len(local.manifest["shards"])
    assert result.skipped == local.skipped and result.skipped  # the odd files: same reasons, same order
    _assert_identical(tmp_path / "local", tmp_path / "ray")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
@pytest.mark.parametrize("opts", [{}, {"resize": 40}, {"format": "lmdb"}], ids=["pass-through", "resize", "lmdb"])
def test_ray_pack_of_a_hostile_tree_matches_the_local_pack(ray_cluster, tiny_folder, tmp_path, opts):
    """A FIFO, a file too large for a record, a header-only bomb, symlink loops: same manifest as locally."""
    from test_reliability_pack import _hostile_tree, _skipped

    from fastload.errors import UserError
    from fastload.pack.ray_engine import pack_with_ray

    src = _hostile_tree(tiny_folder, tmp_path)
    local = pack_folder(str(src), str(tmp_path / "local"), progress=False, workers=2, **opts)
    result = pack_with_ray(str(src), str(tmp_path / "ray"), progress=False, items_per_task=16, **opts)
    assert result.written == local.written == 40
    assert result.skipped == local.skipped
    assert _skipped(tmp_path / "ray") == _skipped(tmp_path / "local") and len(_skipped(tmp_path / "ray")) == 6
    _assert_identical(tmp_path / "local", tmp_path / "ray")
    with pytest.raises(UserError, match=r"on_error='raise'"):
        pack_with_ray(str(src), str(tmp_path / "strict"), progress=False, on_error="fail", items_per_task=16, **opts)


def _kill_a_running_task(name: str, stop: threading.Event, killed: list):
    def kill_one() -> bool:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if cmd.startswith(f"ray::{name}"):
                try:
                    os.kill(proc.info["pid"], signal.SIGKILL)
                    killed.append(proc.info["pid"])
                    return True
                except ProcessLookupError:
                    pass
        return False

    # A Ray worker takes a task's name in its command line, which notifies nobody: the shared
    # polling wait, until the pack is over (`stop`); the test then checks that one was killed.
    wait_until(kill_one, timeout=600, what=f"a running {name} task", every=0.002, stop=stop)


def test_a_killed_task_is_retried_and_the_result_verifies(ray_cluster, realistic, tmp_path):
    from fastload.pack.ray_engine import pack_with_ray

    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_a_running_task, args=("_convert_segment", stop, killed))
    killer.start()
    try:
        result = pack_with_ray(str(realistic), str(tmp_path / "ray"), progress=False, resize=96, items_per_task=16)
    finally:
        stop.set()
        killer.join()
    assert killed, "the test must have killed a worker in the middle of a task"
    assert result.written > 0
    report = verify_dataset(str(tmp_path / "ray"), decode=True)
    assert report.ok, report
    pack_folder(str(realistic), str(tmp_path / "local"), progress=False, resize=96)
    _assert_identical(tmp_path / "local", tmp_path / "ray")


def test_a_killed_run_resumes(ray_cluster, realistic, tmp_path):
    out = tmp_path / "ray"
    script = (
        f"from fastload.pack.ray_engine import pack_with_ray\n"
        f"pack_with_ray({str(realistic)!r}, {str(out)!r}, progress=False, resize=96, items_per_task=8,"
        f" workers=2)\n"
    )
    # Its own Ray cluster, in its own process group: killing the group takes the cluster down too.
    proc = subprocess.Popen(
        [sys.executable, "-c", script], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        segs = out / ".fastload-staging" / "ray"
        wait_until(
            lambda: len(list(segs.glob("*.json"))) >= 3 or proc.poll() is not None,
            timeout=120,
            what="three finished segments of the Ray pack",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (out / MANIFEST_NAME).exists()
    from fastload.pack.ray_engine import pack_with_ray

    result = pack_with_ray(str(realistic), str(out), progress=False, resize=96, items_per_task=8)
    assert result.ray.segments_reused >= 3
    pack_folder(str(realistic), str(tmp_path / "local"), progress=False, resize=96)
    _assert_identical(tmp_path / "local", out)


@requires_s3
def test_pack_to_s3_and_from_s3(ray_cluster, s3_server, realistic, tmp_path):
    from fastload.pack.options import PackOptions
    from fastload.pack.remote_io import pack_remote
    from fastload.records.remote.storage import RemoteStore

    options = s3_server.storage_options()
    env = dict(os.environ, **s3_server.env())
    url = f"s3://{BUCKET}/packs/imgs"
    cmd = [
        sys.executable,
        "-m",
        "fastload",
        "pack",
        str(realistic),
        url,
        "--shard-size",
        "2MB",
        "--quiet",
        "--build-dir",
        str(tmp_path / "build"),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert url in out.stdout
    assert not (tmp_path / "build").exists(), "the build folder goes once published"
    pack_folder(str(realistic), str(tmp_path / "local"), progress=False, shard_size=2 << 20)
    with (
        open_dataset(url, storage_options=options, cache_dir=str(tmp_path / "cache")) as ds,
        open_dataset(tmp_path / "local") as local,
    ):
        assert len(ds) == len(local)
        assert all(bytes(ds.image(i)) == bytes(local.image(i)) for i in range(len(local)))
    store = RemoteStore(url, options)
    for name, data in _files(tmp_path / "local").items():
        assert store.get_bytes(name) == data
    # Another dataset at the same URL is refused without --overwrite.
    again = subprocess.run(
        [*cmd[:6], "--shards", "2", "--quiet", "--build-dir", str(tmp_path / "build-again")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 2 and "holds another dataset" in again.stderr
    # From S3 to S3: the images under a prefix, packed with the Ray engine, equal the local pack.
    src = RemoteStore(f"s3://{BUCKET}/images/imgs", options)
    for path in sorted(realistic.rglob("*")):
        if path.is_file():
            src.put_file(str(path.relative_to(realistic)), str(path))
    result = pack_remote(
        src.url,
        f"s3://{BUCKET}/packs/from-s3",
        options=PackOptions(shard_size=2 << 20, progress=False),
        engine="ray",
        storage_options=options,
        build_dir=str(tmp_path / "build2"),
    )
    assert result.out == f"s3://{BUCKET}/packs/from-s3"
    dst = RemoteStore(result.out, options)
    local_manifest = json.loads((tmp_path / "local" / MANIFEST_NAME).read_text())
    remote_manifest = json.loads(dst.get_bytes(MANIFEST_NAME))
    assert remote_manifest["shards"] == local_manifest["shards"]
    for name, data in _files(tmp_path / "local").items():
        assert dst.get_bytes(name) == data
