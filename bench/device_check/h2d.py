"""Part 2, ``h2d``: host-to-device copies of a batch, pinned vs pageable, and how much hides behind compute.

Copies a ``[B, 3, 224, 224]`` uint8 batch (what the engine writes) and its float16 normalized form
(what the engine writes with a ``Normalize``), from page-locked and from pageable memory, and reports
median GB/s. Then the overlap: a copy on a side stream while the default stream runs bf16 matrix
products sized to last about as long, against each alone; ``hidden`` is the share of the copy's time
that disappears behind the compute (1.0: entirely). Also the cost of converting a uint8 batch to
normalized float on the device (what ``fastload.torch.DataLoader(device=..., normalize=...)`` does
after the copy). Without CUDA the same code times CPU copies (nothing is pinned then).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from bench.device_check.measure import Recorder, median
from bench.device_check.plan import Config

__all__ = ["run"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _sig(value: float) -> float:
    """Four significant digits (tiny dry-run copies must not round to zero)."""
    return float(f"{value:.4g}")


class _Clock:
    """Seconds of device work: synchronize, host clock, synchronize (no-op synchronization on the CPU)."""

    def __init__(self, torch, device) -> None:
        self.torch, self.cuda = torch, device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, fn, repeats: int) -> list[float]:
        out = []
        for _ in range(repeats):
            self.sync()
            t0 = time.perf_counter()
            fn()
            self.sync()
            out.append(time.perf_counter() - t0)
        return out


def run(config: Config, rec: Recorder) -> None:
    import torch

    from fastload.torch.placement import FloatOutput

    device = torch.device(config.device)
    cuda = device.type == "cuda"
    clock = _Clock(torch, device)
    sizes = config.sizes
    shape = (sizes.batch, 3, sizes.size, sizes.size)
    rec.set("shape", list(shape))
    rec.set("pinned_possible", cuda)
    gen = torch.Generator().manual_seed(0)
    host_u8 = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
    sources: dict[tuple[str, bool], Any] = {}
    # Without CUDA nothing can be pinned: the pageable rows alone, through the same code.
    for dtype_name, base in (("uint8", host_u8), ("float16", None)):
        for pinned in (True, False) if cuda else (False,):
            if base is None:
                base = FloatOutput(torch.float16, 1 / 255, MEAN, STD)(host_u8)
            src = torch.empty(shape, dtype=base.dtype, pin_memory=pinned and cuda)
            src.copy_(base)
            sources[(dtype_name, pinned)] = src

    for (dtype_name, pinned), src in sources.items():
        dst = torch.empty_like(src, device=device)

        def copy(src=src, dst=dst, pinned=pinned):
            for _ in range(sizes.copies):
                dst.copy_(src, non_blocking=pinned and cuda)

        copy()  # warm-up: allocation, first-touch, the driver's own pinned bounce buffers
        seconds = median(clock.time(copy, sizes.repeats))
        nbytes = src.numel() * src.element_size()
        rec.row(
            "copies",
            {
                "dtype": dtype_name,
                "source": "pinned" if pinned and cuda else "pageable",
                "mb": _sig(nbytes / 1e6),
                "gb_per_s": _sig(sizes.copies * nbytes / seconds / 1e9),
                "ms_per_copy": _sig(1e3 * seconds / sizes.copies),
            },
        )
        del dst

    # The device-side conversion fastload runs after a uint8 copy (ToTensor + Normalize, float16).
    u8_dev = host_u8.to(device)
    convert = FloatOutput(torch.float16, 1 / 255, MEAN, STD)
    convert(u8_dev)
    rec.set("convert_on_device_ms", _sig(1e3 * median(clock.time(lambda: convert(u8_dev), sizes.repeats))))

    # Overlap: a pinned copy on a side stream beside matrix products on the default stream.
    side = torch.cuda.Stream() if cuda else None

    def on_side():
        return torch.cuda.stream(side) if side is not None else contextlib.nullcontext()

    n = 2048 if cuda else 128
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    a @ b

    def twenty():
        for _ in range(20):
            a @ b

    # Timed in a run of 20: one product alone is shorter than a synchronization's overhead.
    one_matmul = median(clock.time(twenty, sizes.repeats)) / 20
    cases = [c for c in (("uint8", True), ("float16", True), ("uint8", False)) if c in sources]
    for dtype_name, pinned in cases:
        src = sources[(dtype_name, pinned)]
        dst = torch.empty_like(src, device=device)

        def copy(src=src, dst=dst, pinned=pinned):
            with on_side():
                dst.copy_(src, non_blocking=pinned and cuda)

        t_copy = median(clock.time(copy, sizes.repeats))
        k = max(1, round(t_copy / max(one_matmul, 1e-9)))

        def compute(k=k):
            for _ in range(k):
                a @ b

        t_compute = median(clock.time(compute, sizes.repeats))

        def both(copy=copy, compute=compute):
            compute()  # queued on the default stream first, then the copy beside it
            copy()

        t_both = median(clock.time(both, sizes.repeats))
        hidden = (t_copy + t_compute - t_both) / t_copy if t_copy > 0 else 0.0
        rec.row(
            "overlap",
            {
                "dtype": dtype_name,
                "source": "pinned" if pinned and cuda else "pageable",
                "copy_ms": _sig(1e3 * t_copy),
                "compute_ms": _sig(1e3 * t_compute),
                "both_ms": _sig(1e3 * t_both),
                "hidden": round(min(1.0, max(0.0, hidden)), 3),
            },
        )
        del dst
