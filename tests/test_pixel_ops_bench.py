"""Smoke run of the pixel-op benchmark (``python -m bench.pixel_ops --quick``).

No timing assertions (the figures depend on the machine): every pipeline is measured at the asked
thread count, paired against the plain decode, and the side-by-side with torchvision runs when it
is installed; the JSON report is written.
"""

from __future__ import annotations

import json
import math

from bench import pixel_ops

from conftest import HAVE_TORCH, requires_engine


@requires_engine
def test_pixel_ops_bench_quick(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["pixel_ops", "--quick"])
    assert (
        pixel_ops.main(
            ["--quick", "--threads", "1", "--images", "32", "--out", str(tmp_path)]
            + ([] if HAVE_TORCH else ["--no-torchvision"])
        )
        == 0
    )
    res = json.loads((tmp_path / "pixel_ops.json").read_text())
    assert res["threads"] == [1] and res["images"] == 32
    checks = [r["check"] for r in res["paired"]]
    assert len(checks) == 2 * len(pixel_ops.PIPELINES)  # wall clock and CPU time for each
    for i, name in enumerate(pixel_ops.PIPELINES):
        for r, clock in zip(res["paired"][2 * i : 2 * i + 2], ("wall", "cpu"), strict=False):
            assert name in r["check"] and r["extra"]["clock"] == clock
            assert r["pairs"] >= 1 and math.isfinite(r["median"]) and r["median"] > 0
            assert r["extra"]["target_slowdown"] == pixel_ops.TARGETS[name]
    if HAVE_TORCH:
        assert len(res["versus_torchvision"]) == len(pixel_ops.PIPELINES)
        assert all(v["fastload_ips"] > 0 and v["torchvision_ips"] > 0 for v in res["versus_torchvision"])


@requires_engine
def test_pixel_ops_bench_quick_normalized(tmp_path):
    assert (
        pixel_ops.main(
            [
                "--quick",
                "--threads",
                "1",
                "--images",
                "16",
                "--normalize",
                "--pipelines",
                "3",
                "4",
                "--no-torchvision",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "pixel_ops.json").read_text())
    assert res["output"] == "float32 NCHW normalized"
    assert [r["check"].split(" + ")[0] for r in res["paired"]] == [pixel_ops.PIPELINES[3]] * 2 + [
        pixel_ops.PIPELINES[4]
    ] * 2


@requires_engine
def test_pixel_ops_bench_quick_restart_indexed(tmp_path):
    """--restart-index: fastload's side decodes the transcoded records (torchvision: the files)."""
    args = ["--quick", "--threads", "1", "--images", "16", "--pipelines", "1", "--restart-index"]
    assert pixel_ops.main(args + ([] if HAVE_TORCH else ["--no-torchvision"]) + ["--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "pixel_ops.json").read_text())
    assert res["fastload_input"].startswith("restart-indexed")
    assert [r["extra"]["clock"] for r in res["paired"]] == ["wall", "cpu"]
    if HAVE_TORCH:
        assert res["versus_torchvision"][0]["fastload_ips"] > 0
