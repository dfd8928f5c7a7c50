"""Part 3, ``scaling``: images/s against cores, fastload's engine and Loader vs torch's DataLoader + PIL.

The same work everywhere: torchvision's ImageNet training crop (``RandomResizedCrop`` with its scale
and ratio, a horizontal flip with p = 0.5) to uint8 CHW batches. Contenders, at each thread / worker
count in turn (so drift of the machine falls on all of them alike):

- the engine alone: ``fastload.decode.decode_batch`` on encoded images already in memory, one call
  per batch (the ceiling of the loader), on plain and on restart-indexed shards;
- ``fastload.Loader``: reads, orders, decodes into its ring, prefetches (plain, restart-indexed);
- torch's ``DataLoader`` over ``torchvision.datasets.ImageFolder`` with torchvision's transforms on
  PIL images, ``num_workers`` worker processes (the usual ImageNet recipe).

Each row is a steady-state rate (:func:`~bench.device_check.measure.stream_rate`): images/s, images/s
per thread (or worker), and images per CPU-second of the process and its workers. The Loader and the
DataLoader draw from one long random order (longer than the dataset), so no epoch boundary falls in
a window.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from bench.device_check.measure import Recorder, stream_rate
from bench.device_check.plan import Config

__all__ = ["run"]


def _row(family: str, shards: str | None, threads: int, measured: dict[str, Any], **extra: Any) -> dict[str, Any]:
    ips = measured["images_per_s"] or 0.0
    cpu = measured["cpu_seconds"]
    return {
        "family": family,
        "shards": shards,
        "threads": threads,
        **measured,
        "per_thread": round(ips / threads, 2),
        "images_per_cpu_s": round(measured["images"] / cpu, 2) if cpu else None,
        **extra,
    }


def _engine_batches(images: list[bytes], transform, *, batch: int, threads: int):
    from fastload.decode import decode_batch

    h, w = transform.size
    out = np.empty((batch, 3, h, w), np.uint8)
    n = len(images)
    for k in itertools.count():
        lo = (k * batch) % n
        chunk = images[lo : lo + batch]
        if len(chunk) < batch:
            chunk = chunk + images[: batch - len(chunk)]
        result = decode_batch(
            chunk,
            out,
            transform,
            seed=0,
            epoch=k,
            indices=np.arange(k * batch, (k + 1) * batch, dtype=np.int64),
            threads=threads,
            layout="NCHW",
        )
        if result.errors:
            raise RuntimeError(
                f"the engine failed on {len(result.errors)} images: {next(iter(result.errors.values()))}"
            )
        yield result


def _loader_batches(loader):
    while True:  # the loader decodes on into the next epoch: no gap at the boundary
        yield from loader


def _read_all(path: str) -> list[bytes]:
    from fastload.records.dataset import open_dataset

    with open_dataset(path) as ds:
        return [bytes(ds.image(i)) for i in range(len(ds))]


def run(config: Config, rec: Recorder) -> None:
    import fastload
    from fastload.loader import Loader, LoaderConfig

    sizes = config.sizes
    transform = fastload.train(sizes.size)
    rec.set("transform", repr(transform))
    rec.set("batch", sizes.batch)
    rec.set("threads", list(config.threads))
    t0 = time.perf_counter()
    encoded = {"plain": _read_all(config.packed), "restart": _read_all(config.packed_restart)}
    rec.set("read_seconds", round(time.perf_counter() - t0, 2))
    rec.set("images_in_memory", {k: len(v) for k, v in encoded.items()})
    rec.set("engine_backend", fastload.info().get("backend"))
    measure = dict(window=sizes.window, min_batches=sizes.min_batches, cap=3 * sizes.window)
    torch_error: str | None = None
    for threads in config.threads:
        for shards, images in encoded.items():
            measured = stream_rate(
                _engine_batches(images, transform, batch=sizes.batch, threads=threads),
                lambda r: len(r.status),
                skip=1,
                **measure,
            )
            rec.row("rows", _row("engine", shards, threads, measured))
        for shards, path in (("plain", config.packed), ("restart", config.packed_restart)):
            cfg = LoaderConfig(
                batch_size=sizes.batch, transform=transform, shuffle="global", num_threads=threads, layout="NCHW"
            )
            with Loader(path, cfg) as loader:
                measured = stream_rate(_loader_batches(loader), lambda b: b.size, skip=1, **measure)
                stats = loader.stats()
            stages = {k: round(v, 3) for k, v in stats.seconds.items() if v}
            extra = dict(input_bound=round(stats.input_bound, 3), stage_seconds=stages, batches_total=stats.batches)
            rec.row("rows", _row("loader", shards, threads, measured, **extra))
        if torch_error is None:
            try:
                measured = _torch_rate(config, threads, measure)
            except Exception as exc:  # recorded once; the fastload rows go on
                torch_error = f"{type(exc).__name__}: {exc}"
                rec.set("torch_error", torch_error)
            else:
                rec.row("rows", _row("torch", None, threads, measured))


def _torch_rate(config: Config, workers: int, measure: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, RandomSampler
    from torchvision import datasets
    from torchvision import transforms as T

    sizes = config.sizes
    tf = T.Compose([T.RandomResizedCrop(sizes.size), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = datasets.ImageFolder(config.images, tf)
    # One long random order: worker start-up is paid once and no epoch boundary falls in the window.
    sampler = RandomSampler(ds, num_samples=len(ds) * 20, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(ds, batch_size=sizes.batch, sampler=sampler, num_workers=workers)
    it = iter(loader)
    try:
        # Each worker prefetches whole batches from the start: skip one round, time whole rounds.
        return stream_rate(it, lambda b: int(b[0].shape[0]), skip=workers, group=workers, **measure)
    finally:
        del it
