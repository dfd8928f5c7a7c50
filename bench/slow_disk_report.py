"""Measurement stage, output of the cold-epoch benchmark: the table, the checks, the plot, the JSON.

Per profile: every row's images/s, what the device served (MB/s, requests per second, records per
request), the device's bound for the row (``min(bandwidth / mean record size, IOPS x records per
request)``) and the row's share of it; for fastload's rows the producer's time split between
waiting for reads and decoding, and the ratio to the same order from the page cache, paired round
by round. Then each order's price in randomness, and the checks: block and shard order reach 90 %
of the device's bandwidth bound where decoding is faster than the device, else 90 % of the
page-cache rate; the read path alone reaches 90 % of the bandwidth bound; global shuffle against
torch's loader; fastload's LMDB reader in block order against py-lmdb's random ``get``.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
from collections.abc import Sequence

from .harness import machine_line

__all__ = ["checks", "markdown_summary", "profile_rows", "render", "write_outputs"]

_TARGET = 0.9


def _rate(sample: dict) -> float:
    return sample["images"] / sample["seconds"] if sample.get("seconds") else 0.0


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def profile_rows(doc: dict, profile: str) -> list[dict]:
    """The profile's result rows with the derived figures (device rates, bounds, ratios)."""
    info = doc["profiles"].get(profile, {})
    mean_record = doc.get("dataset", {}).get("record_bytes", 0) / max(1, doc.get("dataset", {}).get("images", 1))
    bw_bound = info["bandwidth"] / mean_record if info and mean_record else None
    rows = [dict(r) for r in doc["results"] if r["group"] == f"cold-{profile}"]
    warm = {r["extra"].get("order"): r for r in rows if r["name"].endswith(", page cache") and r.get("median_ips")}
    for r in rows:
        e, samples = r.get("extra", {}), r.get("samples") or []
        seconds = sum(s["seconds"] for s in samples)
        images = sum(s["images"] for s in samples)
        r["bw_bound"] = bw_bound
        if seconds and "device_bytes" in e:
            # Share of the bytes the epochs needed that came from the device: ~1 (or more, with
            # bridged gaps) for a cold epoch; far less means a cache served them.
            needed = sum(s.get("bytes", 0) for s in samples)
            r["cold_fraction"] = e["device_bytes"] / needed if needed else None
            r["device_mbps"] = e["device_bytes"] / seconds / 1e6
            r["device_iops"] = e["device_ios"] / seconds
            r["records_per_io"] = images / e["device_ios"] if e["device_ios"] else None
            # Rows served from memory (the page-cache references) have no device bound.
            if bw_bound and r["records_per_io"] and (r["cold_fraction"] or 0) >= 0.5:
                r["bound"] = min(bw_bound, info["iops"] * r["records_per_io"])
        if r.get("median_ips") and bw_bound:
            r["vs_bw"] = r["median_ips"] / bw_bound
            if r.get("bound"):
                r["vs_bound"] = r["median_ips"] / r["bound"]
        ref = warm.get(e.get("order"))
        if ref is not None and r is not ref and r["name"].startswith("fastload") and samples:
            pairs = [_rate(a) / _rate(b) for a, b in zip(samples, ref["samples"], strict=False) if _rate(b)]
            r["vs_warm"] = statistics.median(pairs) if pairs else None
            r["warm_ips"] = ref["median_ips"]
        st = {k.split(".", 1)[1]: v for k, v in e.items() if k.startswith("stage_seconds.")}
        working = st.get("read", 0) + st.get("read_wait", 0) + st.get("decode", 0)
        if working:
            r["read_wait_share"] = st.get("read_wait", 0) / working
            r["decode_share"] = st.get("decode", 0) / working
    return rows


