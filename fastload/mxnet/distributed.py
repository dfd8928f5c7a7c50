"""Device stage (MXNet): which part of the data this worker reads, from a kvstore or explicit arguments.

Every iterator here takes its share through ``fastload.order`` (contiguous equal shares of one
epoch permutation, padded by repeating records), so all workers of a ``dist_*`` kvstore get the
same number of batches and ``dist_sync`` never waits on a worker that ran out of data.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

__all__ = ["resolve_parts"]


def _int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


def resolve_parts(
    *,
    part_index: int = 0,
    num_parts: int = 1,
    kvstore: mx.kv.KVStore | str | None = None,
    rank: int | None = None,
    num_workers: int | None = None,
) -> tuple[int, int]:
    """``(part_index, num_parts)`` for this worker.

    Precedence: explicit ``rank``/``num_workers``, then a ``dist_*`` kvstore's ``rank`` and
    ``num_workers``, then ``part_index``/``num_parts``. Conflicting non-default values are an error.

    Args:
        part_index: MXNet's ``part_index`` argument.
        num_parts: MXNet's ``num_parts`` argument.
        kvstore: An ``mx.kv.KVStore`` or a kvstore type name; only ``dist*`` types split the data.
            A name is created with ``mx.kv.create`` -- pass the object itself when the training
            code creates one, so the process does not hold two kvstores.
        rank: This worker's rank (overrides the kvstore).
        num_workers: Number of workers.

    Returns:
        The validated ``(part_index, num_parts)``.
    """
    part_index = _int(part_index, "part_index", 0)
    num_parts = _int(num_parts, "num_parts", 1)
    candidates = []
    if rank is not None or num_workers is not None:
        if rank is None or num_workers is None:
            raise ValueError("rank and num_workers must be given together")
        candidates.append(("rank/num_workers", _int(rank, "rank", 0), _int(num_workers, "num_workers", 1)))
    if kvstore is not None:
        kv = mx.kv.create(kvstore) if isinstance(kvstore, str) else kvstore
        if not hasattr(kv, "type") or not hasattr(kv, "rank"):
            raise ValueError(f"kvstore={kvstore!r} is neither a kvstore type name nor an mx.kv.KVStore")
        if "dist" in kv.type:
            candidates.append((f"kvstore {kv.type!r}", int(kv.rank), int(kv.num_workers)))
    if num_parts != 1 or part_index != 0:
        candidates.append(("part_index/num_parts", part_index, num_parts))
    if not candidates:
        return 0, 1
    source, idx, total = candidates[0]
    for other, o_idx, o_total in candidates[1:]:
        if (o_idx, o_total) != (idx, total):
            raise ValueError(f"{source} says part {idx} of {total} but {other} says part {o_idx} of {o_total}")
    if not 0 <= idx < total:
        raise ValueError(f"{source}: part {idx} is outside [0, {total})")
    return idx, total
