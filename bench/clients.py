"""Measurement stage, real clients: each training script's speed-up through its own code, paired.

The client scripts live with the tests (``tests/clients/``, ``tests/mxnet_clients/``), written in the
style of the real ones: torchvision's reference ``train.py`` (with its augmentation recipe: TrivialAugment,
random erasing, the MixUp / CutMix collate; and plain), pytorch/examples ``imagenet/main.py``, a
Lightning ``Trainer.fit``, timm's ``train.py`` (``create_loader``, prefetcher), MXNet's
``train_imagenet.py`` (``Module.fit``; the ImageNet augmentation and ``--aug-level 3``) and
GluonCV's ``--use-rec`` loop. (timm's ``rand-*-inc1`` policies stop with Pillow 13 on timm's side:
its posterize reaches 0 bits, which Pillow 13 refuses; the RandAugment client uses ``rand-m9-mstd0.5``,
which never does.) Each runs as written (torch's ``DataLoader``, MXNet's
``ImageRecordIter``) and with only the loader changed (the ``DataLoader`` import line replaced by
``from fastload.torch import DataLoader``; ``--iterator fastload``), on the same images, each in a
fresh process with ``--bench``: the script iterates its own training loader twice (the first pass
warms the page cache, the workers or the engine; the second is timed: **loader**) and then trains
one epoch with its tiny model (timed: **epoch**).

The two sides of a client alternate run by run (torch then fastload, fastload then torch, ...), after
one untimed warm-up pair; each ratio compares two runs seconds apart, and the report gives the
median of the per-pair ratios with their quartiles. Targets: at least 3x for the torch clients and
2.5x for the MXNet ones, on the loader pass.

Run: ``python -m bench.clients [--data DIR] [--count 2000] [--rounds 3] [--only timm,gluoncv]
[--json OUT]`` (``--quick``: 48 small images, one pair, no warm-up: the smoke run of the tests).
The dataset (``DIR/train``, ``DIR/val`` and their ``.rec`` / ``.idx``) is generated once with
``tools/make_dataset.py`` and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CLIENTS", "Client", "ClientResult", "main", "prepare_data", "run_clients"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_PATH = Path(REPO)
TORCH_CLIENTS = os.path.join(REPO, "tests", "clients")
MXNET_CLIENTS = os.path.join(REPO, "tests", "mxnet_clients")
TORCH_IMPORT = "from torch.utils.data import DataLoader\n"
FASTLOAD_IMPORT = "from fastload.torch import DataLoader\n"
#: Minimum paired loader-pass speed-up per family.
TARGETS = {"torch": 3.0, "mxnet": 2.5}


@dataclass(frozen=True)
class Setup:
    """What a client's command line needs: the dataset, the sizes, and where the run writes."""

    data: str
    count: int
    classes: int
    size: int
    batch: int
    workers: int
    out: str


@dataclass(frozen=True)
class Client:
    """One script and its arguments; ``family`` says how its loader is swapped."""

    name: str
    family: str  # "torch": the import line; "mxnet": --iterator
    script: str
    args: Callable[[Setup, str], list[str]]  # (setup, bench json) -> arguments


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torch_common(s: Setup) -> list[str]:
    return ["-b", str(s.batch), "-j", str(s.workers), "--size", str(s.size)]


def _mxnet_imagenet(aug: list[str]) -> Callable[[Setup, str], list[str]]:
    def args(s: Setup, out: str) -> list[str]:
        rec = os.path.join(s.data, "rec")
        return [
            "--data-train",
            os.path.join(rec, "train.rec"),
            "--data-train-idx",
            os.path.join(rec, "train.idx"),
            "--image-shape",
            f"3,{s.size},{s.size}",
            "--num-classes",
            str(s.classes),
            "--num-examples",
            str(s.count),
            "--batch-size",
            str(s.batch),
            "--data-nthreads",
            str(s.workers),
            "--cpus",
            "0",
            "--num-epochs",
            "1",
            "--disp-batches",
            "100000",
            "--bench",
            out,
            *aug,
        ]

    return args


def _gluoncv(s: Setup, out: str) -> list[str]:
    rec = os.path.join(s.data, "rec")
    return [
        "--rec-train",
        os.path.join(rec, "train.rec"),
        "--rec-train-idx",
        os.path.join(rec, "train.idx"),
        "--rec-val",
        os.path.join(rec, "val.rec"),
        "--rec-val-idx",
        os.path.join(rec, "val.idx"),
        "--input-size",
        str(s.size),
        "--batch-size",
        str(s.batch),
        "--num-workers",
        str(s.workers),
        "--classes",
        str(s.classes),
        "--cpus",
        "0",
        "--bench",
        out,
    ]


