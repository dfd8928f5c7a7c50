"""Read stage, remote: a packed dataset (local folder or object-store URL) copied to node-local storage.

``fastload copy SRC DEST`` is the replacement for copying a whole dataset into ``/dev/shm`` on
every node: with ``node_rank``/``nnodes`` it copies only the shards this node's ranks read in the
shard-aware order (``shuffle="shard"``, :func:`fastload.order.shards_read`) for the given epochs.

- **Space check first**: the bytes still to copy are compared with the free space of DEST's
  filesystem before anything is written; the error names both.
- **Atomic and resumable** (a killed copy, ``kill -9`` included, is finished by running it again):
  every file is written under a temporary name, checked against the manifest's size and checksum
  while it is written, and renamed only then; files already in DEST under their final names are
  complete and are kept. The manifest is written last, so DEST looks like a dataset only once its
  shards are there.
- A full copy is a local dataset (``open_dataset(DEST)``). A copy of a remote dataset also records
  its URL (``fastload-cache.json``), which makes DEST a cache folder of it: a partial (per-node)
  copy opens with ``open_dataset(DEST)`` or ``open_dataset(URL, cache_dir=DEST)``, and shards not
  copied come from the URL when a rank needs them.
- Progress: a bar with MB/s when stderr is a terminal.

A local file is checksummed from the page cache, then copied by the kernel (``copy_file_range`` /
``sendfile``, as ``cp`` does); remote ones go through
:func:`fastload.records.remote.fetch.fetch_to_file` (retries, timeouts, checksum on arrival). Files
go into DEST through the shard cache's own protocol (:func:`fastload.records.remote.cache.fill_object`),
so ranks already reading DEST as their cache and a copy running at the same time never write the
same file twice.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload.checksum import Checksum, checksum_file, recorded_checksum
from fastload.errors import UserError
from fastload.order import OrderSpec, shards_read
from fastload.records.manifest import FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME, load_index
from fastload.records.remote.cache import fill_object, mark_as_cache, shard_objects
from fastload.records.remote.fetch import fetch_to_file
from fastload.records.remote.storage import RemoteNotFound, RemoteStore, is_remote_url

__all__ = ["CopyOptions", "CopyResult", "copy_dataset", "node_from_env"]

_CHUNK = 8 << 20


@dataclass(frozen=True, kw_only=True)
class CopyOptions:
    """What :func:`copy_dataset` copies and how.

    Attributes:
        node_rank: This node's number (None: copy every shard).
        nnodes: Nodes in the job.
        nproc_per_node: Ranks per node (world size = ``nnodes * nproc_per_node``).
        seed: The training run's seed (the shard-aware order depends on it).
        epochs: Epochs whose shards this node needs.
        even: The loader's ``even`` (``"pad"`` or ``"drop"``).
        storage_options: Credentials and endpoint for a remote SRC.
        threads: Files copied at a time.
        overwrite: Replace a different dataset already in DEST.
        progress: Show a progress bar (only on a terminal).
    """

    node_rank: int | None = None
    nnodes: int | None = None
    nproc_per_node: int = 1
    seed: int = 0
    epochs: Sequence[int] = (0,)
    even: str = "pad"
    storage_options: dict[str, Any] | None = None
    threads: int = 4
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if (self.node_rank is None) != (self.nnodes is None):
            raise ValueError("give node_rank and nnodes together (or neither, to copy every shard)")
        if self.nnodes is not None and (self.nnodes < 1 or not 0 <= int(self.node_rank or 0) < self.nnodes):
            raise ValueError(f"node_rank={self.node_rank} must be in [0, nnodes={self.nnodes})")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node={self.nproc_per_node} must be >= 1")
        if not self.epochs or any(e < 0 for e in self.epochs):
            raise ValueError(f"epochs={tuple(self.epochs)} must be non-negative epoch numbers")
        if self.threads < 1:
            raise ValueError(f"threads={self.threads} must be >= 1")


@dataclass(frozen=True)
class CopyResult:
    """What a copy did.

    Attributes:
        dest: The destination folder.
        shards: Shard files of the dataset.
        selected: Shard files this node needs (every shard without a node), now in DEST.
        copied: Files copied in this run.
        copied_bytes: Bytes copied in this run.
        kept: Files already in DEST, kept.
        seconds: Wall time.
        complete: Whether DEST holds every shard (a local dataset by itself).
        files: Every file the selected shards need, as paths in DEST.
    """

    dest: str
    shards: int
    selected: int
    copied: int
    copied_bytes: int
    kept: int
    seconds: float
    complete: bool
    files: list[str] = field(default_factory=list)


def node_from_env(env: dict[str, str] | None = None) -> tuple[int, int, int] | None:
    """This node's place from torchrun's variables, or None when they are not set.

    Returns ``(node_rank, nnodes, nproc_per_node)`` from ``GROUP_RANK`` (or ``NODE_RANK``),
    ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``.
    """
    env = dict(os.environ) if env is None else env
    node = env.get("GROUP_RANK", env.get("NODE_RANK"))
    world, local = env.get("WORLD_SIZE"), env.get("LOCAL_WORLD_SIZE")
    if node is None or world is None or local is None:
        return None
    nproc = int(local)
    return int(node), max(1, int(world) // max(1, nproc)), nproc


class _Source:
    """Where the dataset comes from: a local folder or a URL."""

    def __init__(self, src: str, storage_options: dict[str, Any] | None) -> None:
        self.src = src
        self.store = RemoteStore(src, storage_options) if is_remote_url(src) else None
        if self.store is None and not os.path.isfile(os.path.join(src, MANIFEST_NAME)):
            raise UserError(f"{src}: not a packed fastload dataset (no {MANIFEST_NAME})")

    def manifest_bytes(self) -> bytes:
        if self.store is None:
            with open(os.path.join(self.src, MANIFEST_NAME), "rb") as f:
                return f.read()
        try:
            return self.store.get_bytes(MANIFEST_NAME)
        except RemoteNotFound:
            raise UserError(
                f"{self.store.url_of(MANIFEST_NAME)}: no manifest (not a packed fastload dataset)"
            ) from None

    def copy(self, key: str, dest: str, size: int | None, checksum: str | None) -> int:
        """Copy ``key`` to ``dest`` atomically, verified; returns bytes."""
        if self.store is not None:
            return fetch_to_file(self.store, key, dest, size=size, checksum=checksum)
        return _copy_verified(os.path.join(self.src, *key.split("/")), dest, size, checksum)


def _copy_verified(src: str, dest: str, size: int | None, checksum: str | None) -> int:
    """Copy a local file to ``dest`` through a temporary file, checked against the manifest.

    The source is checksummed first (read into a reused buffer: ~10 GB/s from the page cache), then
    the kernel copies it (``copy_file_range`` as ``cp`` does, ``sendfile`` across filesystems). The
    temporary file is renamed onto ``dest`` only when size and checksum match. Measured on 256 MB
    from the page cache into /dev/shm: a Python read-checksum-write loop ran at 855 MB/s, ``cp`` at
    1,193 MB/s, ``sendfile`` at 1,587 MB/s and the checksum of the source at 10,354 MB/s (reading the
    tmpfs copy back instead: 1,898 MB/s, 3,505 MB/s through a mapping).
    """
    folder = os.path.dirname(os.path.abspath(dest))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(dest) + ".", suffix=".part", dir=folder)
    try:
        os.fchmod(fd, 0o644)
        with open(src, "rb", buffering=0) as f:
            if checksum:
                digest = Checksum(checksum.split(":", 1)[0])
                buf = bytearray(_CHUNK)
                view = memoryview(buf)
                while n := f.readinto(buf):
                    digest.update(view[:n])
                if digest.value() != checksum:
                    raise UserError(f"{src}: checksum mismatch: got {digest.value()}, the manifest says {checksum}")
                f.seek(0)
            total = _kernel_copy(f.fileno(), fd)
        if size is not None and total != size:
            raise UserError(f"{src}: {total} bytes, the manifest lists {size} (changed or truncated source)")
        os.close(fd)
        fd = -1
        os.replace(tmp, dest)
        tmp = ""
        return total
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _kernel_copy(src_fd: int, dst_fd: int) -> int:
    """Copy all of ``src_fd`` to ``dst_fd`` in the kernel; returns bytes."""
    total = 0
    copy_range = getattr(os, "copy_file_range", None)
    while True:
        try:
            if copy_range is not None:
                n = copy_range(src_fd, dst_fd, 1 << 30)
            else:
                n = os.sendfile(dst_fd, src_fd, None, 1 << 30)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP) or total:
                raise
            if copy_range is not None:
                copy_range = None  # e.g. across filesystems on older kernels: sendfile instead
                continue
            return _loop_copy(src_fd, dst_fd)
        if n == 0:
            return total
        total += n


def _loop_copy(src_fd: int, dst_fd: int) -> int:
    total = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(src_fd, "rb", buffering=0, closefd=False) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return total
            written = 0
            while written < n:
                written += os.write(dst_fd, view[written:n])
            total += n


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _selected(manifest: dict[str, Any], index_path: str, options: CopyOptions) -> list[int]:
    """Shard numbers this node copies."""
    n_shards = len(manifest.get("shards", []))
    if options.nnodes is None:
        return list(range(n_shards))
    index = load_index(index_path, int(manifest["label_width"]), int(manifest["records"]))
    starts = np.searchsorted(index["shard"], np.arange(n_shards + 1), side="left")
    starts[-1] = len(index)
    world = options.nnodes * options.nproc_per_node
    spec = OrderSpec(
        num_records=len(index),
        batch_size=1,
        shuffle="shard",
        seed=options.seed,
        world_size=world,
        even=options.even,
        shard_starts=tuple(int(x) for x in starts),
    )
    node = int(options.node_rank or 0)
    ranks = range(node * options.nproc_per_node, (node + 1) * options.nproc_per_node)
    return shards_read(spec, options.epochs, ranks)


def copy_dataset(src: str, dest: str, options: CopyOptions | None = None) -> CopyResult:
    """Copy a packed dataset (or this node's shards of it) into ``dest``.

    Args:
        src: A packed dataset folder, or its URL (``s3://bucket/prefix``, ...).
        dest: The destination folder (created), e.g. under ``/dev/shm``.
        options: :class:`CopyOptions`.

    Returns:
        A :class:`CopyResult`.

    Raises:
        UserError: Not a dataset, not enough space (the message gives both numbers), a different
            dataset in DEST without ``overwrite``, a corrupted source file.
        FetchError: A remote file could not be downloaded intact.
    """
    options = options or CopyOptions()
    t0 = time.perf_counter()
    source = _Source(src, options.storage_options)
    data = source.manifest_bytes()
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise UserError(f"{src}: unreadable manifest ({exc})") from None
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UserError(f"{src}: manifest format_version {version!r} is not supported")
    dest = os.path.abspath(dest)
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{dest}: cannot create the folder ({exc.strerror or exc})") from None
    _check_dest(dest, manifest, options.overwrite)
    objects = shard_objects(manifest)
    index_meta = manifest.get("index", {})
    index_name = str(index_meta.get("file", INDEX_NAME))
    if "/" in index_name or index_name.startswith("."):
        raise UserError(f"{src}: index file {index_name!r} leaves the dataset folder")
    index_path = os.path.join(dest, index_name)
    index_sum = recorded_checksum(index_meta)
    kept = copied = copied_bytes = 0
    if not (os.path.isfile(index_path) and index_sum and checksum_file(index_path) == index_sum):
        source.copy(index_name, index_path, None, index_sum)
        copied += 1
    else:
        kept += 1
    selected = _selected(manifest, index_path, options)
    # Every file to be there: the shard data, and RecordIO's .idx beside it (MXNet's readers use it).
    todo: list[tuple[str, int | None, str | None]] = []
    for s in selected:
        obj, entry = objects[s], manifest["shards"][s]
        todo.append((obj.key, obj.size, obj.checksum))
        if entry.get("index_file"):
            todo.append((str(entry["index_file"]), entry.get("index_bytes"), recorded_checksum(entry, "index_")))
    missing = []
    for key, size, checksum in todo:
        path = os.path.join(dest, *key.split("/"))
        if size is not None and os.path.isfile(path) and os.path.getsize(path) == size:
            kept += 1  # under its final name only once verified: complete
        else:
            missing.append((key, size, checksum))
    needed = sum(size or 0 for _, size, _ in missing)
    st = os.statvfs(dest)
    available = st.f_bavail * st.f_frsize
    if needed > available:
        raise UserError(
            f"{dest}: not enough space to copy {len(missing)} file(s): needs {needed} bytes ({_human(needed)}), "
            f"{available} bytes ({_human(available)}) available"
        )
    bar = _bar(options, needed)
    try:
        with ThreadPoolExecutor(max_workers=options.threads, thread_name_prefix="fastload-copy") as pool:

            def one(job: tuple[str, int | None, str | None]) -> int:
                key, size, checksum = job
                n = fill_object(dest, key, size, lambda path: source.copy(key, path, size, checksum))
                bar.update(n)
                return n

            for n in pool.map(one, missing):
                copied += 1
                copied_bytes += n
    finally:
        bar.close()
    if source.store is not None:
        mark_as_cache(dest, source.store)
    # The manifest last: DEST is a dataset (or a cache folder of one) only from here on.
    manifest_path = os.path.join(dest, MANIFEST_NAME)
    with tempfile.NamedTemporaryFile(dir=dest, prefix="." + MANIFEST_NAME + ".", delete=False) as f:
        f.write(data)
    os.chmod(f.name, 0o644)
    os.replace(f.name, manifest_path)
    return CopyResult(
        dest=dest,
        shards=len(objects),
        selected=len(selected),
        copied=copied,
        copied_bytes=copied_bytes,
        kept=kept,
        seconds=time.perf_counter() - t0,
        complete=len(selected) == len(objects),
        files=[os.path.join(dest, key) for key, _, _ in todo],
    )


def _check_dest(dest: str, manifest: dict[str, Any], overwrite: bool) -> None:
    """Refuse a DEST that holds another dataset (unless ``overwrite``: it is cleared)."""
    path = os.path.join(dest, MANIFEST_NAME)
    if not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            current = json.load(f)
    except (OSError, ValueError):
        current = {}
    same = current.get("shards") == manifest.get("shards") and current.get("index") == manifest.get("index")
    if same:
        return
    if not overwrite:
        raise UserError(f"{dest}: holds another dataset ({current.get('name')!r}); pass --overwrite to replace it")
    for entry in os.scandir(dest):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(options: CopyOptions, total: int) -> Any:
    if not (options.progress and sys.stderr.isatty()):
        return _NoBar()
    from tqdm import tqdm

    # unit_scale with bytes: tqdm shows the rate as MB/s.
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc="copy", file=sys.stderr)
