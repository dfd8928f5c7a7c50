"""Benchmarks, GPU machine: the device check's conclusions, its JSON and markdown, a dry run.

The whole dry run is CI's own step (``make device-check DRY_RUN=1``); here: the arithmetic of the
conclusions, the rendering of a complete result, the JUnit parsing, and one part run end to end
through the driver (``--parts h2d``: the device record, the part's process, both output files).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.device_check import PARTS
from bench.device_check.cuda_tests import parse_junit
from bench.device_check.plan import DRY, FULL, Config, thread_counts
from bench.device_check.report import cores_for, derive, markdown


def test_cores_for_interpolates_and_extrapolates():
    curve = [(1, 400.0), (2, 780.0), (4, 1500.0), (8, 2800.0)]
    assert cores_for(curve, 780.0) == {"cores": 2.0, "extrapolated": False}
    assert cores_for(curve, 2150.0) == {"cores": 6.0, "extrapolated": False}
    assert cores_for(curve, 200.0) == {"cores": 0.5, "extrapolated": False}
    # Past the last point: that point's per-thread rate (350/thread) carried on, flagged.
    assert cores_for(curve, 3500.0) == {"cores": 10.0, "extrapolated": True}
    assert cores_for([], 100.0) is None


def test_thread_counts_and_config_round_trip():
    assert thread_counts(16, dry_run=False) == [1, 2, 4, 8, 16]
    assert thread_counts(6, dry_run=False) == [1, 2, 4]
    assert thread_counts(32, dry_run=False) == [1, 2, 4, 8, 16, 32]
    assert thread_counts(16, dry_run=True) == [1, 2]
    assert FULL.images >= 10_000 and FULL.batch == 256 and FULL.size == 224 and FULL.model == "resnet50"
    config = Config(
        dry_run=True,
        device="cpu",
        cores=2,
        threads=(1, 2),
        sizes=DRY,
        images="i",
        packed="p",
        packed_restart="r",
        out="o",
        repo=".",
        budget=12.5,
    )
    assert Config.from_json(config.to_json()) == config


def _result():
    scaling = [
        {"family": f, "shards": s, "threads": t, "images_per_s": rate * t, "per_thread": rate, "images_per_cpu_s": rate}
        for f, s, rate in (("engine", "plain", 420.0), ("engine", "restart", 600.0), ("loader", "plain", 400.0))
        for t in (1, 2, 4, 8, 16)
    ]
    scaling += [
        {"family": "torch", "shards": None, "threads": t, "images_per_s": 150.0 * t, "per_thread": 150.0}
        for t in (1, 16)
    ]
    feed = {"step_ms": 90.0, "compute_ms": 89.0, "gpu_idle": 0.01, "cpu_s_per_1k_images": 0.1, "steps": 24}
    return {
        "dry_run": False,
        "device": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.1", "cpu_model": "Xeon", "cores": 16, "setup": {}},
        "cuda_tests": {
            "status": "failed",
            "counts": {"passed": 1, "failed": 1, "error": 0, "skipped": 0},
            "tests": [
                {"test": "test_cuda::a[cuda]", "outcome": "passed", "seconds": 0.5},
                {"test": "test_cuda::b[cuda]", "outcome": "failed", "seconds": 0.1, "message": "assert x | y"},
            ],
        },
        "h2d": {
            "status": "ok",
            "shape": [256, 3, 224, 224],
            "convert_on_device_ms": 0.2,
            "copies": [{"dtype": "uint8", "source": "pinned", "mb": 38.5, "gb_per_s": 25.0, "ms_per_copy": 1.5}],
            "overlap": [
                {
                    "dtype": "uint8",
                    "source": "pinned",
                    "copy_ms": 1.5,
                    "compute_ms": 1.6,
                    "both_ms": 1.7,
                    "hidden": 0.93,
                }
            ],
        },
        "scaling": {"status": "ok", "batch": 256, "transform": "train(224)", "rows": scaling},
        "train_step": {
            "status": "ok",
            "feeds": [
                {"feed": "synthetic (on the device)", "images_per_s": 2800.0, **feed},
                {"feed": "fastload.torch.DataLoader: ...", "images_per_s": 2700.0, **feed},
                {"feed": "synthetic (on the device), again", "images_per_s": 2800.0, **feed},
            ],
        },
        "gpu_decode": {
            "status": "timeout",
            "error": "stopped after its 45 s",
            "batch": 256,
            "rows": [{"stage": "decode", "images_per_s": 5000.0, "cpu_s_per_1k_images": 0.2}],
        },
    }


def test_derive_and_markdown_of_a_complete_result():
    result = _result()
    derive(result)
    need = result["train_step"]["cores_to_match_synthetic"]
    assert need["target_images_per_s"] == 2800.0
    assert need["loader_plain"] == {"cores": 7.0, "extrapolated": False}
    assert need["engine_restart"] == {"cores": 4.7, "extrapolated": False}
    summary = result["gpu_decode"]["summary"]
    assert summary["engine_plain_cores_equivalent"] == pytest.approx(11.9)
    assert summary["share_of_a_synthetic_step"] == pytest.approx(51.2 / 90.0, abs=1e-3)
    text = markdown(result)
    json.dumps(result)  # the JSON file is this dict
    headers = [line for line in text.splitlines() if line.startswith("## ")]
    assert len(headers) == len(PARTS)
    for header, title in zip(
        headers, ("CUDA tests", "Host-to-device", "Scaling", "Input-bound", "GPU decode"), strict=True
    ):
        assert title in header
    assert "NVIDIA H100 80GB HBM3" in text and "Dry run" not in text
    assert "| 16 | 6,720 (420/thread) | 9,600 (600/thread) | 6,400 (400/thread) | - | 2,400 (150/thread) |" in text
    assert "**failed**" in text and "**timeout**" in text and "assert x / y" in text  # a | would break the table
    assert "Cores fastload needs to match the synthetic rate (2,800 images/s): loader, plain: 7.0" in text


def test_parse_junit(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_cuda" name="test_a[cuda]" time="1.5"/>'
        '<testcase classname="tests.test_cuda" name="test_b[cuda]" time="0.1"><failure message="boom">tb</failure>'
        "</testcase>"
        '<testcase classname="tests.test_cuda" name="test_c[cuda]" time="0"><skipped message="no CUDA device"/>'
        "</testcase></testsuite></testsuites>"
    )
    tests = parse_junit(xml)
    assert [(t["test"], t["outcome"]) for t in tests] == [
        ("test_cuda::test_a[cuda]", "passed"),
        ("test_cuda::test_b[cuda]", "failed"),
        ("test_cuda::test_c[cuda]", "skipped"),
    ]
    assert tests[1]["message"] == "boom" and tests[0]["seconds"] == 1.5


@pytest.mark.slow
def test_dry_run_of_one_part_writes_both_files(tmp_path, repo_root):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    args = ["--dry-run", "--parts", "h2d", "--out", str(out), "--data", str(tmp_path / "data")]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.device_check", *args, "--carry", str(tmp_path / "no-carry")],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "device-check.json").read_text())
    assert set(PARTS) | {"device", "dry_run"} <= set(result)
    assert result["dry_run"] is True and result["device"]["cores"] >= 1 and result["device"]["date"]
    assert result["device"]["setup"]["build"]["built"] is False  # nothing carried: nothing built
    h2d = result["h2d"]
    assert h2d["status"] == "ok" and h2d["shape"] == [DRY.batch, 3, DRY.size, DRY.size]
    assert [(r["dtype"], r["source"]) for r in h2d["copies"]] == [("uint8", "pageable"), ("float16", "pageable")]
    assert all(r["gb_per_s"] > 0 for r in h2d["copies"]) and len(h2d["overlap"]) == 1  # nothing pinned
    assert all(result[p]["status"] == "not run" for p in PARTS if p != "h2d")
    assert not (tmp_path / "data").exists()  # no part that reads the dataset: none generated
    text = (out / "device-check.md").read_text()
    assert text.startswith("# fastload device check") and "**Dry run**" in text and "| uint8 | pageable |" in text
    assert text.strip() in proc.stdout
