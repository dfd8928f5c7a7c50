"""Folder stage: the fixed names of what a packed dataset folder holds.

The bottom of the data path: the pack (write), the readers (read), the remote cache and node-local
copies all find a dataset's manifest and record index under these names.
"""

from __future__ import annotations

__all__ = ["INDEX_NAME", "MANIFEST_NAME", "WORK_DIR"]

#: The manifest: format, shards with their checksums, classes, the index's file and checksum.
MANIFEST_NAME = "fastload.json"
#: The binary record index (offsets, lengths, labels, per-record checksums).
INDEX_NAME = "fastload-index.npy"
#: The work folder inside OUT where ``fastload pack`` builds a dataset before moving it into place.
#: Its name is part of the resumable output: a pack interrupted by any version resumes from it.
WORK_DIR = ".fastload-staging"
