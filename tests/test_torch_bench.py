"""Smoke run of the drop-in benchmark (bench/torch_dropin.py): every comparison runs and reports."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")

from bench import torch_dropin


def test_quick_run_reports_every_comparison(tiny_folder, tmp_path, capsys):
    assert torch_dropin.main([str(tiny_folder), "--quick", "--workers", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for check in torch_dropin.TARGETS:
        assert check in out
    import json

    report = json.loads((tmp_path / "results.json").read_text())
    rows = {r["check"]: r for r in report["comparisons"]}
    assert set(rows) == set(torch_dropin.TARGETS)
    for r in rows.values():
        assert r["pairs"] == 1 and r["median_ratio"] > 0 and r["numerator_ips"] > 0 and r["denominator_ips"] > 0
    assert report["environment"]["command"].startswith("python -m bench.torch_dropin")
    fid = report["fidelity"]
    assert fid["images"] > 0 and 0 <= fid["eval_mean_abs"] < 0.1 and 0 <= fid["train_mean_abs"] < 0.1
    assert "pixels against torchvision" in out