CLIENTS: tuple[Client, ...] = (
    Client(
        "torchvision-reference-augmented",
        "torch",
        "reference_train.py",
        lambda s, o: [
            s.data,
            s.out,
            *_torch_common(s),
            "--auto-augment",
            "ta_wide",
            "--random-erase",
            "0.1",
            "--bench",
            o,
        ],
    ),
    Client(
        "torchvision-reference-plain",
        "torch",
        "reference_train.py",
        lambda s, o: [s.data, s.out, *_torch_common(s), "--no-mixup", "--bench", o],
    ),
    Client(
        "pytorch-examples-imagenet",
        "torch",
        "imagenet_main.py",
        lambda s, o: [
            s.data,
            s.out,
            "--rank",
            "0",
            "--world-size",
            "1",
            "--port",
            str(_port()),
            *_torch_common(s),
            "--bench",
            o,
        ],
    ),
    Client(
        "lightning",
        "torch",
        "lightning_fit.py",
        lambda s, o: [os.path.join(s.data, "train"), s.out, *_torch_common(s), "--bench", o],
    ),
    Client("timm", "torch", "timm_train.py", lambda s, o: [s.data, s.out, *_torch_common(s), "--bench", o]),
    Client(
        "timm-randaugment-erasing",
        "torch",
        "timm_train.py",
        lambda s, o: [
            s.data,
            s.out,
            *_torch_common(s),
            "--aa",
            "rand-m9-mstd0.5",
            "--reprob",
            "0.25",
            "--bench",
            o,
        ],
    ),
    Client(
        "mxnet-train-imagenet-imagenet-aug",
        "mxnet",
        "train_imagenet.py",
        _mxnet_imagenet(["--use-imagenet-data-augmentation", "1"]),
    ),
    Client("mxnet-train-imagenet-aug-level-3", "mxnet", "train_imagenet.py", _mxnet_imagenet(["--aug-level", "3"])),
    Client("gluoncv-use-rec", "mxnet", "train_gluon.py", _gluoncv),
)


# --- the dataset -------------------------------------------------------------------------------


def _write_rec(folder: str, prefix: str) -> int:
    """The folder's JPEGs as an MXNet ``.rec`` / ``.idx`` pair (im2rec's pass-through layout), labels by class."""
    import mxnet as mx

    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    rec = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    n = 0
    try:
        for label, cls in enumerate(classes):
            for name in sorted(os.listdir(os.path.join(folder, cls))):
                with open(os.path.join(folder, cls, name), "rb") as fh:
                    rec.write_idx(n, mx.recordio.pack(mx.recordio.IRHeader(0, float(label), n, 0), fh.read()))
                n += 1
    finally:
        rec.close()
    return n


def _jpeg_count(folder: str) -> int:
    return sum(len(files) for _, _, files in os.walk(folder)) if os.path.isdir(folder) else 0


