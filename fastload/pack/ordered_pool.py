"""Write stage, parallelism: batches of items on a thread pool, results in input order.

At most a bounded number of batches is in flight.

The pack's converter threads read, check, convert and frame files (file I/O, numpy, Pillow and the
engine release the GIL); the writer takes the results in the order of the input, so the same
command always writes the same bytes.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["ordered_results"]

T = TypeVar("T")
R = TypeVar("R")


def ordered_results(
    items: Iterable[T], fn: Callable[[list[T]], R], *, workers: int, batch: int, window: int
) -> Generator[tuple[list[T], R], None, None]:
    """Run ``fn(chunk)`` on ``workers`` threads over chunks of ``batch`` items; yield ``(chunk, result)`` in order.

    Batches keep the per-image cost of futures and thread hand-offs off the hot path. At most
    ``window`` chunks are in flight (submitted and not yet yielded), which bounds the memory the
    results hold. Closing the generator cancels what has not started and waits for the rest.

    Args:
        items: The input, consumed lazily.
        fn: Called on a worker thread with each chunk; its exception is raised from the generator
            when that chunk's turn comes.
        workers: Threads.
        batch: Items per chunk.
        window: Chunks in flight at most (>= 1).
    """
    if workers < 1 or batch < 1 or window < 1:
        raise ValueError(f"workers={workers}, batch={batch} and window={window} must be >= 1")
    source = iter(items)
    pending: collections.deque[tuple[list[T], Future[R]]] = collections.deque()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fastload-pack")
    try:
        while True:
            chunk = list(itertools.islice(source, batch))
            if not chunk:
                break
            pending.append((chunk, pool.submit(fn, chunk)))
            if len(pending) >= window:
                done, fut = pending.popleft()
                yield done, fut.result()
        while pending:
            done, fut = pending.popleft()
            yield done, fut.result()
    finally:
        for _, fut in pending:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
