"""Smoke run of the scale-out benchmark (``bench/remote_bench.py --quick``) and of the client
measurement (``bench/remote_clients.py --quick``): they run end to end and write their JSON."""

import json
import subprocess
import sys

import pytest
from remote_fixtures import requires_s3

pytestmark = requires_s3


def test_remote_bench_quick(tmp_path, repo_root):
    pytest.importorskip("ray")
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, str(repo_root / "bench" / "remote_bench.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(repo_root),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("first_epoch_vs_local", "later_epoch_vs_local"):
        assert result["loader"][key]["ratio"] > 0
    assert result["ray"]["ray_vs_local"]["ratio"] > 0 and result["ray"]["per_task_overhead_ms"] > 0
    assert result["copy"]["copy_vs_cp"]["ratio"] > 0
    assert "paired ratio" in proc.stdout


def test_client_measurement_quick(tmp_path, repo_root):
    pytest.importorskip("s3fs")
    out = tmp_path / "c.json"
    proc = subprocess.run(
        [sys.executable, str(repo_root / "bench" / "remote_clients.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(repo_root),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["case"] for r in rows} == {"whole -> file", "ranges 1 stream", "ranges 2 streams"}
