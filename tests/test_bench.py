"""Tests of the benchmarks: the harness, the peer protocol, the reports and a --quick smoke run.

No timing assertions: the numbers depend on the machine. What is checked is the structure: every
contender is measured, skipped with a reason or reported as an error; interleaving; the verdicts'
arithmetic; the files ``fastload bench`` writes.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench import harness, model_step, report, targets
from bench.harness import Contender, Result, RunConfig, Sample, Skip, measure
from bench.peers.torch_pil import center_crop_box, rrc_params

from conftest import HAVE_ENGINE, HAVE_TORCH, REPO_ROOT


class _Recorder(Contender):
    """A fake contender: records the order of calls; optional failures."""

    def __init__(
        self, name, log, *, skip=None, fail_run=False, rate=100.0, reference=False, group="g", threads=1, family=None
    ):
        super().__init__(name, group=group, reference=reference, threads=threads, family=family)
        self.log, self.skip, self.fail_run, self.rate = log, skip, fail_run, rate
        self.closed = 0

    def start(self):
        self.log.append(("start", self.name))
        if self.skip:
            raise Skip(self.skip)

    def run(self):
        self.log.append(("run", self.name))
        if self.fail_run:
            raise RuntimeError("boom")
        return Sample(images=int(self.rate), bytes=int(self.rate) * 1000, seconds=1.0, extra={"n": 1})

    def close(self):
        self.closed += 1


def test_measure_interleaves_and_reverses_each_round():
    log = []
    a, b, c = (_Recorder(n, log) for n in "abc")
    measure([a, b, c], RunConfig(repeats=3, warmup=1), quiet=True)
    runs = [name for op, name in log if op == "run"]
    assert runs == list("abc") + list("abc") + list("cba") + list("abc")  # warm-up, then A B C / C B A / A B C
    assert a.closed == b.closed == c.closed == 1


def test_measure_keeps_skipped_and_failed_rows():
    log = []
    ok = _Recorder("ok", log, rate=200, reference=True, threads=2)
    skip = _Recorder("skip", log, skip="no GPU here")
    bad = _Recorder("bad", log, fail_run=True)
    slow = _Recorder("slow", log, rate=50)
    results = measure([ok, skip, bad, slow], RunConfig(repeats=2, warmup=0), quiet=True)
    by = {r.name: r for r in results}
    assert [r.name for r in results] == ["ok", "skip", "bad", "slow"]
    assert by["skip"].skipped == "no GPU here" and not by["skip"].ok
    assert "boom" in by["bad"].error and not by["bad"].ok
    assert by["ok"].median_ips == pytest.approx(200) and by["ok"].per_core_ips == pytest.approx(100)
    assert by["ok"].median_mbps == pytest.approx(0.2)
    assert by["slow"].ratio_to_reference == pytest.approx(0.25)
    assert by["ok"].extra["n"] == 2  # counters add up over repeats
    assert ("run", "skip") not in log  # a skipped contender never runs
    assert skip.closed == 1 and bad.closed == 1


def test_inputs_are_read_through_before_every_repeat(tmp_path, monkeypatch):
    # A file only one contender reads can be evicted between its repeats (proactive reclaim of
    # unmapped page cache) while shared files stay warm; the harness re-reads every contender's
    # inputs, untimed, right before each of its repeats so all start from the same cache state.
    data = tmp_path / "data.rec"
    data.write_bytes(b"x" * 5000)
    log = []
    a = _Recorder("a", log)
    a._inputs = (str(data),)
    b = _Recorder("b", log)
    monkeypatch.setattr(harness, "warm_inputs", lambda paths: log.append(("warm", tuple(paths))))
    measure([a, b], RunConfig(repeats=2, warmup=1), quiet=True)
    warm_a = ("warm", (str(data),))
    assert log.count(warm_a) == 3 and log.count(("warm", ())) == 3
    for i, entry in enumerate(log):
        if entry == ("run", "a"):
            assert log[i - 1] == warm_a


def test_warm_inputs_reads_files_and_folders(tmp_path):
    (tmp_path / "cls" / "sub").mkdir(parents=True)
    (tmp_path / "cls" / "a.jpg").write_bytes(b"a" * 300)
    (tmp_path / "cls" / "sub" / "b.jpg").write_bytes(b"b" * 9_000_000)  # more than one read chunk
    single = tmp_path / "one.rec"
    single.write_bytes(b"c" * 70)
    assert harness.warm_inputs([str(tmp_path / "cls")]) == 9_000_300
    assert harness.warm_inputs([str(single), str(tmp_path / "missing")]) == 70
    assert harness.warm_inputs([]) == 0


def test_fastload_contenders_declare_their_dataset(tiny_folder):
    from bench import stages

    for c in (
        stages.loader_contender("l", str(tiny_folder), threads=1, batch_size=8),
        stages.torch_loader_contender("t", str(tiny_folder), threads=1, batch_size=8),
        stages.read_contender("r", str(tiny_folder)),
    ):
        assert c.inputs == (str(tiny_folder),)


def test_loader_repeats_leave_nothing_running(tiny_folder):
    # fastload's loader decodes on into the next epoch; between timed repeats that would run while
    # another contender is timed, so the contender stops it after each repeat.
    from bench import stages

    c = stages.loader_contender("loader", str(tiny_folder), threads=1, batch_size=8)
    c.start()
    try:
        for _ in range(2):
            s = c.run()
            assert s.images == 40 and s.seconds > 0
            assert c._loader._stream is None
    finally:
        c.close()
        c.close()


def test_run_config_validates():
    with pytest.raises(ValueError, match="repeats"):
        RunConfig(repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        RunConfig(warmup=-1)


def test_environment_records_where_it_ran():
    env = harness.environment(["fastload", "bench", "--quick"])
    for key in ("command", "timestamp", "host", "cpu_model", "cores", "git_sha", "versions", "python"):
        assert key in env
    assert env["command"] == "fastload bench --quick"
    assert env["cores"] >= 1
    assert "numpy" in env["versions"] and "fastload" in env["versions"]


_FAKE_PEER = textwrap.dedent("""
    import sys, time
    from bench.peers.protocol import PeerSkip, serve

    class Runner:
        info = {"peer": "fake"}
        def __init__(self, spec):
            self.n = spec["n"]
        def run(self):
            print("libraries sometimes print to stdout")  # must not break the protocol
            return {"images": self.n, "bytes": 10 * self.n, "seconds": 0.5}
        def close(self):
            pass

    def skipper(spec):
        raise PeerSkip("needs a GPU")

    def broken(spec):
        raise ValueError("bad spec")

    raise SystemExit(serve({"ok": Runner, "skip": skipper, "broken": broken}))
