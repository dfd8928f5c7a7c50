"""Device stage (torch), planning: what a pass of :class:`~fastload.torch.DataLoader` runs in the engine.

The compiled transform of a pass (or None: torch's machinery loads it), the output extras
(``device=``, ``devices=``, ``memory_format=``, ``normalize=``, ``dtype=``) that only the engine path
takes, the :class:`~fastload.loader.Loader` the pass runs on, and the epoch a new pass runs.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload.loader import Loader, LoaderConfig
from fastload.records.read_options import ReadOptions
from fastload.torch.compile import Plan, compile_transform
from fastload.torch.datasets import ImageDataset, Source
from fastload.torch.placement import FLOAT_DTYPES, FloatOutput, cuda_release_fences, pinned_allocator
from fastload.torch.sampler import OrderSampler


class _EnginePlanning(torch.utils.data.DataLoader[Any]):
    """The planning half of :class:`fastload.torch.DataLoader` (which sets every attribute below)."""

    transform: Any
    seed: int | None
    num_threads: int | None
    prefetch: int
    device: Any
    devices: Sequence[torch.device | str | int] | None
    memory_format: torch.memory_format | None
    channels_last: bool
    normalize: tuple[Sequence[float], Sequence[float]] | None
    dtype: torch.dtype | None
    on_error: str
    decode_options: Any
    read_options: ReadOptions
    trace_path: str | None
    copy: bool
    _placement_args: dict[str, Any]
    _source: Source | None
    _fallback_reason: str | None
    _core: Loader | None
    _core_key: tuple[Any, ...] | None
    _next_epoch: int
    _explicit_epoch: int | None
    _resume: dict[str, Any] | None
    _warned_plans: set[tuple[str, str | None]]
    _order_generator: torch.Generator | None

    def _check_output_extras(self) -> dict[str, Any]:
        devices = self.devices
        if self.device is not None and devices is not None:
            raise ValueError("give either device= or devices=, not both")
        if devices is not None:
            if isinstance(devices, (str, torch.device)) or len(devices) == 0:
                raise ValueError(f"devices={devices!r} must be a non-empty list of devices")
            targets: list[torch.device] | None = [torch.device(d) for d in devices]
        elif self.device is not None:
            targets = [torch.device(self.device)]
        else:
            targets = None
        if targets is not None:
            cuda = [d for d in targets if d.type == "cuda"]
            if len(set(cuda)) != len(cuda):
                raise ValueError(f"devices={devices!r} lists a CUDA device twice")
            for d in targets:
                if d.type not in ("cuda", "cpu"):
                    raise ValueError(f"device {d}: only 'cuda' and 'cpu' devices are supported")
                if d.type == "cuda" and not torch.cuda.is_available():
                    raise ValueError(f"device {d} requested but CUDA is not available in this torch build")
        memory_format = self.memory_format
        if self.channels_last:
            if memory_format not in (None, torch.channels_last):
                raise ValueError(f"channels_last=True conflicts with memory_format={memory_format}")
            memory_format = torch.channels_last
        memory_format = torch.contiguous_format if memory_format is None else memory_format
        if memory_format not in (torch.contiguous_format, torch.channels_last):
            raise ValueError(f"memory_format={memory_format} must be torch.contiguous_format or torch.channels_last")
        convert = None
        dtype = self.dtype
        if self.normalize is not None:
            try:
                mean, std = (tuple(float(v) for v in x) for x in self.normalize)
            except (TypeError, ValueError):
                raise ValueError(f"normalize={self.normalize!r} must be (mean, std), three floats each") from None
            if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
                raise ValueError(f"normalize={self.normalize!r} must be (mean, std) with 3 values each and std > 0")
            dtype = torch.float32 if dtype is None else dtype
        else:
            mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        if dtype is not None and dtype != torch.uint8:
            if dtype not in FLOAT_DTYPES:
                raise ValueError(f"dtype={dtype} must be torch.uint8 or a float type")
            convert = FloatOutput(dtype, 1.0 / 255.0, mean, std)
        if (self.normalize is not None or self.dtype is not None) and not self._fastload_op_transform():
            raise ValueError(
                "normalize= / dtype= apply to a fastload transform op (fastload.train(), ...); a "
                "torchvision pipeline says the same with ToTensor() / Normalize()"
            )
        return {"targets": targets, "single": devices is None, "memory_format": memory_format, "convert": convert}

    def _fastload_op_transform(self) -> bool:
        from fastload.torch.compile import is_fastload_transform

        return isinstance(self.dataset, ImageDataset) and is_fastload_transform(self.dataset.transform)

    def _check_fast_only_extras(self) -> None:
        if self._placement_args["targets"] is not None:
            raise ValueError(f"device= / devices= need a dataset the fastload engine reads ({self._fallback_reason})")

    def _plan(self) -> Plan | None:
        """The compiled transform for this pass, or None (with one warning) when nothing compiles."""
        source = self._source
        assert source is not None  # only the fast path (a Source) plans
        transform = source.transform
        if transform is None:
            plan = Plan(geometry=None, stop="the dataset has no transform (it yields PIL images of any size)")
        else:
            plan = compile_transform(transform)
        if plan.geometry is None:
            key = ("torch", plan.stop)
            if key not in self._warned_plans:
                self._warned_plans.add(key)
                self._check_fast_only_extras_for(plan)
                warnings.warn(
                    f"fastload: nothing in {type(self.dataset).__name__}'s transform compiles ({plan.stop}); "
                    "this DataLoader loads it with torch's own DataLoader machinery",
                    UserWarning,
                    stacklevel=3,
                )
            return None
        convert = self._placement_args["convert"]
        if convert is not None and self._placement_args["targets"] is None:
            # normalize= / dtype= with a fastload op and no device: the engine writes the floats. (With
            # a device the uint8 batch is copied and converted there: a quarter of the bytes to move.)
            dtype, scale, mean, std = convert.key
            plan = dataclasses.replace(plan, dtype=dtype, scale=scale, mean=mean, std=std)
        return plan

    def _check_fast_only_extras_for(self, plan: Plan) -> None:
        if self._placement_args["targets"] is not None:
            raise ValueError(f"device= / devices= need a transform the engine runs ({plan.stop})")

    def _core_loader(self, plan: Plan, capacity: int, layout: str) -> Loader:
        pin = bool(self.pin_memory) and torch.cuda.is_available()
        threads = self.num_threads if self.num_threads is not None else max(1, self.num_workers)
        spec, _ = plan.engine_transform()
        key = (spec, capacity, layout, threads, self.prefetch, pin)
        if self._core is not None and self._core_key == key:
            return self._core
        if self._core is not None:
            self._core.close()
            self._core = None
        config = LoaderConfig(
            batch_size=capacity,
            transform=spec,
            shuffle="none",
            num_threads=threads,
            prefetch=self.prefetch,
            layout=layout,
            on_error=self.on_error,
            decode_options=self.decode_options,
            read_options=self.read_options,
            trace_path=self.trace_path,
        )
        hooks = (torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop) if torch.cuda.is_available() else None
        assert self._source is not None  # the fast path runs on a Source
        self._core = Loader(
            self._source.records,
            config,
            allocator=lambda shape, dt: pinned_allocator(shape, dt, pin=pin),
            range_hooks=hooks,
            release_hook=cuda_release_fences,
        )
        self._core_key = key
        return self._core

    def _begin_pass(self) -> tuple[int, int]:
        """``(iteration, epoch)`` of a new pass: the pass counter and the epoch of ``seed=`` keys.

        With ``seed=`` and torch's ``RandomSampler`` made by ``shuffle=True``, the sampler's
        generator is seeded from ``(seed, epoch)`` here, before the pass draws its order.
        """
        iteration = self._explicit_epoch if self._explicit_epoch is not None else self._next_epoch
        self._explicit_epoch = None
        self._next_epoch = iteration + 1
        epoch = iteration
        samplers: tuple[Any, ...] = (self.sampler, getattr(self.batch_sampler, "sampler", None), self.batch_sampler)
        for s in samplers:
            if isinstance(s, OrderSampler):
                epoch = s.upcoming_epoch  # it moves to the next epoch by itself when its pass starts
                break
            if s is not None and hasattr(s, "set_epoch") and isinstance(getattr(s, "epoch", None), int):
                epoch = int(s.epoch)
                break
        if self._order_generator is not None and self.seed is not None:
            self._order_generator.manual_seed(order_seed(self.seed, epoch))
        return iteration, epoch


def order_seed(seed: int, epoch: int) -> int:
    """The seed of a ``shuffle=True`` pass's generator for ``(seed, epoch)`` (distinct streams per epoch)."""
    words = np.random.SeedSequence([int(seed), int(epoch), 0x6F72646572]).generate_state(2, np.uint32)
    return int(words[0]) | (int(words[1]) << 32)