def _table(doc: dict, profile: str) -> list[str]:
    info = doc["profiles"][profile]
    rows = profile_rows(doc, profile)
    ds = doc.get("dataset", {})
    bw = rows[0]["bw_bound"] if rows else None
    reads = info.get("read_options") or {}
    head = (
        f"== {profile}: {info['iops']:,} IOPS, {info['bandwidth'] / 1e6:,.0f} MB/s; bandwidth bound "
        f"{_num(bw)} img/s at {ds.get('mean_record_kb', 0):.1f} KB a record; fastload read options "
        f"{', '.join(f'{k} {v >> 10} KiB' for k, v in reads.items()) or 'defaults'}"
    )
    settings = info.get("order_settings") or {}
    if settings:
        head += f"; orders: {', '.join(settings.values())}"
    check = info.get("cold_check", {})
    repairs = info.get("repairs") or []
    lines = [
        "",
        head,
        f"   cold probe: {check.get('probe_bytes', 0) / 1e6:.1f} MB in {check.get('cold_seconds', 0):.3f} s with "
        f"{check.get('cold_device_bytes', 0) / 1e6:.1f} MB from the device; warm {check.get('warm_seconds', 0):.4f} s "
        f"with {check.get('warm_device_bytes', 0) / 1e6:.1f} MB",
        *([f"   throttle repaired during the runs: {'; '.join(repairs)}"] if repairs else []),
        f"{'row':<58} {'img/s':>7} {'min-max':>11} {'dev MB/s':>8} {'IOPS':>6} {'rec/IO':>6} "
        f"{'bound':>6} {'vs bw':>6} {'vs bnd':>6} {'vs warm':>7} {'wait/dec':>9} {'cold':>5}",
    ]
    for r in rows:
        name = r["name"][:58]
        if r.get("skipped"):
            lines.append(f"{name:<58} skipped: {r['skipped']}")
            continue
        if r.get("error") or not r.get("median_ips"):
            lines.append(f"{name:<58} error: {(r.get('error') or 'no timed repeat').splitlines()[0][:140]}")
            continue
        span = f"{_num(r['min_ips'])}-{_num(r['max_ips'])}"
        split = f"{100 * r['read_wait_share']:.0f}/{100 * r['decode_share']:.0f}%" if "read_wait_share" in r else "-"
        lines.append(
            f"{name:<58} {_num(r['median_ips']):>7} {span:>11} {_num(r.get('device_mbps'), ',.1f'):>8} "
            f"{_num(r.get('device_iops')):>6} {_num(r.get('records_per_io'), '.1f'):>6} {_num(r.get('bound')):>6} "
            f"{_num(r.get('vs_bw'), '.2f'):>6} {_num(r.get('vs_bound'), '.2f'):>6} "
            f"{_num(r.get('vs_warm'), '.2f'):>7} {split:>9} {_num(r.get('cold_fraction'), '.2f'):>5}"
        )
    return lines


def _mixing(doc: dict) -> list[str]:
    mix = doc.get("mixing") or {}
    if not mix:
        return []
    lines = [
        "",
        "== the price of each order in randomness (same records, batch "
        f"{doc['options']['batch_size']}, {doc['options']['classes']} classes)",
        f"{'order':<12} {'label entropy/batch':>22} {'if packed class-sorted':>24} {'file distance':>22}",
    ]
    for order, m in mix.items():
        lines.append(
            f"{order:<12} {m['entropy_bits']:>8.2f} bits ({m['entropy_vs_global']:>4.0%}) "
            f"{m['entropy_sorted_bits']:>10.2f} bits ({m['entropy_sorted_vs_global']:>4.0%}) "
            f"{m['distance_mb']:>10.1f} MB ({m['distance_vs_global']:>4.0%})"
        )
    lines.append(
        "   label entropy per batch: mean over batches, in bits; file distance: mean distance in the shards "
        "between consecutive samples of a batch; (%) = share of the global shuffle's figure."
    )
    return lines


def _find(rows: Sequence[dict], name: str) -> dict | None:
    return next((r for r in rows if r["name"].startswith(name) and r.get("median_ips")), None)


