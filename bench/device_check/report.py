"""The check's conclusions and its markdown table: cores to match the GPU, GPU decode in cores.

:func:`derive` adds what needs two parts' figures (the ``scaling`` rates and the ``train_step``
synthetic rate; the ``gpu_decode`` rate against the engine's per-core rate); :func:`markdown`
renders the whole result as ``device-check.md``.
"""

from __future__ import annotations

from typing import Any

from bench.device_check import PARTS

__all__ = ["cores_for", "derive", "markdown"]

_OK = ("ok",)


def cores_for(points: list[tuple[int, float]], target: float) -> dict[str, Any] | None:
    """Threads needed for ``target`` images/s on a measured curve ``[(threads, images/s)]``.

    Linear between the measured points; above the last one, that point's per-thread rate is
    extended (``extrapolated``: the curve may bend down there, so it is a lower bound).
    """
    pts = sorted((t, r) for t, r in points if r)
    if not pts or target <= 0:
        return None
    prev_t, prev_r = 0, 0.0
    for t, r in pts:
        if r >= target:
            cores = prev_t + (target - prev_r) * (t - prev_t) / (r - prev_r) if r > prev_r else float(t)
            return {"cores": round(cores, 1), "extrapolated": False}
        prev_t, prev_r = t, r
    t, r = pts[-1]
    return {"cores": round(target / (r / t), 1), "extrapolated": True}


def _scaling_points(result: dict[str, Any], family: str, shards: str | None) -> list[tuple[int, float]]:
    rows = result.get("scaling", {}).get("rows", [])
    return [(r["threads"], r["images_per_s"]) for r in rows if r["family"] == family and r["shards"] == shards]


def _synthetic_rate(result: dict[str, Any]) -> float | None:
    rates = [
        f["images_per_s"] for f in result.get("train_step", {}).get("feeds", []) if f["feed"].startswith("synthetic")
    ]
    return sum(rates) / len(rates) if rates else None


def derive(result: dict[str, Any]) -> None:
    """Add the cross-part conclusions to ``result`` in place (where both parts have figures)."""
    target = _synthetic_rate(result)
    train = result.get("train_step")
    if target and isinstance(train, dict):
        needs = {}
        for family in ("loader", "engine"):
            for shards in ("plain", "restart"):
                found = cores_for(_scaling_points(result, family, shards), target)
                if found is not None:
                    needs[f"{family}_{shards}"] = found
        train["cores_to_match_synthetic"] = {"target_images_per_s": round(target, 1), **needs}
    decode = result.get("gpu_decode")
    if isinstance(decode, dict) and decode.get("rows"):
        full = decode["rows"][-1]
        summary: dict[str, Any] = {"gpu_pipeline_images_per_s": full["images_per_s"]}
        for shards in ("plain", "restart"):
            one = dict(_scaling_points(result, "engine", shards)).get(1)
            if one:
                summary[f"engine_{shards}_cores_equivalent"] = round(full["images_per_s"] / one, 1)
        batch = decode.get("batch")
        steps = [f for f in (train or {}).get("feeds", []) if f["feed"].startswith("synthetic")]
        if batch and steps and full["images_per_s"]:
            decode_ms = 1e3 * batch / full["images_per_s"]
            summary["decode_ms_per_batch"] = round(decode_ms, 2)
            summary["share_of_a_synthetic_step"] = round(decode_ms / steps[0]["step_ms"], 3)
        decode["summary"] = summary


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v).replace("|", "/").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _status(part: dict[str, Any]) -> str:
    status = part.get("status", "missing")
    text = f"**{status}**"
    if part.get("seconds") is not None:
        text += f" in {part['seconds']:.0f} s"
    if part.get("error"):
        text += f": `{str(part['error']).splitlines()[0][:300]}`"
    if part.get("reason"):
        text += f" ({part['reason']})"
    return text


