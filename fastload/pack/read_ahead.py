"""Write stage, streamed input read ahead: a reader thread fills a bounded buffer while the pack converts and writes.

A streamed input (tar, parquet) is read by one thread, front to back: its file reads and Arrow's
row-group decoding release the GIL, so they overlap with the converter threads and the writer
instead of stalling the writer that would otherwise pull every item itself. Items travel in small
lists (one hand-off per list, not per item); at most ``depth`` lists wait, which bounds the memory
the reader holds. Closing the generator stops the reader after the item it is reading; an
exception in the reader is raised from the generator with its traceback.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Generator, Iterable
from typing import Any, TypeVar

__all__ = ["read_ahead"]

T = TypeVar("T")


def read_ahead(items: Iterable[T], *, depth: int = 8, group: int = 64) -> Generator[T, None, None]:
    """``items``, produced on a reader thread at most ``depth`` lists of ``group`` items ahead.

    Args:
        items: The input; iterated (and, when a generator, closed) on the reader thread only.
        depth: Lists waiting at most (>= 1).
        group: Items per list (>= 1).
    """
    if depth < 1 or group < 1:
        raise ValueError(f"depth={depth} and group={group} must be >= 1")
    ready: collections.deque[list[T]] = collections.deque()
    cond = threading.Condition()
    state: dict[str, Any] = {"stop": False, "done": False, "error": None}

    def hand_over(batch: list[T]) -> bool:
        with cond:
            while len(ready) >= depth and not state["stop"]:
                cond.wait()
            if state["stop"]:
                return False
            ready.append(batch)
            cond.notify_all()
            return True

    def run() -> None:
        source = iter(items)
        try:
            batch: list[T] = []
            for item in source:
                batch.append(item)
                if len(batch) >= group:
                    if not hand_over(batch):
                        return
                    batch = []
            if batch:
                hand_over(batch)
        except BaseException as exc:
            with cond:
                state["error"] = exc
        finally:
            closer = getattr(source, "close", None)
            if closer is not None:
                closer()
            with cond:
                state["done"] = True
                cond.notify_all()

    reader = threading.Thread(target=run, name="fastload-pack-read", daemon=True)
    reader.start()
    try:
        while True:
            with cond:
                while not ready and not state["done"]:
                    cond.wait()
                if ready:
                    batch = ready.popleft()
                    cond.notify_all()
                elif state["error"] is not None:
                    raise state["error"]
                else:
                    return
            yield from batch
    finally:
        with cond:
            state["stop"] = True
            cond.notify_all()
        reader.join()
