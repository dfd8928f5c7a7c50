"""Benchmarks, output: the table people read, the JSON machines read, the plot.

One format for every benchmark of the project: a list of :class:`~.harness.Result` rows grouped by
comparison, the environment they ran in, derived checks against the performance targets, and the
optional model-step verdict. Written to ``OUT/results.json`` (and appended as one line to
``OUT/results.jsonl`` so runs accumulate), ``OUT/table.txt`` and ``OUT/throughput.png``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from .harness import Result, machine_line

__all__ = ["GROUP_TITLES", "format_table", "format_targets", "plot", "write_outputs"]

GROUP_TITLES = {
    "read": "read only (records from the shards, no decode)",
    "decode": "decode alone (pre-read bytes; fused ops are RandomResizedCrop(224)+flip unless noted)",
    "pipeline": "train pipeline: RandomResizedCrop(224) + flip, uint8 out",
    "eval": "eval pipeline: Resize(256) + CenterCrop(224), uint8 out",
    "mxnet": "MXNet iterators on the same .rec (random resized crop 224 + mirror, uint8)",
    "sparse": "sparse CSR batches (batches/s): fastload.mxnet.NDArrayIter vs mx.io.NDArrayIter",
    "h2d": "host-to-device copy",
    "pack": "packing, pass-through (whole command, same workers)",
    "pack-resize": "packing, --resize 256 (whole command, same workers)",
    "startup": (
        "first batch after constructing the loader "
        "(fresh process per repeat; rate = first batch's images / its seconds)"
    ),
    "memory": "memory over 5 epochs (fresh process; rate = images/s over the 5 epochs)",
}


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def _details(r: Result) -> str:
    """One indented line of what a row's counters say (loader stages, sliced decodes, failures)."""
    e = r.extra
    parts = []
    stages = {
        k.split(".", 1)[1]: v for k, v in e.items() if k.startswith("stage_seconds.") and isinstance(v, (int, float))
    }
    if stages:
        parts.append("stage seconds " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    if "input_bound_fraction" in e:
        parts.append(f"consumer waited {e['input_bound_fraction']:.0%}")
    if "io_bound_fraction" in e:
        # Of the producer's working time: waiting for reads from storage against decoding.
        read_wait, decode = stages.get("read_wait", 0.0), stages.get("decode", 0.0)
        parts.append(
            f"producer: read wait {read_wait:.2f} s, decode {decode:.2f} s "
            f"({'bound by storage' if e['io_bound_fraction'] > 0.5 else 'bound by decoding'}, "
            f"{e['io_bound_fraction']:.0%} waiting for reads)"
        )
    if e.get("loader_reads"):
        parts.append(
            f"{e.get('loader_bytes_read', 0) / 1e6:,.1f} MB in {e['loader_reads']:,} reads "
            f"({e.get('loader_bytes_read', 0) / e['loader_reads'] / 1e3:,.0f} KB a read)"
        )
    if "first_batch_ms_mean" in e:
        parts.append(f"first batch {e['first_batch_ms_mean']:.0f} ms")
    if "index_load_ms_mean" in e:
        parts.append(
            f"constructing {e.get('construct_ms_mean', 0):.0f} ms, index load {e['index_load_ms_mean']:.0f} ms, "
            f"open_dataset {e.get('open_dataset_ms_mean', 0):.0f} ms, {e.get('records_max', 0):,.0f} records, "
            f".rec {e.get('rec_mb_max', 0):,.0f} MB of which {e.get('rec_resident_kb_after_construct_max', 0):,.0f}"
            f" KB mapped in after constructing"
        )
    if "rss_peak_mb_max" in e:
        parts.append(
            f"peak RSS {e['rss_peak_mb_max']:,.0f} MB (bound {e.get('rss_bound_mb_max', 0):,.0f} MB), "
            f"anon peak {e.get('rss_anon_peak_mb_max', 0):,.0f} MB, after imports "
            f"{e.get('rss_after_imports_mb_max', 0):,.0f} MB; per epoch: RSS peak {e.get('rss_epoch_peak_mb')}, "
            f"RSS at the end {e.get('rss_epoch_end_mb')}, anon at the end {e.get('rss_anon_epoch_end_mb')} MB"
        )
    if e.get("sliced"):
        parts.append(f"{e['sliced']:,} decodes took the restart-interval (sliced) path")
    if e.get("failed"):
        parts.append(f"{e['failed']:,} decode failures")
    if e.get("skipped_records"):
        parts.append(f"{e['skipped_records']:,} bad records skipped")
    return "; ".join(parts)


def format_table(results: Sequence[Result]) -> str:
    """A fixed-width table, one block per group, skipped rows with their reason."""
    lines: list[str] = []
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    header = (
        f"{'contender':<64} {'thr':>3} {'median/s':>10} {'min-max/s':>17} {'MB/s':>8} {'per core':>9} {'vs ref':>7}"
    )
    for group, rows in groups.items():
        lines.append("")
        lines.append(f"== {GROUP_TITLES.get(group, group)}")
        unit = rows[0].unit
        lines.append(header.replace("median/s", f"{unit[:6]}/s"))
        for r in rows:
            name = (r.name + (" *" if r.reference else ""))[:64]
            if r.skipped is not None:
                lines.append(f"{name:<64} {'':>3} skipped: {r.skipped}")
                continue
            if not r.ok:
                lines.append(f"{name:<64} {'':>3} error: {(r.error or '').splitlines()[0][:160]}")
                continue
            span = f"{_num(r.min_ips)}-{_num(r.max_ips)}"
            ratio = "-" if r.ratio_to_reference is None else f"{r.ratio_to_reference:.2f}x"
            lines.append(
                f"{name:<64} {r.threads:>3} {_num(r.median_ips):>10} {span:>17} "
                f"{_num(r.median_mbps, ',.1f'):>8} {_num(r.per_core_ips):>9} {ratio:>7}"
            )
            detail = _details(r)
            if detail:
                lines.append(f"    {detail}")
    lines.append("")
    lines.append(
        "* = the group's reference row (fastload); 'vs ref' = median / reference median; "
        "thr = threads or processes allowed; per core = median / thr."
    )
    return "\n".join(lines)


def format_targets(targets: Sequence[dict]) -> str:
    if not targets:
        return ""
    lines = ["", "== performance targets (from this run)"]
    for t in targets:
        if t.get("value") is None:
            value, state = "-", f"not measured: {t.get('why', '')}"
        else:
            value = f"{t['value']:,.2f}{t.get('unit', '')}"
            state = "MET" if t["met"] else "not met"
        lines.append(f"  {t['area'] + ':':<14} {t['check']:<66} {value:>11}  target {t['target_text']:<11} {state}")
    return "\n".join(lines)


def plot(results: Sequence[Result], path: str, *, title: str = "") -> None:
    """Two panels: throughput against threads (decode families), and pipelines side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6.5), gridspec_kw={"width_ratios": [1, 1.4]})
    families: dict[str, list[Result]] = {}
    for r in results:
        if r.ok and r.group == "decode":
            families.setdefault(r.family, []).append(r)
    for family, rows in families.items():
        rows.sort(key=lambda r: r.threads)
        xs = [r.threads for r in rows]
        ys = [r.median_ips for r in rows]
        err = [[r.median_ips - r.min_ips for r in rows], [r.max_ips - r.median_ips for r in rows]]
        style = "-o" if family.startswith("fastload") else "--s"
        left.errorbar(xs, ys, yerr=err, fmt=style, capsize=3, label=family)
    left.set_xlabel("threads")
    left.set_ylabel("images/s")
    left.set_title("decode throughput vs threads")
    if families:
        left.legend(fontsize=7, loc="best")
        left.set_xticks(sorted({r.threads for rows in families.values() for r in rows}))
    else:
        left.text(0.5, 0.5, "decode stage not measured", ha="center", transform=left.transAxes)
    left.grid(alpha=0.3)

    rows = [r for r in results if r.ok and r.group in ("pipeline", "mxnet", "eval")]
    if rows:
        labels = [f"[{r.group}] {r.name}"[:72] for r in rows]
        ys = list(range(len(rows)))[::-1]
        colors = ["tab:green" if r.name.startswith("fastload") else "tab:gray" for r in rows]
        err = [[r.median_ips - r.min_ips for r in rows], [r.max_ips - r.median_ips for r in rows]]
        right.barh(ys, [r.median_ips for r in rows], xerr=err, color=colors, capsize=3)
        right.set_yticks(ys)
        right.set_yticklabels(labels, fontsize=7)
        for y, r in zip(ys, rows, strict=False):
            ratio = "" if r.ratio_to_reference is None else f" ({r.ratio_to_reference:.2f}x)"
            right.text(r.max_ips, y, f" {r.median_ips:,.0f}{ratio}", va="center", fontsize=7)
        right.set_xlim(0, max(r.max_ips for r in rows) * 1.18)  # room for the labels
    else:
        right.text(0.5, 0.5, "no pipeline measured", ha="center", transform=right.transAxes)
    right.set_xlabel("images/s (median, min-max)")
    right.set_title("fastload vs peers, same images")
    right.grid(axis="x", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(
    out_dir: str,
    *,
    env: dict,
    dataset: dict,
    config: dict,
    results: Sequence[Result],
    targets: Sequence[dict],
    model_step: dict | None,
    model_step_text: str = "",
    paired: Sequence[dict] = (),
    paired_text: str = "",
) -> dict[str, str]:
    """Write results.json, results.jsonl (appended), table.txt and throughput.png; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    doc = {
        "format": "fastload-bench/1",
        "environment": env,
        "dataset": dataset,
        "config": config,
        "results": [r.to_json() for r in results],
        "paired": list(paired),
        "targets": list(targets),
        "model_step": model_step,
    }
    paths = {
        "json": os.path.join(out_dir, "results.json"),
        "jsonl": os.path.join(out_dir, "results.jsonl"),
        "table": os.path.join(out_dir, "table.txt"),
        "png": os.path.join(out_dir, "throughput.png"),
    }
    tmp = paths["json"] + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, default=str)
    os.replace(tmp, paths["json"])
    with open(paths["jsonl"], "a") as fh:
        fh.write(json.dumps(doc, default=str) + "\n")
    text = render_text(env, dataset, results, targets, model_step_text, paired_text)
    with open(paths["table"], "w") as fh:
        fh.write(text + "\n")
    plot(
        results,
        paths["png"],
        title=f"{env.get('cpu_model')} x{env.get('cores')} cores | {dataset.get('source')} | {env.get('timestamp')}",
    )
    return paths


def render_text(
    env: dict,
    dataset: dict,
    results: Sequence[Result],
    targets: Sequence[dict],
    model_step_text: str = "",
    paired_text: str = "",
) -> str:
    head = [
        f"$ {env.get('command')}",
        machine_line(env),
        f"dataset: {dataset.get('source')} ({dataset.get('images')} images, mean {dataset.get('mean_kb')} KB)",
    ]
    for note in dataset.get("notes") or []:
        head.append(f"note: {note}")
    text = (
        "\n".join(head)
        + "\n"
        + format_table(results)
        + (paired_text + "\n" if paired_text else "")
        + format_targets(targets)
    )
    if model_step_text:
        text += "\n\n" + model_step_text
    return text
