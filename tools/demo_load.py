#!/usr/bin/env python3
"""Loader demo: load a packed dataset with ``fastload.torch.DataLoader`` and report what it did.

Usage::

    python tools/demo_load.py PACKED_DIR [--batch-size 64] [--epochs 2] [--size 224] [--threads N]
                                         [--device cpu|cuda] [--shuffle global|block|none]

Prints, per epoch, the batches and images/s; then the loader's ``stats()`` summary (per-stage time and
the fraction of time the consumer waited: is training input-bound?), the decoder backend and the bad
records skipped. Used by ``make demo``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

__all__ = ["main", "run_demo"]


def run_demo(
    path: str,
    *,
    batch_size: int = 64,
    epochs: int = 2,
    size: int = 224,
    threads: int | None = None,
    device: str | None = None,
    shuffle: str = "global",
    out=sys.stdout,
) -> dict:
    """Iterate ``epochs`` epochs of ``path`` and print a report.

    Returns:
        ``{"epochs": [{"batches", "images", "seconds", "images_per_s"}], "stats": LoaderStats.as_dict(),
        "backend": str, "skipped": int}``.
    """
    import fastload
    from fastload.decode import engine_info
    from fastload.torch import DataLoader, ImageDataset, OrderSampler

    info = engine_info()
    report = {"epochs": []}
    dataset = ImageDataset(path, transform=fastload.train(size))
    with DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=OrderSampler(dataset, shuffle=shuffle, seed=0),
        seed=0,
        num_threads=threads,
        device=device,
    ) as loader:
        ds = dataset.records
        print(
            f"dataset {path}: {len(ds)} records ({getattr(ds, 'kind', '?')}), label width {ds.label_width}; "
            f"{len(loader)} batches of {batch_size} per epoch, output {size}x{size} uint8 NCHW",
            file=out,
        )
        print(
            f"decoder: {info['backend']}"
            + (
                f" (libjpeg-turbo {info['libjpeg_turbo']}, {info['simd']})"
                if info["libjpeg_turbo"]
                else f" ({info['reason']})"
            )
            + f", {threads or info['threads']} threads",
            file=out,
        )
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            images = batches = 0
            t0 = time.perf_counter()
            for x, _y in loader:
                batches += 1
                images += x.shape[0]
            seconds = time.perf_counter() - t0
            row = {"batches": batches, "images": images, "seconds": seconds, "images_per_s": images / seconds}
            report["epochs"].append(row)
            print(
                f"epoch {epoch}: {batches} batches, {images} images in {seconds:.2f}s = "
                f"{row['images_per_s']:.0f} images/s",
                file=out,
            )
        stats = loader.stats()
    report["stats"] = stats.as_dict()
    report["backend"] = stats.backend
    report["skipped"] = stats.skipped
    print(f"stats: {stats.summary()}", file=out)
    print(
        f"input-bound: the consumer waited {100 * stats.input_bound:.0f}% of the time "
        "(this demo does no training work, so the loader is the bottleneck by design)",
        file=out,
    )
    print(f"decoder backend used: {stats.backend}; bad records skipped: {stats.skipped}", file=out)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", help="packed fastload folder (or .rec, LMDB folder, ImageFolder tree)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (default: CPU views, no copy)")
    parser.add_argument("--shuffle", default="global", choices=["global", "block", "none"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from fastload.errors import UserError

    try:
        run_demo(
            args.path,
            batch_size=args.batch_size,
            epochs=args.epochs,
            size=args.size,
            threads=args.threads,
            device=args.device,
            shuffle=args.shuffle,
        )
    except (UserError, ValueError, FileNotFoundError) as exc:
        print(f"demo_load: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
