"""The cold-epoch benchmark (bench/slow_disk.py): its randomness figures, its checks' arithmetic, a --quick run.

No timing assertions. The --quick run needs a throttled loop device (root, loop devices, the cgroup
v1 blkio controller) and skips with the reason elsewhere; what it checks is that every row is
measured, skipped with a reason or reported, that the device counters are filled in, and that the
device is released.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bench.order_mixing import batch_entropy, file_distance, order_mixing
from bench.slow_device import unsupported_reason
from bench.slow_disk_report import checks, profile_rows, render
from fastload.order import OrderSpec

from conftest import HAVE_ENGINE, REPO_ROOT

REASON = unsupported_reason()


def test_entropy_and_distance_of_known_batches():
    labels = np.array([0, 0, 1, 1, 2, 3, 3, 3])
    assert batch_entropy([np.array([0, 1]), np.array([2, 3])], labels) == 0.0  # each batch one class
    assert batch_entropy([np.array([0, 2, 4, 5])], labels) == pytest.approx(2.0)  # four classes, evenly
    position = np.arange(8) * 10.0
    assert file_distance([np.array([0, 1, 2]), np.array([7, 3])], position) == pytest.approx((10 + 10 + 40) / 3)
    assert file_distance([np.array([5])], position) == 0.0


def test_block_and_shard_order_mix_less_than_global_and_read_closer():
    n, classes = 4096, 32
    labels = np.repeat(np.arange(classes), n // classes)  # a class-sorted pack
    position = np.arange(n) * 100_000
    starts = tuple(range(0, n + 1, 256))
    specs = {
        "global": OrderSpec(num_records=n, batch_size=128, shuffle="global", seed=1),
        "block": OrderSpec(num_records=n, batch_size=128, shuffle="block", seed=1, block_size=128, window=2),
        "shard": OrderSpec(num_records=n, batch_size=128, shuffle="shard", seed=1, shard_starts=starts, window=2),
        "block1": OrderSpec(num_records=n, batch_size=128, shuffle="block", seed=1, block_size=128, window=1),
    }
    mix = order_mixing(specs, labels, position)
    assert mix["global"]["entropy_vs_global"] == pytest.approx(1.0)
    # As packed (class-sorted here), a block window holds a few classes: much lower entropy.
    assert mix["block"]["entropy_bits"] < 0.5 * mix["global"]["entropy_bits"]
    assert mix["shard"]["entropy_bits"] < 0.5 * mix["global"]["entropy_bits"]
    # A window's blocks (shards) are anywhere in the files: consecutive samples of a batch jump
    # between them about (1 - 1/window) of the time; inside one block they are neighbours.
    assert 0.2 < mix["block"]["distance_vs_global"] < 0.9 and 0.2 < mix["shard"]["distance_vs_global"] < 0.9
    assert mix["block1"]["distance_vs_global"] < 0.05
    # "If packed class-sorted" of an already sorted pack is the same figure.
    assert mix["block"]["entropy_sorted_bits"] == pytest.approx(mix["block"]["entropy_bits"])
    # A shuffled pack (what fastload pack --shuffle writes) restores the mixing of labels.
    shuffled = np.random.default_rng(0).permutation(labels)
    mixed = order_mixing(specs, shuffled, position)
    assert mixed["block"]["entropy_vs_global"] > 0.95
    assert mixed["block"]["entropy_sorted_bits"] == pytest.approx(mix["block"]["entropy_bits"])


def _row(name, order, rates, device_bytes=None, device_ios=None, stages=None):
    samples = [{"images": 1000, "bytes": 10**8, "seconds": 1000 / r} for r in rates]
    extra = {"order": order}
    if device_bytes is not None:
        extra.update(device_bytes=device_bytes, device_ios=device_ios)
    for k, v in (stages or {}).items():
        extra[f"stage_seconds.{k}"] = v
    return {
        "name": name,
        "group": "cold-hdd",
        "samples": samples,
        "median_ips": float(np.median(rates)),
        "min_ips": min(rates),
        "max_ips": max(rates),
        "extra": extra,
    }


def _doc(results):
    return {
        "environment": {"command": "x"},
        "options": {"batch_size": 256, "classes": 100, "repeats": 2},
        "threads": 2,
        "dataset": {"images": 1000, "record_bytes": 100_000_000, "mean_record_kb": 100.0, "shards": 16},
        "profiles": {"hdd": {"iops": 150, "bandwidth": 160_000_000, "cold_check": {}, "read_options": {}}},
        "results": results,
    }


def test_rows_get_device_rates_bounds_and_paired_ratios():
    # bandwidth bound: 160 MB/s / 100 KB = 1,600 img/s.
    results = [
        _row("fastload RecordIO, block", "block", [1500, 1540], 2 * 10**8, 200, {"read_wait": 3, "decode": 1}),
        _row("fastload RecordIO, block, page cache", "block", [3000, 3080]),
        _row("fastload RecordIO, shard", "shard", [400, 420], 2 * 10**8, 2000, {"read_wait": 1, "decode": 3}),
        _row("fastload RecordIO, shard, page cache", "shard", [500, 500]),
        _row("fastload RecordIO, global", "global", [300, 300], 2 * 10**8, 1000),
        _row("torch DataLoader + ImageFolder (workers=2)", "global", [60, 60], 2 * 10**8, 2000),
        _row("fastload LMDB, block", "block", [1450, 1450], 2 * 10**8, 200),
        _row("py-lmdb txn.get, global shuffle (first 512 records)", "global", [6, 6], 10**7, 2000),
    ]
    doc = _doc(results)
    rows = {r["name"]: r for r in profile_rows(doc, "hdd")}
    block = rows["fastload RecordIO, block"]
    assert block["bw_bound"] == pytest.approx(1600)
    seconds = 1000 / 1500 + 1000 / 1540
    assert block["device_mbps"] == pytest.approx(2e8 / seconds / 1e6)
    assert block["records_per_io"] == pytest.approx(2000 / 200)
    assert block["bound"] == pytest.approx(min(1600, 150 * 10))
    assert block["vs_warm"] == pytest.approx(np.median([1500 / 3000, 1540 / 3080]))  # paired round by round
    assert block["read_wait_share"] == pytest.approx(0.75) and block["decode_share"] == pytest.approx(0.25)
    verdicts = {c["check"]: c for c in checks(doc)}
    # Block: decoding (3,000 img/s warm) is faster than the device: the bandwidth bound is the target.
    b = verdicts["RecordIO block order, cold: >= 90% of the bandwidth bound"]
    assert b["target"] == pytest.approx(1440) and b["met"]
    # Shard: decoding (500 img/s warm) is slower: 90% of the page-cache rate is the target.
    s = verdicts["RecordIO shard order, cold: >= 90% of the page-cache rate (decoding is slower)"]
    assert s["target"] == pytest.approx(450) and not s["met"]
    assert verdicts["global shuffle: fastload / torch DataLoader + ImageFolder"]["value"] == pytest.approx(5.0)
    assert verdicts["LMDB: fastload block order / py-lmdb random get"]["value"] == pytest.approx(1450 / 6)
    text = render(doc)
    assert "bandwidth bound 1,600 img/s" in text and "not met" in text and "MET" in text


def test_no_device_is_a_skip_with_the_reason(tmp_path, monkeypatch):
    import bench.slow_disk as sd

    monkeypatch.setattr(sd, "unsupported_reason", lambda: "no loop devices here (a test)")
    out = sd.run_slow_disk(sd.SlowDiskOptions(out=str(tmp_path), profiles=("hdd",), quick=True), quiet=True)
    assert out["doc"]["skipped"] == "no loop devices here (a test)"
    assert out["doc"]["results"][0]["skipped"] == "no loop devices here (a test)"
    assert "no slow device on this machine: no loop devices here (a test)" in out["text"]
    assert json.load(open(out["paths"]["json"]))["skipped"]


def test_options_are_validated():
    from bench.slow_disk import SlowDiskOptions

    with pytest.raises(ValueError, match="unknown device profile"):
        SlowDiskOptions(profiles=("floppy",))
    with pytest.raises(ValueError, match="count"):
        SlowDiskOptions(count=0)


@pytest.mark.skipif(REASON is not None, reason=f"no throttled loop device here: {REASON}")
@pytest.mark.skipif(not HAVE_ENGINE, reason="the C++ engine is not built")
def test_quick_run_measures_every_row_cold(tmp_path):
    out = tmp_path / "out"
    # The run's device file goes under this test's own folder (TMPDIR), so the check below sees this
    # run's loop device only, not one of another run on the same machine.
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fastload",
            "bench",
            "--suite",
            "slow-disk",
            "--quick",
            "--profiles",
            "ssd-lite",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO_ROOT),
        env=dict(os.environ, TMPDIR=str(work)),
    )
    try:
        _stdout, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    doc = json.load(open(out / "results.json"))
    rows = {r["name"]: r for r in doc["results"]}
    for order in ("global", "block", "shard"):
        for form in ("RecordIO", "LMDB"):
            r = rows[f"fastload {form}, {order}"]
            assert r["median_ips"] and r["error"] is None, r
            assert r["extra"]["device_bytes"] > 0  # cold: the epoch's records came from the device
            assert "stage_seconds.read_wait" in r["extra"]
        assert rows[f"fastload RecordIO, {order}, page cache"]["median_ips"]
        assert rows[f"fastload RecordIO, {order}, read only"]["median_ips"]
    for r in doc["results"]:
        assert r["median_ips"] or r["skipped"] or r["error"], r  # nothing silently dropped
    assert set(doc["mixing"]) == {"global", "block", "shard"}
    assert (out / "table.txt").read_text().count("== ssd-lite") == 1
    assert os.path.getsize(out / "slow_disk.png") > 0
    # The device is gone: no loop device over a file of this run, no cgroup left.
    assert str(work) not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert not [d for d in os.listdir(work) if d.startswith("fastload-slowdisk")]
    assert not [d for d in os.listdir("/sys/fs/cgroup/blkio") if d.startswith(f"fastload-slowdisk-{proc.pid}-")]


def test_the_bench_table_tells_read_wait_from_decode():
    from bench.harness import Result
    from bench.report import format_table

    row = Result(
        name="fastload Loader",
        group="pipeline",
        family="fastload Loader",
        threads=2,
        median_ips=100.0,
        min_ips=90.0,
        max_ips=110.0,
        median_mbps=9.0,
        per_core_ips=50.0,
        extra={
            "stage_seconds.read": 0.5,
            "stage_seconds.read_wait": 6.0,
            "stage_seconds.decode": 2.0,
            "io_bound_fraction": 6.0 / 8.5,
            "loader_reads": 40,
            "loader_bytes_read": 400_000_000,
        },
    )
    text = format_table([row])
    assert "read_wait 6.00" in text and "decode 2.00" in text
    assert "producer: read wait 6.00 s, decode 2.00 s (bound by storage, 71% waiting for reads)" in text
    assert "400.0 MB in 40 reads (10,000 KB a read)" in text


class _Peers:
    """Stands in for the peer processes: the rows are built, never started."""

    def factory(self, *_args):
        return lambda: None


def test_each_profile_runs_its_recommended_order_settings_beside_the_defaults():
    from bench.slow_disk import ORDER_SETTINGS, SlowDiskOptions, _contenders, _Forms, settings_label

    forms = _Forms("img", "rec", "lmdb", "mx.rec", "mx.idx", 10, 1, 1, np.zeros(10), np.zeros(10), [10])
    opts = SlowDiskOptions(profiles=("hdd", "ssd-lite"))
    hdd = {c.name: c for c in _contenders("hdd", None, forms, opts, 2, _Peers())}
    settings = ORDER_SETTINGS["hdd"]
    # Every row of an order, its page-cache reference included, runs the profile's settings.
    for name in ("fastload RecordIO, block", "fastload LMDB, block", "fastload RecordIO, block, page cache"):
        assert {k: hdd[name].config[k] for k in settings["block"]} == settings["block"]
        assert hdd[name].order == "block"
    assert hdd["fastload RecordIO, shard"].config["window"] == settings["shard"]["window"]
    # Block order with O_DIRECT, beside the buffered rows (which stay buffered).
    for form in ("RecordIO", "LMDB"):
        row = hdd[f"fastload {form}, block, direct I/O"]
        assert row.config["read_options"].direct and row.order == "block"
        assert row.config["block_size"] == settings["block"]["block_size"]
        assert not hdd[f"fastload {form}, block"].config["read_options"].direct
    # The defaults, cold and warm, paired with each other under their own key, not the block rows'.
    for name in ("fastload RecordIO, block, defaults 256x8", "fastload RecordIO, block, defaults 256x8, page cache"):
        assert "block_size" not in hdd[name].config and "window" not in hdd[name].config
        assert hdd[name].order == "block defaults"
    assert hdd["fastload RecordIO, shard, defaults 8"].order == "shard defaults"
    assert settings_label("block", settings["block"]) == "block 128x2"
    assert settings_label("shard", {}) == "shard 8"
    # A profile that keeps the defaults has no defaults rows.
    ssd = [c.name for c in _contenders("ssd-lite", None, forms, opts, 2, _Peers())]
    assert not [n for n in ssd if "defaults" in n]
    assert "window" not in next(c for c in _contenders("ssd-lite", None, forms, opts, 2, _Peers())).config
