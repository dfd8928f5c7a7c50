"""Write stage, progress: the bar ``fastload pack`` shows on a terminal (images, MB/s)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Progress"]


@dataclass
class Progress:
    enabled: bool
    total: int | None  # None: not known up front (a streamed tar)
    bar: Any = None
    images: int = 0
    nbytes: int = 0
    t0: float = field(default_factory=time.perf_counter)
    last: float = 0.0

    def __post_init__(self) -> None:
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="img", desc="pack", dynamic_ncols=True, file=sys.stderr)

    def skip(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def step(self, nbytes: int, images: int = 1) -> None:
        self.images += images
        self.nbytes += nbytes
        if self.bar is None:
            return
        self.bar.update(images)
        now = time.perf_counter()
        if now - self.last > 0.5:
            self.last = now
            self.bar.set_postfix_str(f"{self.nbytes / max(now - self.t0, 1e-9) / 1e6:.1f} MB/s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
