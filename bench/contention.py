"""Measurement stage, contention: fastload against torch's DataLoader and MXNet's ImageRecordIter when
the loader does not have the machine to itself.

Two settings, each covering four clients:

* ``burner``: a CPU burner process (a Python busy loop) takes one core for the whole comparison;
  the consumer runs a light training step (average pool, linear layer, SGD);
* ``cpu-step``: no burner; the training step itself uses the CPU in the consumer thread (a small
  CNN's forward, backward and SGD step at the framework's default intra-op threads), sized to a
  fraction of what the framework's own loader takes per batch: a step as slow as the loading makes
  any loader's epoch the step's, and the comparison says nothing. Each row reports the step's own
  time per batch (``step ms``, measured alone in the setting) beside the loaders' figures.

Clients (the ``fastload`` side changes only the class, as a user would):

* ``torch``: ``ImageFolder(RandomResizedCrop + flip + ToTensor + Normalize)``, ``shuffle=True``,
  ``num_workers``: ``fastload.torch.DataLoader`` / ``torch.utils.data.DataLoader``;
* ``torch-mixup``: the same with torchvision's reference-script ``collate_fn``,
  ``v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)])`` on ``default_collate(batch)``;
* ``mxnet-fit``: one epoch of ``mx.mod.Module.fit`` over MXNet's ``train_imagenet.py`` training
  iterator (``common/data.py``'s arguments, ``--aug-level 1``): ``fastload.mxnet.ImageRecordIter`` /
  ``mx.io.ImageRecordIter``;
* ``gluon``: a GluonCV-style loop (``split_and_load``, ``autograd``, ``Trainer.step``) over GluonCV's
  ``--use-rec`` training iterator, the same two classes.

Method: each comparison alternates its two sides epoch by epoch (:func:`bench.paired.run_pair`: one
untimed warm-up pair, then ``rounds`` pairs, the order swapped every pair), so every ratio compares two
epochs seconds apart; the figure is the median of the per-pair img/s ratios. On the fastload side each
epoch also reports the loader's ``wait_slot`` (the producer waiting for a slot to come back while
its prefetch queue is short: a stall) and ``wait_consumer`` (the producer ``prefetch`` batches ahead,
waiting for a slower consumer) as fractions of the epoch; the largest over the timed epochs is shown.

Targets: fastload at least 2x the framework's own loader in every row, ``wait_slot`` under 2% of every
epoch. Run ``python -m bench.contention [DATASET] [--rounds 3] [--out DIR]`` (DATASET: an image folder
or nothing to generate 2,000 realistic JPEGs; ``--quick`` is the smoke run the tests use).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .harness import machine_line
from .paired import run_pair

__all__ = ["CLIENTS", "SETTINGS", "TARGET_RATIO", "TARGET_WAIT_SLOT", "burner", "main", "run"]

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
SETTINGS = ("burner", "cpu-step")
CLIENTS = ("torch", "torch-mixup", "mxnet-fit", "gluon")
TARGET_RATIO = 2.0  # fastload img/s over the framework's, median of the pairs, every row
TARGET_WAIT_SLOT = 0.02  # fastload's wait_slot as a fraction of an epoch, every timed epoch

_BURN = "while True:\n    pass\n"


@contextmanager
def burner(active: bool = True) -> Iterator[subprocess.Popen | None]:
    """A CPU burner process (one busy Python loop: one core) for the duration of the block."""
    if not active:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", _BURN], stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


class _Sample:
    __slots__ = ("images", "seconds")

    def __init__(self, images: int, seconds: float) -> None:
        self.images, self.seconds = images, seconds


@dataclass
class Contender:
    """One side of a comparison: ``make()`` builds ``(loader, run_epoch)``; ``run()`` times an epoch.

    ``run_epoch(loader) -> images`` runs one whole epoch, consumer step included. ``stats(loader)``
    (fastload sides) returns the loader's :class:`~fastload.stats.LoaderStats` since its last reset.
    """

    name: str
    make: Callable[[], tuple[object, Callable[[object], int]]]
    stats: Callable[[object], object] | None = None
    reset: Callable[[object], None] | None = None
    waits: list[dict[str, float]] = field(default_factory=list)
    _loader: object = None
    _run: Callable[[object], int] | None = None

    def run(self) -> _Sample:
        if self._loader is None:
            self._loader, self._run = self.make()
        assert self._run is not None
        if self.reset is not None:
            self.reset(self._loader)
        t0 = time.perf_counter()
        images = self._run(self._loader)
        seconds = time.perf_counter() - t0
        if self.stats is not None:
            s = self.stats(self._loader).seconds
            self.waits.append({k: s.get(k, 0.0) / seconds for k in ("wait_slot", "wait_consumer", "wait_data")})
        return _Sample(images, seconds)

    def close(self) -> None:
        close = getattr(self._loader, "close", None)
        if close is not None:
            close()
        self._loader = self._run = None


# --- torch ---------------------------------------------------------------------------------------


def _torch_step(heavy: bool, classes: int):
    """``step(images, targets)``: a light step (pool + linear) or a small CNN, SGD, in this thread."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if heavy:
        model = nn.Sequential(
            nn.AvgPool2d(8),
            nn.Conv2d(3, 16, 3),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, classes),
        )
    else:
        model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step(images, targets) -> None:
        loss = loss_fn(model(images), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def torch_contenders(
    images_root: str, *, mixup: bool, heavy: bool, batch_size: int, workers: int, size: int
) -> tuple[Contender, Contender]:
    """(fastload.torch.DataLoader, torch DataLoader) over the same ImageFolder, same step."""
    import torch.utils.data as tud
    from torchvision import datasets
    from torchvision import transforms as T
    from torchvision.transforms import v2

    import fastload.torch as ft

    tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    classes = len(datasets.ImageFolder(images_root).classes)

    def collate():
        if not mixup:
            return None
        mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes)])

        def collate_fn(batch):
            return mix(*tud.default_collate(batch))

        return collate_fn

    def maker(cls):
        def make():
            loader = cls(
                datasets.ImageFolder(images_root, tf),
                batch_size=batch_size,
                shuffle=True,
                num_workers=workers,
                collate_fn=collate(),
            )
            step = _torch_step(heavy, classes)

            def epoch(dl) -> int:
                n = 0
                for x, y in dl:
                    step(x, y)
                    n += int(x.shape[0])
                return n

            return loader, epoch

        return make

    def reset(dl) -> None:
        if dl.loader is not None:
            dl.loader.reset_stats()

    kind = "MixUp/CutMix collate_fn" if mixup else "plain"
    return (
        Contender(f"fastload.torch DataLoader, {kind}", maker(ft.DataLoader), stats=lambda dl: dl.stats(), reset=reset),
        Contender(f"torch DataLoader, {kind}", maker(tud.DataLoader)),
    )


