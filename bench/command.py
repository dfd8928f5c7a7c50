"""Benchmarks, entry point: ``fastload bench``, every benchmark of the project in one run.

``fastload bench [DATASET] [--quick] [--suite ...] [--out DIR] [--peer-python NAME=PYTHON ...]
[--model-step MS --gpus N --target IPS]`` prepares the dataset (generated when none is given),
measures the stages of fastload's data path alone and together, runs the peers on the same images
interleaved with fastload, benchmarks packing against im2rec, and writes the table, the JSON and
the plot. ``fastload bench`` (:mod:`fastload.cli.bench`) registers this module's :func:`add_parser`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass, field

from fastload.errors import UserError

from . import stages
from .harness import Contender, Result, RunConfig, cpu_count, environment, measure, skipped
from .model_step import format_report, input_bound_report, parse_model_step
from .pack_bench import pack_contenders, pack_pair
from .paired import PairedRatio, decode_pairs, format_paired, normalized_output_pairs, run_pair
from .peers.registry import (
    PeerProcesses,
    eval_peers,
    mxnet_peers,
    peer_python,
    pipeline_peers,
    set_overrides,
    sparse_peers,
)
from .prepare import BenchData, prepare
from .report import render_text, write_outputs
from .startup import first_batch_contender, memory_contender
from .targets import FAMILIES, evaluate

__all__ = ["SUITES", "BenchOptions", "add_parser", "bench_main", "run_bench"]

SUITES = ("all", "stages", "peers", "pack", "decode", "loader", "mxnet", "slow-disk")
_GROUPS_OF_SUITE = {
    "all": ("read", "decode", "pipeline", "eval", "sparse", "h2d", "pack", "startup", "memory"),
    "stages": ("read", "decode", "pipeline", "eval", "h2d"),
    "peers": ("pipeline", "eval"),
    "pack": ("pack",),
    "decode": ("decode",),
    "loader": ("pipeline", "startup", "memory"),
    "mxnet": ("pipeline", "sparse"),
    "slow-disk": (),  # its own run: cold epochs from a throttled device (bench/slow_disk.py)
}


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """What ``fastload bench`` runs.

    Args:
        dataset: None (generate one), an image folder, a packed fastload folder or a ``.rec``.
        quick: Smoke-test size: tiny dataset, one repeat, few contenders (under a minute).
        suite: Which comparisons (see :data:`SUITES`).
        out: Output folder for results.json, results.jsonl, table.txt, throughput.png.
        peer_python: ``name -> interpreter`` for peers in their own environments (``dali``, ``ffcv``).
        threads: Most threads any contender may use (default: every CPU of this process).
        batch_size: Batch size of the pipelines (default 256, 32 with ``quick``).
        repeats: Timed repeats (default 3, 1 with ``quick``).
        warmup: Untimed repeats before them.
        count: Images to generate when no dataset is given.
        model_step: Milliseconds per step, or ``module:function`` to time.
        gpus: GPUs fed by one host (for ``model_step``).
        target: Images/s fastload must deliver (default: what the GPUs consume).
        profiles: Device profiles of ``--suite slow-disk`` (``hdd``, ``cloud-disk``, ``ssd-lite``).
        argv: The command line, recorded in the JSON.
    """

    dataset: str | None = None
    quick: bool = False
    suite: str = "all"
    out: str = "bench-out"
    peer_python: dict[str, str] = field(default_factory=dict)
    threads: int | None = None
    batch_size: int | None = None
    repeats: int | None = None
    warmup: int = 1
    count: int | None = None
    model_step: str | None = None
    gpus: int = 1
    target: float | None = None
    profiles: tuple[str, ...] = ("hdd", "cloud-disk", "ssd-lite")
    argv: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise ValueError(f"suite={self.suite!r} must be one of {', '.join(SUITES)}")
        for name in ("threads", "batch_size", "repeats", "count"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value} must be >= 1")
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup} must be >= 0")
        if self.gpus < 1:
            raise ValueError(f"gpus={self.gpus} must be >= 1")


def _thread_counts(max_threads: int, quick: bool) -> list[int]:
    if quick:
        return sorted({1, max_threads})
    return list(range(1, max_threads + 1))


def _decode_group(data: BenchData, threads: list[int], batch: int, quick: bool) -> tuple[list[Contender], list[Result]]:
    f = FAMILIES
    out: list[Contender] = []
    skips: list[Result] = []
    if data.packed is None:
        reason = data.missing.get("packed", "no packed dataset")
        return [], [skipped(f["engine_train"], group="decode", reason=reason)]
    top = max(threads)
    for t in threads:
        out.append(
            stages.engine_contender(
                f"{f['engine_train']}, {t}t",
                data.packed,
                threads=t,
                batch_size=batch,
                family=f["engine_train"],
                reference=(t == top),
                notes="RandomResizedCrop(224)+flip fused into the decode, NHWC",
            )
        )
    if data.restart_packed is not None and not quick:
        for t in threads:
            out.append(
                stages.engine_contender(
                    f"{f['engine_train_restart']}, {t}t",
                    data.restart_packed,
                    threads=t,
                    batch_size=batch,
                    family=f["engine_train_restart"],
                    notes="sliced entropy decode of the covering restart intervals",
                )
            )
    else:
        skips.append(
            skipped(
                f["engine_train_restart"],
                group="decode",
                reason="not in --quick" if quick else data.missing.get("restart", "no restart-indexed pack"),
            )
        )
    out.append(
        stages.engine_contender(
            f"{f['engine_eval']}, {top}t",
            data.packed,
            kind="eval",
            threads=top,
            batch_size=batch,
            family=f["engine_eval"],
            notes="Resize(256)+CenterCrop(224)",
        )
    )
    for t in threads:
        out.append(stages.simplejpeg_full_contender(data.packed, threads=t))
    if not quick:
        for t in threads:
            out.append(stages.engine_full_contender(data.packed, threads=t))
            out.append(stages.pillow_full_contender(data.packed, threads=t))
        for decoder in ("pillow", "simplejpeg", "simplejpeg+cv2"):
            out.append(stages.python_pipeline_contender(data.packed, decoder=decoder))
    else:
        out.append(stages.python_pipeline_contender(data.packed, decoder="pillow"))
    return out, skips


def _pipeline_group(
    opts: BenchOptions,
    data: BenchData,
    procs: PeerProcesses,
    threads: int,
    batch: int,
) -> tuple[list[Contender], list[Result]]:
    f = FAMILIES
    out: list[Contender] = []
    skips: list[Result] = []
    fastload_rows = opts.suite in ("all", "loader", "peers", "stages")
    if fastload_rows:
        if data.packed is None:
            skips.append(skipped(f["loader"], group="pipeline", reason=data.missing.get("packed", "no packed dataset")))
        else:
            out.append(
                stages.loader_contender(
                    f"{f['loader']} ({threads} threads, batch {batch})",
                    data.packed,
                    threads=threads,
                    batch_size=batch,
                    reference=True,
                    notes="global shuffle, NCHW uint8, page-cache shards",
                )
            )
            out.append(
                stages.engine_contender(
                    f"{f['engine_alone']}, {threads}t",
                    data.packed,
                    threads=threads,
                    batch_size=batch,
                    group="pipeline",
                    family=f["engine_alone"],
                    layout="NCHW",
                    notes="decode_batch on pre-read bytes: the loader's ceiling",
                )
            )
            if not opts.quick:
                out.append(
                    stages.torch_loader_contender(
                        f"fastload.torch DataLoader ({threads} threads)", data.packed, threads=threads, batch_size=batch
                    )
                )
                if data.restart_packed is not None:
                    out.append(
                        stages.loader_contender(
                            f"{f['loader_restart']} ({threads} threads)",
                            data.restart_packed,
                            threads=threads,
                            batch_size=batch,
                        )
                    )
                else:
                    skips.append(
                        skipped(
                            f["loader_restart"],
                            group="pipeline",
                            reason=data.missing.get("restart", "no restart-indexed pack"),
                        )
                    )
    if opts.suite in ("all", "peers", "loader"):
        if opts.suite == "loader":
            peer_rows, peer_skips = pipeline_peers(
                data, procs=procs, threads=threads, batch_size=batch, quick=True, overrides=opts.peer_python
            )
            peer_rows = [c for c in peer_rows if c.name.startswith(f["torch_peer"])]
        else:
            peer_rows, peer_skips = pipeline_peers(
                data, procs=procs, threads=threads, batch_size=batch, quick=opts.quick, overrides=opts.peer_python
            )
        out += peer_rows
        skips += peer_skips if opts.suite != "loader" else []
    if opts.suite in ("all", "peers", "mxnet"):
        rows, more = mxnet_peers(
            data,
            procs=procs,
            threads=threads,
            batch_size=batch,
            with_mxnet_own=opts.suite == "mxnet",
            reference=opts.suite == "mxnet",
        )
        out += rows
        skips += more
    return out, skips


def _eval_group(
    opts: BenchOptions, data: BenchData, procs: PeerProcesses, threads: int, batch: int
) -> tuple[list[Contender], list[Result]]:
    out: list[Contender] = []
    skips: list[Result] = []
    if data.packed is None:
        skips.append(
            skipped("fastload Loader eval", group="eval", reason=data.missing.get("packed", "no packed dataset"))
        )
    else:
        out.append(
            stages.loader_contender(
                f"fastload Loader eval ({threads} threads, batch {batch})",
                data.packed,
                kind="eval",
                threads=threads,
                batch_size=batch,
                group="eval",
                reference=True,
                notes="no shuffle, NCHW uint8",
            )
        )
    if opts.quick:
        skips.append(skipped("torch DataLoader + PIL eval", group="eval", reason="not in --quick"))
    else:
        rows, more = eval_peers(data, procs=procs, threads=threads, batch_size=batch)
        out += rows
        skips += more
    return out, skips


def _read_group(data: BenchData) -> tuple[list[Contender], list[Result]]:
    if data.packed is None:
        return [], [skipped("read shards", group="read", reason=data.missing.get("packed", "no packed dataset"))]
    out = [
        stages.read_contender(
            "read records, page cache", data.packed, reference=True, notes="Dataset.image(i) + one memcpy per record"
        )
    ]
    skips: list[Result] = []
    if data.tmpfs_packed is not None:
        out.append(stages.read_contender("read records, tmpfs (/dev/shm)", data.tmpfs_packed))
    else:
        skips.append(skipped("read records, tmpfs", group="read", reason=data.missing.get("tmpfs", "no tmpfs copy")))
    return out, skips


# Records of the dataset whose first batch is timed (the target's: a million; --quick: a smoke-test size).
STARTUP_RECORDS = 1_000_000
STARTUP_RECORDS_QUICK = 20_000


def _startup_group(opts: BenchOptions, data: BenchData, threads: int) -> tuple[list[Contender], list[Result]]:
    name = FAMILIES["first_batch"]
    if data.packed is None:
        return [], [skipped(name, group="startup", reason=data.missing.get("packed", "no packed dataset"))]
    records = STARTUP_RECORDS_QUICK if opts.quick else STARTUP_RECORDS
    batch = opts.batch_size or 256
    cache = os.path.join(opts.out, "cache")
    rows = [
        first_batch_contender(
            f"{name}, {records:,} records, page cache warm",
            source=data.packed,
            cache_dir=cache,
            records=records,
            threads=threads,
            batch_size=batch,
            reference=True,
        )
    ]
    if opts.quick:
        return rows, [skipped(f"{name}, {records:,} records, .rec evicted", group="startup", reason="not in --quick")]
    rows.append(
        first_batch_contender(
            f"{name}, {records:,} records, .rec evicted",
            source=data.packed,
            cache_dir=cache,
            records=records,
            threads=threads,
            batch_size=batch,
            evict=True,
        )
    )
    return rows, []


def _memory_group(data: BenchData, threads: int, batch: int) -> tuple[list[Contender], list[Result]]:
    if data.packed is None:
        reason = data.missing.get("packed", "no packed dataset")
        return [], [skipped(FAMILIES["memory_torch"], group="memory", reason=reason)]
    f = FAMILIES
    return [
        memory_contender(
            f"{f['memory_torch']}, batch {batch}",
            path=data.packed,
            api="torch",
            threads=threads,
            batch_size=batch,
            reference=True,
        ),
        memory_contender(
            f"{f['memory_loader']}, batch {batch}", path=data.packed, api="loader", threads=threads, batch_size=batch
        ),
    ], []


def _h2d_group(batch: int) -> tuple[list[Contender], list[Result]]:
    reason = stages.cuda_available()
    if reason is not None:
        return [], [
            skipped("host-to-device copy, pinned", group="h2d", reason=reason),
            skipped("host-to-device copy, pageable", group="h2d", reason=reason),
        ]
    return stages.h2d_contenders(batch), []


def _loader_pair(data: BenchData, threads: int, batch: int, quiet: bool, *, rounds: int) -> PairedRatio:
    """The restart-index loader ratio: fastload.torch.DataLoader, restart-indexed vs plain shards, alternated."""
    if not quiet:
        print("[bench] paired loader epochs, restart-indexed vs plain", file=sys.stderr, flush=True)
    check = f"fastload.torch DataLoader restart-indexed / plain shards, {threads} threads"
    num = stages.torch_loader_contender(
        "fastload.torch DataLoader, restart-indexed", data.restart_packed, threads=threads, batch_size=batch
    )
    den = stages.torch_loader_contender("fastload.torch DataLoader", data.packed, threads=threads, batch_size=batch)
    try:
        num.start()
        den.start()
        return run_pair(check, num, den, rounds=rounds)
    except Exception as exc:
        nan = float("nan")
        return PairedRatio(
            check=check,
            numerator=num.name,
            denominator=den.name,
            median=nan,
            q1=nan,
            q3=nan,
            total=nan,
            pairs=0,
            chunk=0,
            skipped=f"{type(exc).__name__}: {exc}",
        )
    finally:
        num.close()
        den.close()


def _slow_disk(opts: BenchOptions, quiet: bool) -> dict:
    """``--suite slow-disk``: cold epochs from a throttled loop device (:mod:`bench.slow_disk`)."""
    from .slow_disk import SlowDiskOptions, run_slow_disk

    if opts.dataset is not None:
        raise UserError("--suite slow-disk generates its own images (tools/make_dataset.py); give --count instead")
    try:
        sd = SlowDiskOptions(
            profiles=opts.profiles,
            count=opts.count or (64 if opts.quick else 4800),
            classes=4 if opts.quick else 100,
            repeats=opts.repeats or (1 if opts.quick else 3),
            threads=opts.threads,
            batch_size=opts.batch_size or (16 if opts.quick else 256),
            shards=4 if opts.quick else 16,
            quick=opts.quick,
            out=opts.out,
            argv=tuple(opts.argv),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    outcome = run_slow_disk(sd, quiet=quiet)
    return {"paths": outcome["paths"], "results": outcome["doc"]["results"], "targets": [], "text": outcome["text"]}


def run_bench(opts: BenchOptions, *, quiet: bool = False) -> dict:
    """Run the benchmark and write its outputs.

    Returns:
        ``{"paths": {...}, "results": [Result...], "targets": [...], "text": str}``.
    """
    if opts.suite == "slow-disk":
        return _slow_disk(opts, quiet)
    cores = cpu_count()
    max_threads = opts.threads or cores
    threads = _thread_counts(max_threads, opts.quick)
    batch = opts.batch_size or (32 if opts.quick else 256)
    config = RunConfig(repeats=opts.repeats or (1 if opts.quick else 3), warmup=opts.warmup)
    groups = _GROUPS_OF_SUITE[opts.suite]
    step = None
    if opts.model_step is not None:
        try:
            # B images per GPU per step: the pipelines' batch size, or 256 when --quick shrank it.
            step = parse_model_step(opts.model_step, gpus=opts.gpus, batch=opts.batch_size or 256, target=opts.target)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
    if not quiet:
        print(f"[bench] preparing the dataset ({'quick' if opts.quick else 'full'})", file=sys.stderr, flush=True)
    data = prepare(
        opts.dataset,
        quick=opts.quick,
        count=opts.count,
        restart_index=not opts.quick and any(g in groups for g in ("decode", "pipeline")),
        tmpfs="read" in groups,
    )
    set_overrides(opts.peer_python)
    procs = PeerProcesses()
    results: list[Result] = []
    paired: list[PairedRatio] = []
    scratch = None
    try:
        for group in groups:
            if group == "read":
                rows, skips = _read_group(data)
            elif group == "decode":
                rows, skips = _decode_group(data, threads, batch, opts.quick)
            elif group == "pipeline":
                rows, skips = _pipeline_group(opts, data, procs, max_threads, batch)
            elif group == "eval":
                rows, skips = _eval_group(opts, data, procs, max_threads, batch)
            elif group == "sparse":
                rows, skips = sparse_peers(procs=procs, quick=opts.quick)
            elif group == "h2d":
                rows, skips = _h2d_group(batch)
            elif group == "startup":
                rows, skips = _startup_group(opts, data, max_threads)
            elif group == "memory":
                rows, skips = _memory_group(data, max_threads, batch)
            else:
                rows, skips, scratch = pack_contenders(data.images_root, workers=max_threads, quick=opts.quick)
            procs.spawn_all()
            group_config = config
            if group == "memory" or (group == "startup" and opts.quick):
                # A fresh process per repeat: a warm-up run only re-warms the page cache, which
                # --quick skips; one 5-epoch run is the memory measurement (repeating re-measures it).
                group_config = RunConfig(repeats=opts.repeats or (1 if group == "memory" else config.repeats), warmup=0)
            results += measure(rows, group_config, quiet=quiet) + skips
            procs.close()
            if group == "decode" and data.packed is not None:
                if not quiet:
                    print("[bench] paired single-thread decode ratios", file=sys.stderr, flush=True)
                restart = stages.load_images(data.restart_packed) if data.restart_packed and not opts.quick else None
                # More repeats buy more pairs: the medians' own sampling error shrinks with them.
                paired += decode_pairs(
                    stages.load_images(data.packed),
                    restart,
                    chunk=16 if opts.quick else 128,
                    rounds=1 if opts.quick else max(3, config.repeats + 1),
                )
                if not quiet:
                    print("[bench] paired normalized float32 vs uint8 output", file=sys.stderr, flush=True)
                paired += normalized_output_pairs(
                    stages.load_images(data.packed),
                    threads=sorted({1, max_threads}),
                    chunk=16 if opts.quick else 128,
                    rounds=1 if opts.quick else max(3, config.repeats + 1),
                )
            if group == "pipeline" and data.packed and data.restart_packed and not opts.quick:
                paired.append(_loader_pair(data, max_threads, batch, quiet, rounds=max(10, 4 * config.repeats)))
            if group == "pack" and data.images_root and not opts.quick:
                if not quiet:
                    print("[bench] paired runs, pack_folder() in-process vs copy", file=sys.stderr, flush=True)
                paired.append(pack_pair(data.images_root, workers=max_threads, rounds=30))
            stages.clear_image_cache()
        env = environment(
            list(opts.argv) or ["fastload", "bench"],
            extra_versions={
                name: _peer_version(name, module, opts.peer_python)
                for name, module in (("dali", "nvidia.dali"), ("ffcv", "ffcv"))
            },
        )
        targets = evaluate(results, paired)
        paired_text = format_paired(paired)
        model = model_text = None
        if step is not None:
            model = input_bound_report(results, step, cores=cores)
            model_text = format_report(model)
        run_config = {
            "quick": opts.quick,
            "suite": opts.suite,
            "threads": threads,
            "batch_size": batch,
            "repeats": config.repeats,
            "warmup": config.warmup,
            "order": "interleaved, reversed every round",
            "peer_python": dict(opts.peer_python),
        }
        paths = write_outputs(
            opts.out,
            env=env,
            dataset=data.describe(),
            config=run_config,
            results=results,
            targets=targets,
            model_step=model,
            model_step_text=model_text or "",
            paired=[p.to_json() for p in paired],
            paired_text=paired_text,
        )
        text = render_text(env, data.describe(), results, targets, model_text or "", paired_text)
        return {"paths": paths, "results": results, "targets": targets, "text": text}
    finally:
        procs.close()
        data.close()
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def _peer_version(name: str, module: str, overrides: dict[str, str]) -> str | None:
    """The version of a peer library as its own interpreter sees it (None when there is none)."""
    python = peer_python(name, overrides)
    if python is None:
        return None
    import subprocess

    code = (
        f"import importlib.metadata as m, {module} as x; "
        f"print(getattr(x, '__version__', None) or m.version('{name if name != 'dali' else 'nvidia-dali-cuda120'}'))"
    )
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def _peer_python_arg(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(
            f"--peer-python {value!r}: expected NAME=/path/to/python (e.g. dali=.venv-dali/bin/python)"
        )
    return name.strip(), path.strip()


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``fastload bench`` on the CLI's sub-command parser."""
    p = subparsers.add_parser(
        "bench",
        help="measure the loader's stages and compare with peer loaders",
        description="Measure fastload's stages alone and together, and peer loaders on the same images.",
    )
    p.add_argument("dataset", nargs="?", help="image folder, packed fastload folder or .rec (default: generate one)")
    p.add_argument("--quick", action="store_true", help="tiny smoke run (under a minute)")
    p.add_argument("--suite", choices=SUITES, default="all", help="which comparisons to run (default all)")
    p.add_argument("--out", default="bench-out", help="output folder (default ./bench-out)")
    p.add_argument(
        "--peer-python",
        action="append",
        type=_peer_python_arg,
        default=[],
        metavar="NAME=PYTHON",
        help="interpreter for a peer in its own environment, e.g. dali=.venv-dali/bin/python",
    )
    p.add_argument("--threads", type=int, help="most threads a contender may use (default: all CPUs)")
    p.add_argument("--batch-size", type=int, help="pipeline batch size (default 256; 32 with --quick)")
    p.add_argument("--repeats", type=int, help="timed repeats per contender (default 3; 1 with --quick)")
    p.add_argument("--warmup", type=int, default=1, help="untimed repeats first (default 1)")
    p.add_argument("--count", type=int, help="images to generate when no DATASET is given")
    p.add_argument("--model-step", metavar="MS", help="model step in ms per batch per GPU, or module:function to time")
    p.add_argument("--gpus", type=int, default=1, help="GPUs fed by this host (with --model-step)")
    p.add_argument("--target", type=float, help="images/s to feed (default: what the GPUs consume)")
    p.add_argument(
        "--profiles",
        default="hdd,cloud-disk,ssd-lite",
        help="--suite slow-disk: comma-separated device profiles (hdd, cloud-disk, ssd-lite)",
    )
    p.set_defaults(func=bench_main)
    return p


def bench_main(args) -> int:
    """CLI handler: builds :class:`BenchOptions`, runs, prints the table."""
    try:
        opts = BenchOptions(
            dataset=args.dataset,
            quick=args.quick,
            suite=args.suite,
            out=args.out,
            peer_python=dict(args.peer_python),
            threads=args.threads,
            batch_size=args.batch_size,
            repeats=args.repeats,
            warmup=args.warmup,
            count=args.count,
            model_step=args.model_step,
            gpus=args.gpus,
            target=args.target,
            profiles=tuple(x.strip() for x in args.profiles.split(",") if x.strip()),
            argv=("fastload", *sys.argv[1:]),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    outcome = run_bench(opts)
    print(outcome["text"])
    print(f"\nwrote {outcome['paths']['json']}, {outcome['paths']['table']}, {outcome['paths']['png']}")
    return 0
