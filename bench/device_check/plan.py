"""What a device check measures and how long each part may take: full sizes on a GPU, tiny ones dry.

The full plan fits 8 minutes on a 16-core GPU machine, the engine's build and the dataset included
(``BUDGETS`` are the per-part ceilings; ``DEADLINE`` bounds the whole run, and a part never gets more
than what the deadline leaves after reserving a minimum for the parts still to come). The dry plan
runs the same code on CPU devices in a minute or two on 2 cores.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

__all__ = ["BUDGETS", "DEADLINE", "MIN_PART_SECONDS", "Config", "Sizes", "sizes_for", "thread_counts"]

# Seconds: the whole run, and each step's ceiling (the full plan; the dry plan's steps are short).
DEADLINE = 450.0
BUDGETS = {
    "build": 180.0,
    "data": 150.0,
    "cuda_tests": 120.0,
    "h2d": 40.0,
    "scaling": 150.0,
    "train_step": 120.0,
    "gpu_decode": 45.0,
}
# What a part is guaranteed when an earlier one overran: below this it is not started.
MIN_PART_SECONDS = 15.0


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """The sizes of one plan.

    Args:
        images: Generated JPEGs (ImageNet-like; small with ``tiny``).
        tiny: Generate small (60-200 px) images instead of ImageNet-sized ones.
        batch: Batch size of every loader, of the copies and of the training step.
        size: Output side of the crops (224 on a GPU).
        window: Seconds each throughput row is measured for (at least).
        min_batches: Batches each throughput row covers (at least).
        train_steps: Timed training steps per feed.
        warmup_steps: Untimed training steps before the synthetic feed (cuDNN's autotuning).
        loader_skip: Untimed training steps of a fastload feed (its prefetched batches and start).
        decode_batches: Timed batches of the GPU-decode part.
        model: The torchvision model of the training step (ResNet-50; a SqueezeNet on the CPU, where
            a ResNet step takes seconds).
        copies: Copies per timed repeat of the host-to-device part.
        repeats: Timed repeats (medians are reported).
    """

    images: int
    tiny: bool
    batch: int
    size: int
    window: float
    min_batches: int
    train_steps: int
    warmup_steps: int
    loader_skip: int
    decode_batches: int
    model: str
    copies: int
    repeats: int


FULL = Sizes(
    images=10_000,
    tiny=False,
    batch=256,
    size=224,
    window=2.0,
    min_batches=4,
    train_steps=24,
    warmup_steps=8,
    loader_skip=3,
    decode_batches=6,
    model="resnet50",
    copies=10,
    repeats=5,
)
DRY = Sizes(
    images=192,
    tiny=True,
    batch=16,
    size=32,
    window=0.25,
    min_batches=2,
    train_steps=2,
    warmup_steps=1,
    loader_skip=1,
    decode_batches=2,
    model="squeezenet1_1",
    copies=2,
    repeats=2,
)


def sizes_for(dry_run: bool) -> Sizes:
    return DRY if dry_run else FULL


def thread_counts(cores: int, dry_run: bool) -> list[int]:
    """1, 2, 4, 8, 16 threads (the dry plan: 1 and 2); more than the machine's cores are left out."""
    if dry_run:
        return [1, 2]
    counts = [t for t in (1, 2, 4, 8, 16) if t <= cores]
    if cores > 16 and cores not in counts:
        counts.append(cores)
    return counts or [1]


@dataclass(frozen=True, kw_only=True)
class Config:
    """What every part process receives (as JSON): the plan, the device and the data's paths.

    Args:
        dry_run: CPU devices and tiny sizes.
        device: ``"cuda"`` or ``"cpu"``.
        cores: CPUs this process may use.
        threads: Thread / worker counts of the scaling part.
        sizes: The plan's sizes.
        images: The ImageFolder tree of generated JPEGs.
        packed: Its plain fastload shards.
        packed_restart: Its restart-indexed shards.
        out: The output folder.
        repo: The repository root.
        budget: Seconds this part may run (set per part by the driver).
    """

    dry_run: bool
    device: str
    cores: int
    threads: tuple[int, ...]
    sizes: Sizes
    images: str
    packed: str
    packed_restart: str
    out: str
    repo: str
    budget: float = 0.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Config:
        raw = json.loads(text)
        raw["sizes"] = Sizes(**raw["sizes"])
        raw["threads"] = tuple(raw["threads"])
        return cls(**raw)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Config:
        with open(path) as fh:
            return cls.from_json(fh.read())
