"""Measurement stage, sample order: what each order costs in randomness, in numbers beside its speed.

Block and shard order read a disk faster because a batch's records lie close together in the
files; the price is that a batch mixes less of the dataset than a global shuffle's. Two numbers
make the price visible, computed from the order alone (no I/O, the same pure function the loader
uses):

- **label entropy per batch** (bits): the entropy of the labels in a batch, averaged over the
  epoch's batches. A global shuffle's batches reach about ``log2(classes)`` (less for batches
  smaller than the number of classes); a batch drawn from a few hundred neighbouring records of a
  class-sorted pack holds a handful of classes. Given for the records as packed (``fastload pack
  --shuffle`` spreads the classes over the files) and as they would be in a class-sorted pack (what
  packing an ImageFolder without ``--shuffle`` gives).
- **mean file distance** (MB): the distance in the files (shards laid end to end) between
  consecutive samples of a batch, averaged: about a third of the dataset for a global shuffle, a
  third of a shuffle window for block and shard order.

Both are also given as a share of the global shuffle's figure on the same data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["batch_entropy", "file_distance", "order_mixing"]


def batch_entropy(batches: Sequence[np.ndarray], labels: np.ndarray) -> float:
    """Mean over ``batches`` of the Shannon entropy (bits) of the labels of their records."""
    values = []
    for b in batches:
        if len(b) == 0:
            continue
        _, counts = np.unique(labels[b], return_counts=True)
        p = counts / counts.sum()
        values.append(float(-(p * np.log2(p)).sum()))
    return float(np.mean(values)) if values else 0.0


def file_distance(batches: Sequence[np.ndarray], position: np.ndarray) -> float:
    """Mean distance (in ``position``'s unit) between consecutive samples of each batch."""
    total, count = 0.0, 0
    for b in batches:
        if len(b) < 2:
            continue
        d = np.abs(np.diff(position[b].astype(np.float64)))
        total += float(d.sum())
        count += len(d)
    return total / count if count else 0.0


def order_mixing(
    spec_of: dict[str, object],
    labels: np.ndarray,
    position: np.ndarray,
    *,
    epoch: int = 0,
) -> dict[str, dict[str, float]]:
    """Each order's randomness figures (see the module docstring).

    Args:
        spec_of: ``order name -> fastload.order.OrderSpec``; a ``"global"`` entry is the reference.
        labels: int ``[N]``: each record's class, as packed.
        position: ``[N]`` each record's byte offset in the files (shards laid end to end).
        epoch: The epoch whose order is measured.

    Returns:
        ``order -> {"entropy_bits", "entropy_sorted_bits", "distance_mb", and each as a share of
        the global shuffle's: "entropy_vs_global", "entropy_sorted_vs_global", "distance_vs_global"}``.
    """
    from fastload.order import EpochOrder

    labels = np.asarray(labels).astype(np.int64).ravel()
    # The same records in a class-sorted pack: record i would hold the i-th label in sorted order.
    sorted_labels = np.sort(labels, kind="stable")
    out: dict[str, dict[str, float]] = {}
    for name, spec in spec_of.items():
        order = EpochOrder(spec, epoch)  # type: ignore[arg-type]
        batches = [order[k] for k in range(len(order))]
        out[name] = {
            "entropy_bits": batch_entropy(batches, labels),
            "entropy_sorted_bits": batch_entropy(batches, sorted_labels),
            "distance_mb": file_distance(batches, position) / 1e6,
        }
    ref = out.get("global")
    for figures in out.values():
        for key, base in (
            ("entropy_vs_global", "entropy_bits"),
            ("entropy_sorted_vs_global", "entropy_sorted_bits"),
            ("distance_vs_global", "distance_mb"),
        ):
            figures[key] = figures[base] / ref[base] if ref and ref[base] else float("nan")
    return out
