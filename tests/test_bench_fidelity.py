"""Smoke run of the geometry fidelity benchmark (bench/fidelity.py): it measures and reports every size."""

import json

import pytest

pytest.importorskip("torchvision")

from bench import fidelity


def test_sizes_are_parsed():
    assert fidelity.parse_sizes("32:40") == list(range(32, 41))
    assert fidelity.parse_sizes("32:512:160") == [32, 192, 352, 512]
    assert fidelity.parse_sizes("64,112,224") == [64, 112, 224]


def test_quick_run_reports_every_size(tmp_path, capsys):
    assert fidelity.main(["--quick", "--residual", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "results.json").read_text())
    assert [r["size"] for r in report["rows"]] == [32, 112, 224]
    for r in report["rows"]:
        assert 0 <= r["eval_median"] <= r["eval_max"] <= fidelity.BOUND
        assert 0 <= r["train_median"] <= r["train_max"] <= fidelity.BOUND
        assert r["within"]
    assert "bound 0.02" in out
    table = report["residual"]["bilinear"]
    assert table and {r["denom"] for r in table} <= {2, 4, 8}
    for r in table:
        assert r["images"] > 0 and 0 <= r["median"] <= r["max"]
    # The rule's premise: from the residual shrink it leaves (4x at 1/2, 5x deeper), a DCT-scaled
    # decode stays within the bound.
    assert all(r["max"] <= fidelity.BOUND for r in table if r["g_low"] >= (4.0 if r["denom"] == 2 else 5.0))
