"""Smoke run of the contention benchmark (bench/contention.py): every setting and client runs and reports."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("mxnet")

from bench import contention


def test_quick_run_reports_every_setting_and_client(tiny_folder, tmp_path, capsys):
    assert contention.main([str(tiny_folder), "--quick", "--workers", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["setting"], r["client"]): r for r in report["rows"]}
    assert set(rows) == {(s, c) for s in contention.SETTINGS for c in contention.CLIENTS}
    for (setting, client), r in rows.items():
        assert r["pairs"] == 1 and r["numerator_ips"] > 0 and r["denominator_ips"] > 0, (setting, client)
        assert r["numerator"].startswith("fastload") and not r["denominator"].startswith("fastload")
        assert 0 <= r["wait_slot_max"] <= 1 and 0 <= r["wait_consumer_max"] <= 1
        assert f"{setting:<9} {client:<12}" in out
    assert report["environment"]["command"].startswith("python -m bench.contention")
    assert "wait_slot" in out and "Target: ratio >= 2x" in out


def test_settings_and_clients_are_checked(capsys):
    with pytest.raises(SystemExit):
        contention.main(["--settings", "quiet"])
    assert "unknown settings or clients: quiet" in capsys.readouterr().err
