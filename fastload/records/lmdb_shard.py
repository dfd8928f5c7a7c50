"""Read stage: fastload's LMDB shards (one LMDB environment per shard), their key scheme and value layout.

A shard is a directory ``<name>-NNNNN.lmdb/`` holding LMDB's ``data.mdb`` (the writer removes
``lock.mdb``). The writer is py-lmdb; readers read the pages with ``pread``
(:mod:`fastload.records.lmdb_pages`), never through a memory map, so a truncated file is an error,
not a crash.

Keys: the record's number inside the shard as an 8-byte big-endian unsigned integer, so LMDB's
byte-wise key order is record order (decimal keys would sort ``"10"`` before ``"2"``).

Values (little-endian, no pickle)::

    offset 0   4 bytes   magic b"FLDB"
    offset 4   uint16    layout version (1)
    offset 6   uint16    k = number of float32 labels
    offset 8   uint64    record id
    offset 16  4*k       float32 labels
    offset 16+4k ...     the encoded image bytes (JPEG)
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import lmdb
import numpy as np
from numpy.typing import NDArray

from fastload.records.lmdb_pages import LmdbFile

__all__ = [
    "VALUE_MAGIC",
    "VALUE_VERSION",
    "LmdbShard",
    "LmdbShardWriter",
    "LmdbValueHeader",
    "decode_key",
    "encode_key",
    "is_lmdb_shard",
    "pack_value",
    "unpack_value_header",
]

VALUE_MAGIC = b"FLDB"
VALUE_VERSION = 1
_HEAD = struct.Struct("<4sHHQ")
_KEY = struct.Struct(">Q")
_COMMIT_BYTES = 64 << 20  # bounded write transactions: LMDB keeps a transaction's dirty pages in RAM


def encode_key(record: int) -> bytes:
    """The LMDB key of a shard's ``record``-th record (8-byte big-endian)."""
    return _KEY.pack(record)


def decode_key(key: bytes) -> int:
    """Inverse of :func:`encode_key`."""
    if len(key) != _KEY.size:
        raise ValueError(f"a key of {len(key)} bytes is not an 8-byte fastload record key")
    record: int = _KEY.unpack(key)[0]
    return record


@dataclass(frozen=True)
class LmdbValueHeader:
    """The decoded header of a value: labels, id and where the image bytes start."""

    labels: tuple[float, ...]
    id: int
    image_offset: int


def pack_value_header(labels: float | Sequence[float], id: int) -> bytes:
    """The header bytes that precede the image in a value."""
    arr = np.atleast_1d(np.asarray(labels, dtype="<f4")).ravel()
    header: bytes = _HEAD.pack(VALUE_MAGIC, VALUE_VERSION, arr.size, int(id)) + arr.tobytes()
    return header


def pack_value(labels: float | Sequence[float], id: int, image: bytes) -> bytes:
    """A complete value: header then image bytes."""
    return pack_value_header(labels, id) + bytes(image)


def unpack_value_header(value: bytes | bytearray | memoryview) -> LmdbValueHeader:
    """Decode a value's header.

    Raises:
        ValueError: On a bad magic word, an unknown version or a value too short for its labels.
    """
    if len(value) < _HEAD.size:
        raise ValueError(f"value of {len(value)} bytes is shorter than the {_HEAD.size}-byte header")
    magic, version, count, rid = _HEAD.unpack_from(value, 0)
    if magic != VALUE_MAGIC:
        raise ValueError(f"bad value magic 0x{magic.hex()} (expected {VALUE_MAGIC!r})")
    if version != VALUE_VERSION:
        raise ValueError(f"unsupported value layout version {version}")
    end = _HEAD.size + 4 * count
    if len(value) < end:
        raise ValueError(f"value announces {count} labels but has only {len(value)} bytes")
    labels = tuple(float(x) for x in np.frombuffer(value, dtype="<f4", count=count, offset=_HEAD.size))
    return LmdbValueHeader(labels, rid, end)


