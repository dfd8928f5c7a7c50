"""Benchmarks, verdict: would training be input-bound, and how many cores feed N GPUs.

Given a model step time (ms per batch of ``batch`` images on each GPU) and a GPU count, the GPUs
consume ``gpus * batch / step`` images/s. Each measured pipeline (fastload and every peer) either
keeps up or leaves the GPUs waiting; the fraction of step time they would be busy is
``min(1, supply / demand)``. The cores fastload needs for a target rate come from its measured
per-core throughput, scaled by the thread scaling measured in the same run.
"""

from __future__ import annotations

import importlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .harness import Result

__all__ = ["ModelStep", "format_report", "input_bound_report", "parse_model_step", "time_callable"]


@dataclass(frozen=True, kw_only=True)
class ModelStep:
    """What the GPUs need.

    Args:
        step_ms: Milliseconds per training step (one batch per GPU).
        gpus: Number of GPUs (data parallel).
        batch: Images per GPU per step.
        target: Images/s fastload must deliver (default: what the GPUs consume).
        source: Where ``step_ms`` came from (a number, or the callable that was timed).
    """

    step_ms: float
    gpus: int = 1
    batch: int = 256
    target: float | None = None
    source: str = "given"

    def __post_init__(self) -> None:
        if not (self.step_ms > 0 and math.isfinite(self.step_ms)):
            raise ValueError(f"model step {self.step_ms!r} ms must be a positive number")
        if self.gpus < 1:
            raise ValueError(f"gpus={self.gpus} must be >= 1")
        if self.batch < 1:
            raise ValueError(f"batch={self.batch} must be >= 1")
        if self.target is not None and self.target <= 0:
            raise ValueError(f"target={self.target} images/s must be positive")

    @property
    def demand(self) -> float:
        """Images/s the GPUs consume."""
        return self.gpus * self.batch / (self.step_ms / 1000.0)


def time_callable(fn: Callable, batch: int, *, repeats: int = 5) -> float:
    """Median milliseconds of ``fn(images)`` on a uint8 ``[batch, 3, 224, 224]`` array."""
    images = np.zeros((batch, 3, 224, 224), dtype=np.uint8)
    fn(images)  # warm-up: first-call costs (allocation, JIT) are not a step time
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(images)
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def parse_model_step(value: str, *, gpus: int, batch: int, target: float | None) -> ModelStep:
    """``"85"`` (ms) or ``"package.module:function"`` (a step callable, timed here on one batch)."""
    if ":" in value:
        module_name, _, attr = value.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"--model-step {value}: cannot load the callable ({exc})") from exc
        return ModelStep(
            step_ms=time_callable(fn, batch), gpus=gpus, batch=batch, target=target, source=f"timed {value} on this CPU"
        )
    try:
        ms = float(value)
    except ValueError as exc:
        raise ValueError(f"--model-step {value!r} must be milliseconds or module:function") from exc
    return ModelStep(step_ms=ms, gpus=gpus, batch=batch, target=target)


def _scaling(results: Sequence[Result], family: str) -> dict[str, float] | None:
    series = sorted((r.threads, r.median_ips) for r in results if r.ok and r.family == family)
    if len(series) < 2 or series[0][0] != 1:
        return None
    (_, one), (tn, many) = series[0], series[-1]
    return {"threads": tn, "efficiency": many / (tn * one), "one_thread_ips": one}


def input_bound_report(
    results: Sequence[Result], step: ModelStep, *, cores: int, loader_name_prefix: str = "fastload Loader"
) -> dict:
    """The verdict for every measured pipeline, and fastload's core count for the target.

    Args:
        results: All rows of the run (pipeline rows are judged; decode rows give the scaling).
        step: The model's demand.
        cores: Cores on this machine.
        loader_name_prefix: Which row is fastload's loader.

    Returns:
        A JSON-ready dict (``demand_ips``, ``pipelines`` [...], ``fastload_cores_needed`` ...).
    """
    demand = step.demand
    target = step.target or demand
    rows = []
    for r in results:
        # Only loaders are judged; the engine-alone row is their ceiling, not a way to feed a GPU.
        if r.group not in ("pipeline", "mxnet") or not r.ok or r.name.startswith("fastload engine alone"):
            continue
        rows.append(
            {
                "name": r.name,
                "images_per_s": r.median_ips,
                "input_bound": r.median_ips < demand,
                "gpu_busy_fraction": min(1.0, r.median_ips / demand),
                "step_ms_with_this_loader": max(step.step_ms, step.gpus * step.batch / r.median_ips * 1000.0),
            }
        )
    loader = next(
        (
            r
            for r in results
            if r.ok and r.group == "pipeline" and r.name.startswith(loader_name_prefix) and "restart" not in r.name
        ),
        None,
    )
    report: dict[str, float | int | str | list | dict | None] = {
        "step_ms": step.step_ms,
        "step_source": step.source,
        "gpus": step.gpus,
        "batch_per_gpu": step.batch,
        "demand_ips": demand,
        "target_ips": target,
        "pipelines": rows,
        "fastload_cores_needed": None,
    }
    if loader is None:
        report["cores_note"] = "fastload's loader was not measured in this run"
        return report
    per_core = loader.median_ips / max(1, loader.threads)
    scaling = _scaling(results, "fastload engine train")
    # Beyond the threads measured, assume each extra core adds what a core added here: the
    # per-core rate at the measured thread count already includes its scaling loss.
    needed = math.ceil(target / per_core)
    report.update(
        {
            "fastload_cores_needed": needed,
            "fastload_per_core_ips": per_core,
            "fastload_loader_threads": loader.threads,
            "thread_scaling": scaling,
            "cores_here": cores,
            "cores_note": (
                f"from {loader.median_ips:,.0f} images/s on {loader.threads} threads "
                f"({per_core:,.0f}/core"
                + (
                    f", {scaling['efficiency']:.0%} scaling efficiency 1->{scaling['threads']} threads"
                    if scaling
                    else ""
                )
                + ")"
            ),
        }
    )
    return report


def format_report(report: dict) -> str:
    """The verdict as text for the terminal and table.txt."""
    lines = [
        f"Model step {report['step_ms']:.1f} ms x {report['gpus']} GPU(s), batch {report['batch_per_gpu']}/GPU "
        f"({report['step_source']}): the GPUs consume {report['demand_ips']:,.0f} images/s"
    ]
    for row in report["pipelines"]:
        verdict = "INPUT-BOUND" if row["input_bound"] else "keeps up"
        lines.append(
            f"  {row['name']:<62} {row['images_per_s']:>9,.0f} images/s  {verdict:<11} "
            f"GPUs busy {row['gpu_busy_fraction']:.0%}"
        )
    if report.get("fastload_cores_needed") is not None:
        lines.append(
            f"fastload needs ~{report['fastload_cores_needed']} cores for {report['target_ips']:,.0f} images/s "
            f"({report['cores_note']}; this machine has {report['cores_here']})"
        )
    else:
        lines.append(f"cores needed: unknown ({report.get('cores_note')})")
    return "\n".join(lines)