def prepare_data(root: str, *, count: int, seed: int = 0, tiny: bool = False, rec: bool = True) -> dict:
    """``root/train`` (``count`` images, 10 classes), ``root/val`` and ``root/rec``; what exists is reused.

    The folders are ``tools/make_dataset.py`` output (train: ``--seed seed``, val: ``count // 10``
    images, ``--seed seed + 1``); a folder holding another number of files is made again. ``rec``:
    also write the ``.rec`` / ``.idx`` pairs the MXNet clients read (with MXNet's own writer); False
    where only torch clients run, so that a machine without MXNet runs them.
    """
    marker = os.path.join(root, "READY.json")
    spec = {"count": count, "seed": seed, "tiny": tiny, "classes": 10}
    if os.path.exists(marker):
        with open(marker) as fh:
            made = json.load(fh)
        if {k: v for k, v in made.items() if k != "rec"} == spec and (made.get("rec", True) or not rec):
            return spec
        if {k: v for k, v in made.items() if k != "rec"} != spec:
            raise SystemExit(f"{root} holds another benchmark dataset ({marker}); give another --data folder")
    sys.path.insert(0, REPO)  # tools/ is a top-level package of the checkout
    from tools.make_dataset import make_dataset

    os.makedirs(os.path.join(root, "rec"), exist_ok=True)
    for split, n, split_seed in (("train", count, seed), ("val", max(40, count // 10), seed + 1)):
        folder = os.path.join(root, split)
        if _jpeg_count(folder) != n:
            make_dataset(folder, count=n, seed=split_seed, classes=10, tiny=tiny, overwrite=True, quiet=True)
        if rec:
            _write_rec(folder, os.path.join(root, "rec", split))
    with open(marker, "w") as fh:
        json.dump({**spec, "rec": rec}, fh)
    return spec


# --- the runs ----------------------------------------------------------------------------------


@dataclass
class Run:
    loader_ips: float
    epoch_ips: float
    loader: str
    warnings: list[str]
    inner_ips: float | None = None  # timm's prefetcher path: the DataLoader inside PrefetchLoader alone


@dataclass
class ClientResult:
    """One client's paired runs: per-pair ratios (fastload over torch / MXNet) and each side's img/s."""

    name: str
    family: str
    target: float
    loader_ratios: list[float] = field(default_factory=list)
    epoch_ratios: list[float] = field(default_factory=list)
    inner_ratios: list[float] = field(default_factory=list)
    runs: dict[str, list[Run]] = field(default_factory=lambda: {"base": [], "fastload": []})
    error: str | None = None

    def summary(self) -> dict:
        out: dict = {"name": self.name, "family": self.family, "target": self.target, "error": self.error}
        for key, ratios in (("loader", self.loader_ratios), ("epoch", self.epoch_ratios), ("inner", self.inner_ratios)):
            if ratios:
                q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
                out[key] = {"median": statistics.median(ratios), "q1": q[0], "q3": q[2], "pairs": len(ratios)}
                for side in ("base", "fastload"):
                    values = [getattr(r, f"{key}_ips") for r in self.runs[side][-len(ratios) :]]
                    out[key][f"{side}_ips"] = statistics.median(values)
        runs = self.runs["fastload"]
        out["fastload_loader_class"] = runs[-1].loader if runs else None
        out["fastload_warnings"] = sorted({w for r in runs for w in r.warnings if "fastload" in w})
        return out


def _script(client: Client, side: str, tmp: str) -> list[str]:
    """The command of one side: the script as written, or with only its loader swapped."""
    if client.family == "mxnet":
        return [
            sys.executable,
            os.path.join(MXNET_CLIENTS, client.script),
            "--iterator",
            "fastload" if side == "fastload" else "mxnet",
        ]
    path = os.path.join(TORCH_CLIENTS, client.script)
    if side == "base":
        return [sys.executable, path]
    with open(path) as fh:
        text = fh.read()
    if text.count(TORCH_IMPORT) != 1:
        raise RuntimeError(f"{client.script}: expected one line {TORCH_IMPORT.strip()!r}")
    swapped = os.path.join(tmp, f"fastload_{client.script}")
    with open(swapped, "w") as fh:
        fh.write(text.replace(TORCH_IMPORT, FASTLOAD_IMPORT))
    return [sys.executable, swapped]


def _run_once(client: Client, side: str, setup: Setup, tmp: str, timeout: float) -> Run:
    out = os.path.join(tmp, f"{client.name}-{side}.json")
    if os.path.exists(out):
        os.remove(out)
    cmd = _script(client, side, tmp) + client.args(setup, out)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not os.path.exists(out):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise RuntimeError(f"{client.name} ({side}) exited {proc.returncode}: " + " | ".join(tail))
    with open(out) as fh:
        r = json.load(fh)
    return Run(
        loader_ips=r["loader_images"] / r["loader_seconds"],
        epoch_ips=r["epoch_images"] / r["epoch_seconds"],
        loader=r["loader"],
        warnings=list(r.get("warnings", [])),
        inner_ips=r["inner_images"] / r["inner_seconds"] if "inner_seconds" in r else None,
    )


def run_clients(
    clients: Sequence[Client],
    setup: Setup,
    *,
    rounds: int,
    warmup: bool = True,
    timeout: float = 1800.0,
    log: Callable[[str], None] = print,
) -> list[ClientResult]:
    """Each client's paired runs: ``rounds`` timed pairs (after an untimed one with ``warmup``), sides alternated."""
    results = []
    with tempfile.TemporaryDirectory(prefix="fastload-clients-") as tmp:
        for client in clients:
            res = ClientResult(client.name, client.family, TARGETS[client.family])
            results.append(res)
            try:
                for r in range(rounds + (1 if warmup else 0)):
                    order = ("base", "fastload") if r % 2 == 0 else ("fastload", "base")
                    pair = {side: _run_once(client, side, setup, tmp, timeout) for side in order}
                    timed = not (warmup and r == 0)
                    log(
                        f"{client.name:<36} {'pair' if timed else 'warm-up'} {r}: loader "
                        f"{pair['base'].loader_ips:7.1f} -> {pair['fastload'].loader_ips:7.1f} img/s, epoch "
                        f"{pair['base'].epoch_ips:7.1f} -> {pair['fastload'].epoch_ips:7.1f} img/s"
                    )
                    if not timed:
                        continue
                    for side in order:
                        res.runs[side].append(pair[side])
                    res.loader_ratios.append(pair["fastload"].loader_ips / pair["base"].loader_ips)
                    res.epoch_ratios.append(pair["fastload"].epoch_ips / pair["base"].epoch_ips)
                    base_inner, fl_inner = pair["base"].inner_ips, pair["fastload"].inner_ips
                    if base_inner and fl_inner:
                        res.inner_ratios.append(fl_inner / base_inner)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                res.error = str(exc)
                log(f"{client.name}: {exc}")
    return results


def format_report(results: Sequence[ClientResult]) -> str:
    lines = [
        "== real clients through their own scripts: fastload / torch's DataLoader or MXNet's ImageRecordIter "
        "(median of per-pair ratios, quartiles; img/s medians)",
        f"{'client':<36} {'loader pass':>12} {'quartiles':>13} {'img/s base -> fastload':>24} "
        f"{'epoch':>8} {'img/s base -> fastload':>24} {'target':>7}",
    ]
    for res in results:
        s = res.summary()
        if res.error or "loader" not in s:
            lines.append(f"{res.name:<36} error: {res.error}")
            continue
        ld, ep = s["loader"], s["epoch"]
        ok = "met" if ld["median"] >= res.target else "NOT met"
        lines.append(
            f"{res.name:<36} {ld['median']:>11.2f}x {ld['q1']:>5.2f}-{ld['q3']:<5.2f}x "
            f"{ld['base_ips']:>10.1f} -> {ld['fastload_ips']:>9.1f} {ep['median']:>7.2f}x "
            f"{ep['base_ips']:>10.1f} -> {ep['fastload_ips']:>9.1f} {res.target:>5.1f}x {ok}"
        )
        if "inner" in s:
            inner = s["inner"]
            lines.append(
                f"{'':<36} the DataLoader inside timm's PrefetchLoader alone: {inner['median']:.2f}x "
                f"({inner['q1']:.2f}-{inner['q3']:.2f}x), {inner['base_ips']:.1f} -> {inner['fastload_ips']:.1f} img/s"
            )
        if s["fastload_warnings"]:
            lines.append(f"{'':<36} fastload said: {' | '.join(w[:160] for w in s['fastload_warnings'])}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clients", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "fastload-clients-data"))
    parser.add_argument("--count", type=int, default=2000, help="training images (at least 2,000 for the targets)")
    parser.add_argument("--rounds", type=int, default=3, help="timed pairs per client")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="loader workers / threads")
    parser.add_argument("--only", default="", help="comma-separated client names (default: all)")
    parser.add_argument("--json", default="", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="smoke run: 48 small images, one pair, no warm-up")
    args = parser.parse_args(argv)
    clients = list(CLIENTS)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {c.name for c in CLIENTS})
        if unknown:
            parser.error(f"unknown clients {unknown}; known: {[c.name for c in CLIENTS]}")
        clients = [c for c in CLIENTS if c.name in wanted]
    if args.quick:
        args.count, args.rounds, args.size, args.batch = 48, 1, 48, 8
        if args.data == parser.get_default("data"):
            args.data += "-quick"
    # The scripts run in folders of their own: a relative --data would name another folder there.
    args.data = os.path.abspath(args.data)
    t0 = time.perf_counter()
    spec = prepare_data(args.data, count=args.count, tiny=args.quick, rec=any(c.family == "mxnet" for c in clients))
    with tempfile.TemporaryDirectory(prefix="fastload-clients-out-") as out:
        setup = Setup(
            args.data, args.count, spec["classes"], args.size, args.batch, args.workers, os.path.join(out, "o")
        )
        results = run_clients(clients, setup, rounds=args.rounds, warmup=not args.quick)
    report = format_report(results)
    print(report)
    print(
        f"({len(clients)} clients, {args.count} images, batch {args.batch}, size {args.size}, "
        f"{args.workers} workers / threads, {time.perf_counter() - t0:.0f} s)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "argv": list(argv) if argv is not None else sys.argv[1:],
                    "count": args.count,
                    "results": [r.summary() for r in results],
                },
                fh,
                indent=1,
            )
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
