"""Measurement helpers shared by the parts: results saved as they come, CPU time, steady-state rates.

A part writes its result file after every row (:class:`Recorder`), so a part stopped at its time
limit still hands back what it measured. Throughput rows are steady-state rates: the batches a
loader had ready or in flight when the consumer started are skipped, then batches are counted for at
least a window of seconds (:func:`stream_rate`).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Recorder", "cpu_seconds", "median", "stream_rate"]


class Recorder:
    """A part's result, rewritten atomically to ``path`` after every change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"status": "running"}
        self.save()

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def row(self, table: str, row: dict[str, Any]) -> None:
        """Append ``row`` to the list ``table``."""
        self.data.setdefault(table, []).append(row)
        self.save()

    def save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(self.data, fh, indent=1, default=str)
        os.replace(tmp, self.path)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, its finished children and its live ones.

    Live children (torch's DataLoader workers) are read through psutil when it is installed;
    without it only this process and its finished children count.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + done.ru_utime + done.ru_stime
    try:
        import psutil
    except ImportError:
        return total
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:  # exited meanwhile: counted in RUSAGE_CHILDREN once waited for
            continue
        total += t.user + t.system
    return total


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def stream_rate(
    batches: Iterator[Any],
    count: Callable[[Any], int],
    *,
    skip: int,
    group: int = 1,
    window: float,
    min_batches: int,
    cap: float,
) -> dict[str, Any]:
    """The steady-state rate of an iterator of batches.

    Args:
        batches: The batches (consumed; the caller closes what produced them).
        count: Images in a batch.
        skip: Batches taken before timing starts: what was ready or in flight at the start (a
            loader's prefetch, one batch per worker process), and start-up.
        group: Timing stops only after a multiple of this many batches (worker processes deliver
            in bursts of one batch each).
        window: Seconds to time at least.
        min_batches: Batches to time at least.
        cap: Seconds after which timing stops anyway (at a group boundary if one was reached).

    Returns:
        ``images``, ``batches``, ``seconds``, ``images_per_s``, ``cpu_seconds`` (this process and its
        workers, over the timed batches) and ``first_batch_s`` (from the call to the first batch).
    """
    t_call = time.perf_counter()
    first = None
    for _ in range(max(1, skip)):
        next(batches)
        if first is None:
            first = time.perf_counter() - t_call
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    images = taken = 0
    at_boundary: tuple[int, int, float, float] | None = None
    while True:
        images += count(next(batches))
        taken += 1
        now = time.perf_counter()
        if taken % group == 0:
            at_boundary = (images, taken, now, cpu_seconds())
            if (now - t0 >= window and taken >= min_batches) or now - t0 >= cap:
                break
        elif now - t0 >= cap * 1.5 and at_boundary is not None:
            break
    assert at_boundary is not None
    images, taken, t1, cpu1 = at_boundary
    seconds = t1 - t0
    return {
        "images": images,
        "batches": taken,
        "seconds": round(seconds, 4),
        "images_per_s": round(images / seconds, 2) if seconds > 0 else None,
        "cpu_seconds": round(cpu1 - cpu0, 3),
        "first_batch_s": round(first or 0.0, 3),
    }