# --- MXNet ---------------------------------------------------------------------------------------


def _mx_symbol(heavy: bool, classes: int):
    import mxnet as mx

    net = mx.sym.var("data")
    if heavy:
        net = mx.sym.Pooling(net, kernel=(8, 8), stride=(8, 8), pool_type="avg")
        net = mx.sym.Convolution(net, kernel=(3, 3), num_filter=16, name="conv0")
        net = mx.sym.Activation(net, act_type="relu")
        net = mx.sym.Pooling(net, global_pool=True, pool_type="avg", kernel=(1, 1))
    else:
        net = mx.sym.Pooling(net, kernel=(8, 8), stride=(8, 8), pool_type="avg")
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=classes, name="fc")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def _gluon_net(heavy: bool, classes: int):
    from mxnet import gluon

    net = gluon.nn.HybridSequential()
    if heavy:
        net.add(gluon.nn.AvgPool2D(8), gluon.nn.Conv2D(16, 3, activation="relu"), gluon.nn.GlobalAvgPool2D())
    else:
        net.add(gluon.nn.AvgPool2D(8))
    net.add(gluon.nn.Dense(classes))
    return net


def mxnet_contenders(
    rec: str, *, gluon: bool, heavy: bool, records: int, classes: int, batch_size: int, threads: int, size: int
) -> tuple[Contender, Contender]:
    """(fastload.mxnet.ImageRecordIter, mx.io.ImageRecordIter) under Module.fit or a Gluon loop."""
    import mxnet as mx

    import fastload.mxnet as fm

    from .mxnet_iters import data_py_train_kwargs, gluoncv_train_kwargs

    if gluon:
        kwargs = gluoncv_train_kwargs(rec, color=True, batch_size=batch_size, size=size, threads=threads)
    else:
        kwargs = data_py_train_kwargs(rec, aug_level=1, batch_size=batch_size, size=size, threads=threads)

    def fit_epoch(state) -> int:
        it, mod = state
        mod.fit(
            it,
            num_epoch=1,
            optimizer="sgd",
            optimizer_params={"learning_rate": 0.01, "momentum": 0.9},
            initializer=mx.init.Xavier(),
            eval_metric="acc",
        )
        mx.nd.waitall()
        return records

    def gluon_epoch(state) -> int:
        from mxnet import autograd
        from mxnet import gluon as g

        it, (net, trainer, loss_fn) = state
        n = 0
        it.reset()
        for batch in it:
            data = g.utils.split_and_load(batch.data[0], ctx_list=[mx.cpu()], batch_axis=0)
            label = g.utils.split_and_load(batch.label[0], ctx_list=[mx.cpu()], batch_axis=0)
            with autograd.record():
                losses = [loss_fn(net(x), y) for x, y in zip(data, label, strict=True)]
            for loss in losses:
                loss.backward()
            trainer.step(batch_size)
            n += batch_size - batch.pad
        mx.nd.waitall()
        return n

    def maker(cls):
        def make():
            it = cls(**kwargs)
            if gluon:
                from mxnet import gluon as g

                net = _gluon_net(heavy, classes)
                net.initialize(mx.init.Xavier(), ctx=[mx.cpu()])
                net.hybridize()
                trainer = g.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
                return _Closing(it, (net, trainer, g.loss.SoftmaxCrossEntropyLoss())), gluon_epoch
            mod = mx.mod.Module(_mx_symbol(heavy, classes), context=[mx.cpu()])
            return _Closing(it, mod), fit_epoch

        return make

    def stats(state):
        return state[0].stats()

    def reset(state) -> None:
        state[0].loader.reset_stats()

    kind = "Gluon loop" if gluon else "Module.fit"
    return (
        Contender(f"fastload.mxnet.ImageRecordIter, {kind}", maker(fm.ImageRecordIter), stats=stats, reset=reset),
        Contender(f"mx.io.ImageRecordIter, {kind}", maker(mx.io.ImageRecordIter)),
    )


