"""bench/clients.py: the real clients' paired runs through their own scripts (structure, not timings).

The smoke run takes two clients (a torch one, through timm's create_loader, and an MXNet one) on a
tiny dataset, one pair each: every client reports both sides, the ratios are the ratios of the
reported rates, and fastload's side really ran fastload's loader.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("timm")
pytest.importorskip("mxnet")

from bench import clients


def test_every_client_script_has_one_swappable_import_or_an_iterator_flag():
    for client in clients.CLIENTS:
        if client.family == "torch":
            text = (clients.REPO_PATH / "tests" / "clients" / client.script).read_text()
            assert text.count(clients.TORCH_IMPORT) == 1, client.script
        else:
            text = (clients.REPO_PATH / "tests" / "mxnet_clients" / client.script).read_text()
            assert "--iterator" in text or "args.iterator" in text, client.script
    assert {c.family for c in clients.CLIENTS} == set(clients.TARGETS)


def test_quick_run_pairs_both_sides(tmp_path):
    out = tmp_path / "clients.json"
    code = clients.main(
        ["--quick", "--data", str(tmp_path / "data"), "--only", "timm,gluoncv-use-rec", "--json", str(out)]
    )
    assert code == 0
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"timm", "gluoncv-use-rec"}
    for r in results.values():
        assert r["error"] is None
        for key in ("loader", "epoch"):
            side = r[key]
            assert side["pairs"] == 1 and side["base_ips"] > 0 and side["fastload_ips"] > 0
            assert side["median"] == pytest.approx(side["fastload_ips"] / side["base_ips"])
    assert results["timm"]["fastload_loader_class"] == "fastload.torch.dataloader.DataLoader"
    assert "inner" in results["timm"]  # the DataLoader inside timm's PrefetchLoader, timed alone
    assert results["gluoncv-use-rec"]["fastload_loader_class"].startswith("fastload.mxnet")
    # The dataset is made once and reused.
    assert clients.prepare_data(str(tmp_path / "data"), count=48, tiny=True)["count"] == 48


def test_a_failing_client_is_reported_not_dropped(tmp_path):
    bad = clients.Client("broken", "torch", "timm_train.py", lambda s, o: ["--no-such-flag"])
    setup = clients.Setup(str(tmp_path), 1, 1, 8, 1, 1, str(tmp_path / "o"))
    (res,) = clients.run_clients([bad], setup, rounds=1, warmup=False, log=lambda m: None)
    assert res.error and "broken (base)" in res.error
    assert "error" in clients.format_report([res])