def checks(doc: dict) -> list[dict]:
    """The benchmark's verdicts, one dict each: check, value, target, met (None when not measured)."""
    out: list[dict] = []
    for profile in doc.get("profiles", {}):
        rows = profile_rows(doc, profile)
        for form in ("RecordIO", "LMDB"):
            # Buffered reads, then O_DIRECT (ReadOptions(direct=True)) where the run has that row.
            for order, reads in itertools.product(("block", "shard"), ("", ", direct I/O")):
                name = f"fastload {form}, {order}{reads}"
                r = _find(rows, name)
                warm = _find(rows, f"fastload RecordIO, {order}, page cache")
                if r is None or r["name"] != name or warm is None or not r.get("bw_bound"):
                    continue
                decode_faster = warm["median_ips"] >= r["bw_bound"]
                target = _TARGET * (r["bw_bound"] if decode_faster else warm["median_ips"])
                what = "the bandwidth bound" if decode_faster else "the page-cache rate (decoding is slower)"
                out.append(
                    {
                        "profile": profile,
                        "check": f"{form} {order} order{reads}, cold: >= 90% of {what}",
                        "value": r["median_ips"],
                        "target": target,
                        "met": r["median_ips"] >= target,
                    }
                )
        for order in ("block", "shard"):
            r = _find(rows, f"fastload RecordIO, {order}, read only")
            if r is not None and r.get("bw_bound"):
                out.append(
                    {
                        "profile": profile,
                        "check": f"RecordIO {order} order, read path alone: >= 90% of the bandwidth bound",
                        "value": r["median_ips"],
                        "target": _TARGET * r["bw_bound"],
                        "met": r["median_ips"] >= _TARGET * r["bw_bound"],
                    }
                )
        fast, torch = _find(rows, "fastload RecordIO, global"), _find(rows, "torch DataLoader")
        if fast is not None and torch is not None and fast["name"] == "fastload RecordIO, global":
            out.append(
                {
                    "profile": profile,
                    "check": "global shuffle: fastload / torch DataLoader + ImageFolder",
                    "value": fast["median_ips"] / torch["median_ips"],
                    "target": 1.0,
                    "met": fast["median_ips"] > torch["median_ips"],
                    "ratio": True,
                }
            )
        lm, plain = _find(rows, "fastload LMDB, block"), _find(rows, "py-lmdb")
        if lm is not None and plain is not None and lm["name"] == "fastload LMDB, block":
            out.append(
                {
                    "profile": profile,
                    "check": "LMDB: fastload block order / py-lmdb random get",
                    "value": lm["median_ips"] / plain["median_ips"],
                    "target": 1.0,
                    "met": lm["median_ips"] > plain["median_ips"],
                    "ratio": True,
                }
            )
    return out


def _checks_text(doc: dict) -> list[str]:
    found = checks(doc)
    if not found:
        return []
    lines = ["", "== checks"]
    for c in found:
        unit = "x" if c.get("ratio") else " img/s"
        fmt = ".2f" if c.get("ratio") else ",.0f"
        lines.append(
            f"  {c['profile']:<10} {c['check']:<78} {format(c['value'], fmt):>8}{unit}  "
            f"target {format(c['target'], fmt)}{unit}  {'MET' if c['met'] else 'not met'}"
        )
    return lines


