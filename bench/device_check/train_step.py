"""Part 4, ``train_step``: is a ResNet-50 training step input-bound, fed by each loader?

torchvision's ResNet-50 (a SqueezeNet in the dry run), bf16 autocast, channels-last, SGD with
momentum, batch ``B``, eager mode with cuDNN autotuning, fed by:

- a synthetic batch already on the device (the step's own speed: what a loader must match);
- ``fastload.torch.DataLoader`` on restart-indexed shards with ``device=`` (the uint8 batch copied
  on its own stream, normalized to float on the device, channels-last);
- ``fastload.torch.DataLoader`` as a drop-in for the usual recipe: ``ImageFolder`` with torchvision's
  ``RandomResizedCrop``, ``RandomHorizontalFlip``, ``ToTensor``, ``Normalize``, ``pin_memory=True``,
  and the training loop's own ``.to(device, non_blocking=True)``;
- torch's ``DataLoader`` on the same ``ImageFolder`` and transforms, one worker process per core;
- the synthetic batch again (drift of the GPU between the first and the last feed).

Per feed: images/s over the timed steps, milliseconds per step, and the GPU's idle fraction: one
minus the time between CUDA events recorded around each step's compute (forward, backward,
optimizer), over the wall time. The copy and the channels-last conversion of a host batch count as
idle: the compute waits for them. CPU seconds per image of the whole process (its workers included)
tell what each feed costs the host. The cores fastload needs to match the synthetic rate come from
the ``scaling`` part's Loader rates (the driver computes them once both parts ran).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

from bench.device_check.measure import Recorder, cpu_seconds
from bench.device_check.plan import Config

__all__ = ["run"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def run(config: Config, rec: Recorder) -> None:
    import torch
    import torch.nn.functional as F
    import torchvision
    from torch.utils.data import DataLoader as TorchDataLoader
    from torch.utils.data import RandomSampler
    from torchvision import datasets
    from torchvision import transforms as T

    import fastload
    import fastload.torch as ft

    device = torch.device(config.device)
    cuda = device.type == "cuda"
    sizes = config.sizes
    B, S = sizes.batch, sizes.size
    workers = config.cores
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = getattr(torchvision.models, sizes.model)(num_classes=1000).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    rec.set(
        "model", f"torchvision {sizes.model}, bf16 autocast, channels_last, SGD(momentum=0.9), eager, cudnn.benchmark"
    )
    rec.set("batch", B)
    rec.set("image_size", S)
    rec.set("workers", workers)

    def step(x, y) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def to_device(batch) -> tuple[Any, Any]:
        x, y = batch
        x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        return x, y.to(device, non_blocking=True)

    def measure(name: str, batches: Iterator, *, skip: int, group: int = 1, **extra: Any) -> dict[str, Any]:
        t_first, first = time.perf_counter(), 0.0
        for k in range(skip):
            step(*next(batches))
            if k == 0:
                sync()
                first = time.perf_counter() - t_first
        sync()
        steps = math.ceil(sizes.train_steps / group) * group
        events, host_busy = [], 0.0
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        for _ in range(steps):
            x, y = next(batches)
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step(x, y)
                end.record()
                events.append((start, end))
            else:
                t = time.perf_counter()
                step(x, y)
                host_busy += time.perf_counter() - t
        sync()
        wall = time.perf_counter() - t0
        cpu = cpu_seconds() - cpu0
        busy = sum(s.elapsed_time(e) for s, e in events) / 1e3 if cuda else host_busy
        row = {
            "feed": name,
            "steps": steps,
            "images_per_s": round(steps * B / wall, 1),
            "step_ms": round(1e3 * wall / steps, 2),
            "compute_ms": round(1e3 * busy / steps, 2),
            "gpu_idle": round(max(0.0, 1.0 - busy / wall), 3),
            "cpu_s_per_1k_images": round(1e3 * cpu / (steps * B), 3),
            "first_step_s": round(first, 2),
            **extra,
        }
        rec.row("feeds", row)
        return row

    def synthetic() -> Iterator:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn((B, 3, S, S), generator=gen).to(device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (B,), generator=gen).to(device)
        while True:
            yield x, y

    def endless(loader, place=None) -> Iterator:
        try:
            while True:
                for batch in loader:
                    yield place(batch) if place is not None else batch
        finally:
            close = getattr(loader, "close", None)
            if close is not None:
                close()

    measure("synthetic (on the device)", synthetic(), skip=sizes.warmup_steps)

    draws = B * (sizes.train_steps + 2 * workers + 8)
    packed = ft.DataLoader(
        config.packed_restart,
        batch_size=B,
        sampler=RandomSampler(range(_length(config.packed_restart)), num_samples=draws),
        transform=fastload.train(S),
        num_workers=workers,
        pin_memory=cuda,  # a page-locked ring: the copy on the loader's stream is truly asynchronous
        device=device,
        channels_last=True,
        normalize=(MEAN, STD),
    )
    feed = endless(packed, lambda b: (b[0], b[1]))
    try:
        name = "fastload.torch.DataLoader: restart-indexed shards, device= (normalized on the device)"
        measure(name, feed, skip=sizes.loader_skip)
    finally:
        feed.close()

    recipe = T.Compose([T.RandomResizedCrop(S), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    folder = datasets.ImageFolder(config.images, recipe)
    for cls, name, skip, group in (
        (
            ft.DataLoader,
            "fastload.torch.DataLoader: ImageFolder + torchvision transforms, pin_memory",
            sizes.loader_skip,
            1,
        ),
        (TorchDataLoader, "torch DataLoader: ImageFolder + torchvision transforms, pin_memory", workers, workers),
    ):
        sampler = RandomSampler(folder, num_samples=draws, generator=torch.Generator().manual_seed(0))
        loader = cls(folder, batch_size=B, sampler=sampler, num_workers=workers, pin_memory=cuda)
        feed = endless(loader, to_device)
        try:
            measure(name, feed, skip=skip, group=group, num_workers=workers)
        finally:
            feed.close()
            del loader

    measure("synthetic (on the device), again", synthetic(), skip=2)
    if cuda:
        rec.set("max_memory_gib", round(torch.cuda.max_memory_allocated() / 2**30, 2))


def _length(path: str) -> int:
    from fastload.records.dataset import open_dataset

    with open_dataset(path) as ds:
        return len(ds)
