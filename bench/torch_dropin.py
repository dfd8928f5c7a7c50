"""Benchmarks, drop-in form: a torchvision training script with only the DataLoader import changed.

The pytorch/examples ImageNet input pipeline -- ``ImageFolder(root, Compose([RandomResizedCrop(224),
RandomHorizontalFlip(), ToTensor(), Normalize(mean, std)]))``, ``batch_size=256, shuffle=True,
num_workers=2, pin_memory=True`` -- is run with ``torch.utils.data.DataLoader`` and with
``fastload.torch.DataLoader`` (same arguments), and the same for the evaluation pipeline
(``Resize(256), CenterCrop(224), ToTensor(), Normalize``, no shuffle). The packed form reads the
same images after ``fastload pack`` through ``fastload.torch.ImageDataset(packed, same Compose)``,
and its uint8 twin (``PILToTensor()`` instead of ``ToTensor() + Normalize``) tells what the float
output costs.

Method: each comparison alternates its two sides epoch by epoch (A B, then B A, ...) after one
untimed warm-up pair, so every ratio compares two epochs seconds apart on this shared machine; the
figure reported is the median of the per-pair ratios (quartiles beside it), next to each side's
median images/s. An epoch is timed from ``iter(loader)`` to its last batch, worker start-up
included (torch's ``persistent_workers=False`` default, as the example script), and the loop body
only touches the batch. The input files are read through the page cache before every epoch.

Run ``python -m bench.torch_dropin [DATASET] [--rounds 5] [--out DIR]`` (DATASET: an image
folder, or nothing to generate 2,000 realistic JPEGs); ``--quick`` is the smoke run the tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .harness import machine_line

__all__ = ["TARGETS", "Comparison", "Side", "main", "run"]

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

#: What the comparisons must reach (numerator / denominator, median of the paired ratios).
TARGETS = {
    "train, unpacked folder: fastload.torch / torch DataLoader": (">=", 2.5),
    "train, packed: fastload.torch / torch DataLoader": (">=", 3.0),
    "train, packed: float32 normalized / uint8 output, fastload.torch": (">=", 0.9),
    "eval, unpacked folder: fastload.torch / torch DataLoader": (">=", 2.5),
    # The augmentation target: the same pipelines in torchvision side by side, fastload at least 3x.
    "train, reference recipe (TrivialAugmentWide + RandomErasing), unpacked: fastload.torch / torch": (">=", 3.0),
}


@dataclass
class Side:
    """One loader configuration: ``make()`` builds the loader, run epoch by epoch."""

    name: str
    make: Callable[[], object]
    inputs: Sequence[str]
    ips: list[float] = field(default_factory=list)
    _loader: object = None

    def epoch(self) -> float:
        """Images/s of one epoch."""
        if self._loader is None:
            self._loader = self.make()
        _warm(self.inputs)
        images = 0
        t0 = time.perf_counter()
        for x, _ in self._loader:
            images += int(x.shape[0])
        seconds = time.perf_counter() - t0
        return images / seconds

    def close(self) -> None:
        close = getattr(self._loader, "close", None)
        if close is not None:
            close()
        self._loader = None


@dataclass
class Comparison:
    """``numerator`` against ``denominator``, alternated epoch by epoch."""

    check: str
    numerator: Side
    denominator: Side
    ratios: list[float] = field(default_factory=list)

    def run(self, rounds: int) -> None:
        for r in range(rounds + 1):
            order = (self.numerator, self.denominator) if r % 2 == 0 else (self.denominator, self.numerator)
            got = {id(side): side.epoch() for side in order}
            if r == 0:
                continue  # warm-up pair
            a, b = got[id(self.numerator)], got[id(self.denominator)]
            self.numerator.ips.append(a)
            self.denominator.ips.append(b)
            self.ratios.append(a / b)

    def summary(self) -> dict:
        q = statistics.quantiles(self.ratios, n=4) if len(self.ratios) >= 2 else [self.ratios[0]] * 3
        _op, target = TARGETS.get(self.check, (">=", None))
        median = statistics.median(self.ratios)
        return {
            "check": self.check,
            "numerator": self.numerator.name,
            "denominator": self.denominator.name,
            "median_ratio": median,
            "q1": q[0],
            "q3": q[2],
            "pairs": len(self.ratios),
            "numerator_ips": statistics.median(self.numerator.ips),
            "denominator_ips": statistics.median(self.denominator.ips),
            "target": target,
            "met": None if target is None else median >= target,
        }


def _warm(paths: Sequence[str]) -> None:
    """Read the inputs through the page cache (untimed): every side starts with the same cache state."""
    chunk = bytearray(8 << 20)
    for root in paths:
        for folder, _, files in os.walk(root):
            for name in files:
                try:
                    with open(os.path.join(folder, name), "rb", buffering=0) as f:
                        while f.readinto(chunk):
                            pass
                except OSError:
                    pass


def _pipelines(size: int, resize: int):
    from torchvision import transforms as T

    train = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    train_u8 = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()])
    evaluate = T.Compose([T.Resize(resize), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])
    return train, train_u8, evaluate


def recipe_pipeline(size: int):
    """torchvision's reference recipe (ClassificationPresetTrain, ``--auto-augment ta_wide
    --random-erase 0.1`` of the recipes that train ResNet-50 to 80.9%): bilinear RRC, flip,
    TrivialAugmentWide, PILToTensor, ConvertImageDtype, Normalize, RandomErasing."""
    import torch
    from torchvision import transforms as T

    return T.Compose(
        [
            T.RandomResizedCrop(size),
            T.RandomHorizontalFlip(),
            T.TrivialAugmentWide(),
            T.PILToTensor(),
            T.ConvertImageDtype(torch.float),
            T.Normalize(MEAN, STD),
            T.RandomErasing(0.1),
        ]
    )


def comparisons(
    images_root: str, packed: str | None, *, batch_size: int, workers: int, size: int, resize: int
) -> list[Comparison]:
    """The comparisons of the drop-in benchmark (the packed ones when ``packed`` is given)."""
    import torch.utils.data as tud
    from torchvision import datasets

    import fastload.torch as ft

    train, train_u8, evaluate = _pipelines(size, resize)
    args = dict(batch_size=batch_size, shuffle=True, num_workers=workers, pin_memory=True)
    eval_args = dict(batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=True)

    def folder(tf):
        return datasets.ImageFolder(images_root, tf)

    torch_train = Side(
        "torch DataLoader, ImageFolder, train", lambda: tud.DataLoader(folder(train), **args), [images_root]
    )
    out = [
        Comparison(
            "train, unpacked folder: fastload.torch / torch DataLoader",
            Side(
                "fastload.torch DataLoader, ImageFolder, train",
                lambda: ft.DataLoader(folder(train), **args),
                [images_root],
            ),
            torch_train,
        )
    ]
    if packed is not None:
        packed_float = Side(
            "fastload.torch DataLoader, packed, train float32",
            lambda: ft.DataLoader(ft.ImageDataset(packed, train), **args),
            [packed],
        )
        packed_u8 = Side(
            "fastload.torch DataLoader, packed, train uint8",
            lambda: ft.DataLoader(ft.ImageDataset(packed, train_u8), **args),
            [packed],
        )
        out.append(
            Comparison(
                "train, packed: fastload.torch / torch DataLoader",
                packed_float,
                Side(torch_train.name, torch_train.make, torch_train.inputs),
            )
        )
        out.append(
            Comparison(
                "train, packed: float32 normalized / uint8 output, fastload.torch",
                Side(packed_float.name, packed_float.make, packed_float.inputs),
                packed_u8,
            )
        )
    recipe = recipe_pipeline(size)
    out.append(
        Comparison(
            "train, reference recipe (TrivialAugmentWide + RandomErasing), unpacked: fastload.torch / torch",
            Side(
                "fastload.torch DataLoader, ImageFolder, recipe",
                lambda: ft.DataLoader(folder(recipe), **args),
                [images_root],
            ),
            Side(
                "torch DataLoader, ImageFolder, recipe", lambda: tud.DataLoader(folder(recipe), **args), [images_root]
            ),
        )
    )
    out.append(
        Comparison(
            "eval, unpacked folder: fastload.torch / torch DataLoader",
            Side(
                "fastload.torch DataLoader, ImageFolder, eval",
                lambda: ft.DataLoader(folder(evaluate), **eval_args),
                [images_root],
            ),
            Side(
                "torch DataLoader, ImageFolder, eval",
                lambda: tud.DataLoader(folder(evaluate), **eval_args),
                [images_root],
            ),
        )
    )
    return out


def fidelity(images_root: str, *, size: int, resize: int, limit: int = 256, batch_size: int = 32) -> dict:
    """Mean absolute difference to torchvision's own pipeline, in normalized units, train and eval.

    Eval: ``fastload.torch.DataLoader`` against ``torch.utils.data.DataLoader`` on the same
    ImageFolder and transform. Train: the engine's sampled crop and flip of every image (its boxes
    are a pure function of the iterator's ``base_seed`` and the index) replayed through torchvision's
    functional API (``resized_crop``, ``hflip``, ``to_tensor``, ``normalize``) on the PIL image, so
    both sides crop the same box.
    """
    import torch
    import torch.utils.data as tud
    import torchvision.transforms.functional as TF
    from torchvision import datasets

    import fastload.torch as ft
    from fastload.transforms import sample_params

    train, _, evaluate = _pipelines(size, resize)
    ds_eval = datasets.ImageFolder(images_root, evaluate)
    subset = list(range(0, len(ds_eval), max(1, len(ds_eval) // limit)))[:limit]
    ours = torch.cat([x for x, _ in ft.DataLoader(tud.Subset(ds_eval, subset), batch_size=batch_size)])
    theirs = torch.cat([x for x, _ in tud.DataLoader(tud.Subset(ds_eval, subset), batch_size=batch_size)])
    per_image_eval = (ours - theirs).abs().flatten(1).mean(1)
    ds_train = datasets.ImageFolder(images_root, train)
    loader = ft.DataLoader(tud.Subset(ds_train, subset), batch_size=batch_size)
    plan = ft.compile_transform(train)
    it = iter(loader)
    got = torch.cat([x for x, _ in it])
    diffs = []
    for k, i in enumerate(subset):
        img = ds_train.loader(ds_train.samples[i][0])
        p = sample_params(img.width, img.height, plan.geometry, seed=it.base_seed & ((1 << 63) - 1), epoch=0, index=i)
        ref = TF.resized_crop(img, int(p.y0), int(p.x0), int(p.y1 - p.y0), int(p.x1 - p.x0), [size, size])
        ref = TF.normalize(TF.to_tensor(TF.hflip(ref) if p.flip else ref), MEAN, STD)
        diffs.append(float((got[k] - ref).abs().mean()))
    return {
        "images": len(subset),
        "eval_mean_abs": float(per_image_eval.mean()),
        "eval_worst_image": float(per_image_eval.max()),
        "train_mean_abs": statistics.fmean(diffs),
        "train_worst_image": max(diffs),
    }


def run(
    dataset: str | None,
    *,
    rounds: int = 5,
    count: int | None = None,
    batch_size: int = 256,
    workers: int = 2,
    size: int = 224,
    resize: int = 256,
    quick: bool = False,
    argv: Sequence[str] = (),
    log=sys.stderr,
) -> dict:
    """Prepare the data, run every comparison, return the report (see the module docstring)."""
    from .harness import environment
    from .prepare import prepare

    with prepare(dataset, quick=quick, count=count, restart_index=False, tmpfs=False) as data:
        if data.images_root is None:
            raise RuntimeError(f"no image folder for the torch side: {data.missing}")
        rows = []
        with warnings.catch_warnings():
            # pin_memory=True on a machine without CUDA: torch's (and fastload's) warning, once per epoch.
            warnings.filterwarnings("ignore", message=".*pin_memory.*")
            for comp in comparisons(
                data.images_root, data.packed, batch_size=batch_size, workers=workers, size=size, resize=resize
            ):
                print(f"running {comp.check} ({rounds} pairs + 1 warm-up) ...", file=log, flush=True)
                try:
                    comp.run(rounds)
                finally:
                    comp.numerator.close()
                    comp.denominator.close()
                rows.append(comp.summary())
            print("measuring pixel fidelity ...", file=log, flush=True)
            fid = fidelity(data.images_root, size=size, resize=resize, limit=32 if quick else 256)
        return {
            "environment": environment(list(argv)),
            "dataset": data.describe(),
            "batch_size": batch_size,
            "num_workers": workers,
            "size": size,
            "rounds": rounds,
            "comparisons": rows,
            "fidelity": fid,
        }


def format_report(report: dict) -> str:
    env = report["environment"]
    lines = [
        machine_line(env),
        f"command: {env['command']}",
        f"dataset: {report['dataset']['source']} ({report['dataset']['images']} images, "
        f"{report['dataset']['mean_kb']} KB mean); batch {report['batch_size']}, num_workers "
        f"{report['num_workers']}, {report['size']}x{report['size']}",
        "",
        f"{'comparison':<66} {'ratio':>6} {'quartiles':>11} {'num img/s':>10} {'den img/s':>10} {'target':>8}",
    ]
    for r in report["comparisons"]:
        target = "" if r["target"] is None else f">={r['target']:.1f} {'ok' if r['met'] else 'MISSED'}"
        lines.append(
            f"{r['check']:<66} {r['median_ratio']:>5.2f}x {r['q1']:>4.2f}-{r['q3']:<5.2f} "
            f"{r['numerator_ips']:>10,.0f} {r['denominator_ips']:>10,.0f} {target:>8}"
        )
    lines.append("")
    lines.append("ratio = median of per-pair ratios, the two sides alternating epoch by epoch; img/s = medians.")
    fid = report.get("fidelity")
    if fid:
        grey = 1.0 / (255 * statistics.fmean(STD))  # one grey level in normalized units
        lines.append(
            f"pixels against torchvision's own pipeline, {fid['images']} images, mean absolute difference in "
            f"normalized units (1 grey level ~ {grey:.4f}): eval {fid['eval_mean_abs']:.4f} (worst image "
            f"{fid['eval_worst_image']:.4f}), train with the engine's crops replayed through torchvision "
            f"{fid['train_mean_abs']:.4f} (worst image {fid['train_worst_image']:.4f})"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", nargs="?", help="an ImageFolder tree (default: generate realistic JPEGs)")
    parser.add_argument("--rounds", type=int, default=5, help="timed pairs per comparison")
    parser.add_argument("--count", type=int, default=None, help="images to generate (default 2000; quick: 96)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2, help="num_workers of both loaders")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--resize", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny dataset, 1 pair, small batches")
    parser.add_argument("--out", default=None, help="folder for results.json and table.txt")
    args = parser.parse_args(argv)
    argv = ["python -m bench.torch_dropin", *list(sys.argv[1:] if argv is None else argv)]
    if args.quick:
        args.rounds, args.batch_size, args.size, args.resize = min(args.rounds, 1), min(args.batch_size, 16), 64, 72
    report = run(
        args.dataset,
        rounds=args.rounds,
        count=args.count,
        batch_size=args.batch_size,
        workers=args.workers,
        size=args.size,
        resize=args.resize,
        quick=args.quick,
        argv=argv,
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
