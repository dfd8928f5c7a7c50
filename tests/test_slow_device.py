"""The throttled loop device of the cold-epoch benchmark (bench/slow_device.py) and cold reads from it.

These tests need root, loop devices and the cgroup v1 blkio controller; elsewhere they skip with the
reason :func:`bench.slow_device.unsupported_reason` gives. No timing assertions: what is checked is
that reads reach the device (its counters), that every record comes back, and that the device is
released on close, on Ctrl-C and after a kill.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_records_data import tiny_folder  # noqa: F401  (fixture)

from bench import slow_device
from bench.slow_device import DeviceBusy, DeviceProfile, SlowDevice, profile_named, unsupported_reason

from conftest import REPO_ROOT

REASON = unsupported_reason()
needs_device = pytest.mark.skipif(REASON is not None, reason=f"no throttled loop device here: {REASON}")


def test_profiles_are_the_documented_ones():
    assert {p.name: (p.iops, p.bandwidth) for p in slow_device.PROFILES.values()} == {
        "hdd": (150, 160_000_000),
        "cloud-disk": (3_000, 125_000_000),
        "ssd-lite": (20_000, 500_000_000),
    }
    assert profile_named("hdd").bytes_per_io == pytest.approx(160e6 / 150)
    with pytest.raises(ValueError, match="known: hdd, cloud-disk, ssd-lite"):
        profile_named("floppy")
    with pytest.raises(ValueError, match="iops"):
        DeviceProfile("x", 0, 1)


def test_unsupported_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in unsupported_reason()
    with pytest.raises(slow_device.Unsupported, match="root"):
        SlowDevice(size=64 << 20)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(slow_device, "BLKIO_ROOT", "/nonexistent/blkio")
    if sys.platform == "linux" and os.path.exists("/dev/loop-control") and slow_device._tool("losetup"):
        assert "blkio" in unsupported_reason()


def _released(info: dict) -> list[str]:
    """What is still there of a device described by ``info`` (empty when all of it was released)."""
    left = []
    if os.path.exists(info["cgroup"]):
        left.append(info["cgroup"])
    if slow_device._mounted(info["mount"]):
        left.append(info["mount"])
    out = subprocess.run(["losetup", "-j", info["image"]], capture_output=True, text=True).stdout
    if out.strip():
        left.append(out.strip())
    if os.path.exists(info["folder"]):
        left.append(info["folder"])
    return left


def _info(dev: SlowDevice) -> dict:
    return {
        "cgroup": dev.cgroup,
        "mount": dev.mount_point,
        "image": dev._image,
        "folder": dev._folder,
        "janitor": dev._janitor.pid,
    }


@needs_device
def test_reads_reach_the_throttled_device_cold_and_close_releases_it(tmp_path):
    with SlowDevice(size=128 << 20, profile="hdd") as dev:
        info = _info(dev)
        assert dev.direct_io  # the loop device keeps no second copy of the data
        assert dev.major_minor.count(":") == 1 and dev.queue_settings()["max_sectors_kb"] > 0
        dev.join()
        try:
            assert os.getpid() in dev.members()
            check = dev.check_cold()  # raises when the cold read was served from memory
            assert check["cold_device_bytes"] >= check["probe_bytes"] and check["warm_device_bytes"] == 0
            path = os.path.join(dev.mount_point, "data")
            with open(path, "wb") as fh:
                fh.write(os.urandom(3 << 20))
            dev.drop_cache()
            before, disk_before = dev.counters(), dev.device_counters()
            with open(path, "rb") as fh:
                assert len(fh.read()) == 3 << 20
                # An open file pins the mount: the cache cannot be dropped, and the error says by whom.
                with pytest.raises(DeviceBusy, match=f"pid {os.getpid()}"):
                    dev.drop_cache()
            served = dev.counters() - before
            assert served.bytes >= 3 << 20 and served.ios >= 3
            assert (dev.device_counters() - disk_before).bytes >= 3 << 20
            dev.set_profile(None)  # unthrottled still counts
            dev.set_profile("ssd-lite")
            assert dev.profile.name == "ssd-lite"
        finally:
            dev.leave()
        assert os.getpid() not in dev.members()
    assert _released(info) == []
    dev.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        dev.drop_cache()


def _spawn_owner(script: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO_ROOT),
        # As in a terminal: a process started in the background (CI runners, `cmd &`) inherits
        # SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=60)
        pytest.fail(f"the owner process exited with {proc.returncode} before making the device")
    return proc, json.loads(line)


_OWNER = """
    import json, sys
    from bench.slow_device import SlowDevice
    with SlowDevice(size=64 << 20, profile="hdd") as dev:
        dev.join()
        print(json.dumps({"cgroup": dev.cgroup, "mount": dev.mount_point, "image": dev._image,
                          "folder": dev._folder, "janitor": dev._janitor.pid}), flush=True)
        sys.stdin.read()  # until the test interrupts or kills this process
"""


def _wait_exit(pid: int, seconds: float) -> bool:
    """Wait for a process that is not our child to exit (a pidfd becomes readable), with a deadline."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], seconds)
        return bool(ready)
    finally:
        os.close(fd)


@needs_device
def test_ctrl_c_releases_the_device():
    proc, info = _spawn_owner(_OWNER)
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0  # KeyboardInterrupt
    assert _wait_exit(info["janitor"], 60)
    assert _released(info) == []


@needs_device
def test_a_kill_is_cleaned_up_by_the_janitor():
    proc, info = _spawn_owner(_OWNER)
    proc.kill()  # SIGKILL: nothing in the owner runs
    proc.wait(timeout=60)
    assert _wait_exit(info["janitor"], 60)  # the janitor saw its pipe close and released everything
    assert _released(info) == []


@needs_device
@pytest.mark.parametrize("fmt", ["recordio", "lmdb"])
def test_every_order_reads_every_record_cold_from_the_device(tiny_folder, fmt):
    from fastload.loader import Loader, LoaderConfig
    from fastload.pack.packer import pack_folder
    from fastload.records.dataset import open_dataset
    from fastload.transforms import Resize

    with SlowDevice(size=128 << 20, profile="ssd-lite") as dev:
        out = os.path.join(dev.mount_point, "ds")
        pack_folder(tiny_folder, out, format=fmt, shards=3, progress=False, workers=2)
        with open_dataset(out) as ds:
            expected = ds.labels[:, 0].copy()
            total = int(sum(len(ds.image(i)) for i in range(len(ds))))
        dev.join()
        try:
            for shuffle in ("global", "block", "shard"):
                dev.drop_cache()
                before = dev.counters()
                config = LoaderConfig(
                    batch_size=8,
                    shuffle=shuffle,
                    seed=1,
                    block_size=4,
                    window=2,
                    num_threads=1,
                    transform=Resize(size=(16, 16)),
                )
                with Loader(out, config) as loader:
                    batches = [(b.indices.copy(), b.labels[:, 0].copy()) for b in loader]
                    stats = loader.stats()
                seen = np.concatenate([i for i, _ in batches])
                assert sorted(seen.tolist()) == list(range(len(expected)))  # full coverage, each record once
                for indices, labels in batches:
                    np.testing.assert_array_equal(labels, expected[indices])
                assert stats.skipped == 0 and stats.records_read >= len(expected)
                assert (dev.counters() - before).bytes >= total  # cold: the records came from the device
        finally:
            dev.leave()
