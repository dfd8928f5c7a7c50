"""Measurement stage, resume: the state's size and the time from ``load_state_dict`` to the first batch.

For a dataset of a million records (``--records``), a job of 8 ranks saves its position in the
middle of an epoch; rank 0 of a job of 6 ranks (the new world size) loads it and takes its first
batch. Measured:

- the state's size: bytes of ``json.dumps``, ``pickle.dumps`` and ``torch.save`` of
  ``Loader.state_dict()`` after one, two and three resumes in the epoch (its size does not depend
  on the dataset's);
- ``resume``: seconds from ``load_state_dict(state)`` to the first batch in hand, under the new world
  size (the remaining records recomputed from the seed: one pass over the epoch's order per resume),
  on a loader just made (untimed), as after a restart;
- ``fresh``: seconds from ``set_epoch(e)`` to the first batch of a whole epoch on a loader just made,
  the baseline: the difference is what resuming costs.

Paired and alternated: every round times ``resume`` and ``fresh``, in reversed order on every other
round; medians, min-max and the median ratio are printed, one JSON line each.
Through ``fastload.Loader`` for the ``global``, ``block`` and ``shard`` orders, and through
``fastload.torch.DataLoader`` with ``OrderSampler`` (``global``).

The dataset is the million-record RecordIO folder of :mod:`bench.startup` (the benchmark's images
as 32x32 thumbnails, reused cyclically; built once and cached in ``--out``), made from a small
generated image folder unless ``--source`` names one. It is one shard; the ``shard`` order groups its
records as shards of 1,000 (a view declaring those ``shard_starts``), which is all the order reads.

    python -m bench.resume_bench                    # 1,000,000 records, 7 rounds
    python -m bench.resume_bench --quick            # 20,000 records, 3 rounds (smoke run)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["main", "measure", "state_sizes"]

NEW_WORLD, OLD_WORLD, BATCH = 6, 8, 256


class _ShardView:
    """A dataset seen as shards of ``shard`` records (``shard_starts``); everything else is the dataset's."""

    def __init__(self, dataset: Any, shard: int) -> None:
        import numpy as np

        self._ds = dataset
        n = len(dataset)
        self.shard_starts = np.append(np.arange(0, n, shard, dtype=np.int64), n)

    def __len__(self) -> int:
        return len(self._ds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ds, name)


def _loader(dataset: Any, shuffle: str, rank: int, world: int, batch: int):
    from fastload.loader import Loader, LoaderConfig
    from fastload.transforms import eval_transform

    config = LoaderConfig(
        batch_size=batch,
        transform=eval_transform(32, resize=32),
        shuffle=shuffle,
        seed=7,
        rank=rank,
        world_size=world,
        num_threads=2,
        prefetch=2,
        block_size=256,
        window=4,
    )
    return Loader(dataset, config)


def saved_states(dataset: Any, shuffle: str, depth: int) -> list[dict[str, Any]]:
    """States after 1..``depth`` resumes in epoch 0: jobs of 8, 5, 7 ranks each taking 3 batches per rank.

    Only rank 0 of each job runs (every rank saves the same state).
    """
    states: list[dict[str, Any]] = []
    worlds = (OLD_WORLD, 5, 7)[:depth]
    for world in worlds:
        with _loader(dataset, shuffle, 0, world, BATCH) as loader:
            if states:
                loader.load_state_dict(states[-1])
            else:
                loader.set_epoch(0)
            it = iter(loader)
            for _ in range(3):
                next(it)
            it.close()
            states.append(loader.state_dict())
    return states