def render(doc: dict) -> str:
    """The text report."""
    env = doc.get("environment", {})
    ds = doc.get("dataset", {})
    lines = [
        f"$ {env.get('command', '')}",
        machine_line(env),
    ]
    if doc.get("skipped"):
        lines.append(f"no slow device on this machine: {doc['skipped']}")
        return "\n".join(lines)
    lines.append(
        f"dataset: {ds.get('source')}: {ds.get('images')} images, {ds.get('record_bytes', 0) / 1e6:,.0f} MB of "
        f"records ({ds.get('mean_record_kb', 0):.1f} KB each) in {ds.get('shards')} shards, packed with --shuffle; "
        f"loop device: direct I/O {'on' if ds.get('device', {}).get('direct_io') else 'off'}, requests up to "
        f"{ds.get('device', {}).get('max_sectors_kb')} KB"
    )
    lines.append(
        f"threads {doc.get('threads')}, batch {doc['options']['batch_size']}, {doc['options']['repeats']} cold epochs "
        "per row, rows alternated round by round (A B C, C B A, ...)"
    )
    for profile in doc.get("profiles", {}):
        lines += _table(doc, profile)
    lines += _mixing(doc)
    if doc.get("paired"):
        lines += [
            "",
            "== paired epochs (alternated epoch by epoch; median of the per-pair ratios, quartiles, ratio of sums)",
        ]
        for p in doc["paired"]:
            lines.append(
                f"  {p['check']:<78} {p['median']:.2f}x ({p['q1']:.2f}-{p['q3']:.2f}, of sums {p['total']:.2f}x, "
                f"{p['pairs']} pairs; {p['extra'].get('numerator_ips', 0):,.0f} / "
                f"{p['extra'].get('denominator_ips', 0):,.0f} img/s)"
            )
    lines += _checks_text(doc)
    lines += [
        "",
        "img/s: median of the cold epochs; dev MB/s, IOPS: what the device served during the timed epochs "
        "(cgroup blkio counters); rec/IO: images per request; bound: min(bandwidth / mean record, IOPS x rec/IO); "
        "vs bw: share of the bandwidth bound; vs bnd: share of the row's bound; vs warm: cold / page-cache rate of "
        "the same order, paired round by round; wait/dec: the loader's producer time waiting for reads / decoding; "
        "cold: bytes the device served / bytes the epochs read (below 0.9: not a cold epoch).",
    ]
    return "\n".join(lines)


_SUMMARY_ROWS = (
    ("fastload RecordIO, block, read only", "fastload, block order, read path alone"),
    ("fastload RecordIO, shard, read only", "fastload, shard order, read path alone"),
    ("fastload RecordIO, global, read only", "fastload, global order, read path alone"),
    ("fastload LMDB, block, read only", "fastload LMDB, block order, read path alone"),
    ("fastload RecordIO, block, one pread per record", "fastload, block order, one pread per record"),
    ("fastload RecordIO, block", "fastload, block order, decoding"),
    ("fastload RecordIO, block, page cache", "fastload, block order, decoding, page cache"),
    ("fastload RecordIO, shard", "fastload, shard order, decoding"),
    ("fastload RecordIO, shard, page cache", "fastload, shard order, decoding, page cache"),
    ("fastload RecordIO, block, direct I/O", "fastload, block order, direct I/O, decoding"),
    ("fastload RecordIO, shard, direct I/O", "fastload, shard order, direct I/O, decoding"),
    ("fastload LMDB, block, direct I/O", "fastload LMDB, block order, direct I/O, decoding"),
    ("fastload LMDB, shard, direct I/O", "fastload LMDB, shard order, direct I/O, decoding"),
    ("fastload RecordIO, block, defaults", "fastload, block order at its defaults (256 x 8), decoding"),
    ("fastload RecordIO, shard, defaults", "fastload, shard order at its defaults (8 shards), decoding"),
    ("torch DataLoader", "torch DataLoader + ImageFolder"),
    ("MXNet ImageRecordIter", "MXNet ImageRecordIter, shuffle=True"),
    ("py-lmdb", "py-lmdb txn.get, global shuffle"),
)


