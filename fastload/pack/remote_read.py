"""Write stage, remote input read in place: objects of a remote SRC as file objects, never downloaded whole.

A tar or an Arrow stream is read front to back through one streamed GET (:class:`RemoteStream`,
from any byte offset, for a resumed pack); a parquet file is read by ranges, footer first, then the
column chunks of each row group (:class:`RemoteFile`, seekable, for ``pyarrow.parquet``). Both go
through :class:`fastload.records.remote.storage.RemoteStore`, the storage client ``open_dataset`` uses
(retries, timeouts, credentials from the same places); a failure raises its
:class:`fastload.records.remote.storage.RemoteError` naming the URL, which stops the pack (a rerun resumes).
"""

from __future__ import annotations

import io
from collections.abc import Iterator

from fastload.records.remote.storage import RemoteStore

__all__ = ["RemoteFile", "RemoteStream"]


class RemoteStream(io.RawIOBase):
    """An object's bytes from ``start`` on, through one streamed GET, as a readable raw file.

    Args:
        store: The store holding it.
        key: The object's key.
        start: First byte to read.
    """

    def __init__(self, store: RemoteStore, key: str, start: int = 0) -> None:
        super().__init__()
        self._chunks: Iterator[memoryview] = store.stream(key, start or None, None)
        self._left = memoryview(b"")
        self.name = store.url_of(key)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        if not self._left:
            piece = next(self._chunks, None)
            if piece is None:
                return 0
            self._left = piece.cast("B")
        n = min(len(out), len(self._left))
        out[:n] = self._left[:n]
        self._left = self._left[n:]
        return n

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (a chunk as it came, when it fits: no copy into a buffer first)."""
        if size is None or size < 0:
            return self.readall()
        if not self._left:
            piece = next(self._chunks, None)
            if piece is None:
                return b""
            self._left = piece.cast("B")
        data = bytes(self._left[:size])
        self._left = self._left[size:]
        return data

    def close(self) -> None:
        closer = getattr(self._chunks, "close", None)
        if closer is not None:
            closer()  # ends the GET
        super().close()


class RemoteFile(io.RawIOBase):
    """An object as a seekable raw file whose reads are ranged GETs (for ``pyarrow.parquet``).

    Args:
        store: The store holding it.
        key: The object's key.
        size: Its size (from a listing or HEAD).
    """

    def __init__(self, store: RemoteStore, key: str, size: int) -> None:
        super().__init__()
        self._store, self._key, self._size, self._pos = store, key, size, 0
        self.name = store.url_of(key)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def size(self) -> int:
        """The object's size."""
        return self._size

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        end = min(self._size, self._pos + len(out))
        n = 0
        if end > self._pos:
            for piece in self._store.stream(self._key, self._pos, end):
                out[n : n + len(piece)] = piece
                n += len(piece)
        self._pos += n
        return n
