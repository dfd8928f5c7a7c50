"""The read-ahead's hand-out rate from the page cache, without the decode, under variants that tell causes apart.

A Loader at 16 threads waited for its reads from the page cache (read_wait ~30 ms a batch of 256
images of ~90 KB, 23 MB) where an older read path waited ~12 ms. This drives
:class:`~fastload.records.readahead.ReadAhead` alone, as the Loader does (global order, batches of
256 handed out one after the other, ``hold`` batches' views kept alive as the decode keeps them,
``consumers`` threads hashing each batch's views with the GIL released, as decode threads would
take the cores), once per variant, variants alternated over ``repeats`` rounds:

- ``auto``: the read path as it is (automatic budget, large reads into reused mappings);
- ``bytes``: large reads into ``bytes`` (no mappings): the mappings' bookkeeping is the cause
  where this one is much faster;
- ``budget256``: a fixed 256 MiB budget (the budget before it was automatic): the small budget
  (reads issued only two batches ahead) is the cause where this one is much faster.

Each row: MB/s and images/s handed out, the wait per batch, minor page faults per batch, CPU
seconds, and the CPU time a read spent in ``ReadBuffers.take`` (serial: under its lock and the GIL).
About a minute on 16 cores with the device check's data::

    python -m bench.read_handout build/device-check-data/packed build/device-check-data/packed-restart
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import resource
import statistics
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

VARIANTS = ("auto", "bytes", "budget256")


def _digest(views: list[Any]) -> None:
    for v in views:
        hashlib.sha1(v).digest()  # releases the GIL for views over 2 KB


def _timed_take(buffers: Any, spent: list[float]) -> None:
    take = buffers.take

    def timed(n: int, cap: int | None = None) -> memoryview:
        t0 = time.thread_time()
        try:
            return take(n, cap)
        finally:
            spent.append(time.thread_time() - t0)

    buffers.take = timed


def measure(path: str, variant: str, *, qd: int, consumers: int, hold: int, batches: int, seed: int) -> dict[str, Any]:
    """One run of ``batches`` batches of 256 through a fresh ReadAhead; the first batch is not timed."""
    from fastload.records.dataset import open_dataset
    from fastload.records.readahead import ReadAhead, ReadOptions

    batch = 256
    with open_dataset(path) as ds:
        n = len(ds)
        rng = np.random.default_rng(seed)
        seq = np.concatenate([rng.permutation(n) for _ in range(-(-batch * batches // n) + 1)]).astype(np.int64)
        options = ReadOptions(queue_depth=qd, budget=256 << 20 if variant == "budget256" else None)
        reader = ReadAhead(ds, options, decode_threads=consumers)  # as the Loader with that many decode threads
        spent: list[float] = []
        buffers = getattr(reader, "_buffers", None)
        if variant == "bytes":
            reader._reads_into = False  # type: ignore[attr-defined]
        elif buffers is not None:
            _timed_take(buffers, spent)
        pool = ThreadPoolExecutor(consumers) if consumers else None
        reader.begin(seq)
        held: deque[list[Any]] = deque()
        decoding: deque[list[Any]] = deque()
        handed = 0
        t0 = time.perf_counter()
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        wait0 = 0.0
        for k in range(batches):
            if k == 1:
                t0, usage0, handed, wait0 = (
                    time.perf_counter(),
                    resource.getrusage(resource.RUSAGE_SELF),
                    0,
                    reader.counters().wait_seconds,
                )
                spent.clear()
            views, errors = reader.records(k * batch, (k + 1) * batch)
            if errors:
                raise RuntimeError(f"{len(errors)} unreadable records: {next(iter(errors.values()))}")
            handed += sum(len(v) for v in views)
            if pool is not None:
                decoding.append([pool.submit(_digest, views[i::consumers]) for i in range(consumers)])
                while len(decoding) > 1:  # one batch decoded while the next is handed out
                    for f in decoding.popleft():
                        f.result()
            held.append(views)
            while len(held) > hold:
                held.popleft()
        for fs in decoding:
            for f in fs:
                f.result()
        seconds = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        counters = reader.counters()
        reader.close()
        if pool is not None:
            pool.shutdown()
    timed = batches - 1
    return {
        "path": path,
        "variant": variant,
        "mb_s": round(handed / seconds / 1e6, 1),
        "images_s": round(timed * batch / seconds, 1),
        "wait_ms_batch": round(1000 * (counters.wait_seconds - wait0) / timed, 2),
        "minflt_batch": round((usage.ru_minflt - usage0.ru_minflt) / timed, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime, 2),
        "take_us": round(1e6 * statistics.fmean(spent), 1) if spent else None,
        "take_ms_batch": round(1000 * sum(spent) / timed, 2) if spent else None,
        "budget_mb": round(getattr(counters, "budget", 0) / 2**20, 1),
        "grown": getattr(counters, "grown", None),
        "mapped": getattr(buffers, "mapped", None),
        "reused": getattr(buffers, "reused", None),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.read_handout", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", help="packed folders (e.g. the device check's packed, packed-restart)")
    p.add_argument("--queue-depth", type=int, default=16, help="reader threads (ReadOptions.queue_depth)")
    p.add_argument("--consumers", type=int, default=16, help="threads hashing the views (decode threads' place)")
    p.add_argument("--hold", type=int, default=2, help="batches whose views stay alive")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {','.join(VARIANTS)}")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        p.error(f"unknown variants {sorted(unknown)}")
    for path in args.paths:  # into the page cache
        for f in sorted(pathlib.Path(path).glob("*")):
            f.read_bytes()
    rows: list[dict[str, Any]] = []
    for r in range(args.repeats):
        order = variants if r % 2 == 0 else variants[::-1]
        for path in args.paths:
            for variant in order:
                row = measure(
                    path,
                    variant,
                    qd=args.queue_depth,
                    consumers=args.consumers,
                    hold=args.hold,
                    batches=args.batches,
                    seed=r,
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("medians:")
    for path in args.paths:
        for variant in variants:
            mine = [x for x in rows if x["path"] == path and x["variant"] == variant]
            med = {
                k: statistics.median(x[k] for x in mine)
                for k in ("mb_s", "images_s", "wait_ms_batch", "minflt_batch", "cpu_s", "take_ms_batch")
                if all(x[k] is not None for x in mine)
            }
            print(json.dumps({"path": path, "variant": variant, **med}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