def _cuda_tests(p: dict[str, Any]) -> list[str]:
    counts = p.get("counts", {})
    out = [_table(list(counts), [list(counts.values())]) if counts else "no tests reported", ""]
    tests = p.get("tests", [])
    if tests:
        out.append(
            _table(
                ["test", "outcome", "s", "message"],
                [[t["test"], t["outcome"], t["seconds"], (t.get("message") or "")[:120]] for t in tests],
            )
        )
    return out


def _h2d(p: dict[str, Any]) -> list[str]:
    out = []
    if p.get("shape"):
        convert = p.get("convert_on_device_ms")
        out.append(f"batch {p['shape']}; uint8 to normalized float16 on the device: {convert} ms")
        out.append("")
    if p.get("copies"):
        out.append(
            _table(
                ["dtype", "source", "MB", "GB/s", "ms per copy"],
                [[r["dtype"], r["source"], r["mb"], r["gb_per_s"], r["ms_per_copy"]] for r in p["copies"]],
            )
        )
        out.append("")
    if p.get("overlap"):
        out.append("A copy on a side stream beside matrix products of about its length:")
        out.append("")
        out.append(
            _table(
                ["dtype", "source", "copy ms", "compute ms", "both ms", "share of the copy hidden"],
                [
                    [r["dtype"], r["source"], r["copy_ms"], r["compute_ms"], r["both_ms"], r["hidden"]]
                    for r in p["overlap"]
                ],
            )
        )
    return out


def _scaling(p: dict[str, Any]) -> list[str]:
    rows = p.get("rows", [])
    if not rows:
        return [f"torch: {p['torch_error']}"] if p.get("torch_error") else []
    columns = [("engine", "plain"), ("engine", "restart"), ("loader", "plain"), ("loader", "restart"), ("torch", None)]
    names = [
        "engine, plain",
        "engine, restart-indexed",
        "Loader, plain",
        "Loader, restart-indexed",
        "torch DataLoader + PIL",
    ]
    by_key = {(r["family"], r["shards"], r["threads"]): r for r in rows}
    threads = sorted({r["threads"] for r in rows})

    def rate(r):
        return None if r is None else f"{r['images_per_s']:,.0f} ({r['per_thread']:,.0f}/thread)"

    def per_cpu(r):
        return None if r is None else r.get("images_per_cpu_s")

    out = [f"images/s (per thread or worker); batch {p.get('batch')}, `{p.get('transform')}`", ""]
    out.append(_table(["threads", *names], [[t, *(rate(by_key.get((f, s, t))) for f, s in columns)] for t in threads]))
    out += ["", "images per CPU-second (the process and its workers):", ""]
    out.append(
        _table(["threads", *names], [[t, *(per_cpu(by_key.get((f, s, t))) for f, s in columns)] for t in threads])
    )
    if p.get("torch_error"):
        out += ["", f"torch: {p['torch_error']}"]
    return out


def _train_step(p: dict[str, Any]) -> list[str]:
    out = []
    if p.get("model"):
        out += [
            f"{p['model']}; batch {p.get('batch')}, {p.get('image_size')} px, {p.get('workers')} threads / workers",
            "",
        ]
    feeds = p.get("feeds", [])
    if feeds:
        out.append(
            _table(
                ["feed", "images/s", "ms/step", "compute ms/step", "GPU idle", "CPU s per 1k images"],
                [
                    [
                        f["feed"],
                        f["images_per_s"],
                        f["step_ms"],
                        f["compute_ms"],
                        f["gpu_idle"],
                        f["cpu_s_per_1k_images"],
                    ]
                    for f in feeds
                ],
            )
        )
    need = p.get("cores_to_match_synthetic")
    if need:
        parts = [
            f"{k.replace('_', ', ')}: {v['cores']}{' (extrapolated)' if v['extrapolated'] else ''}"
            for k, v in need.items()
            if isinstance(v, dict)
        ]
        out += [
            "",
            f"Cores fastload needs to match the synthetic rate ({need['target_images_per_s']:,.0f} images/s): "
            + "; ".join(parts),
        ]
    return out


