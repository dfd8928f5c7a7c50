"""The device check's driver: set-up, data, then each part in its own process under its time budget.

``python -m bench.device_check [--out DIR] [--data DIR] [--carry DIR] [--dry-run] [--parts a,b]``
(``make device-check`` runs it). Steps, with the elapsed time printed as each starts:

1. the carried wheels installed aside (a ``--target`` folder on ``PYTHONPATH``) and the engine built
   for this Python against the carried libjpeg-turbo (:mod:`~bench.device_check.build`);
2. the ``device`` record, in a process that imports torch (:mod:`~bench.device_check.environment`);
   no CUDA there makes the run a dry run;
3. the dataset (:mod:`~bench.device_check.dataset`), when a selected part reads it;
4. the parts, in order (:mod:`~bench.device_check.run_part`): each gets the smaller of its budget
   and what the deadline leaves after a minimum for each part still to come; a part past its time is
   killed with its whole process group (torch's workers included) and keeps what it recorded;
5. the conclusions that need two parts (:func:`~bench.device_check.report.derive`), then
   ``device-check.json`` and ``device-check.md``; the markdown is printed last.

The exit status is 0 when every selected part ended ``ok``, else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.device_check import PARTS
from bench.device_check.build import build_engine, install_wheels
from bench.device_check.dataset import prepare_data
from bench.device_check.plan import BUDGETS, DEADLINE, MIN_PART_SECONDS, Config, sizes_for, thread_counts
from bench.device_check.report import derive, markdown

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[2]
_NEEDS_DATA = ("scaling", "train_step", "gpu_decode")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.device_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("DEVICE_CHECK_OUT") or "build/device-check", help="output folder")
    p.add_argument("--data", default="build/device-check-data", help="where the dataset is generated (reused)")
    p.add_argument("--carry", default=".device", help="the carried folder (tools/prepare_device_carry.sh)")
    p.add_argument("--dry-run", action="store_true", help="CPU devices and tiny sizes (automatic without CUDA)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--deadline", type=float, default=DEADLINE, help="seconds the whole run may take")
    p.add_argument(
        "--sizes",
        choices=("auto", "full", "dry"),
        default="auto",
        help="the plan's sizes: auto (full on a GPU, dry otherwise); full on a CPU measures per-core rates",
    )
    p.add_argument("--images", type=int, default=None, help="generate this many images instead of the plan's")
    p.add_argument(
        "--threads",
        type=_thread_list,
        default=None,
        help="comma-separated thread / worker counts of the scaling part (default: 1, 2, 4, 8, 16 up to the cores)",
    )
    return p


def _thread_list(text: str) -> tuple[int, ...]:
    counts = tuple(int(t) for t in text.split(",") if t.strip())
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--threads takes positive counts such as 8,12,16 (got {text!r})")
    return counts


class _Run:
    def __init__(self, deadline: float) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline

    def say(self, msg: str) -> None:
        print(f"[device-check {time.monotonic() - self.t0:6.1f} s] {msg}", flush=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()


def _run_part(name: str, config: Config, out: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One part in a new process group; killed with its children after ``timeout`` seconds."""
    cfg_path, res_path, log_path = out / f"{name}.config.json", out / f"{name}.json", out / f"{name}.log"
    cfg_path.write_text(config.to_json())
    res_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.device_check.run_part", name, str(cfg_path), str(res_path)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = None
    try:
        result = json.loads(res_path.read_text())
    except (OSError, ValueError):
        result = {}
    tail = "\n".join(log_path.read_text(errors="replace").strip().splitlines()[-15:])
    if returncode is None:
        result.update(status="timeout", error=f"stopped after its {timeout:.0f} s; what it measured until then is kept")
    elif result.get("status") in (None, "running"):
        result.update(status="error", error=f"the part's process exited {returncode}: {tail}")
    if result.get("status") != "ok":
        result["log_tail"] = tail
    result.pop("traceback", None) if result.get("status") == "ok" else None
    return result


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    selected = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in selected if p not in PARTS]
    if unknown:
        _parser().error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    run = _Run(args.deadline)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_root, carry = Path(args.data).resolve(), Path(args.carry).resolve()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [str(REPO), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]

    # 1. set-up
    setup: dict[str, Any] = {}
    run.say(f"set-up: carried folder {carry} ({'present' if carry.is_dir() else 'absent'}), {cores} cores")
    site = out / "site"
    try:
        setup["wheels"] = install_wheels(carry, site, timeout=120)
    except Exception as exc:
        setup["wheels"] = {"error": f"{type(exc).__name__}: {exc}"}
    if setup["wheels"].get("installed"):
        paths.append(str(site))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    run.say("engine build")
    try:
        setup["build"] = build_engine(
            REPO, carry, cores=cores, env=env, log=out / "build.log", timeout=min(BUDGETS["build"], run.left())
        )
    except Exception as exc:
        setup["build"] = {"built": False, "error": f"{type(exc).__name__}: {exc}"}
    engine = setup["build"].get("engine") or {}
    run.say(f"engine: {'imports' if engine.get('importable') else 'does not import'} {engine.get('libjpeg') or ''}")

    # 2. the device record
    device_path = out / "device.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.device_check.environment", str(device_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        device = json.loads(device_path.read_text())
    except (OSError, ValueError):
        device = {"error": (proc.stdout + proc.stderr)[-2000:], "cuda_available": False, "cores": cores}
    device["setup"] = setup
    dry_run = bool(args.dry_run) or os.environ.get("DRY_RUN", "") not in ("", "0")
    reason = "asked for" if dry_run else None
    if not device.get("cuda_available"):
        dry_run, reason = True, reason or f"no CUDA: {device.get('cuda_reason', 'unknown')}"
    result: dict[str, Any] = {"dry_run": dry_run, "dry_run_reason": reason, "device": device}
    run.say(f"device: {device.get('gpu') or 'no GPU'}, {device.get('cpu_model')}; dry run: {dry_run} ({reason})")

    # 3. data
    sizes = sizes_for(dry_run if args.sizes == "auto" else args.sizes == "dry")
    if args.images is not None:
        sizes = dataclasses.replace(sizes, images=args.images)
    data_error = None
    if any(p in selected for p in _NEEDS_DATA):
        run.say(f"data: {sizes.images} {'tiny' if sizes.tiny else 'ImageNet-like'} JPEGs, plain and restart-indexed")
        try:
            data = prepare_data(
                data_root,
                images=sizes.images,
                tiny=sizes.tiny,
                cores=cores,
                repo=REPO,
                env=env,
                deadline=time.monotonic() + min(BUDGETS["data"], max(1.0, run.left() - MIN_PART_SECONDS)),
            )
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            data_error = f"{type(exc).__name__}: {exc}"
            data = {"error": data_error}
        setup["data"] = data
    config = Config(
        dry_run=dry_run,
        device="cpu" if dry_run else "cuda",
        cores=cores,
        threads=args.threads or tuple(thread_counts(cores, sizes.tiny)),
        sizes=sizes,
        images=str(data_root / "images"),
        packed=str(data_root / "packed"),
        packed_restart=str(data_root / "packed-restart"),
        out=str(out),
        repo=str(REPO),
    )

    # 4. the parts
    for i, name in enumerate(PARTS):
        if name not in selected:
            result[name] = {"status": "not run", "reason": "not selected (--parts)"}
            continue
        if data_error is not None and name in _NEEDS_DATA:
            result[name] = {"status": "error", "error": f"no dataset: {data_error}"}
            continue
        later = sum(1 for p in PARTS[i + 1 :] if p in selected)
        budget = min(BUDGETS[name], run.left() - later * MIN_PART_SECONDS)
        if budget < MIN_PART_SECONDS:
            result[name] = {"status": "not run", "reason": f"out of time ({run.left():.0f} s left of the deadline)"}
            continue
        run.say(f"{name} (at most {budget:.0f} s)")
        result[name] = _run_part(name, Config(**{**config.__dict__, "budget": budget}), out, env, budget)
        run.say(f"{name}: {result[name].get('status')}")

    # 5. conclusions and outputs
    derive(result)
    result["seconds"] = round(time.monotonic() - run.t0, 1)
    (out / "device-check.json").write_text(json.dumps(result, indent=1, default=str))
    text = markdown(result)
    (out / "device-check.md").write_text(text)
    run.say(f"wrote {out / 'device-check.json'} and {out / 'device-check.md'}")
    print(text, flush=True)
    failed = [p for p in selected if result[p].get("status") != "ok"]
    if failed:
        run.say(f"parts not ok: {', '.join(failed)}")
    return 1 if failed else 0
