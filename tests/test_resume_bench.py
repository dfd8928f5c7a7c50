"""Smoke run of the resume benchmark (``python -m bench.resume_bench --quick``): it runs end to end, the
state stays small, and every case reports both of its paired timings."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_resume_bench_quick(tmp_path, repo_root, tiny_folder):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.resume_bench",
            "--quick",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
            "--source",
            str(tiny_folder),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(repo_root),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows[0]["records"] == 20_000
    sizes = [r for r in rows if "state_bytes" in r]
    assert {(r["shuffle"], r.get("resumes")) for r in sizes if "resumes" in r} == {
        (s, d) for s in ("global", "block", "shard") for d in (1, 2, 3)
    }
    # Independent of the dataset's size: a few hundred bytes for the loader, a few kB with the
    # DataLoader's RNG states.
    assert all(r["state_bytes"]["json"] < 4000 for r in sizes)
    cases = [r for r in rows if "case" in r]
    assert len(cases) == 7 and all(r["resume_s"] > 0 and r["fresh_s"] > 0 and r["ratio"] > 0 for r in cases)