class _Closing(tuple):
    """``(iterator, model)``; ``close()`` closes the iterator when it can."""

    def __new__(cls, it, model):
        return super().__new__(cls, (it, model))

    def close(self) -> None:
        close = getattr(self[0], "close", None)
        if close is not None:
            close()


# --- the step alone ------------------------------------------------------------------------------


def _median_ms(run: Callable[[], None], repeats: int = 5) -> float:
    run()  # warm-up: first-call allocations, primitive caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def step_ms(client: str, *, heavy: bool, classes: int, batch_size: int, size: int) -> float:
    """The consumer's training step alone on a random batch (median ms), in the current setting."""
    if client.startswith("torch"):
        import torch

        step = _torch_step(heavy, classes)
        x, y = torch.randn(batch_size, 3, size, size), torch.randint(0, classes, (batch_size,))
        return _median_ms(lambda: step(x, y))
    import mxnet as mx

    x = mx.nd.random.uniform(shape=(batch_size, 3, size, size))
    y = mx.nd.array([k % classes for k in range(batch_size)])
    sgd = {"learning_rate": 0.01, "momentum": 0.9}
    if client == "gluon":
        from mxnet import autograd
        from mxnet import gluon as g

        net = _gluon_net(heavy, classes)
        net.initialize(mx.init.Xavier())
        net.hybridize()
        trainer = g.Trainer(net.collect_params(), "sgd", sgd)
        loss_fn = g.loss.SoftmaxCrossEntropyLoss()

        def gluon_step() -> None:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(batch_size)
            mx.nd.waitall()

        return _median_ms(gluon_step)
    mod = mx.mod.Module(_mx_symbol(heavy, classes), context=[mx.cpu()])
    mod.bind(data_shapes=[("data", x.shape)], label_shapes=[("softmax_label", y.shape)])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(optimizer="sgd", optimizer_params=sgd)
    batch = mx.io.DataBatch([x], [y])

    def module_step() -> None:
        mod.forward_backward(batch)
        mod.update()
        mx.nd.waitall()

    return _median_ms(module_step)


# --- the run -------------------------------------------------------------------------------------


def _row(setting: str, client: str, ratio, fast: Contender, step: float) -> dict:
    worst = {k: max((w[k] for w in fast.waits), default=0.0) for k in ("wait_slot", "wait_consumer", "wait_data")}
    return {
        "setting": setting,
        "client": client,
        "numerator": ratio.numerator,
        "denominator": ratio.denominator,
        "median_ratio": ratio.median,
        "q1": ratio.q1,
        "q3": ratio.q3,
        "pairs": ratio.pairs,
        "numerator_ips": ratio.extra["numerator_ips"],
        "denominator_ips": ratio.extra["denominator_ips"],
        "wait_slot_max": worst["wait_slot"],
        "wait_consumer_max": worst["wait_consumer"],
        "wait_data_max": worst["wait_data"],
        "step_ms": step,
        "met": ratio.median >= TARGET_RATIO and worst["wait_slot"] < TARGET_WAIT_SLOT,
    }


