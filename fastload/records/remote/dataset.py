"""Read stage for remote datasets: a packed dataset in object storage, read through the node's shard cache.

:func:`open_remote_dataset` (what ``fastload.open_dataset("s3://...")`` calls) fetches the manifest
and the record index once per node (:class:`~fastload.records.remote.cache.ShardCache`), and returns a
:class:`RemoteDataset`: the same API as a local packed dataset (records by global index, zero-copy
views into memory-mapped shards), whose shards are downloaded whole into the cache when needed.

Fetching ahead: the loader tells the dataset, at the start of each epoch, the records this rank
will read in order (:meth:`RemoteDataset.will_read`) and, after each batch, which ones it consumed
(:meth:`RemoteDataset.done_with`). From that plan a background thread keeps the shards being read
plus the next ``prefetch_shards`` ones downloaded (``fetch_threads`` downloads at a time), pinned
against eviction; shards whose records are all consumed are unmapped and unpinned. With the
shard-aware order (``shuffle="shard"``) a rank reads few shards at a time, so the cache holds only
those. Without a plan (direct ``ds.image(i)`` calls) a shard is downloaded when first touched.

:meth:`RemoteDataset.remote_stats` tells how often and how long reading waited for the network.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from fastload.errors import UserError
from fastload.records import recordio
from fastload.records.lmdb_shard import LmdbShard
from fastload.records.manifest import FORMAT_VERSION, MANIFEST_NAME, load_index
from fastload.records.remote.cache import (
    CACHE_MARKER,
    CachedObject,
    CacheError,
    NoRoomYet,
    ShardCache,
    default_cache_dir,
    shard_objects,
)
from fastload.records.remote.fetch import DEFAULT_RETRY, FetchError, RetryPolicy
from fastload.records.remote.storage import RemoteNotFound, RemoteStore, is_remote_url
from fastload.records.sharded import ShardedDataset

__all__ = ["CACHE_MARKER", "RemoteDataset", "is_remote_url", "open_remote_dataset", "parse_bytes"]

log = logging.getLogger("fastload.remote")


def parse_bytes(value: int | str | None, name: str) -> int | None:
    """``cache_limit`` as bytes: an int, or a size string like ``"20GB"`` (powers of 1024)."""
    if value is None:
        return None
    if isinstance(value, str):
        import re

        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", value, re.IGNORECASE)
        if not m:
            raise UserError(f"{name}={value!r}: expected bytes or a size like 20GB")
        value = int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UserError(f"{name}={value!r} must be a positive number of bytes")
    return int(value)


class _CachedShard:
    """A shard that is mapped from the cache on first use (the interface ShardedDataset reads)."""

    def __init__(self, owner: RemoteDataset, number: int, obj: CachedObject) -> None:
        self._owner, self.number, self.obj = owner, number, obj
        self.name = obj.shard
        self.size = obj.size
        self.path = owner.store.url_of(obj.key)

    def _shard(self) -> Any:
        return self._owner._acquire(self.number)

    def payload(self, offset: int, length: int = -1, parts: int = 0, record: int | None = None) -> Any:
        return self._shard().payload(offset, length, parts, record)

    def value(self, record: int) -> bytes:
        return self._shard().value(record)

    def will_need(self, offset: int, length: int) -> None:
        shard = self._owner._mapped(self.number)
        if shard is not None and hasattr(shard, "_advise"):
            shard.will_need(offset, length)

    def done_with(self, offset: int, length: int) -> None:
        shard = self._owner._mapped(self.number)
        if shard is not None and hasattr(shard, "done_with"):
            shard.done_with(offset, length)

    def close(self) -> None:
        self._owner._unmap(self.number)


class RemoteDataset(ShardedDataset):
    """A packed dataset in object storage, read through a per-node shard cache.

    Built by :func:`open_remote_dataset`; see the module docstring.

    Attributes:
        store: The dataset's remote root.
        cache: The node's shard cache.
    """

    def __init__(
        self,
        *,
        store: RemoteStore,
        cache: ShardCache,
        manifest: dict[str, Any],
        index: np.ndarray,
        prefetch_shards: int = 2,
        fetch_threads: int = 2,
    ) -> None:
        self.store, self.cache = store, cache
        self.prefetch_shards, self.fetch_threads = prefetch_shards, fetch_threads
        self._objects = shard_objects(manifest)
        self._state = threading.RLock()
        self._open: dict[int, Any] = {}
        self._futures: dict[int, Future] = {}
        self._plan: np.ndarray | None = None  # visits: rows (first position, last position, shard)
        self._planned: set = set()  # shards the plan reads
        self._active = 1  # the most shards a plan reads at once
        self._cursor = 0
        self._waits = 0
        self._waited = 0.0
        self._stop = threading.Event()
        self._wake = threading.Condition(self._state)
        self._reader = cache.reader()
        # Stand-ins with the shard interface ShardedDataset reads: mapped on first use.
        shards: list[Any] = [_CachedShard(self, n, obj) for n, obj in enumerate(self._objects)]
        try:
            super().__init__(
                path=store.url, kind=f"fastload-{manifest['format']}", shards=shards, index=index, manifest=manifest
            )
        except BaseException:
            self._reader.close()
            raise
        self._lmdb = manifest.get("format") == "lmdb"
        self._pool = ThreadPoolExecutor(max_workers=fetch_threads, thread_name_prefix="fastload-fetch")
        self._manager: threading.Thread | None = None
        self._start_manager()
        _open_datasets.add(self)

    def _start_manager(self) -> None:
        self._manager = threading.Thread(target=self._manage, name="fastload-prefetch-shards", daemon=True)
        self._manager.start()

    def _after_fork_in_child(self) -> None:
        """A forked child (a torch DataLoader worker) starts with its own threads, locks and pins.

        The parent's prefetch threads do not exist here and any of its locks may have been held at
        the fork; its mapped shards and its downloads in flight are the parent's. The child reads
        on demand (downloads run in a helper process, :mod:`fastload.records.remote.spawned`) and starts
        prefetching when it is given a plan (:meth:`will_read`).
        """
        self._lock = threading.Lock()
        self._state = threading.RLock()
        self._wake = threading.Condition(self._state)
        self._stop = threading.Event()
        self._open, self._futures = {}, {}
        self._plan, self._planned, self._active, self._cursor = None, set(), 1, 0
        self._waits, self._waited = 0, 0.0
        self._pool = ThreadPoolExecutor(max_workers=self.fetch_threads, thread_name_prefix="fastload-fetch")
        self._manager = None
        # The parent's reader registration stays the parent's (its methods do nothing here).
        try:
            self._reader = self.cache.reader()
        except (OSError, CacheError) as exc:
            log.warning(
                "forked process %d: cannot register as a reader of cache %s (%s); its shards are not "
                "pinned against eviction by other processes",
                os.getpid(),
                self.cache.folder,
                exc,
            )

    # --- the loader's hints --------------------------------------------------------------------

    def will_read(self, *parts: Iterable[int]) -> None:
        """The records this reader will read next, in order (replaces the previous plan).

        Args:
            parts: One array of record indices per epoch (the rest of this epoch, then the next):
                a shard read in two epochs is two visits, each spanning its first to last read.

        Shards are fetched ahead following it; see the module docstring.
        """
        visits = []
        offset = 0
        for part in parts:
            idx = np.asarray(part if isinstance(part, np.ndarray) else list(part), dtype=np.int64)
            if idx.size:
                seq = self._shard[idx].astype(np.int64)
                shards, first = np.unique(seq, return_index=True)
                _, last_rev = np.unique(seq[::-1], return_index=True)
                visits.append(np.stack([first + offset, len(seq) - 1 - last_rev + offset, shards], 1))
            offset += idx.size
        plan = np.concatenate(visits) if visits else np.zeros((0, 3), np.int64)
        plan = plan[np.lexsort((plan[:, 2], plan[:, 0]))]
        active = 1
        if len(plan):
            # The most visits in progress at once: +1 at a visit's first read, -1 after its last.
            events = np.concatenate(
                [
                    np.stack([plan[:, 0], np.ones(len(plan), np.int64)], 1),
                    np.stack([plan[:, 1] + 1, -np.ones(len(plan), np.int64)], 1),
                ]
            )
            events = events[np.lexsort((events[:, 1], events[:, 0]))]
            active = max(1, int(np.cumsum(events[:, 1]).max()))
        with self._state:
            self._plan = plan
            self._planned = set(plan[:, 2].tolist())
            self._active = active
            self._cursor = 0
            self._unmap_unneeded()
            if self._manager is None and not self._closed:  # in a forked child
                self._start_manager()
            self._wake.notify_all()

    def done_with(self, indices: Iterable[int]) -> None:
        """Records consumed: advances the plan, unmaps and unpins shards it no longer reads."""
        idx = indices if isinstance(indices, np.ndarray) else np.asarray(list(indices), dtype=np.int64)
        super().done_with(idx)
        with self._state:
            if self._plan is None:
                return
            self._cursor += len(idx)
            self._unmap_unneeded()
            self._wake.notify_all()

    def _unmap_unneeded(self) -> None:
        """Unmap (and so unpin) the shards the plan does not read now or next."""
        keep = set(self._targets())
        for s in [s for s in self._open if s not in keep]:
            self._unmap(s)

    def remote_stats(self) -> dict[str, Any]:
        """How much this process fetched, and how often and how long reads waited for the network.

        ``fetched`` objects and ``fetched_bytes`` by this process, ``waits`` (reads that found their
        shard not yet in the cache) and ``waited_seconds`` (how long they waited), the cache folder.
        """
        return {
            "fetched": self.cache.fetched,
            "fetched_bytes": self.cache.fetched_bytes,
            "waits": self._waits,
            "waited_seconds": self._waited,
            "cache_dir": self.cache.folder,
        }

    def locate(self, i: int) -> str:
        """``"shard s3://bucket/prefix/name-00003.rec record 17"``."""
        i, _, shard, record = self._where(i)
        return f"shard {shard.path} record {record}"

    # --- shards --------------------------------------------------------------------------------

    def _targets(self) -> list[int]:
        """Shards to have in the cache now: those being read, then the next ``prefetch_shards``."""
        if self._plan is None:
            return []
        pending = self._plan[self._plan[:, 1] >= self._cursor, 2]  # visits not finished, by first read
        return list(dict.fromkeys(pending[: self._active + self.prefetch_shards].tolist()))

    def _publish(self) -> None:
        keys = self._objects
        pinned = {keys[s].key for s in self._open} | {keys[s].key for s in self._targets()}
        upcoming = []
        if self._plan is not None:
            pending = self._plan[self._plan[:, 1] >= self._cursor, 2]
            upcoming = [keys[s].key for s in dict.fromkeys(pending.tolist())]
        self._reader.update(pinned, upcoming)

    def _manage(self) -> None:
        """Background thread: keep the plan's next shards downloaded."""
        while not self._stop.is_set():
            with self._state:
                targets = self._targets()
                for s in targets:
                    if s in self._open:
                        continue
                    fut = self._futures.get(s)
                    # A prefetch that found no room yet is tried again; one that failed is fetched
                    # again by the read that needs it (which raises if that fails too).
                    if fut is not None and not (fut.done() and isinstance(fut.exception(), NoRoomYet)):
                        continue
                    self._futures[s] = self._pool.submit(self._prefetch, s)
                keep = set(targets) | set(self._open)
                for s in [s for s, f in self._futures.items() if s not in keep and f.done()]:
                    del self._futures[s]
                self._publish()
                self._wake.wait(0.5)

    def _prefetch(self, s: int) -> str:
        return self.cache.ensure(self._objects[s], stop=self._stop, wait_for_room=False)

    def _mapped(self, s: int) -> Any:
        return self._open.get(s)

    def _acquire(self, s: int) -> Any:
        """Shard ``s`` mapped, downloading it first when needed (called by record reads)."""
        shard = self._open.get(s)
        if shard is not None:
            return shard
        if self._closed:
            raise ValueError(f"dataset {self.path} is closed")
        obj = self._objects[s]
        with self._state:
            shard = self._open.get(s)
            if shard is not None:
                return shard
            fut = self._futures.get(s)
            if self._plan is None or s not in self._planned:
                self._reader.update({o.key for o in (self._objects[x] for x in self._open)} | {obj.key}, [])
        t0 = time.perf_counter()
        waited = not self.cache.has(obj)
        path = None
        if fut is not None:
            try:
                path = fut.result()
            except FetchError as exc:
                log.warning("prefetch of %s failed (%s); fetching it again now", obj.key, exc)
            except Exception:
                path = None
        for _attempt in range(3):
            if path is None:
                path = self.cache.ensure(obj, stop=self._stop)
            try:
                opened = LmdbShard(os.path.dirname(path)) if self._lmdb else recordio.RecordIOShard(path)
                break
            except FileNotFoundError:  # evicted between the check and the open: fetch it again
                path = None
        else:
            raise FetchError(
                f"{obj.shard}: evicted from {self.cache.folder} three times while being opened; "
                "cache_limit is too small for the readers on this node",
                url=self.store.url_of(obj.key),
            )
        if waited:
            self._waits += 1
            self._waited += time.perf_counter() - t0
        with self._state:
            current = self._open.get(s)
            if current is not None:
                opened.close()
                return current
            self._open[s] = opened
            if self._plan is None:
                self._evict_unplanned(s)
            self._publish()
            self._wake.notify_all()
        return opened

    def _evict_unplanned(self, keep: int) -> None:
        """Without a plan, keep at most ``prefetch_shards + 1`` shards mapped (least recent go)."""
        while len(self._open) > self.prefetch_shards + 1:
            victim = next(s for s in self._open if s != keep)
            self._unmap(victim)

    def _unmap(self, s: int) -> None:
        with self._state:
            shard = self._open.pop(s, None)
        if shard is not None:
            shard.close()

    def close(self) -> None:
        """Stop prefetching, unmap every shard and leave the cache (idempotent)."""
        if self._closed:
            return
        self._stop.set()
        with self._state:
            self._wake.notify_all()
        if self._manager is not None:
            self._manager.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=True)
        super().close()
        with self._state:
            for s in list(self._open):
                self._unmap(s)
        self._reader.close()


