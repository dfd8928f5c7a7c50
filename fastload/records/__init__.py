"""Read stage: shards, manifest and index to zero-copy record bytes by global index."""

from fastload.records.dataset import Dataset, open_dataset

__all__ = ["open_dataset", "Dataset"]