def run(
    dataset: str | None,
    *,
    rounds: int = 3,
    count: int | None = None,
    batch_size: int = 64,
    workers: int = 2,
    size: int = 224,
    settings: Sequence[str] = SETTINGS,
    clients: Sequence[str] = CLIENTS,
    quick: bool = False,
    argv: Sequence[str] = (),
    log=sys.stderr,
) -> dict:
    """Prepare the data, run every (setting, client) comparison, return the report."""
    from .harness import environment
    from .prepare import prepare

    with prepare(dataset, quick=quick, count=count, restart_index=False, tmpfs=False) as data:
        if data.images_root is None or data.rec is None:
            raise RuntimeError(f"the contention benchmark needs an image folder and a .rec: {data.missing}")
        from torchvision import datasets

        classes = len(datasets.ImageFolder(data.images_root).classes)
        with open(os.path.splitext(data.rec)[0] + ".idx") as fh:
            records = sum(1 for line in fh if line.strip())  # the .rec MXNet reads (its first shard)
        rows = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*pin_memory.*")
            for setting in settings:
                heavy = setting == "cpu-step"
                for client in clients:
                    if client.startswith("torch"):
                        fast, ref = torch_contenders(
                            data.images_root,
                            mixup=client == "torch-mixup",
                            heavy=heavy,
                            batch_size=batch_size,
                            workers=workers,
                            size=size,
                        )
                    else:
                        fast, ref = mxnet_contenders(
                            data.rec,
                            gluon=client == "gluon",
                            heavy=heavy,
                            records=records,
                            classes=classes,
                            batch_size=batch_size,
                            threads=workers,
                            size=size,
                        )
                    print(f"running {setting} / {client} ({rounds} pairs + 1 warm-up) ...", file=log, flush=True)
                    try:
                        with burner(setting == "burner"):
                            step = step_ms(client, heavy=heavy, classes=classes, batch_size=batch_size, size=size)
                            ratio = run_pair(f"{setting}: {client}", fast, ref, rounds=rounds)
                    finally:
                        fast.close()
                        ref.close()
                    rows.append(_row(setting, client, ratio, fast, step))
        return {
            "environment": environment(list(argv)),
            "dataset": data.describe(),
            "batch_size": batch_size,
            "workers": workers,
            "size": size,
            "rounds": rounds,
            "rows": rows,
        }


def format_report(report: dict) -> str:
    env = report["environment"]
    lines = [
        machine_line(env),
        f"command: {env['command']}",
        f"dataset: {report['dataset']['source']} ({report['dataset']['images']} images); batch "
        f"{report['batch_size']}, {report['workers']} workers / decode threads, {report['size']}x{report['size']}",
        "",
        f"{'setting':<9} {'client':<12} {'ratio':>6} {'quartiles':>11} {'fastload':>9} {'theirs':>8} "
        f"{'wait_slot':>9} {'wait_cons':>9} {'step ms':>7} {'target':>7}",
    ]
    for r in report["rows"]:
        lines.append(
            f"{r['setting']:<9} {r['client']:<12} {r['median_ratio']:>5.2f}x {r['q1']:>4.2f}-{r['q3']:<5.2f} "
            f"{r['numerator_ips']:>9,.0f} {r['denominator_ips']:>8,.0f} {100 * r['wait_slot_max']:>8.1f}% "
            f"{100 * r['wait_consumer_max']:>8.1f}% {r['step_ms']:>7.0f} {'ok' if r['met'] else 'MISSED':>7}"
        )
    lines += [
        "",
        "ratio = median of per-pair img/s ratios (fastload / the framework's loader), the sides alternating epoch",
        "by epoch; fastload / theirs = img/s over the timed epochs. wait_slot, wait_cons(umer) = fastload's producer",
        "waiting for a slot / for the consumer, the largest share of an epoch; step ms = the consumer's training",
        "step alone on one batch, in the setting (median). Target: ratio >= "
        f"{TARGET_RATIO:.0f}x and wait_slot < {100 * TARGET_WAIT_SLOT:.0f}% in every row.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", nargs="?", help="an ImageFolder tree (default: generate realistic JPEGs)")
    parser.add_argument("--rounds", type=int, default=3, help="timed pairs per comparison")
    parser.add_argument("--count", type=int, default=None, help="images to generate (default 2000; quick: 96)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="num_workers / preprocess_threads of every loader")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated subset of {SETTINGS}")
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated subset of {CLIENTS}")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny dataset, 1 pair, small batches")
    parser.add_argument("--out", default=None, help="folder for results.json and table.txt")
    args = parser.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    clients = [c for c in args.clients.split(",") if c]
    bad = [s for s in settings if s not in SETTINGS] + [c for c in clients if c not in CLIENTS]
    if bad:
        parser.error(f"unknown settings or clients: {', '.join(bad)}")
    command = ["python -m bench.contention", *list(sys.argv[1:] if argv is None else argv)]
    if args.quick:
        args.rounds, args.batch_size, args.size = min(args.rounds, 1), min(args.batch_size, 16), 64
    report = run(
        args.dataset,
        rounds=args.rounds,
        count=args.count,
        batch_size=args.batch_size,
        workers=args.workers,
        size=args.size,
        settings=settings,
        clients=clients,
        quick=args.quick,
        argv=command,
    )
    text = format_report(report)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        with open(os.path.join(args.out, "table.txt"), "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