def state_sizes(state: dict[str, Any]) -> dict[str, int]:
    """Bytes of ``state`` as JSON, pickle and ``torch.save``."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    return {
        "json": len(json.dumps(state).encode()),
        "pickle": len(pickle.dumps(state)),
        "torch_save": buf.tell(),
    }


def _first_batch(make: Callable[[], Any], start: Callable[[Any], None]) -> float:
    """Seconds from ``start(loader)`` to the first batch in hand, on a loader just made (untimed).

    A new loader every time, as after a restart: nothing of an earlier order is cached.
    """
    loader = make()
    try:
        t0 = time.perf_counter()
        start(loader)
        it = iter(loader)
        next(it)
        seconds = time.perf_counter() - t0
        close = getattr(it, "close", None)
        if close is not None:
            close()
    finally:
        loader.close()
    return seconds


def measure(pairs: dict[str, tuple[Callable[[], float], Callable[[], float]]], rounds: int) -> list[dict[str, Any]]:
    """``{name: (resume, fresh)}``: alternated, reversed every other round; medians and ratios."""
    rows = []
    for name, (resume, fresh) in pairs.items():
        times: dict[str, list[float]] = {"resume": [], "fresh": []}
        resume(), fresh()  # warm-up (page cache, allocator)
        for r in range(rounds):
            order = (("resume", resume), ("fresh", fresh))
            for label, fn in order if r % 2 == 0 else order[::-1]:
                times[label].append(fn())
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            {
                "case": name,
                "resume_s": round(med["resume"], 4),
                "fresh_s": round(med["fresh"], 4),
                "resume_range_s": [round(min(times["resume"]), 4), round(max(times["resume"]), 4)],
                "fresh_range_s": [round(min(times["fresh"]), 4), round(max(times["fresh"]), 4)],
                "ratio": round(med["resume"] / med["fresh"], 2),
                "rounds": rounds,
            }
        )
    return rows


def _dataloader_pair(dataset: Any, state_loader: dict[str, Any]) -> tuple[Callable[[], float], Callable[[], float]]:
    from fastload.torch import DataLoader, OrderSampler
    from fastload.transforms import eval_transform

    def make(rank: int, world: int):
        sampler = OrderSampler(dataset, seed=7, rank=rank, world_size=world)
        return DataLoader(dataset, batch_size=BATCH, sampler=sampler, transform=eval_transform(32, resize=32))

    saver = make(0, OLD_WORLD)
    it = iter(saver)
    for _ in range(3):
        next(it)
    state = saver.state_dict()
    saver.close()
    state_loader["dataloader"] = state

    def resume() -> float:
        return _first_batch(lambda: make(0, NEW_WORLD), lambda loader: loader.load_state_dict(state))

    def fresh() -> float:
        return _first_batch(lambda: make(0, NEW_WORLD), lambda loader: loader.set_epoch(1))

    return resume, fresh


def run(path: str, rounds: int) -> list[dict[str, Any]]:
    """Every measurement on the dataset at ``path``; one dict per printed line."""
    from fastload.records.dataset import open_dataset

    out: list[dict[str, Any]] = []
    with open_dataset(path) as ds:
        n = len(ds)
        pairs: dict[str, tuple[Callable[[], float], Callable[[], float]]] = {}
        for shuffle in ("global", "block", "shard"):
            data = _ShardView(ds, 1000) if shuffle == "shard" else ds
            states = saved_states(data, shuffle, 3)
            for depth, state in enumerate(states, 1):
                out.append({"records": n, "shuffle": shuffle, "resumes": depth, "state_bytes": state_sizes(state)})

            def make(data: Any = data, shuffle: str = shuffle) -> Any:
                return _loader(data, shuffle, 0, NEW_WORLD, BATCH)

            for depth in (1, 3):
                state = states[depth - 1]
                pairs[f"Loader {shuffle}, {depth} resume(s), {OLD_WORLD}->{NEW_WORLD} ranks"] = (
                    lambda make=make, state=state: _first_batch(make, lambda loader: loader.load_state_dict(state)),
                    lambda make=make: _first_batch(make, lambda loader: loader.set_epoch(1)),
                )
        dl_states: dict[str, Any] = {}
        pairs[f"DataLoader + OrderSampler global, {OLD_WORLD}->{NEW_WORLD} ranks"] = _dataloader_pair(ds, dl_states)
        sizes = state_sizes(dl_states["dataloader"])
        out.append({"records": n, "shuffle": "global", "what": "DataLoader", "state_bytes": sizes})
        for row in measure(pairs, rounds):
            out.append({"records": n, **row})
    return out


def _source(out: str) -> str:
    from tools.make_dataset import make_dataset

    root = os.path.join(out, "cache", "resume-source")
    if not os.path.isdir(root):
        make_dataset(root, count=64, seed=3, classes=4, tiny=True, workers=2)
    return root


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.resume_bench [--quick] [--records N] [--rounds R] [--out DIR] [--source PATH]``."""
    from bench.startup import build_records_dataset

    p = argparse.ArgumentParser(prog="bench.resume_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20,000 records, 3 rounds")
    p.add_argument("--records", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--out", default="bench-out")
    p.add_argument("--source", default=None, help="images to build the dataset from (default: generated)")
    args = p.parse_args(argv)
    records = args.records or (20_000 if args.quick else 1_000_000)
    rounds = args.rounds or (3 if args.quick else 7)
    if records < OLD_WORLD * BATCH * 4 or rounds < 1:
        p.error(f"--records must be >= {OLD_WORLD * BATCH * 4} and --rounds >= 1")
    source = args.source or _source(args.out)
    path, info = build_records_dataset(source, os.path.join(args.out, "cache"), records=records)
    print(json.dumps({"dataset": path, **info}), flush=True)
    for row in run(path, rounds):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
