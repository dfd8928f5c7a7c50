"""What the read-side checks cost: per-record checksums on vs off, paired in one process.

``python -m bench.read_checks checksums DATASET [--pairs 24]`` loads the dataset epoch after epoch
with a :class:`fastload.loader.Loader` (train(224), batch 64, 2 decode threads), alternating
checksums on and off (ABBA order), and prints the median and quartiles of the per-pair ratios of
wall time and of process CPU time, then the hash's own cost per record.

``python -m bench.read_checks load DATASET [--epochs 3]`` is the loop alone (images/s), for timing
two checkouts against each other as whole processes, alternated (run it with ``PYTHONPATH`` set to
each checkout in turn).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _config():
    from fastload.loader import LoaderConfig
    from fastload.transforms import train

    return LoaderConfig(batch_size=64, transform=train(224), num_threads=2, shuffle="global", seed=0)


def _epoch(dataset, epoch: int) -> tuple[float, float]:
    from fastload.loader import Loader

    with Loader(dataset, _config()) as loader:
        loader.set_epoch(epoch)
        wall, cpu = time.perf_counter(), time.process_time()
        for batch in loader:
            del batch
        return time.perf_counter() - wall, time.process_time() - cpu


def checksums(path: str, pairs: int) -> None:
    import xxhash

    from fastload.records.dataset import open_dataset

    with open_dataset(path) as ds:
        saved = ds._checksum
        if saved is None:
            raise SystemExit(f"{path}: the index has no per-record checksums (pack it with this fastload)")

        def run(on: bool, epoch: int) -> tuple[float, float]:
            ds._checksum = saved if on else None
            return _epoch(ds, epoch)

        run(True, 0), run(False, 0)  # warm-up: page cache, engine threads
        wall, cpu = [], []
        for k in range(pairs):
            order = (True, False) if k % 2 == 0 else (False, True)
            res = {on: run(on, k) for on in order}
            wall.append(res[True][0] / res[False][0])
            cpu.append(res[True][1] / res[False][1])
        ds._checksum = saved
        for name, ratios in (("wall", wall), ("cpu", cpu)):
            q = np.percentile(ratios, [25, 50, 75])
            print(f"checksums on/off, {name}: median {q[1]:.4f} (quartiles {q[0]:.4f}-{q[2]:.4f}), {pairs} pairs")
        payloads = [bytes(ds.payload(i)) for i in range(len(ds))]
    t = time.perf_counter()
    for payload in payloads:
        xxhash.xxh3_64_intdigest(payload)
    dt = time.perf_counter() - t
    print(f"xxh3_64 alone: {dt / len(payloads) * 1e6:.1f} us per record, {sum(map(len, payloads)) / dt / 1e9:.1f} GB/s")


def load(path: str, epochs: int) -> None:
    from fastload.loader import Loader

    images, t = 0, time.perf_counter()
    with Loader(path, _config()) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                images += len(batch.indices)
                del batch
    print(f"{images / (time.perf_counter() - t):.1f} images/s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.read_checks", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("checksums", help="per-record checksums on vs off, paired in one process")
    p.add_argument("path")
    p.add_argument("--pairs", type=int, default=24)
    p = sub.add_parser("load", help="the loader loop alone (images/s)")
    p.add_argument("path")
    p.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.what == "checksums":
        checksums(args.path, args.pairs)
    else:
        load(args.path, args.epochs)


if __name__ == "__main__":
    main()