def markdown_summary(doc: dict) -> str:
    """A Markdown table of the rows the docs quote: images/s per profile and share of the bandwidth bound."""
    profiles = list(doc.get("profiles", {}))
    rows = {p: profile_rows(doc, p) for p in profiles}
    head = "| | " + " | ".join(
        f"{p} ({doc['profiles'][p]['iops']:,} IOPS, {doc['profiles'][p]['bandwidth'] / 1e6:,.0f} MB/s)"
        for p in profiles
    )
    lines = [head + " |", "|---" * (len(profiles) + 1) + "|"]
    bounds = " | ".join(f"{_num(rows[p][0]['bw_bound']) if rows[p] else '-'} img/s" for p in profiles)
    lines.append(f"| bandwidth bound | {bounds} |")
    for prefix, label in _SUMMARY_ROWS:
        cells = []
        for p in profiles:
            r = next((x for x in rows[p] if x["name"].startswith(prefix) and x.get("median_ips")), None)
            if r is not None and prefix.endswith((", block", ", shard")) and r["name"] != prefix:
                r = None
            if r is None:
                cells.append("-")
                continue
            share = f" ({r['vs_bw']:.2f}x)" if r.get("vs_bw") is not None else ""
            cells.append(f"{_num(r['median_ips'])}{share}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(doc: dict, path: str) -> None:
    """One panel per profile: every row's images/s, the bandwidth bound as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = list(doc.get("profiles", {}))
    if not profiles:
        return
    fig, axes = plt.subplots(1, len(profiles), figsize=(7 * len(profiles), 7), squeeze=False)
    for ax, profile in zip(axes[0], profiles, strict=True):
        rows = [r for r in profile_rows(doc, profile) if r.get("median_ips")]
        ys = list(range(len(rows)))[::-1]

        def color(name: str) -> str:
            if name.endswith("page cache"):
                return "tab:blue"
            if name.endswith("read only"):
                return "yellowgreen"
            if "one pread" in name:
                return "tab:orange"
            return "tab:green" if name.startswith("fastload") else "tab:gray"

        err = [[r["median_ips"] - r["min_ips"] for r in rows], [r["max_ips"] - r["median_ips"] for r in rows]]
        ax.barh(ys, [r["median_ips"] for r in rows], xerr=err, color=[color(r["name"]) for r in rows], capsize=2)
        ax.set_yticks(ys)
        ax.set_yticklabels([r["name"][:52] for r in rows], fontsize=7)
        for y, r in zip(ys, rows, strict=True):
            ax.text(r["max_ips"], y, f" {r['median_ips']:,.0f}", va="center", fontsize=7)
        bw = rows[0]["bw_bound"] if rows else None
        if bw:
            ax.axvline(bw, color="black", linestyle="--", linewidth=1)
            ax.text(bw, len(rows) - 0.4, " bandwidth bound", fontsize=7)
        info = doc["profiles"][profile]
        ax.set_title(f"{profile}: {info['iops']:,} IOPS, {info['bandwidth'] / 1e6:,.0f} MB/s", fontsize=9)
        ax.set_xlabel("images/s, cold epoch (median, min-max)")
        ax.set_xscale("log")
        ax.grid(axis="x", alpha=0.3)
    env = doc.get("environment", {})
    fig.suptitle(
        f"cold epochs from a throttled device | {env.get('cpu_model')} x{env.get('cores')} | {env.get('timestamp')}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(out_dir: str, doc: dict, text: str) -> dict[str, str]:
    """Write results.json, table.txt, summary.md and slow_disk.png; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    doc = dict(doc, checks=checks(doc))
    paths = {
        "json": os.path.join(out_dir, "results.json"),
        "table": os.path.join(out_dir, "table.txt"),
        "summary": os.path.join(out_dir, "summary.md"),
        "png": os.path.join(out_dir, "slow_disk.png"),
    }
    if doc.get("profiles"):
        with open(paths["summary"], "w") as fh:
            fh.write(
                f"Cold epochs, images/s (share of the device's bandwidth bound); "
                f"`{doc.get('environment', {}).get('command', '')}`\n\n{markdown_summary(doc)}\n"
            )
    else:
        del paths["summary"]
    with open(paths["json"] + ".tmp", "w") as fh:
        json.dump(doc, fh, indent=1, default=str)
    os.replace(paths["json"] + ".tmp", paths["json"])
    with open(paths["table"], "w") as fh:
        fh.write(text + "\n")
    plot(doc, paths["png"])
    return paths
