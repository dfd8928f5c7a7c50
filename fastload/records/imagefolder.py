"""Read stage: an unpacked ImageFolder tree served through the same ``Dataset`` API as packed shards.

Records are the tree's image files in :func:`fastload.records.folder_tree.scan_folder` order; ``image(i)``
reads the file (a copy, not a mapping). Nothing is validated up front: a bad file fails when it is
decoded, named by its path. Only regular files are listed, and each directory is walked once
(what the walk refuses is logged and kept in ``skipped``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import numpy as np

from fastload.errors import CorruptRecordError
from fastload.records.base import Dataset
from fastload.records.folder_tree import advise_will_need, read_regular_file, scan_folder
from fastload.records.recordio import pack_header

__all__ = ["ImageFolderDataset"]

log = logging.getLogger("fastload.records")


class ImageFolderDataset(Dataset):
    """Class-folder images as records.

    Args:
        path: Folder with one sub-folder per class.
    """

    def __init__(self, path: str) -> None:
        source = scan_folder(path)
        if source.skipped:
            first, reason = source.skipped[0]
            log.warning(
                "%s: %d entries skipped while listing (first: %s: %s)", path, len(source.skipped), first, reason
            )
        self.skipped = source.skipped
        self.path = path
        self.kind = "imagefolder"
        self.shards = []
        self.classes = source.classes
        self.files = [item.path for item in source.items]
        self.label_width = 1
        self.labels = np.asarray([item.labels for item in source.items], dtype=np.float32).reshape(-1, 1)
        self.ids = np.asarray([item.id for item in source.items], dtype=np.uint64)
        self._closed = False
        self._lock = threading.Lock()

    def image(self, i: int) -> memoryview:
        if self._closed:
            raise ValueError(f"dataset {self.path} is closed")
        i = self._check_index(i)
        try:
            return memoryview(read_regular_file(self.files[i]))
        except OSError as exc:
            raise CorruptRecordError(
                f"cannot read image file: {exc.strerror or exc}", shard=self.files[i], record=i
            ) from None

    def payload(self, i: int) -> bytes:
        image = self.image(i)
        i = self._check_index(i)
        return pack_header(float(self.labels[i, 0]), int(self.ids[i])) + bytes(image)

    def locate(self, i: int) -> str:
        return self.files[self._check_index(i)]

    def will_need(self, indices: Iterable[int]) -> None:
        """``posix_fadvise(WILLNEED)`` on each file."""
        if self._closed:
            return
        files = []
        for i in indices:
            try:
                files.append(self.files[self._check_index(i)])
            except IndexError:
                continue
        advise_will_need(files)

    def close(self) -> None:
        with self._lock:
            self._closed = True