def is_lmdb_shard(path: str) -> bool:
    """Whether ``path`` is a directory holding an LMDB ``data.mdb``."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "data.mdb"))


class LmdbShardWriter:
    """Writes one shard's records in order into a fresh LMDB environment.

    Args:
        path: The shard directory to create.
        map_size: Upper bound of the database size (address space only; the file grows as needed).
    """

    def __init__(self, path: str, map_size: int = 1 << 40) -> None:
        self.path = path
        self._env = lmdb.open(
            path, map_size=map_size, subdir=True, metasync=False, sync=False, readahead=False, meminit=True, max_dbs=0
        )
        self._txn = self._env.begin(write=True)
        self._pending = 0
        self.records = 0

    def write(self, value: bytes) -> int:
        """Append one value under the next record key; returns the record number."""
        record = self.records
        if not self._txn.put(encode_key(record), value, append=True):
            raise RuntimeError(f"LMDB refused record {record} in {self.path}")
        self.records += 1
        self._pending += len(value)
        if self._pending >= _COMMIT_BYTES:
            self._txn.commit()
            self._txn = self._env.begin(write=True)
            self._pending = 0
        return record

    def finish(self) -> None:
        """Commit, flush to disk and close; removes ``lock.mdb`` (readers never use it)."""
        self._txn.commit()
        self._env.sync(True)
        self._env.close()
        lock = os.path.join(self.path, "lock.mdb")
        if os.path.exists(lock):
            os.unlink(lock)

    def abort(self) -> None:
        """Drop the open transaction and close the environment."""
        try:
            self._txn.abort()
        finally:
            self._env.close()


class LmdbShard:
    """A read-only fastload LMDB shard, read with ``pread`` (:mod:`fastload.records.lmdb_pages`).

    The library (py-lmdb) maps ``data.mdb``: a data file truncated under the mapping would kill the
    reading process with ``SIGBUS``. Reads go through :class:`~fastload.records.lmdb_pages.LmdbFile`
    instead: the meta page is checked at open (the file must hold every page it says the database
    uses), the tree is walked once on first use, and each value is one ``pread`` into memory the
    caller owns; a file that shrinks afterwards gives a short read, reported as a
    :class:`~fastload.errors.CorruptRecordError`. Reads are thread-safe.

    Args:
        path: The shard directory (with ``data.mdb``).

    Raises:
        CorruptRecordError: Not a readable LMDB data file, or truncated below what its meta page says.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self._file = LmdbFile(os.path.join(path, "data.mdb"), name=path)
        self.size = self._file.size

    def __len__(self) -> int:
        return self._file.meta.entries

    def value(self, record: int, nbytes: int = -1) -> bytes:
        """The raw value of the shard's ``record``-th record (its first ``nbytes`` when given).

        Raises:
            CorruptRecordError: When the key is missing, a page is damaged or the file ends inside the value.
            ValueError: The shard is closed.
        """
        return self._file.value(record, nbytes)

    def extents(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(start, end)`` of the bytes to read for each record's value (int64, by record number)."""
        return self._file.extents()

    def value_from(self, data: bytes | bytearray | memoryview, record: int) -> memoryview:
        """Record ``record``'s value from its extent's bytes as read (its overflow page header checked).

        Raises:
            CorruptRecordError: A damaged page header or bytes of another length than the extent.
        """
        return self._file.value_from(data, record)

    @property
    def file_path(self) -> str:
        """The file :meth:`read` reads (``data.mdb``)."""
        return self._file.path

    def reopen(self, flags: int) -> int:
        """A new descriptor of ``data.mdb``, opened with ``flags`` (``O_DIRECT``); the caller closes it."""
        return self._file.reopen(flags)

    def read(self, offset: int, length: int, record: int | None = None) -> bytes:
        """``length`` bytes at ``offset`` of ``data.mdb`` (one ``pread``; thread-safe).

        Raises:
            CorruptRecordError: The file ends first, or the read fails.
            ValueError: The shard is closed.
        """
        return self._file.read(offset, length, record)

    def read_into(self, offset: int, buf: memoryview, record: int | None = None) -> None:
        """:meth:`read` into ``buf`` (writable; its length is the length read; thread-safe).

        Raises:
            CorruptRecordError: The file ends first, or the read fails.
            ValueError: The shard is closed.
        """
        self._file.read_into(offset, buf, record)

    def lengths(self) -> NDArray[np.int64]:
        """Every value's length in bytes (int64, by record number)."""
        return np.abs(self._file.locations()[1])

    def header(self, record: int) -> LmdbValueHeader:
        """The header of record ``record``'s value, reading only its bytes.

        Raises:
            CorruptRecordError: The value cannot be read.
            ValueError: A damaged header.
        """
        head = self.value(record, _HEAD.size)
        if len(head) == _HEAD.size and head[:4] == VALUE_MAGIC:
            count = _HEAD.unpack_from(head, 0)[2]
            if count:
                head = self.value(record, _HEAD.size + 4 * count)
        return unpack_value_header(head)

    def items(self) -> Iterator[tuple[int, bytes]]:
        """All ``(record, value)`` pairs in key order."""
        for record in range(len(self._file.locations()[0])):
            yield record, self.value(record)

    def will_need(self, records: Sequence[int]) -> None:
        """LMDB gives no byte ranges to advise on; read-ahead is left to the page cache."""

    def close(self) -> None:
        """Close the data file. Idempotent."""
        self._file.close()