""")


def _checkout_path(tmp_path: Path) -> str:
    """A PYTHONPATH under which subprocesses import this checkout's fastload, bench and tools."""
    return os.pathsep.join([str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def test_peer_process_protocol(tmp_path):
    script = tmp_path / "fake_peer.py"
    script.write_text(_FAKE_PEER)
    env_path = _checkout_path(tmp_path)
    procs = []

    def process():
        if not procs:
            procs.append(
                harness.PeerProcess(
                    [sys.executable, str(script)], label="fake", env={"PYTHONPATH": env_path}, timeout=60
                )
            )
        return procs[0]

    rows = [
        harness.PeerContender("fake ok", process=process, kind="ok", spec={"n": 40}, group="g", reference=True),
        harness.PeerContender("fake skip", process=process, kind="skip", spec={}, group="g"),
        harness.PeerContender("fake broken", process=process, kind="broken", spec={}, group="g"),
        harness.PeerContender("fake unknown", process=process, kind="nope", spec={}, group="g"),
    ]
    try:
        results = measure(rows, RunConfig(repeats=2, warmup=1), quiet=True)
    finally:
        procs[0].close()
        procs[0].close()  # idempotent
    by = {r.name: r for r in results}
    assert by["fake ok"].median_ips == pytest.approx(80.0)
    assert by["fake ok"].samples == [{"images": 40, "bytes": 400, "seconds": 0.5}] * 2
    assert by["fake skip"].skipped == "needs a GPU"
    assert "bad spec" in by["fake broken"].error
    assert "unknown peer kind" in by["fake unknown"].error


def test_peer_process_that_cannot_start_is_a_skip():
    with pytest.raises(Skip, match="cannot start"):
        harness.PeerProcess(["/nonexistent/python", "-c", "pass"], label="ghost")


def test_torchvision_crop_sampling_matches_its_definition():
    rng = random.Random(0)
    areas = []
    for _ in range(2000):
        w, h = rng.randint(50, 600), rng.randint(50, 600)
        x, y, cw, ch = rrc_params(w, h, rng)
        assert x >= 0 and y >= 0 and x + cw <= w and y + ch <= h and cw > 0 and ch > 0
        areas.append(cw * ch / (w * h))
    assert 0.3 < sum(areas) / len(areas) < 0.7  # area fraction ~ U(0.08, 1) with some fallbacks
    # A very wide image can never fit the ratio range: the centred fallback clamps to 4/3.
    assert rrc_params(1000, 10, random.Random(1)) == ((1000 - 13) // 2, 0, 13, 10)
    assert center_crop_box(256, 341, 224) == (16, 58, 240, 282)


def _result(name, group, ips, *, threads=1, family=None, reference=False):
    r = Result(name=name, group=group, family=family or name, threads=threads, reference=reference)
    r.median_ips = r.min_ips = r.max_ips = float(ips)
    r.median_mbps = ips / 10
    r.per_core_ips = ips / threads
    return r


def _synthetic_results():
    f = targets.FAMILIES
    rows = [
        _result(f"{f['engine_train']}, 1t", "decode", 1000, family=f["engine_train"]),
        _result(f"{f['engine_train']}, 2t", "decode", 1800, threads=2, family=f["engine_train"], reference=True),
        # Restart-indexed rows share the family prefix; they must not enter the plain series.
        _result(f"{f['engine_train_restart']}, 1t", "decode", 1400, family=f["engine_train_restart"]),
        _result(f"{f['engine_train_restart']}, 2t", "decode", 2600, threads=2, family=f["engine_train_restart"]),
        _result(f"{f['simplejpeg']}, 1t", "decode", 800, family=f["simplejpeg"]),
        _result(f"{f['simplejpeg']}, 2t", "decode", 1500, threads=2, family=f["simplejpeg"]),
        _result(f"{f['python_pipeline']} (Pillow), 1t", "decode", 500, family=f"{f['python_pipeline']} (Pillow)"),
        _result(f"{f['loader']} (2 threads, batch 256)", "pipeline", 1700, threads=2, reference=True),
        _result(f"{f['engine_alone']}, 2t", "pipeline", 1800, threads=2),
        _result(f"{f['torch_peer']} (num_workers=2)", "pipeline", 850, threads=2),
        harness.skipped("DALI CPU pipeline", group="pipeline", reason="no DALI interpreter"),
    ]
    harness.apply_ratios(rows)
    return rows


def test_targets_are_ratios_of_rows_in_the_run():
    checks = {c["check"]: c for c in targets.evaluate(_synthetic_results())}
    c = checks["fused train 1 thread / simplejpeg full-size decode 1 thread"]
    assert c["value"] == pytest.approx(1.25) and c["met"] is True
    c = checks["fused train 1 thread / fastest per-image Python pipeline"]
    assert c["value"] == pytest.approx(2.0) and c["met"] is True
    c = checks["2-thread scaling of fused train vs simplejpeg's scaling"]
    assert c["value"] == pytest.approx(1.8 / 1.875)
    assert checks["fastload Loader train images/s"]["met"] is False
    assert checks["fastload Loader / torch DataLoader + PIL"]["value"] == pytest.approx(2.0)
    c = checks["restart-indexed fused train 1t / plain shards 1t"]
    assert c["value"] == pytest.approx(1.4) and c["met"] is True
    c = checks["fastload Loader restart-indexed / plain shards"]
    assert c["value"] is None and "not measured" in c["why"]


def test_model_step_verdict_and_cores():
    rows = _synthetic_results()
    step = model_step.ModelStep(step_ms=200.0, gpus=4, batch=256)
    assert step.demand == pytest.approx(4 * 256 / 0.2)
    rep = model_step.input_bound_report(rows, step, cores=2)
    by = {p["name"]: p for p in rep["pipelines"]}
    loader = by["fastload Loader (2 threads, batch 256)"]
    assert loader["input_bound"] is True and loader["gpu_busy_fraction"] == pytest.approx(1700 / 5120)
    assert rep["fastload_cores_needed"] == 7  # ceil(5120 / 850 per core)
    assert rep["thread_scaling"]["efficiency"] == pytest.approx(0.9)
    easy = model_step.input_bound_report(
        rows, model_step.ModelStep(step_ms=1000, gpus=1, batch=256, target=100), cores=2
    )
    assert all(not p["input_bound"] for p in easy["pipelines"])
    assert easy["fastload_cores_needed"] == 1
    text = model_step.format_report(rep)
    assert "INPUT-BOUND" in text and "cores" in text
    with pytest.raises(ValueError, match="positive"):
        model_step.ModelStep(step_ms=0)
    with pytest.raises(ValueError, match="gpus"):
        model_step.ModelStep(step_ms=10, gpus=0)
    with pytest.raises(ValueError, match="milliseconds"):
        model_step.parse_model_step("fast", gpus=1, batch=8, target=None)


def test_model_step_callable_is_timed():
    step = model_step.parse_model_step("numpy:sum", gpus=2, batch=4, target=None)
    assert step.step_ms > 0 and step.source.startswith("timed numpy:sum")
    with pytest.raises(ValueError, match="cannot load"):
        model_step.parse_model_step("numpy:no_such_function", gpus=1, batch=4, target=None)


def test_report_files(tmp_path):
    rows = _synthetic_results()
    env = harness.environment(["fastload", "bench"])
    paths = report.write_outputs(
        str(tmp_path),
        env=env,
        dataset={"source": "synthetic", "images": 3, "mean_kb": 1.0},
        config={},
        results=rows,
        targets=targets.evaluate(rows),
        model_step=None,
    )
    doc = json.loads(Path(paths["json"]).read_text())
    assert doc["format"] == "fastload-bench/1" and len(doc["results"]) == len(rows)
    assert Path(paths["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = Path(paths["table"]).read_text()
    assert "skipped: no DALI interpreter" in table and "0.50x" in table
    report.write_outputs(
        str(tmp_path), env=env, dataset={"source": "synthetic"}, config={}, results=rows, targets=[], model_step=None
    )
    assert len(Path(paths["jsonl"]).read_text().splitlines()) == 2  # runs accumulate


def test_options_are_validated():
    from bench.command import BenchOptions, _peer_python_arg

    with pytest.raises(ValueError, match="suite"):
        BenchOptions(suite="everything")
    with pytest.raises(ValueError, match="repeats"):
        BenchOptions(repeats=0)
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="NAME="):
        _peer_python_arg("dali")
    assert _peer_python_arg("dali=/x/python") == ("dali", "/x/python")


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_ENGINE, reason="the C++ engine is not built: the smoke run measures it")
def test_paired_ratio_alternates_and_compares_like_with_like():
    from bench import paired

    calls = []
    now = [0.0]
    drift = [1.0]

    def work(name, cost):
        def run(start, stop):
            calls.append((name, start))
            # A simulated clock: b costs twice a per image, and the machine slows down 1% per
            # call (as a shared machine drifts), equally for both sides.
            now[0] += (stop - start) * cost * drift[0]
            drift[0] *= 1.01

        return run

    r = paired.paired_ratio(
        "a / b", "a", work("a", 1.0), "b", work("b", 2.0), images=40, chunk=10, rounds=2, clock=lambda: now[0]
    )
    assert r.pairs == 8 and r.chunk == 10
    # Only the drift between the two halves of a pair remains: each ratio is 2 * 1.01 or 2 / 1.01.
    assert r.q1 == pytest.approx(2 / 1.01) and r.q3 == pytest.approx(2 * 1.01)
    assert r.median == pytest.approx(2.0, rel=0.011) and r.total == pytest.approx(2.0, rel=0.011)
    # Each chunk is done by both sides back to back, and the side that goes first alternates.
    firsts = [calls[i][0] for i in range(0, len(calls), 2)]
    assert all(calls[i][1] == calls[i + 1][1] for i in range(0, len(calls), 2))
    assert "a" in firsts and "b" in firsts
    text = paired.format_paired([r])
    assert "a / b" in text and "8 x 10" in text


def test_run_pair_uses_whole_runs():
    from bench import paired

    class Fake(Contender):
        def __init__(self, name, ips):
            super().__init__(name, group="pipeline")
            self.ips, self.runs = ips, 0

        def run(self):
            self.runs += 1
            return Sample(images=100, bytes=0, seconds=100 / self.ips)

    num, den = Fake("restart", 300.0), Fake("plain", 200.0)
    warmed = []
    r = paired.run_pair("restart / plain", num, den, rounds=4, before=lambda c: warmed.append((c.name, c.runs)))
    assert num.runs == den.runs == 5  # one warm-up pair
    assert len(warmed) == 10 and ("restart", 4) in warmed and ("plain", 4) in warmed  # before every run
    assert r.median == pytest.approx(1.5) and r.total == pytest.approx(1.5) and r.pairs == 4
    checks = {c["check"]: c for c in targets.evaluate([], [r])}
    assert not [k for k in checks if k.endswith("(paired)")]  # not one of the issues' targets
    r.check = "fastload.torch DataLoader restart-indexed / plain shards, 2 threads"
    checks = {c["check"]: c for c in targets.evaluate([], [r])}
    c = checks[r.check + " (paired)"]
    assert c["area"] == "restart index" and c["met"] is True and c["value"] == pytest.approx(1.5)


def test_quick_bench_smoke(tmp_path):
    out = tmp_path / "bench-out"
    env = dict(os.environ, PYTHONPATH=_checkout_path(tmp_path), MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "fastload", "bench", "--quick", "--out", str(out), "--model-step", "100", "--gpus", "2"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["format"] == "fastload-bench/1"
    for key in ("command", "host", "cpu_model", "cores", "versions", "git_sha", "timestamp"):
        assert key in doc["environment"]
    assert doc["config"]["quick"] is True
    groups = {r["group"] for r in doc["results"]}
    assert {"read", "decode", "pipeline", "eval", "sparse", "h2d", "pack", "startup", "memory"} <= groups
    for row in doc["results"]:
        # Every row is measured or says why not; a crash inside a contender is a failure here.
        assert row["error"] is None, (row["name"], row["error"])
        assert row["skipped"] or (row["median_ips"] > 0 and row["samples"]), row["name"]
    measured = {r["name"] for r in doc["results"] if not r["skipped"]}
    assert any(n.startswith("fastload Loader") for n in measured)
    assert any(n.startswith("fastload engine train") for n in measured)
    assert doc["targets"] and doc["model_step"]["demand_ips"] == pytest.approx(2 * 256 / 0.1)
    by_group = {r["group"]: r for r in doc["results"] if not r["skipped"]}
    assert by_group["startup"]["extra"]["records_max"] == 20_000  # --quick builds a small dataset
    assert by_group["memory"]["extra"]["rss_peak_mb_max"] > 0
    checks = {t["check"]: t for t in doc["targets"]}
    assert "this run used 20,000 records" in checks["seconds to the first batch, 1,000,000-record dataset"]["why"]
    assert doc["paired"] and doc["paired"][0]["check"] == "fused train 1t / simplejpeg full-size 1t"
    assert doc["paired"][0]["skipped"] or doc["paired"][0]["median"] > 0
    table = (out / "table.txt").read_text()
    assert "== train pipeline" in table and "performance targets" in table and "GPUs consume" in table
    assert "== paired ratios" in table
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert "wrote" in proc.stdout


# --- the loader's limits: first batch of a large dataset, memory over epochs -------------------


def test_loader_suite_has_startup_and_memory_groups(tiny_folder, tmp_path):
    from bench import command
    from bench.prepare import BenchData

    for suite in ("all", "loader"):
        assert {"startup", "memory"} <= set(command._GROUPS_OF_SUITE[suite])
    data = BenchData(source="test", packed=str(tiny_folder))
    quick = command.BenchOptions(quick=True, out=str(tmp_path))
    rows, skips = command._startup_group(quick, data, threads=2)
    assert [(r.group, r.reference) for r in rows] == [("startup", True)]
    assert rows[0].records == command.STARTUP_RECORDS_QUICK and rows[0].batch_size == 256
    assert rows[0].cache_dir == str(tmp_path / "cache")
    assert [s.skipped for s in skips] == ["not in --quick"]
    rows, skips = command._startup_group(command.BenchOptions(out=str(tmp_path)), data, threads=2)
    assert [r.evict for r in rows] == [False, True] and rows[0].records == 1_000_000 and not skips
    rows, skips = command._memory_group(data, threads=2, batch=32)
    assert [(r.group, r.api, r.batch_size, r.prefetch, r.epochs) for r in rows] == [
        ("memory", "torch", 32, 2, 5),
        ("memory", "loader", 32, 2, 5),
    ]
    missing = BenchData(source="test", missing={"packed": "pack failed"})
    for rows, skips in (command._startup_group(quick, missing, threads=2), command._memory_group(missing, 2, 32)):
        assert rows == [] and [s.skipped for s in skips] == ["pack failed"]


@pytest.mark.skipif(not HAVE_ENGINE, reason="the C++ engine is not built: the builder makes thumbnails with it")
def test_large_dataset_builder_cycles_real_images(tiny_folder, tmp_path):
    from bench.startup import build_records_dataset
    from fastload.records.dataset import open_dataset

    path, info = build_records_dataset(str(tiny_folder), str(tmp_path), records=1000, side=16)
    assert info["cached"] is False and info["distinct_images"] == 40
    with open_dataset(path) as ds, open_dataset(str(tiny_folder)) as src:
        assert len(ds) == 1000 and ds.ids[999] == 999
        assert bytes(ds.image(7)) == bytes(ds.image(47)) == bytes(ds.image(967)) != bytes(ds.image(8))
        assert bytes(ds.image(7))[:2] == b"\xff\xd8"  # a JPEG
        assert ds.labels[47, 0] == src.labels[7, 0]
    again, info = build_records_dataset(str(tiny_folder), str(tmp_path), records=1000, side=16)
    assert again == path and info["cached"] is True
    with pytest.raises(ValueError, match="records"):
        build_records_dataset(str(tiny_folder), str(tmp_path), records=0)


@pytest.mark.slow
@pytest.mark.skipif(not (HAVE_ENGINE and HAVE_TORCH), reason="needs the C++ engine and torch")
def test_startup_and_memory_contenders_report_their_figures(tiny_folder, tmp_path):
    from bench import startup

    env_path = _checkout_path(tmp_path)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path  # the children import this checkout's bench
    try:
        first = startup.FirstBatchContender(
            "first",
            source=str(tiny_folder),
            cache_dir=str(tmp_path / "cache"),
            records=2000,
            threads=1,
            batch_size=8,
            size=32,
        )
        mem = startup.MemoryContender("mem", path=str(tiny_folder), api="loader", threads=1, batch_size=8, size=32)
        results = measure([first, mem], RunConfig(repeats=1, warmup=0), quiet=True)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    by = {r.name: r for r in results}
    assert all(r.ok for r in results), [(r.name, r.error, r.skipped) for r in results]
    e = by["first"].extra
    assert e["records_max"] == 2000 and by["first"].samples[0]["images"] == 8
    assert e["rec_resident_kb_after_construct_max"] == 0  # constructing maps no page of the shard in
    assert e["index_load_ms_mean"] > 0 and e["first_batch_ms_mean"] >= e["construct_ms_mean"]
    e = by["mem"].extra
    assert len(e["rss_epoch_end_mb"]) == len(e["rss_epoch_peak_mb"]) == 5 and e["growth_epochs"] == [2, 5]
    assert all(p >= end for p, end in zip(e["rss_epoch_peak_mb"], e["rss_epoch_end_mb"], strict=False))
    assert e["rss_peak_mb_max"] >= max(e["rss_epoch_end_mb"]) and e["rss_anon_peak_mb_max"] > 0
    assert e["rss_bound_mb_max"] == pytest.approx(startup.rss_bound_mb(prefetch=2, batch_size=8, size=32), abs=0.05)
    assert by["mem"].samples[0]["images"] == 5 * 40


def _limit_row(name, group, extra, seconds=(0.5,)):
    r = Result(name=name, group=group, family=name, threads=2, extra=dict(extra))
    r.samples = [{"images": 256, "bytes": 0, "seconds": s} for s in seconds]
    r.median_ips = r.min_ips = r.max_ips = 256 / sorted(seconds)[len(seconds) // 2]
    return r


def test_loader_limit_checks():
    f = targets.FAMILIES
    mem = {
        "rss_peak_mb_max": 500.0,
        "rss_bound_mb_max": 454.1,
        "rss_anon_growth_mb_max": 1.0,
        "rss_growth_mb_max": 40.0,
        "growth_slack_mb_max": 16.0,
        "growth_epochs": [2, 5],
    }
    rows = [
        _limit_row(
            f"{f['first_batch']}, 1,000,000 records, page cache warm",
            "startup",
            {"records_max": 1_000_000},
            seconds=(0.4, 1.5, 0.6),
        ),
        _limit_row(
            f"{f['first_batch']}, 1,000,000 records, .rec evicted",
            "startup",
            {"records_max": 1_000_000},
            seconds=(3.0,),
        ),
        _limit_row(f"{f['memory_torch']}, batch 256", "memory", mem),
        _limit_row(
            f"{f['memory_loader']}, batch 256", "memory", dict(mem, rss_peak_mb_max=300.0, rss_anon_growth_mb_max=40.0)
        ),
    ]
    checks = {c["check"]: c for c in targets.evaluate(rows)}
    c = checks["seconds to the first batch, 1,000,000-record dataset"]
    assert c["value"] == pytest.approx(0.6) and c["met"] is True  # median of the warm row's repeats
    assert checks["peak RSS over 5 epochs, fastload.torch"]["met"] is False
    assert checks["peak RSS over 5 epochs, fastload Loader, no torch"]["met"] is True
    # Growth is judged on anonymous RSS: full RSS swings with the shard pages of batches in flight.
    assert checks["anon RSS growth, fastload.torch, end of epoch 2 -> 5"]["met"] is True
    assert checks["anon RSS growth, fastload Loader, no torch, end of epoch 2 -> 5"]["met"] is False
    small = [_limit_row(f"{f['first_batch']}, 20,000 records", "startup", {"records_max": 20_000})]
    c = {c["check"]: c for c in targets.evaluate(small)}["seconds to the first batch, 1,000,000-record dataset"]
    assert c["value"] is None and "20,000 records" in c["why"]


def test_pack_pair_alternates_pack_and_copy_and_checks_issue_2(tiny_folder, tmp_path):
    from bench import pack_bench

    r = pack_bench.pack_pair(str(tiny_folder), workers=1, rounds=2, workdir=str(tmp_path))
    assert r.skipped is None and r.pairs == 2 and r.median > 0
    assert r.numerator.startswith("fastload pack_folder() in-process") and r.denominator.startswith("copy")
    assert os.listdir(tmp_path) == []  # its scratch space is gone
    c = {c["check"]: c for c in targets.evaluate([], [r])}[pack_bench.PACK_PAIR_CHECK + " (paired)"]
    assert c["area"] == "pack" and c["target"] == targets.COPY_BANDWIDTH_SHARE and c["met"] == (r.median >= 0.8)