def _gpu_decode(p: dict[str, Any]) -> list[str]:
    out = []
    if p.get("rows"):
        out.append(
            _table(
                ["stage", "images/s", "CPU s per 1k images"],
                [[r["stage"], r["images_per_s"], r["cpu_s_per_1k_images"]] for r in p["rows"]],
            )
        )
    summary = p.get("summary")
    if summary:
        out += ["", "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in summary.items())]
    return out


_RENDER = {
    "cuda_tests": _cuda_tests,
    "h2d": _h2d,
    "scaling": _scaling,
    "train_step": _train_step,
    "gpu_decode": _gpu_decode,
}
_TITLES = {
    "cuda_tests": "1. CUDA tests (`pytest -m cuda`)",
    "h2d": "2. Host-to-device copies",
    "scaling": "3. Scaling with cores",
    "train_step": "4. Input-bound check: ResNet-50 training step",
    "gpu_decode": "5. GPU decode (nvJPEG through torchvision)",
}


def markdown(result: dict[str, Any]) -> str:
    """``device-check.md``: the machine, the set-up, then one section per part."""
    dev = result.get("device", {})
    lines = ["# fastload device check", ""]
    if result.get("dry_run"):
        lines += [
            f"**Dry run** ({result.get('dry_run_reason', '')}): CPU devices and tiny sizes; no figure here is a GPU's.",
            "",
        ]
    lines.append(
        _table(
            [
                "GPU",
                "driver",
                "CPU",
                "cores",
                "memory GiB",
                "date",
                "python",
                "torch",
                "torchvision",
                "numpy",
                "libjpeg-turbo",
            ],
            [
                [
                    dev.get("gpu") or "none",
                    dev.get("driver"),
                    dev.get("cpu_model"),
                    dev.get("cores"),
                    dev.get("memory_gib"),
                    dev.get("date"),
                    dev.get("python"),
                    (dev.get("versions") or {}).get("torch"),
                    (dev.get("versions") or {}).get("torchvision"),
                    (dev.get("versions") or {}).get("numpy"),
                    (dev.get("engine") or {}).get("libjpeg_turbo") or (dev.get("engine") or {}).get("backend"),
                ]
            ],
        )
    )
    setup = dev.get("setup", {})
    if setup:
        build = setup.get("build", {})
        data = setup.get("data", {})
        wheels = setup.get("wheels", {})
        lines += [
            "",
            f"Set-up: engine {'built' if build.get('built') else 'not built'}"
            + (f" in {build['seconds']} s" if build.get("seconds") else "")
            + (f" ({build['reason']})" if build.get("reason") else "")
            + (f", error: `{str(build['error']).splitlines()[0][:200]}`" if build.get("error") else "")
            + (
                f"; libjpeg: `{(build.get('engine') or {}).get('libjpeg')}`"
                if (build.get("engine") or {}).get("libjpeg")
                else ""
            )
            + f"; wheels installed: {', '.join(wheels.get('installed') or []) or 'none'}"
            + (f"; data: {data.get('count')} images" if data.get("count") else "")
            + (" (reused)" if data.get("reused") else "")
            + (
                f", generated in {data.get('generate_seconds')} s, packed in {data.get('pack_seconds')} s "
                f"(restart-indexed {data.get('pack_restart_seconds')} s)"
                if data.get("generate_seconds")
                else ""
            )
            + (f", error: `{str(data['error']).splitlines()[0][:200]}`" if data.get("error") else ""),
        ]
    for name in PARTS:
        part = result.get(name) or {}
        lines += ["", f"## {_TITLES[name]}", "", _status(part), ""]
        if isinstance(part, dict):
            lines += _RENDER[name](part)
    lines.append("")
    return "\n".join(lines)
