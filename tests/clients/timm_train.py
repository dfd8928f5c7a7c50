"""A training script in the style of timm's ``train.py``: ``create_dataset`` and ``create_loader`` with its
augmentation arguments, the prefetcher path by default, MixUp / CutMix through ``FastCollateMixup``.

timm's ``create_loader`` looks up ``torch.utils.data.DataLoader`` when it is called; the script points
that name at the ``DataLoader`` it imports (as written, torch's own: no change). The drop-in tests
and ``bench/clients.py`` run it as written and with that import line changed to
``from fastload.torch import DataLoader``. Like train.py: RandomResizedCropAndInterpolation with
``--train-interpolation random``, flips, colour jitter or ``--aa`` (RandAugment / AutoAugment /
AugMix), random erasing (``--reprob``, ``--remode``, in the prefetcher), ``--mixup`` / ``--cutmix``
(FastCollateMixup with the prefetcher, ``Mixup`` in the loop without), SoftTargetCrossEntropy under
mixing, then a validation pass. It records the training batches (shape, dtype, targets), the
validation images and targets, the loader's class and the warnings; with ``--bench OUT.json`` it
times instead: two passes of its train loader alone (the second timed; with the prefetcher also one
pass of the DataLoader inside it) and one training epoch.

Usage: ``python timm_train.py DATA OUT [--aa rand-m9-mstd0.5-inc1] [--reprob 0.25] [--mixup 0.8]
[--no-prefetcher] [-b 8] [-j 2] [--size 64] [--bench OUT.json]``
"""

import argparse
import json
import os
import time
import warnings

import torch
import torch.nn as nn
import torch.utils.data
from timm.data import FastCollateMixup, Mixup, create_dataset, create_loader, resolve_data_config
from timm.data.loader import PrefetchLoader
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch.utils.data import DataLoader

torch.utils.data.DataLoader = DataLoader  # the class timm's create_loader builds


def train_one_epoch(model, loader, optimizer, loss_fn, mixup_fn, prefetcher, device, record):
    model.train()
    n = 0
    for input, target in loader:
        if not prefetcher:
            input, target = input.to(device), target.to(device)
            if mixup_fn is not None:
                input, target = mixup_fn(input, target)
        output = model(input)
        loss = loss_fn(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        n += input.shape[0]
        if record is not None:
            record.append({"shape": list(input.shape), "dtype": str(input.dtype), "target": list(target.shape),
                           "target_dtype": str(target.dtype),
                           "target_sums": target.sum(1).tolist() if target.ndim == 2 else None})
    return n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--aa", default=None)
    parser.add_argument("--reprob", type=float, default=0.0)
    parser.add_argument("--remode", default="pixel")
    parser.add_argument("--recount", type=int, default=1)
    parser.add_argument("--mixup", type=float, default=0.0)
    parser.add_argument("--cutmix", type=float, default=0.0)
    parser.add_argument("--smoothing", type=float, default=0.1)
    parser.add_argument("--train-interpolation", default="random")
    parser.add_argument("--color-jitter", type=float, default=0.4)
    parser.add_argument("--no-prefetcher", action="store_true")
    parser.add_argument("-b", "--batch-size", type=int, default=8)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--bench", default=None, help="time the loader and one epoch, write them here")
    args = parser.parse_args()
    warnings.simplefilter("always")
    caught = []
    warnings.showwarning = lambda message, *a, **k: caught.append(str(message))
    torch.manual_seed(0)
    prefetcher = not args.no_prefetcher
    device = torch.device("cpu")

    dataset_train = create_dataset("", root=os.path.join(args.data, "train"), split="train", is_training=True)
    dataset_eval = create_dataset("", root=os.path.join(args.data, "val"), split="validation")
    num_classes = len(dataset_train.reader.class_to_idx)
    model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(3 * 16, num_classes))
    data_config = resolve_data_config({"input_size": (3, args.size, args.size), "crop_pct": 0.875}, model=model)

    mixup_fn, collate_fn = None, None
    mixup_active = args.mixup > 0 or args.cutmix > 0
    if mixup_active:
        mixup_args = dict(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, label_smoothing=args.smoothing,
                          num_classes=num_classes)
        if prefetcher:
            collate_fn = FastCollateMixup(**mixup_args)
        else:
            mixup_fn = Mixup(**mixup_args)

    loader_train = create_loader(
        dataset_train, input_size=data_config["input_size"], batch_size=args.batch_size, is_training=True,
        use_prefetcher=prefetcher, re_prob=args.reprob, re_mode=args.remode, re_count=args.recount,
        color_jitter=args.color_jitter, auto_augment=args.aa, interpolation=args.train_interpolation,
        mean=data_config["mean"], std=data_config["std"], num_workers=args.workers, collate_fn=collate_fn,
        device=device)
    loader_eval = create_loader(
        dataset_eval, input_size=data_config["input_size"], batch_size=args.batch_size, is_training=False,
        use_prefetcher=prefetcher, interpolation=data_config["interpolation"], mean=data_config["mean"],
        std=data_config["std"], num_workers=args.workers, crop_pct=data_config["crop_pct"], device=device)

    loss_fn = SoftTargetCrossEntropy() if mixup_active else LabelSmoothingCrossEntropy(smoothing=args.smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inner = loader_train.loader if isinstance(loader_train, PrefetchLoader) else loader_train

    if args.bench:
        loader_s, loader_n = 0.0, 0
        for _ in range(2):  # the first pass warms the page cache, the pool, the ring; the second is timed
            t0, loader_n = time.perf_counter(), 0
            for input, target in loader_train:
                loader_n += input.shape[0]
            loader_s = time.perf_counter() - t0
        timings = {}
        if inner is not loader_train:  # the prefetcher's own work aside: the DataLoader alone
            t0, n = time.perf_counter(), 0
            for input, target in inner:
                n += input.shape[0]
            timings.update(inner_images=n, inner_seconds=time.perf_counter() - t0)
        t0 = time.perf_counter()
        epoch_n = train_one_epoch(model, loader_train, optimizer, loss_fn, mixup_fn, prefetcher, device, None)
        epoch_s = time.perf_counter() - t0
        with open(args.bench, "w") as fh:
            json.dump({"loader_images": loader_n, "loader_seconds": loader_s, "epoch_images": epoch_n,
                       "epoch_seconds": epoch_s, "loader": f"{type(inner).__module__}.{type(inner).__name__}",
                       "warnings": caught, **timings}, fh)
        return

    seen = []
    for _ in range(args.epochs):
        train_one_epoch(model, loader_train, optimizer, loss_fn, mixup_fn, prefetcher, device, seen)
    model.eval()
    images, targets = [], []
    with torch.no_grad():
        for input, target in loader_eval:
            images.append(input.clone())
            targets.append(target.clone())
    torch.save({"loader": f"{type(inner).__module__}.{type(inner).__name__}", "seen": seen,
                "eval_images": torch.cat(images), "eval_targets": torch.cat(targets), "warnings": caught}, args.out)


if __name__ == "__main__":
    main()
