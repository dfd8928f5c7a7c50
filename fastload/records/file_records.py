"""Read stage: records that are image files a framework's dataset already listed, loose or inside tars.

The torch adapter reads other libraries' datasets through these (the dataset made the list; these
only read the bytes): :class:`FileRecords` for one file per image (torchvision's ``ImageFolder``,
timm's ``ReaderImageFolder``), :class:`TarMemberRecords` for images stored in uncompressed tar
archives (timm's ``ReaderImageInTar``: a tar of images, a folder of such tars, or tars inside a tar),
each member read with one ``pread`` at its data offset. Both follow the records contract
(``image(i)``, ``labels``, ``locate(i)``, ``will_need``, ``close``) in memory the caller owns, and
raise :class:`~fastload.errors.CorruptRecordError` naming the file (and member) for a record they
cannot read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fastload.errors import CorruptRecordError
from fastload.records.folder_tree import advise_will_need, read_regular_file

__all__ = ["FileRecords", "TarMember", "TarMemberRecords"]


def _labels(targets: Sequence[int]) -> NDArray[np.float32]:
    return np.asarray(targets, dtype=np.float32).reshape(-1, 1)


class FileRecords:
    """The records contract over a list of image files.

    Args:
        paths: Image file of each record, in dataset index order.
        targets: Integer class of each record.
    """

    def __init__(self, paths: Sequence[str], targets: Sequence[int]) -> None:
        self.paths = [os.fspath(p) for p in paths]
        self.labels = _labels(targets)
        self.label_width = 1
        self.kind = "files"
        self.path = os.path.commonpath(self.paths) if self.paths else ""
        self.restart_indexed = False
        self._closed = False

    def __len__(self) -> int:
        return len(self.paths)

    def image(self, i: int) -> memoryview:
        try:
            return memoryview(read_regular_file(self.paths[i]))
        except OSError as exc:
            raise CorruptRecordError(
                f"cannot read image file: {exc.strerror or exc}", shard=self.paths[i], record=int(i)
            ) from None

    def locate(self, i: int) -> str:
        return self.paths[int(i)]

    def will_need(self, indices: Any) -> None:
        """``posix_fadvise(WILLNEED)`` on each file: the kernel reads them ahead while we decode."""
        advise_will_need(self.paths[i] for i in np.asarray(indices).tolist())

    def close(self) -> None:
        self._closed = True


@dataclass(frozen=True)
class TarMember:
    """Where one image lives inside a tar file on disk.

    Attributes:
        tar: Path of the tar file on disk (the outer one, for a tar inside a tar).
        offset: Byte offset of the member's data in that file.
        size: The member's size in bytes.
        name: The member's name, for messages (``inner.tar/cls/img.jpg`` inside a nested tar).
    """

    tar: str
    offset: int
    size: int
    name: str


class TarMemberRecords:
    """The records contract over images stored in uncompressed tar files (one ``pread`` per image).

    Descriptors are opened on first use, one per tar file, shared by every reading thread (``pread``
    needs no seek) and closed by :meth:`close`; a pickled copy (a spawned worker) opens its own.

    Args:
        members: Where each record's image is, in dataset index order.
        targets: Integer class of each record.
    """

    def __init__(self, members: Sequence[TarMember], targets: Sequence[int]) -> None:
        self.members = list(members)
        if len(self.members) != len(targets):
            raise ValueError(f"{len(self.members)} members but {len(targets)} targets")
        self.labels = _labels(targets)
        self.label_width = 1
        self.kind = "tar"
        tars = sorted({m.tar for m in self.members})
        self.path = tars[0] if len(tars) == 1 else (os.path.commonpath(tars) if tars else "")
        self.restart_indexed = False
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __len__(self) -> int:
        return len(self.members)

    def _fd(self, tar: str) -> int:
        fd = self._fds.get(tar)
        if fd is not None:
            return fd
        with self._lock:
            if self._closed:
                raise OSError(f"the records over {self.path} are closed")
            fd = self._fds.get(tar)
            if fd is None:
                fd = os.open(tar, os.O_RDONLY | os.O_CLOEXEC)
                self._fds[tar] = fd
            return fd

    def image(self, i: int) -> memoryview:
        m = self.members[i]
        try:
            data = os.pread(self._fd(m.tar), m.size, m.offset)
        except OSError as exc:
            raise CorruptRecordError(
                f"cannot read tar member {m.name}: {exc.strerror or exc}", shard=m.tar, record=int(i)
            ) from None
        if len(data) != m.size:
            raise CorruptRecordError(
                f"tar member {m.name} ends after {len(data)} of its {m.size} bytes (the tar file is truncated)",
                shard=m.tar,
                record=int(i),
            )
        return memoryview(data)

    def locate(self, i: int) -> str:
        m = self.members[int(i)]
        return f"{m.tar} member {m.name}"

    def will_need(self, indices: Any) -> None:
        """``posix_fadvise(WILLNEED)`` on each member's bytes."""
        if not hasattr(os, "posix_fadvise"):
            return
        for i in np.asarray(indices).tolist():
            m = self.members[i]
            try:
                os.posix_fadvise(self._fd(m.tar), m.offset, m.size, os.POSIX_FADV_WILLNEED)
            except OSError:
                continue

    def close(self) -> None:
        """Close the tar files (idempotent); reading afterwards raises."""
        with self._lock:
            self._closed = True
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fds"], state["_lock"], state["_closed"] = {}, None, False
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