_open_datasets: weakref.WeakSet[RemoteDataset] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for ds in list(_open_datasets):
        if not ds._closed:
            ds._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)


def open_remote_dataset(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | None = None,
    cache_limit: int | str | None = None,
    prefetch_shards: int = 2,
    fetch_threads: int = 2,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> RemoteDataset:
    """Open a packed dataset stored under ``url`` (``s3://bucket/prefix``, ``gs://...``, ``https://...``).

    Args:
        url: The dataset's root (where ``fastload.json`` is).
        storage_options: Credentials, endpoint, timeouts (see :mod:`fastload.records.remote.storage`).
        cache_dir: The node's cache folder for this dataset (shared by the ranks that give the same
            one). Default: ``/dev/shm/fastload-cache/<hash of url>`` when /dev/shm has room for the
            dataset (or ``cache_limit``), else ``~/.cache/fastload/<hash>``.
        cache_limit: Bytes (or ``"20GB"``) the cached shards may take; None: no limit.
        prefetch_shards: Shards downloaded ahead of those being read.
        fetch_threads: Downloads at a time.
        retry: Attempts and backoff of one download.

    Raises:
        UserError: Bad options, no manifest at ``url``, an unsupported format.
        RemoteError / FetchError: The storage could not be reached (the message names the URL).
    """
    for value, name, minimum in ((prefetch_shards, "prefetch_shards", 0), (fetch_threads, "fetch_threads", 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise UserError(f"{name}={value!r} must be an int >= {minimum}")
    limit = parse_bytes(cache_limit, "cache_limit")
    store = RemoteStore(url, storage_options)
    manifest_bytes = None
    if cache_dir is None:
        try:
            manifest_bytes = store.get_bytes(MANIFEST_NAME)
        except RemoteNotFound:
            raise UserError(
                f"{store.url_of(MANIFEST_NAME)}: no manifest (not a packed fastload dataset, or an unfinished pack)"
            ) from None
        import json

        try:
            total = sum(int(s.get("bytes", 0)) for s in json.loads(manifest_bytes).get("shards", []))
        except (ValueError, AttributeError, TypeError) as exc:
            raise UserError(f"{store.url_of(MANIFEST_NAME)}: unreadable manifest ({exc})") from None
        cache_dir = default_cache_dir(store.url, min(total, limit) if limit else total)
    cache = ShardCache(os.fspath(cache_dir), store, limit=limit, policy=retry)
    try:
        manifest, index_path = cache.metadata(manifest_bytes)
    except Exception as exc:
        if isinstance(exc, RemoteNotFound):
            raise UserError(
                f"{store.url_of(MANIFEST_NAME)}: no manifest (not a packed fastload dataset, or an unfinished pack)"
            ) from None
        raise
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UserError(
            f"{store.url_of(MANIFEST_NAME)}: manifest format_version {version!r} is not supported "
            f"(this fastload reads up to {FORMAT_VERSION})"
        )
    if manifest.get("format") not in ("recordio", "lmdb"):
        raise UserError(f"{store.url_of(MANIFEST_NAME)}: unknown dataset format {manifest.get('format')!r}")
    index = load_index(index_path, int(manifest["label_width"]), int(manifest["records"]))
    ds = RemoteDataset(
        store=store,
        cache=cache,
        manifest=manifest,
        index=index,
        prefetch_shards=prefetch_shards,
        fetch_threads=fetch_threads,
    )
    # Unpickled (a spawned DataLoader worker), it reopens through the same cache folder.
    options = {"storage_options": store.storage_options, "cache_dir": cache.folder, "cache_limit": limit}
    ds._opened_by = (
        open_remote_dataset,
        (url,),
        {**options, "prefetch_shards": prefetch_shards, "fetch_threads": fetch_threads, "retry": retry},
    )
    return ds
