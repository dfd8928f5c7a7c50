"""Smoke run of the ingest benchmark (``python -m bench.ingest_bench --quick``): it runs end to end and writes its JSON."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("webdataset")
pytest.importorskip("datasets")


def test_ingest_bench_quick(tmp_path, repo_root):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.ingest_bench", "--quick", "--json", str(out), "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(repo_root),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["images"] == 48 and result["workers"] >= 1
    for kind in ("tars", "parquet"):
        row = result[f"{kind}_vs_folder"]
        assert row["median"] > 0 and row["pairs"] == 1 and row["target"] == 0.8
    assert set(result["cpu_seconds_median"]) == set(result["cpu_seconds"]) == {"folder", "tars", "parquet"}
    for kind in ("tars", "parquet"):
        assert result[f"{kind}_vs_folder_cpu"]["median"] > 0
    assert all(v["user"] > 0 and v["system"] >= 0 for v in result["cpu_seconds"].values())
    assert "target: tars / folder >= 0.80x" in proc.stdout
    assert list(tmp_path.iterdir()) == [out]  # the inputs and outputs were removed
