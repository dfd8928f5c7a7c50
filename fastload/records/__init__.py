"""Read stage: shards, manifest and index to zero-copy record bytes by global index."""

from fastload.records.base import Dataset
from fastload.records.dataset import open_dataset

__all__ = ["Dataset", "open_dataset"]
