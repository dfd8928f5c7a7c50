"""Read stage, remote: the per-node shard cache that several ranks share without a daemon.

One cache folder holds one remote dataset, laid out as a dataset folder (so a complete cache, or a
``fastload copy`` output, also opens as a local dataset)::

    fastload-cache.json          which URL this caches (and the manifest's etag when it was fetched)
    fastload.json                the remote manifest, fetched once per node
    fastload-index.npy           the remote record index, fetched once per node, checksum-verified
    <shard files>                complete, checksum-verified shards under their manifest names
    .fastload-cache/             coordination between the processes using the cache:
        locks/<object>.lock      one process downloads an object; the others wait on this lock
        cache.lock               held while the space accounting and eviction are decided
        reserved/<object>        bytes reserved by a download in flight
        readers/<id>.lock        held (flock) by an open reader for its whole life
        readers/<id>.json        that reader's pinned shards and the shards it will read later

Coordination uses ``flock`` locks and atomic renames only. The kernel drops a dead process's locks
(kill -9 included): a reader whose lock can be taken is gone, and its files are removed by the
next process that looks. A download lands under a temporary name and is renamed only once its size
and checksum match the manifest (:mod:`fastload.records.remote.fetch`), so every file under a shard's name
is complete and verified; a second rank wanting the same shard waits for the first one's download
instead of fetching it again.

``limit`` (bytes) bounds the shards kept plus the downloads in flight. Making room evicts shards no
live reader has pinned, first those no reader will read again (least recently used first), then
those needed furthest in the future. Pinned shards (mapped by a reader, or fetched ahead for it) are
never evicted; when they alone leave no room, the download waits for a reader to unpin one, up to a
timeout, then fails with the numbers. Eviction unlinks the file: a process that still maps it keeps
reading it, and the space returns when it unmaps it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from fastload.checksum import file_matches, recorded_checksum
from fastload.errors import FastloadError, UserError
from fastload.folder import INDEX_NAME, MANIFEST_NAME
from fastload.records.remote.fetch import DEFAULT_RETRY, RetryPolicy, fetch_to_file
from fastload.records.remote.storage import ObjectInfo, RemoteStore

__all__ = [
    "CACHE_MARKER",
    "CacheError",
    "CacheFullError",
    "CachedObject",
    "NoRoomYet",
    "ShardCache",
    "default_cache_dir",
    "fill_object",
    "mark_as_cache",
    "object_lock",
    "shard_objects",
]

log = logging.getLogger("fastload.remote")

CACHE_MARKER = "fastload-cache.json"
_META = ".fastload-cache"
_POLL = 0.05  # seconds between two tries of a lock another process holds


class CacheError(FastloadError):
    """The cache folder cannot be used (wrong dataset, unwritable, a stalled peer download)."""


class CacheFullError(CacheError):
    """``cache_limit`` cannot hold what the readers need at once."""


class NoRoomYet(CacheError):
    """A download that must not wait for room (a prefetch) found none; it is tried again later."""


@dataclass(frozen=True)
class CachedObject:
    """One remote object of a dataset and where it lands in the cache.

    Attributes:
        key: Key below the dataset's URL (``train-00003.rec``, ``x-00000.lmdb/data.mdb``).
        shard: The manifest's shard file name this object belongs to.
        size: Bytes, from the manifest.
        checksum: ``"<algo>:<hex>"`` from the manifest.
    """

    key: str
    shard: str
    size: int
    checksum: str | None


def shard_objects(manifest: dict[str, Any]) -> list[CachedObject]:
    """The object holding each shard's records, in manifest order (LMDB: the environment's data.mdb).

    Raises:
        UserError: A shard name that would leave the dataset folder.
    """
    out = []
    for entry in manifest.get("shards", []):
        name = str(entry["file"])
        if not name or name.startswith(("/", ".")) or "/" in name or "\\" in name or name in ("..", "."):
            raise UserError(f"manifest lists shard {name!r}, which is not a plain file name in the dataset folder")
        key = f"{name}/data.mdb" if manifest.get("format") == "lmdb" else name
        out.append(CachedObject(key, name, int(entry["bytes"]), recorded_checksum(entry)))
    return out


def default_cache_dir(url: str, need_bytes: int) -> str:
    """Where a dataset's shards are cached by default.

    ``/dev/shm/fastload-cache/<hash>`` when /dev/shm has ``need_bytes`` free (plus 10%), else
    ``$XDG_CACHE_HOME/fastload/<hash>`` (``~/.cache/fastload/<hash>``).
    """
    import hashlib

    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    disk = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastload", key)
    shm = os.path.join("/dev/shm", "fastload-cache", key)
    for folder in (shm, disk):
        if os.path.isfile(os.path.join(folder, CACHE_MARKER)):
            return folder
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= need_bytes * 1.1:
            return shm
    except OSError:
        pass
    return disk


class _FileLock:
    """An exclusive ``flock`` on a lock file, taken with a deadline instead of blocking forever.

    Threads of one process first queue on an in-process lock of the same path: a thread waiting
    for another thread of its own process (a prefetch and a read wanting the same shard) wakes the
    moment it is released instead of at the next poll of the ``flock``. A forked child (a
    DataLoader worker) closes its copies of the descriptors of the locks held at the fork: an
    ``flock`` belongs to the open file, so a child's copy would otherwise keep the parent's lock
    taken after the parent released it, stalling every process that waits for it.
    """

    _threads_guard: ClassVar[threading.Lock] = threading.Lock()
    # Lock file path -> [its in-process lock, threads holding or waiting]; an entry lives while used.
    _threads: ClassVar[dict[str, list[Any]]] = {}
    _held: ClassVar[set[_FileLock]] = set()  # locks this process holds (their descriptors carry the flock)

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.fd = -1
        self._entry: list[Any] | None = None  # this lock's in-process entry while acquiring or held

    def _enter(self) -> threading.Lock:
        with _FileLock._threads_guard:
            entry = _FileLock._threads.setdefault(self.path, [threading.Lock(), 0])
            entry[1] += 1
        self._key, self._entry = self.path, entry  # the key stays if the path is renamed while held
        return entry[0]

    def _leave(self) -> None:
        entry, self._entry = self._entry, None
        if entry is None:
            return
        with _FileLock._threads_guard:
            entry[1] -= 1
            if entry[1] == 0 and _FileLock._threads.get(self._key) is entry:
                del _FileLock._threads[self._key]

    def acquire(self, timeout: float | None, *, waiting: Callable[[], None] | None = None) -> bool:
        """Take the lock; ``waiting()`` runs between tries (it may raise). False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        in_process = self._enter()
        try:
            while not in_process.acquire(timeout=_POLL):
                if deadline is not None and time.monotonic() >= deadline:
                    self._leave()
                    return False
                if waiting is not None:
                    waiting()
        except BaseException:
            self._leave()
            raise
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    _FileLock._held.add(self)
                    return True
                except BlockingIOError:
                    pass
                if deadline is not None and time.monotonic() >= deadline:
                    self.release()
                    return False
                if waiting is not None:
                    waiting()
                time.sleep(_POLL)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        _FileLock._held.discard(self)
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)  # closing the descriptor drops the flock
        entry = self._entry
        if entry is not None:
            entry[0].release()
            self._leave()

    @classmethod
    def _after_fork_in_child(cls) -> None:
        # The parent's threads are gone in a forked child (a DataLoader worker): the locks they held
        # stay the parent's. Closing the child's copy of a descriptor leaves the parent's flock in
        # place; no flock(LOCK_UN), which would drop it for the parent too.
        for lock in list(cls._held):
            with contextlib.suppress(OSError):
                os.close(lock.fd)
            lock.fd, lock._entry = -1, None
        cls._held = set()
        cls._threads_guard = threading.Lock()
        cls._threads = {}


