"""Read stage: fastload's LMDB shards (one LMDB environment per shard), their key scheme and value layout.

A shard is a directory ``<name>-NNNNN.lmdb/`` holding LMDB's ``data.mdb`` (the writer removes
``lock.mdb``; readers open with ``lock=False``).

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

import contextlib
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import lmdb
import numpy as np

from fastload.errors import CorruptRecordError

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
        raise ValueError(f"key {key[:16]!r} is not an 8-byte fastload record key")
    return _KEY.unpack(key)[0]


@dataclass(frozen=True)
class LmdbValueHeader:
    """The decoded header of a value: labels, id and where the image bytes start."""

    labels: tuple[float, ...]
    id: int
    image_offset: int


def pack_value_header(labels: float | Sequence[float], id: int) -> bytes:
    """The header bytes that precede the image in a value."""
    arr = np.atleast_1d(np.asarray(labels, dtype="<f4")).ravel()
    return _HEAD.pack(VALUE_MAGIC, VALUE_VERSION, arr.size, int(id)) + arr.tobytes()


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
        raise ValueError(f"bad value magic {magic!r} (expected {VALUE_MAGIC!r})")
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


# py-lmdb refuses to open one environment twice in a process, yet two datasets (or a dataset and a
# verify) may share shards: environments are shared and reference-counted.
_ENVS: dict[str, list[Any]] = {}
_ENVS_LOCK = threading.Lock()


def _acquire_env(key: str) -> Any:
    with _ENVS_LOCK:
        slot = _ENVS.get(key)
        if slot is None:
            try:
                env = lmdb.open(
                    key, readonly=True, lock=False, readahead=False, meminit=False, subdir=True, max_readers=4096
                )
            except lmdb.Error as exc:
                raise CorruptRecordError(f"cannot open LMDB environment: {exc}", shard=key) from None
            slot = _ENVS[key] = [env, 0]
        slot[1] += 1
        return slot[0]


def _release_env(key: str) -> None:
    with _ENVS_LOCK:
        slot = _ENVS.get(key)
        if slot is None:
            return
        slot[1] -= 1
        if slot[1] <= 0:
            del _ENVS[key]
            slot[0].close()


class LmdbShard:
    """A read-only LMDB shard.

    Each reading thread gets its own long-lived read transaction (no per-read ``begin``). Values are
    returned as copies: py-lmdb's zero-copy buffers die with their transaction, and a view outliving
    :meth:`close` would crash the process instead of raising; a copy costs ~10 us per 100 KB image,
    small beside its decode. (RecordIO shards are the zero-copy format.)

    Args:
        path: The shard directory (with ``data.mdb``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self._key = os.path.realpath(path)
        self._env = _acquire_env(self._key)
        self._local = threading.local()
        self._txns: list[Any] = []
        self._txns_lock = threading.Lock()
        self._closed = False
        self.size = os.path.getsize(os.path.join(path, "data.mdb"))

    def __len__(self) -> int:
        return self._env.stat()["entries"]

    def _txn(self) -> Any:
        txn = getattr(self._local, "txn", None)
        if txn is None:
            if self._closed:
                raise ValueError(f"LMDB shard {self.path} is closed")
            txn = self._env.begin(buffers=False)
            self._local.txn = txn
            with self._txns_lock:
                self._txns.append(txn)
        return txn

    def value(self, record: int) -> bytes:
        """The raw value of the shard's ``record``-th record (a copy).

        Raises:
            CorruptRecordError: When the key is missing.
        """
        value = self._txn().get(encode_key(record))
        if value is None:
            raise CorruptRecordError("record key missing from the LMDB shard", shard=self.path, record=record)
        return value

    def items(self) -> Iterator[tuple[int, bytes]]:
        """All ``(record, value)`` pairs in key order."""
        with self._env.begin(buffers=False) as txn:
            for key, value in txn.cursor():
                yield decode_key(bytes(key)), value

    def will_need(self, records: Sequence[int]) -> None:
        """LMDB gives no byte ranges to advise on; read-ahead is left to the page cache."""

    def close(self) -> None:
        """Close every thread's transaction and the environment. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._txns_lock:
            for txn in self._txns:
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
            self._txns.clear()
        _release_env(self._key)
