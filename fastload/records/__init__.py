"""Read stage: shards, manifest and index to zero-copy record bytes by global index.

``Dataset`` and ``open_dataset`` load on first use, so that one module of this package (the
object-storage transport that a spawned helper process runs, say) imports without every reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastload.records.base import Dataset
    from fastload.records.dataset import open_dataset

__all__ = ["Dataset", "open_dataset"]


def __getattr__(name: str) -> Any:
    if name == "Dataset":
        from fastload.records.base import Dataset

        return Dataset
    if name == "open_dataset":
        from fastload.records.dataset import open_dataset

        return open_dataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