os.register_at_fork(after_in_child=_FileLock._after_fork_in_child)


def object_lock(folder: str, key: str) -> _FileLock:
    """The lock a process holds while it writes object ``key`` into the cache folder ``folder``."""
    locks = os.path.join(folder, _META, "locks")
    os.makedirs(locks, exist_ok=True)
    return _FileLock(os.path.join(locks, key.replace("/", "%") + ".lock"))


def _remove_stale_parts(path: str) -> None:
    """Delete the temporary files of earlier, killed downloads of ``path`` (call with its lock held)."""
    folder, base = os.path.split(path)
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith("." + base + ".") and entry.name.endswith(".part"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def fill_object(folder: str, key: str, size: int | None, write: Callable[[str], int]) -> int:
    """Put object ``key`` into the cache folder ``folder`` the way the cache itself does.

    For a process that fills a cache folder from elsewhere (``fastload copy``): it takes the
    object's lock, so that ranks reading ``folder`` as their cache never write the same file at
    the same time, and deletes the temporary files a killed writer left (known stale once the lock
    is held). A file already there with ``size`` bytes is complete (a file gets its final name only
    once verified) and is kept.

    Args:
        folder: The cache folder (or a dataset folder becoming one).
        key: The object's key below the dataset's root (``train-00003.rec``, ``x.lmdb/data.mdb``).
        size: Its size from the manifest; None: unknown, always written.
        write: ``write(path)`` writes the object at ``path`` through a temporary file named
            ``.<name>.<anything>.part`` beside it, renamed onto ``path`` once verified (as
            :func:`fastload.records.remote.fetch.fetch_to_file` does); returns the bytes written.

    Returns:
        The bytes written; 0 when the object was already there.
    """
    path = os.path.join(folder, *key.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = object_lock(folder, key)
    lock.acquire(None)
    try:
        if size is not None and os.path.isfile(path) and os.path.getsize(path) == size:
            return 0
        _remove_stale_parts(path)
        return write(path)
    finally:
        lock.release()


def mark_as_cache(folder: str, store: RemoteStore) -> None:
    """Make the dataset folder ``folder`` a cache folder of the dataset at ``store``.

    Writes the marker a :class:`ShardCache` of that URL reads (the URL, and the remote manifest's
    etag and size as of now): shards missing from the folder are then fetched from the URL when a
    rank needs them (``open_dataset(folder)`` or ``open_dataset(url, cache_dir=folder)``).
    """
    _write_marker(folder, store, store.head(MANIFEST_NAME))


def _write_marker(folder: str, store: RemoteStore, head: ObjectInfo) -> None:
    _write_json(
        os.path.join(folder, CACHE_MARKER),
        {"source": store.url, "manifest_etag": head.etag, "manifest_size": head.size},
    )


def _write_json(path: str, obj: Any) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _read_json(path: str) -> Any | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class ShardCache:
    """A cache folder for one remote dataset, shared by every process of the node that opens it.

    Args:
        folder: The cache folder (created).
        store: The dataset's remote root.
        limit: Bytes the cached shards may take (None: unbounded).
        policy: Retries of a download.
        stall_timeout: Seconds without progress after which waiting for another process's
            download, or for room in a full cache, fails.

    Raises:
        CacheError: The folder caches another URL, or cannot be created.
    """

    def __init__(
        self,
        folder: str,
        store: RemoteStore,
        *,
        limit: int | None = None,
        policy: RetryPolicy = DEFAULT_RETRY,
        stall_timeout: float = 120.0,
    ) -> None:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise UserError(f"cache_limit={limit!r} must be a positive number of bytes")
        self.folder = os.path.abspath(folder)
        self.store, self.limit, self.policy, self.stall_timeout = store, limit, policy, stall_timeout
        self.meta = os.path.join(self.folder, _META)
        try:
            for sub in ("locks", "reserved", "readers"):
                os.makedirs(os.path.join(self.meta, sub), exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cache folder {self.folder}: cannot create it ({exc.strerror or exc})") from None
        marker = _read_json(os.path.join(self.folder, CACHE_MARKER))
        if marker is not None and marker.get("source") != store.url:
            raise CacheError(
                f"cache folder {self.folder} holds a cache of {marker.get('source')!r}, "
                f"not of {store.url!r}; give another cache_dir"
            )
        self.fetched = 0  # objects this process downloaded (tests and stats)
        self.fetched_bytes = 0

    # --- paths and locks -----------------------------------------------------------------------

    def path(self, key: str) -> str:
        """Local path of an object."""
        return os.path.join(self.folder, *key.split("/"))

    def _lock(self, name: str) -> _FileLock:
        return object_lock(self.folder, name)

    def _progress(self, obj_path: str) -> int:
        """Bytes in the temporary files of downloads of ``obj_path`` (another process's progress)."""
        folder, base = os.path.split(obj_path)
        total = 0
        try:
            for entry in os.scandir(folder):
                if entry.name.startswith("." + base + ".") and entry.name.endswith(".part"):
                    with contextlib.suppress(FileNotFoundError):
                        total += entry.stat().st_size
        except FileNotFoundError:
            pass
        return total

    def _wait_guard(self, what: str, progress: Callable[[], Any]) -> Callable[[], None]:
        """A ``waiting`` callback that raises when ``progress()`` stops changing for stall_timeout s."""
        state = {"value": progress(), "since": time.monotonic()}

        def check() -> None:
            value = progress()
            now = time.monotonic()
            if value != state["value"]:
                state["value"], state["since"] = value, now
            elif now - state["since"] > self.stall_timeout:
                raise CacheError(f"waited {self.stall_timeout:.0f} s without progress for {what}")

        return check

    # --- the manifest and index ----------------------------------------------------------------

    def metadata(self, manifest_bytes: bytes | None = None) -> tuple[dict[str, Any], str]:
        """The manifest (parsed) and the local path of the verified index, fetched once per node.

        A cached manifest is reused while the remote one keeps its etag (one HEAD); when the remote
        dataset was rewritten, the new manifest and index replace the old ones and cached shards
        whose checksum changed are dropped.

        Args:
            manifest_bytes: The remote manifest when the caller already downloaded it.
        """
        lock = self._lock(MANIFEST_NAME)
        if not lock.acquire(self.stall_timeout * 5):
            raise CacheError(f"cache folder {self.folder}: another process holds the manifest lock")
        try:
            head = self.store.head(MANIFEST_NAME)
            marker = _read_json(os.path.join(self.folder, CACHE_MARKER)) or {}
            local_manifest = os.path.join(self.folder, MANIFEST_NAME)
            old = _read_json(local_manifest)
            if (
                old is not None
                and marker.get("manifest_etag") == head.etag
                and marker.get("manifest_size") == head.size
                and os.path.isfile(os.path.join(self.folder, old.get("index", {}).get("file", INDEX_NAME)))
            ):
                return old, os.path.join(self.folder, old.get("index", {}).get("file", INDEX_NAME))
            data = manifest_bytes if manifest_bytes is not None else self.store.get_bytes(MANIFEST_NAME)
            try:
                manifest = json.loads(data)
            except ValueError as exc:
                raise CacheError(f"{self.store.url_of(MANIFEST_NAME)}: unreadable manifest ({exc})") from None
            index_meta = manifest.get("index", {}) if isinstance(manifest, dict) else {}
            index_name = str(index_meta.get("file", INDEX_NAME))
            if "/" in index_name or index_name.startswith("."):
                raise UserError(f"{self.store.url_of(MANIFEST_NAME)}: index file {index_name!r} leaves the dataset")
            index_path = os.path.join(self.folder, index_name)
            checksum = recorded_checksum(index_meta)
            if not (os.path.isfile(index_path) and checksum and file_matches(index_path, checksum)):
                fetch_to_file(self.store, index_name, index_path, checksum=checksum, policy=self.policy)
                self.fetched += 1
            if old is not None:
                self._drop_changed(old, manifest)
            tmp = local_manifest + f".{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, local_manifest)
            _write_marker(self.folder, self.store, head)
            return manifest, index_path
        finally:
            lock.release()

    def _drop_changed(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        try:
            before = {o.key: o for o in shard_objects(old)}
        except (UserError, KeyError, TypeError, ValueError):
            before = {}
        after = {o.key: o for o in shard_objects(new)}
        for key, obj in before.items():
            if after.get(key) != obj:
                self._remove(key)

    # --- shards --------------------------------------------------------------------------------

    def has(self, obj: CachedObject) -> bool:
        """Whether a verified copy of ``obj`` is in the cache."""
        try:
            return os.stat(self.path(obj.key)).st_size == obj.size
        except OSError:
            return False

    def ensure(self, obj: CachedObject, *, stop: threading.Event | None = None, wait_for_room: bool = True) -> str:
        """The local path of ``obj``, downloading it unless it is cached or another process is.

        Args:
            obj: The object.
            stop: Set it to cancel a download in progress (raises ``InterruptedError``).
            wait_for_room: With a full cache, wait for readers to unpin shards (a read that needs
                the shard now); False raises :class:`NoRoomYet` at once (a prefetch).

        Raises:
            FetchError: The download failed after its retries.
            CacheFullError: No room within the limit (see the module docstring).
            CacheError: Another process's download of it stalled.
        """
        path = self.path(obj.key)
        if self.has(obj):
            _touch(path)
            return path
        lock = self._lock(obj.key)
        lock.acquire(
            None,
            waiting=self._wait_guard(
                f"another process downloading {self.store.url_of(obj.key)} into {path}", lambda: self._progress(path)
            ),
        )
        try:
            if self.has(obj):  # another process fetched it while this one waited
                _touch(path)
                return path
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _remove_stale_parts(path)  # a download killed half way (its process is gone: we hold the lock)
            self._reserve(obj, stop, wait_for_room)
            try:
                fetch_to_file(
                    self.store, obj.key, path, size=obj.size, checksum=obj.checksum, policy=self.policy, stop=stop
                )
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise CacheError(
                        f"cache folder {self.folder}: no space left while fetching "
                        f"{self.store.url_of(obj.key)} ({obj.size} bytes); set cache_limit or "
                        "another cache_dir"
                    ) from None
                raise
            finally:
                self._unreserve(obj)
            self.fetched += 1
            self.fetched_bytes += obj.size
            return path
        finally:
            lock.release()

    def _remove(self, key: str) -> None:
        path = self.path(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(path, ignore_errors=True)

    def _unreserve(self, obj: CachedObject) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.meta, "reserved", obj.key.replace("/", "%")))

    def _reserve(self, obj: CachedObject, stop: threading.Event | None, wait_for_room: bool = True) -> None:
        """Account for ``obj``'s bytes before downloading it, evicting unpinned shards if needed."""
        if self.limit is None:
            return
        if obj.size > self.limit:
            raise CacheFullError(
                f"cache_limit={self.limit} bytes cannot hold shard {obj.shard} ({obj.size} bytes) of {self.store.url}"
            )
        lock = _FileLock(os.path.join(self.meta, "cache.lock"))
        state: dict[str, int | None] = {"last": None}

        def progress() -> int | None:
            return state["last"]

        guard = self._wait_guard(f"room in the cache ({self.limit} bytes) for {obj.shard}", progress)
        while True:
            if stop is not None and stop.is_set():
                raise InterruptedError("download cancelled")
            if not lock.acquire(self.stall_timeout):
                raise CacheError(
                    f"cache folder {self.folder}: the cache lock was not released in {self.stall_timeout:.0f} s"
                )
            try:
                fits, pinned_bytes, used = self._make_room(obj)
                if fits:
                    _write_json(os.path.join(self.meta, "reserved", obj.key.replace("/", "%")), {"bytes": obj.size})
                    return
            finally:
                lock.release()
            if not wait_for_room:
                raise NoRoomYet(f"no room yet in the cache for {obj.shard}")
            state["last"] = used  # any change (a reader unpinned, a download finished) is progress
            try:
                guard()
            except CacheError:
                raise CacheFullError(
                    f"cache_limit={self.limit} bytes cannot hold shard {obj.shard} ({obj.size} bytes): "
                    f"{pinned_bytes} bytes are pinned by the readers on this node and {used} are in use; "
                    "raise cache_limit, lower prefetch_shards or window, or read with shuffle='shard' "
                    "(a global shuffle reads every shard at once)"
                ) from None
            time.sleep(0.2)

    def _make_room(self, obj: CachedObject) -> tuple[bool, int, int]:
        """Under the cache lock: evict until ``obj`` fits. Returns ``(fits, pinned bytes, used bytes)``."""
        readers = self.readers()
        pinned = set()
        next_use: dict[str, int] = {}
        for r in readers:
            pinned.update(r.get("pinned", []))
            for pos, key in enumerate(r.get("upcoming", [])):
                next_use[key] = min(next_use.get(key, pos), pos)
        reserved = {}
        for entry in os.scandir(os.path.join(self.meta, "reserved")):
            info = _read_json(entry.path)
            if info is not None:
                reserved[entry.name.replace("%", "/")] = int(info.get("bytes", 0))
        limit = self.limit
        assert limit is not None  # only called with a limit
        cached = self._cached_objects()
        used = sum(size for _, size, _ in cached) + sum(reserved.values())
        pinned_bytes = sum(size for key, size, _ in cached if key in pinned)
        if used + obj.size <= limit:
            return True, pinned_bytes, used
        # Never needed again first (least recently used first), then needed furthest in the future.
        candidates = [(key, size, mtime) for key, size, mtime in cached if key not in pinned and key not in reserved]
        candidates.sort(key=lambda c: (0, c[2], c[0]) if c[0] not in next_use else (1, -next_use[c[0]], c[0]))
        for key, size, _ in candidates:
            if used + obj.size <= limit:
                break
            self._remove(key)
            used -= size
            log.debug("cache %s: evicted %s (%d bytes)", self.folder, key, size)
        return used + obj.size <= limit, pinned_bytes, used

    def _cached_objects(self) -> list[tuple[str, int, float]]:
        """``(key, size, mtime)`` of every cached shard object (manifest-listed files only)."""
        manifest = _read_json(os.path.join(self.folder, MANIFEST_NAME)) or {}
        out = []
        try:
            objects = shard_objects(manifest)
        except (UserError, KeyError, TypeError, ValueError):
            objects = []
        for obj in objects:
            try:
                st = os.stat(self.path(obj.key))
            except OSError:
                continue
            out.append((obj.key, st.st_size, st.st_mtime))
        return out

    def cached_bytes(self) -> int:
        """Bytes of the shards in the cache now."""
        return sum(size for _, size, _ in self._cached_objects())

    # --- readers -------------------------------------------------------------------------------

    def readers(self) -> list[dict[str, Any]]:
        """The live readers' states; files of dead readers are removed."""
        folder = os.path.join(self.meta, "readers")
        out = []
        for entry in os.scandir(folder):
            if not entry.name.endswith(".lock"):
                continue
            rid = entry.name[:-5]
            fd = os.open(entry.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                state = _read_json(os.path.join(folder, rid + ".json"))
                if state is not None:
                    out.append(state)
                continue
            finally:
                os.close(fd)
            # Nobody holds it: that reader is gone.
            for suffix in (".json", ".lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, rid + suffix))
        return out

    def reader(self) -> CacheReader:
        """Register a reader (one per open dataset) whose pins protect shards from eviction."""
        return CacheReader(self)


class CacheReader:
    """One open dataset's presence in the cache: a held lock plus its pinned and upcoming shards."""

    def __init__(self, cache: ShardCache) -> None:
        self.cache = cache
        self.id = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        folder = os.path.join(cache.meta, "readers")
        self._json = os.path.join(folder, self.id + ".json")
        # The state file first, then the lock file, locked under a temporary name and renamed into
        # place: a scan never sees this reader's lock file unlocked (it would take it for dead).
        self._state: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        _write_json(self._json, {"id": self.id, "pinned": [], "upcoming": []})
        final = os.path.join(folder, self.id + ".lock")
        self._lock = _FileLock(final + ".new")
        self._lock.acquire(None)
        os.replace(self._lock.path, final)
        self._lock.path = final
        self._pid = os.getpid()
        self._closed = False

    def update(self, pinned: Iterable[str], upcoming: Sequence[str]) -> None:
        """Publish which object keys this reader has pinned and which it will read, in order."""
        state = (tuple(sorted(pinned)), tuple(upcoming))
        if state == self._state or self._closed or os.getpid() != self._pid:  # a forked child's copy
            return
        self._state = state
        _write_json(self._json, {"id": self.id, "pinned": list(state[0]), "upcoming": list(state[1])})

    def close(self) -> None:
        """Unregister (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:  # a forked child's copy: the registration is the parent's
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._json)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._lock.path)
        self._lock.release()


def _touch(path: str) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)  # the eviction's "least recently used" is the modification time
