"""Write stage: parallel, atomic and resumable packing of a folder or ``.lst`` into RecordIO or LMDB shards.

How a pack survives being killed at any moment:

1. Everything is built in ``OUT/.fastload-staging/``. ``plan.json`` there holds a fingerprint of the
   input (paths, sizes, mtimes, labels) and of the options that change the bytes.
2. Each shard is written under a ``.partial`` name, fsynced, renamed, and only then gets its sidecar
   ``<shard>.done.json`` (sizes, checksums, its index rows, skipped files). A rerun with the same
   fingerprint keeps every shard whose sidecar matches the files on disk and rewrites the rest.
3. When all shards are done, the index and ``fastload.json`` are written into staging, then moved
   into OUT: shards first, the manifest last (an older dataset's manifest is set aside first, so OUT
   never looks complete while it mixes two datasets), and the staging folder is removed.

Images flow through a bounded, ordered pipeline: worker threads read, check/convert and frame
batches of files (file I/O, numpy and Pillow release the GIL; with the C++ engine built, a
pass-through batch is read, checked and framed by one GIL-free call into a reused buffer); the
calling thread writes the records in a deterministic order (so the same command always produces
the same bytes), a few megabytes per ``writev``, checksums what it wrote and starts its writeback
to disk early, so the per-shard fsync finds little left to do.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import errno
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from fastload import __version__
from fastload.errors import UserError
from fastload.pack.convert import NOT_INDEXED as _NOT_INDEXED
from fastload.pack.convert import ConvertOptions, Converted, convert_images
from fastload.pack.framing import BufferPool, FramedBatch, Prepared, engine_framing, frame_batch
from fastload.pack.sources import Source, SourceItem, open_source
from fastload.records import recordio
from fastload.records.dataset import STAGING_DIR
from fastload.records.lmdb_shard import LmdbShardWriter, pack_value_header
from fastload.records.manifest import (FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME, Checksum, checksum_bytes,
                                       checksum_file, empty_index, file_matches, fsync_dir, read_manifest,
                                       recorded_checksum, write_index, write_json_atomic)

__all__ = ["ShardFormat", "OnError", "PackOptions", "PackResult", "pack_folder", "pack_main", "parse_size",
           "format_summary"]

DEFAULT_SHARD_SIZE = 512 << 20
_PLAN = "plan.json"
_DONE = ".done.json"
_PARTIAL = ".partial"
_OLD_MANIFEST = "old-" + MANIFEST_NAME
_USER_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


class ShardFormat(str, enum.Enum):
    """Shard container."""

    RECORDIO = "recordio"
    LMDB = "lmdb"


class OnError(str, enum.Enum):
    """What to do with a file that is not a decodable image."""

    SKIP = "skip"
    FAIL = "fail"


@dataclass(frozen=True, kw_only=True)
class PackOptions:
    """Options of :func:`pack_folder` (the CLI flags of ``fastload pack``).

    Attributes:
        format: Shard container.
        shards: Number of shards (overrides ``shard_size``).
        shard_size: Target shard size in bytes (estimated from the source file sizes).
        workers: Reader/converter threads (default: all cores).
        resize: Shorter side to resize to (re-encoded at ``quality``); None: pass-through.
        quality: JPEG quality of re-encoded images.
        shuffle: Shuffle the record order with ``seed``.
        seed: Shuffle seed.
        name: Shard name prefix (default: the source's name).
        on_error: Skip bad files (listed in the manifest) or fail on the first.
        overwrite: Replace a dataset already in OUT.
        restart_index: Add JPEG restart markers with the C++ engine's transcoder.
        verify: With ``restart_index``, check every transcoded image decodes identically.
        root: Image root for ``.lst`` paths.
        progress: Show a progress bar (only on a terminal).
    """

    format: ShardFormat = ShardFormat.RECORDIO
    shards: Optional[int] = None
    shard_size: int = DEFAULT_SHARD_SIZE
    workers: Optional[int] = None
    resize: Optional[int] = None
    quality: int = 95
    shuffle: bool = False
    seed: int = 0
    name: Optional[str] = None
    on_error: OnError = OnError.SKIP
    overwrite: bool = False
    restart_index: bool = False
    verify: bool = False
    root: Optional[str] = None
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", ShardFormat(self.format))
        object.__setattr__(self, "on_error", OnError(self.on_error))
        if self.shards is not None and self.shards < 1:
            raise ValueError(f"shards={self.shards} must be >= 1")
        if self.shard_size < 1:
            raise ValueError(f"shard_size={self.shard_size} must be >= 1 byte")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers={self.workers} must be >= 1")
        if self.resize is not None and self.resize < 1:
            raise ValueError(f"resize={self.resize} must be >= 1")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality={self.quality} must be in 1..100")
        if self.name is not None and (not self.name or not re.fullmatch(r"[A-Za-z0-9._-]+", self.name)
                                      or self.name.startswith(".")):
            raise ValueError(f"name={self.name!r} must be letters, digits, '.', '_' or '-' (not starting with '.')")
        if self.verify and not self.restart_index:
            raise ValueError("verify=True only applies with restart_index=True")


@dataclass(frozen=True)
class PackResult:
    """What a pack did.

    Attributes:
        out: The dataset folder.
        manifest: The manifest written.
        written: Records written.
        skipped: ``[(path, reason)]`` of files left out.
        converted: Conversions per kind (``grayscale``, ``cmyk``, ``png``, ``resized``, ...).
        bytes_in: Source bytes read (this run).
        bytes_out: Shard bytes.
        seconds: Wall time of this run.
        resumed_shards: Shards kept from an interrupted run.
        processed: Images read and converted in this run.
    """

    out: str
    manifest: Dict[str, Any]
    written: int
    skipped: List[Tuple[str, str]]
    converted: Dict[str, int]
    bytes_in: int
    bytes_out: int
    seconds: float
    resumed_shards: int = 0
    processed: int = 0
    up_to_date: bool = False


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse ``512MB``, ``1.5GiB``, ``64k``, ``1048576`` into bytes (K/M/G/T are powers of 1024).

    Raises:
        UserError: On anything else.
    """
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UserError(f"--shard-size {text!r}: expected a size like 512MB, 2GB or 1048576")
    value = float(m.group(1)) * (1024 ** " KMGT".index(m.group(2).upper() or " "))
    if value < 1:
        raise UserError(f"--shard-size {text!r} must be at least 1 byte")
    return int(value)


@dataclass
class _ShardDone:
    number: int
    start: int
    end: int
    entry: Dict[str, Any]
    rows: Dict[str, list]
    skipped: List[Tuple[str, str]]
    kinds: Dict[str, int]
    bytes_in: int


@dataclass
class _Progress:
    enabled: bool
    total: int
    bar: Any = None
    images: int = 0
    nbytes: int = 0
    t0: float = field(default_factory=time.perf_counter)
    last: float = 0.0

    def __post_init__(self) -> None:
        if self.enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=self.total, unit="img", desc="pack", dynamic_ncols=True, file=sys.stderr)

    def skip(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def step(self, nbytes: int, images: int = 1) -> None:
        self.images += images
        self.nbytes += nbytes
        if self.bar is None:
            return
        self.bar.update(images)
        now = time.perf_counter()
        if now - self.last > 0.5:
            self.last = now
            self.bar.set_postfix_str(f"{self.nbytes / max(now - self.t0, 1e-9) / 1e6:.1f} MB/s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _write_error(exc: OSError, path: str) -> UserError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UserError(f"no space left on device while writing {path}")
    return UserError(f"cannot write {path}: {exc.strerror or exc}")


def _resolve_transcoder(options: PackOptions):
    """The restart-marker transcoder of the C++ engine (issue 7), or None without ``--restart-index``."""
    if not options.restart_index:
        return None
    from fastload.pack import restart
    if not restart.available():
        raise UserError("--restart-index needs the C++ engine (fastload._engine.add_restart_markers), "
                        "which is not built; build it with `python setup.py build_ext --inplace`")
    # Verifies the first image and one in 16 (every image with --verify); raises ValueError for an
    # image it cannot transcode, which convert_image stores unchanged and counts as not indexed.
    return restart.RestartTranscoder(_restart_config(options))


def _restart_manifest(options: PackOptions) -> Dict[str, Any]:
    from fastload.pack.restart import manifest_settings
    return manifest_settings(_restart_config(options))


def _restart_config(options: PackOptions):
    from fastload.pack.restart import RestartIndexConfig, VerifyPolicy
    return RestartIndexConfig(verify=VerifyPolicy.ALL if options.verify else VerifyPolicy.SAMPLE)


def _fixed_edges(n: int, shards: Optional[int]) -> Optional[List[int]]:
    """Item boundaries for ``--shards N`` (None: cut by size while writing)."""
    if shards is None:
        return None
    k = min(shards, n)
    return [i * n // k for i in range(k + 1)]


def _fingerprint(source: Source, order: np.ndarray, stats: List[Tuple[int, int]], options: PackOptions,
                 name: str) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({
        "v": FORMAT_VERSION, "format": options.format.value, "resize": options.resize,
        "quality": options.quality, "name": name, "restart_index": options.restart_index,
        # The transcode settings change the bytes: shards from other settings are not reused.
        "restart": _restart_manifest(options) if options.restart_index else None,
        "on_error": options.on_error.value, "source": source.path, "root": source.root,
        "shards": options.shards, "shard_size": None if options.shards else options.shard_size,
    }, sort_keys=True).encode())
    for i in order.tolist():
        item = source.items[i]
        h.update(f"{item.id}\t{item.path}\t{item.labels}\t{stats[i][0]}\t{stats[i][1]}\n".encode("utf-8", "replace"))
    return h.hexdigest()


def _prepare(item: SourceItem, image: bytes, fmt: ShardFormat, label_width: int) -> Prepared:
    if fmt is ShardFormat.RECORDIO:
        header = recordio.pack_header(item.labels[0] if label_width == 1 else item.labels, item.id)
        return Prepared(recordio.FramedRecord(image, header), len(header) + len(image), len(header))
    header = pack_value_header(item.labels, item.id)
    value = header + image
    return Prepared(value, len(value), len(header))


def _read_file(path: str, size: int) -> bytes:
    """A file's bytes: one ``read`` of the size ``stat`` reported (plus one byte, to notice growth)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, size + 1)
        if len(data) == size:  # the common case: exactly the stat size, EOF reached
            return data
        parts = [data]
        while True:  # the file changed since the stat (or a short read): read to EOF
            chunk = os.read(fd, max(size, 1 << 16))
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
    finally:
        os.close(fd)


def _convert_batch(batch: List[Tuple[SourceItem, int]], options: ConvertOptions, fmt: ShardFormat,
                   label_width: int,
                   pool: BufferPool) -> Union[FramedBatch, List[Tuple[Converted, int, Optional[Prepared]]]]:
    """Read a batch of files, convert them together (one engine call with ``--resize``), frame them.

    Pass-through RecordIO batches go to the engine's ``frame_files`` first (read, check and frame
    in one GIL-free call): a batch it frames whole is returned as is, for the writer to take in one
    piece; files it leaves take the per-file path below.
    """
    framed: List[Optional[Tuple[Converted, int, Prepared]]] = [None] * len(batch)
    if fmt is ShardFormat.RECORDIO and options.resize is None and options.transcode is None:
        frame_files = engine_framing()
        if frame_files is not None:
            whole = frame_batch(batch, label_width, frame_files, pool)
            if whole.complete:
                return whole
            framed = whole.entries()
    datas: Dict[int, bytes] = {}
    results: Dict[int, Converted] = {}
    for i, (item, size) in enumerate(batch):
        if framed[i] is not None:
            continue
        try:
            datas[i] = _read_file(item.path, size)
        except OSError as exc:
            results[i] = Converted(None, None, f"cannot read: {exc.strerror or exc}")
    results.update(zip(datas, convert_images(list(datas.values()), options)))
    out = []
    for i, (item, _) in enumerate(batch):
        if framed[i] is not None:
            out.append(framed[i])
            continue
        result = results[i]
        prepared = _prepare(item, result.data, fmt, label_width) if result.data is not None else None
        out.append((result, len(datas.get(i, b"")), prepared))
    return out


_PASS_BATCH = 32  # images per worker task when they pass through
_DECODE_BATCH = 8  # images per task when each is decoded (milliseconds each): one engine call, even load
_BATCHES_PER_WORKER = 4  # tasks in flight per worker: bounds the images held in memory
_WRITEBACK_STEP = 32 << 20  # start the disk writes of every this many bytes while packing goes on
_sync_file_range = None


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``[offset, offset + length)`` to disk now, without waiting.

    The fsync that completes a shard then only waits for the last few megabytes instead of the
    whole shard. Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; elsewhere nothing happens.
    """
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                _sync_file_range = fn
            except (OSError, AttributeError):
                pass
    if _sync_file_range:
        _sync_file_range(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE; a failure only costs time


class _GatherFile:
    """The shard file as ``RecordIOWriter`` sees it: gathers chunks, writes ~4 MB per ``writev``.

    Each written batch is added to the shard's checksum (XXH3-128: a few milliseconds per hundred
    megabytes, so on the writing thread) and its disk writes are started at once, so the fsync
    that completes the shard only waits for the last few megabytes.
    """

    _MAX_IOV = 512  # below IOV_MAX (1024 on Linux)
    _MAX_BYTES = 4 << 20

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
        self._chunks: List[Any] = []
        self._pending = 0
        self.written = 0
        self._kicked = 0
        self._hash = Checksum()
        self._after: List[Any] = []  # run once the chunks gathered so far are written and checksummed

    def fileno(self) -> int:
        return self._fd

    def write(self, chunk) -> int:
        self._chunks.append(chunk)
        n = len(chunk)
        self._pending += n
        if self._pending >= self._MAX_BYTES or len(self._chunks) >= self._MAX_IOV:
            self.flush()
        return n

    def after_flush(self, fn) -> None:
        """Call ``fn()`` once everything written so far has left the gathered chunks (buffer reuse)."""
        self._after.append(fn)

    def flush(self) -> None:
        """Write the gathered chunks (short writes resumed), checksum them, start their writeback."""
        chunks, self._chunks = self._chunks, []
        if not chunks:
            return
        n = os.writev(self._fd, chunks)
        if n != self._pending:  # a short write: resume where it stopped
            views = [memoryview(c).cast("B") for c in chunks]
            while views:
                while views and n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                if views and n:
                    views[0] = views[0][n:]
                if views:
                    n = os.writev(self._fd, views)
                    if n == 0:
                        raise OSError(errno.EIO, "writev wrote nothing")
        self.written += self._pending
        self._pending = 0
        for chunk in chunks:
            self._hash.update(chunk)
        if self.written - self._kicked >= _WRITEBACK_STEP:
            _start_writeback(self._fd, self._kicked, self.written - self._kicked)
            self._kicked = self.written
        del chunks
        after, self._after = self._after, []
        for fn in after:
            fn()

    def checksum(self) -> str:
        """Flush and return the checksum of everything written (``"<algo>:<hex>"``)."""
        self.flush()
        return self._hash.value()

    def sync_and_close(self) -> None:
        os.fsync(self._fd)
        self.close()

    def close(self) -> None:
        """Idempotent (used on abort too)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def _ordered_results(items: Iterator[Tuple[SourceItem, int]], fn, workers: int,
                     batch: int) -> Iterator[Tuple[List[Tuple[SourceItem, int]], Any]]:
    """Run ``fn([(item, size), ...])`` on a thread pool over batches of ``batch`` items, yielding
    ``(batch, result)`` in input order with a bounded window.

    Batches keep the per-image cost of futures and thread hand-offs off the hot path.
    """
    window = max(4, workers * _BATCHES_PER_WORKER)  # bounds memory: at most `window` batches in flight
    pending: "collections.deque[Tuple[List[Tuple[SourceItem, int]], Future]]" = collections.deque()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fastload-pack")

    def drain_one() -> Iterator[Tuple[List[Tuple[SourceItem, int]], Any]]:
        chunk, fut = pending.popleft()
        yield chunk, fut.result()

    try:
        while True:
            chunk = list(itertools.islice(items, batch))
            if not chunk:
                break
            pending.append((chunk, pool.submit(fn, chunk)))
            if len(pending) >= window:
                yield from drain_one()
        while pending:
            yield from drain_one()
    finally:
        for _, fut in pending:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


_GIL_SWITCH = 0.0005  # seconds; CPython's default is 0.005


@contextlib.contextmanager
def _short_gil_switch() -> Iterator[None]:
    """Shorten the interpreter's GIL switch interval while the pack pipeline runs.

    The writing thread spends its time in ``writev`` with the GIL released; each return then waits
    for a converter thread to drop the GIL, up to a whole switch interval (5 ms by default) per
    ~4 MB written. With 0.5 ms, pass-through packing of 2,000 ImageNet-like files (2 converter
    threads) went from 0.35 s to 0.27 s in-process. The previous interval is restored afterwards.
    """
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, _GIL_SWITCH))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _shard_files(entry: Dict[str, Any]) -> List[str]:
    return [entry["file"]] + ([entry["index_file"]] if entry.get("index_file") else [])


def _data_file(folder: str, entry: Dict[str, Any]) -> str:
    path = os.path.join(folder, entry["file"])
    return os.path.join(path, "data.mdb") if entry["file"].endswith(".lmdb") else path


def _load_done(staging: str, number: int, file: str, start: int,
               edges: Optional[List[int]]) -> Optional[_ShardDone]:
    """A completed shard's sidecar, if it exists, starts at ``start`` and matches the files on disk."""
    try:
        with open(os.path.join(staging, file + _DONE), "rb") as f:
            meta = json.load(f)
        entry = meta["entry"]
        first, end = meta["range"]
        if entry["file"] != file or first != start or (edges is not None and end != edges[number + 1]):
            return None
        data = _data_file(staging, entry)
        if os.path.getsize(data) != entry["bytes"] or not file_matches(data, recorded_checksum(entry)):
            return None
        if entry.get("index_file"):
            idx = os.path.join(staging, entry["index_file"])
            if os.path.getsize(idx) != entry["index_bytes"] or \
                    not file_matches(idx, recorded_checksum(entry, "index_")):
                return None
        return _ShardDone(number, first, end, entry, meta["rows"], [tuple(x) for x in meta["skipped"]],
                          meta["kinds"], meta["bytes_in"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _discard_from(staging: str, name: str, number: int) -> None:
    """Remove shards (and sidecars, partial files) numbered ``number`` and up: they will be rewritten."""
    pattern = re.compile(re.escape(name) + r"-(\d{5,})\.")
    for entry in os.listdir(staging):
        m = pattern.match(entry)
        if m and int(m.group(1)) >= number:
            _remove(os.path.join(staging, entry))


class _ShardSink:
    """Writes one shard's records into staging under ``.partial`` names."""

    def __init__(self, staging: str, number: int, file: str, start: int, fmt: ShardFormat,
                 label_width: int) -> None:
        self.staging, self.number, self.file_name, self.start = staging, number, file, start
        self.fmt, self.label_width = fmt, label_width
        self.final = os.path.join(staging, file)
        self.partial = self.final + _PARTIAL
        self.rows: Dict[str, list] = {k: [] for k in ("offset", "id", "length", "data_offset", "parts", "labels")}
        self.skipped: List[Tuple[str, str]] = []
        self.kinds: Dict[str, int] = collections.Counter()
        self.bytes_in = 0
        self.nbytes = 0
        _remove(self.partial)
        if fmt is ShardFormat.RECORDIO:
            self.file = _GatherFile(self.partial)
            self.writer = recordio.RecordIOWriter(self.file)
        else:
            self.lmdb = LmdbShardWriter(self.partial)

    def add(self, item: SourceItem, prepared: Prepared) -> None:
        if self.fmt is ShardFormat.RECORDIO:
            offset, parts = self.writer.write_framed(prepared.record, item.id)
        else:
            offset, parts = self.lmdb.write(prepared.record), 0
        self.nbytes += recordio.framed_size(prepared.length)
        for key, value in (("offset", offset), ("id", item.id), ("length", prepared.length),
                           ("data_offset", prepared.data_offset), ("parts", parts), ("labels", list(item.labels))):
            self.rows[key].append(value)

    def add_framed(self, batch: List[Tuple[SourceItem, int]], framed: FramedBatch, pool: BufferPool) -> None:
        """Append a batch the engine framed whole: one write, the index rows extended at once; its
        buffer goes back to ``pool`` once written."""
        items = [item for item, _ in batch]
        ids = [item.id for item in items]
        offsets = self.writer.write_records(framed.data, ids, framed.framed)
        buffer = framed.buffer
        self.file.after_flush(lambda: pool.give(buffer))
        self.nbytes += len(framed.data)
        self.bytes_in += sum(framed.sizes)
        self.kinds["pass"] += len(items)
        rows = self.rows
        rows["offset"] += offsets
        rows["id"] += ids
        rows["length"] += framed.lengths
        rows["data_offset"] += framed.head_lens
        rows["parts"] += [0] * len(items)
        rows["labels"] += [list(item.labels) for item in items]

    def finish(self, end: int) -> _ShardDone:
        """Flush, fsync, rename into place, then write the sidecar that marks the shard complete."""
        entry: Dict[str, Any] = {"file": self.file_name, "records": len(self.rows["id"])}
        if self.fmt is ShardFormat.RECORDIO:
            digest = self.file.checksum()
            self.file.sync_and_close()
            idx_name = os.path.splitext(self.file_name)[0] + ".idx"
            idx_data = self.writer.idx_bytes()
            idx_partial = os.path.join(self.staging, idx_name + _PARTIAL)
            with open(idx_partial, "wb") as f:
                f.write(idx_data)
                f.flush()
                os.fsync(f.fileno())
            entry.update(bytes=self.writer.offset, checksum=digest, index_file=idx_name,
                         index_bytes=len(idx_data), index_checksum=checksum_bytes(idx_data))
            os.replace(idx_partial, os.path.join(self.staging, idx_name))
            os.replace(self.partial, self.final)
        else:
            self.lmdb.finish()
            data = os.path.join(self.partial, "data.mdb")
            _fsync_file(data)
            entry.update(bytes=os.path.getsize(data), checksum=checksum_file(data))
            _remove(self.final)
            os.replace(self.partial, self.final)
        fsync_dir(self.staging)
        done = _ShardDone(self.number, self.start, end, entry, self.rows, self.skipped, dict(self.kinds),
                          self.bytes_in)
        write_json_atomic(self.final + _DONE, {
            "entry": entry, "range": [self.start, end], "rows": self.rows, "skipped": self.skipped,
            "kinds": done.kinds, "bytes_in": self.bytes_in}, indent=None)  # rows: compact, C encoder
        return done

    def abort(self) -> None:
        try:
            if self.fmt is ShardFormat.RECORDIO:
                self.file.close()
            else:
                self.lmdb.abort()
        except Exception:  # noqa: BLE001 - best effort while another error propagates
            pass
        _remove(self.partial)


@contextlib.contextmanager
def _exclusive(out: str) -> Iterator[None]:
    """Create OUT and hold an exclusive lock on it, so two packs never write the same folder.

    ``flock`` on the directory itself: nothing is left behind, and the kernel drops the lock when
    the process dies (kill -9 included).
    """
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"{out}: exists and is not a folder")
    try:
        os.makedirs(out, exist_ok=True)
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise UserError(f"{out}: cannot create the output folder ({exc.strerror or exc})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{out}: another fastload pack is writing to this folder") from None
        yield
    finally:
        os.close(fd)


def _prepare_out(out: str, options: PackOptions, fingerprint: str) -> Tuple[str, bool]:
    """Check OUT, set up staging. Returns ``(staging, up_to_date)``."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"{out}: exists and is not a folder")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create the output folder ({exc.strerror or exc})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"{out}: the output folder is not writable")
    staging = os.path.join(out, STAGING_DIR)
    manifest_path = os.path.join(out, MANIFEST_NAME)
    plan_path = os.path.join(staging, _PLAN)
    staged_plan = None
    if os.path.isdir(staging):
        try:
            with open(plan_path, "rb") as f:
                staged_plan = json.load(f).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            staged_plan = None
    if staged_plan not in (None, fingerprint) and os.path.isfile(os.path.join(staging, MANIFEST_NAME)):
        # A complete dataset from another command was being moved into place when that run died:
        # finish the move first, so it is never lost, then treat it as the dataset OUT holds.
        try:
            _finalize(out, staging)
        except OSError as exc:
            raise _write_error(exc, out) from None
        staged_plan = None
    has_dataset = os.path.isfile(manifest_path)
    if has_dataset:
        try:
            current = read_manifest(out)
        except UserError:
            current = {}
        if not options.overwrite and current.get("plan") == fingerprint and staged_plan in (None, fingerprint) \
                and not os.path.isfile(os.path.join(staging, MANIFEST_NAME)):
            shutil.rmtree(staging, ignore_errors=True)  # leftovers of a run killed after its manifest landed
            return staging, True
        if not options.overwrite:
            raise UserError(f"{out} already holds a dataset ({current.get('records', '?')} records); "
                            "pass --overwrite to replace it")
    if staged_plan is not None and staged_plan != fingerprint or os.path.isdir(staging) and staged_plan is None:
        # An unfinished pack of other inputs or options: only partial work, no complete dataset, is lost.
        print(f"fastload pack: discarding an unfinished pack in {staging} made from other inputs or options",
              file=sys.stderr)
        shutil.rmtree(staging)
        staged_plan = None
    try:
        os.makedirs(staging, exist_ok=True)
        if staged_plan is None:
            write_json_atomic(plan_path, {"fingerprint": fingerprint, "fastload_version": __version__})
    except OSError as exc:
        if exc.errno in _USER_WRITE_ERRNOS:
            raise _write_error(exc, staging) from None
        raise
    return staging, False


def _finalize(out: str, staging: str) -> Dict[str, Any]:
    """Move a complete staged dataset into OUT, replacing any older one; returns the new manifest."""
    with open(os.path.join(staging, MANIFEST_NAME), "rb") as f:
        manifest = json.load(f)
    old_path = os.path.join(out, MANIFEST_NAME)
    set_aside = os.path.join(staging, _OLD_MANIFEST)
    if os.path.isfile(old_path):
        os.replace(old_path, set_aside)  # from here on OUT does not look complete until the new manifest lands
        fsync_dir(out)
    new_files = {INDEX_NAME}
    for entry in manifest["shards"]:
        new_files.update(_shard_files(entry))
    for name in sorted(new_files):
        src = os.path.join(staging, name)
        if os.path.lexists(src):
            dst = os.path.join(out, name)
            if os.path.isdir(src):
                _remove(dst)
            os.replace(src, dst)
    if os.path.isfile(set_aside):
        try:
            with open(set_aside, "rb") as f:
                old = json.load(f)
            stale = {n for e in old.get("shards", []) for n in _shard_files(e)}
            stale.add(old.get("index", {}).get("file", INDEX_NAME))
        except (OSError, ValueError):
            stale = set()
        for name in stale - new_files:
            if os.path.basename(name) == name:  # never follow a path out of OUT
                _remove(os.path.join(out, name))
    fsync_dir(out)
    os.replace(os.path.join(staging, MANIFEST_NAME), os.path.join(out, MANIFEST_NAME))
    fsync_dir(out)
    shutil.rmtree(staging, ignore_errors=True)
    return manifest


def pack_folder(src: str, out: str, *, options: Optional[PackOptions] = None, **kwargs: Any) -> PackResult:
    """Pack a class-folder tree or an im2rec ``.lst`` into shards plus ``fastload.json``.

    Args:
        src: Folder with one sub-folder per class, or a ``.lst`` file.
        out: Output folder.
        options: A :class:`PackOptions`; or pass its fields as keyword arguments.

    Returns:
        A :class:`PackResult`.

    Raises:
        UserError: Bad input, refused overwrite, unwritable output, full disk, or a bad file with
            ``on_error="fail"``.
    """
    if options is None:
        try:
            options = PackOptions(**kwargs)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    elif kwargs:
        raise TypeError("pass either options= or keyword options, not both")
    t0 = time.perf_counter()
    transcode = _resolve_transcoder(options)
    source = open_source(src, options.root)
    name = options.name or re.sub(r"[^A-Za-z0-9._-]", "_", os.path.splitext(os.path.basename(
        os.path.normpath(source.path)))[0]).lstrip(".") or "data"
    order = np.arange(len(source.items))
    if options.shuffle:
        order = np.random.default_rng(options.seed).permutation(len(source.items))
    stats = []
    for item in source.items:
        try:
            st = os.stat(item.path)
            stats.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((0, 0))
    items = [source.items[i] for i in order.tolist()]
    fingerprint = _fingerprint(source, order, stats, options, name)
    out = os.path.abspath(out)
    if source.kind == "folder" and (out == source.path or out.startswith(source.path + os.sep)):
        raise UserError(f"{out}: the output folder must not be inside the source folder")
    with _exclusive(out):
        staging, up_to_date = _prepare_out(out, options, fingerprint)
        if up_to_date:
            manifest = read_manifest(out)
            counts = manifest.get("counts", {})
            return PackResult(out=out, manifest=manifest, written=manifest["records"],
                              skipped=[(s["path"], s["reason"]) for s in manifest.get("skipped", [])],
                              converted=counts.get("converted", {}), bytes_in=0,
                              bytes_out=sum(s["bytes"] for s in manifest["shards"]),
                              seconds=time.perf_counter() - t0, up_to_date=True)

        convert_options = ConvertOptions(resize=options.resize, quality=options.quality, transcode=transcode)
        ext = ".rec" if options.format is ShardFormat.RECORDIO else ".lmdb"

        def shard_file(number: int) -> str:
            return f"{name}-{number:05d}{ext}"

        edges = _fixed_edges(len(items), options.shards)
        resumed = processed = bytes_in = 0
        if not os.path.isfile(os.path.join(staging, MANIFEST_NAME)):
            # Shards are written in order, so the completed ones are a prefix; reuse it, redo the rest.
            done: List[_ShardDone] = []
            pos = 0
            while pos < len(items):
                d = _load_done(staging, len(done), shard_file(len(done)), pos, edges)
                if d is None:
                    break
                done.append(d)
                pos = d.end
            resumed = len(done)
            _discard_from(staging, name, resumed)
            workers = options.workers or os.cpu_count() or 1
            progress = _Progress(options.progress and sys.stderr.isatty(), len(items))
            progress.skip(pos)
            try:
                sizes = [stats[i][0] for i in order[pos:].tolist()]
                # Big batches for pass-through, where the per-image overhead is what counts; small
                # ones when every image is decoded (milliseconds each: even load on the workers).
                batch = _PASS_BATCH if convert_options.resize is None and transcode is None else _DECODE_BATCH
                # Buffers in flight: the batches the window holds, plus those gathered by the writer.
                pool = BufferPool(keep=max(4, workers * _BATCHES_PER_WORKER) + 4)
                stream = _ordered_results(
                    zip(items[pos:], sizes),
                    lambda chunk: _convert_batch(chunk, convert_options, options.format, source.label_width, pool),
                    workers, batch)
                try:
                    with _short_gil_switch():
                        new = _write_shards(staging, items, pos, resumed, shard_file, stream, options, edges,
                                            source.label_width, progress, pool)
                finally:
                    stream.close()
            finally:
                progress.close()
            processed = len(items) - pos
            bytes_in = sum(d.bytes_in for d in new)
            _write_dataset_files(staging, source, options, name, fingerprint, done + new)
        try:
            manifest = _finalize(out, staging)
        except OSError as exc:
            if exc.errno in _USER_WRITE_ERRNOS:
                raise _write_error(exc, out) from None
            raise
        counts = manifest["counts"]
        return PackResult(out=out, manifest=manifest, written=manifest["records"],
                          skipped=[(s["path"], s["reason"]) for s in manifest["skipped"]],
                          converted=counts["converted"], bytes_in=bytes_in,
                          bytes_out=sum(s["bytes"] for s in manifest["shards"]),
                          seconds=time.perf_counter() - t0, resumed_shards=resumed, processed=processed)


def _write_shards(staging: str, items: List[SourceItem], pos: int, number: int, shard_file, stream,
                  options: PackOptions, edges: Optional[List[int]], label_width: int,
                  progress: _Progress, pool: BufferPool) -> List[_ShardDone]:
    """Consume converted items from ``pos`` on, cutting shards at ``edges`` or by size."""
    done: List[_ShardDone] = []
    sink: Optional[_ShardSink] = None
    target = os.path.join(staging, shard_file(number))

    def open_sink() -> _ShardSink:
        nonlocal target
        target = os.path.join(staging, shard_file(number))
        return _ShardSink(staging, number, shard_file(number), pos, options.format, label_width)

    try:
        for batch, out in stream:
            if isinstance(out, FramedBatch):
                if sink is None:
                    sink = open_sink()
                fits = (sink.nbytes + len(out.data) <= options.shard_size) if edges is None else \
                    (pos + len(batch) <= edges[number + 1])
                if fits:  # the usual pass-through case: the whole batch in one piece
                    sink.add_framed(batch, out, pool)
                    progress.step(sum(out.sizes), len(batch))
                    pos += len(batch)
                    if edges is not None and pos == edges[number + 1]:
                        done.append(sink.finish(pos))
                        sink, number = None, number + 1
                    continue
                out = out.entries()  # a shard boundary falls inside the batch: record by record
            for (item, _), (result, nread, prepared) in zip(batch, out):
                if prepared is not None and sink is not None and edges is None and sink.rows["id"] and \
                        sink.nbytes + recordio.framed_size(prepared.length) > options.shard_size:
                    done.append(sink.finish(pos))
                    sink, number = None, number + 1
                if sink is None:
                    sink = open_sink()
                sink.bytes_in += nread
                if result.data is None:
                    if options.on_error is OnError.FAIL:
                        raise UserError(f"{item.path}: {result.reason} (--on-error fail)")
                    sink.skipped.append((item.path, result.reason))
                else:
                    sink.kinds[result.kind] += 1
                    if result.note:
                        sink.kinds[result.note] += 1
                    sink.add(item, prepared)
                progress.step(nread)
                pos += 1
                if edges is not None and pos == edges[number + 1]:
                    done.append(sink.finish(pos))
                    sink, number = None, number + 1
        if sink is not None:
            done.append(sink.finish(pos))
            sink = None
    except OSError as exc:
        if sink is not None:
            sink.abort()
        if exc.errno in _USER_WRITE_ERRNOS:
            raise _write_error(exc, target) from None
        raise
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    return done


def _write_dataset_files(staging: str, source: Source, options: PackOptions, name: str, fingerprint: str,
                         done: List[_ShardDone]) -> None:
    """The binary index, then the manifest, into staging."""
    width = source.label_width
    total = sum(len(d.rows["id"]) for d in done)
    found = done[-1].end if done else 0
    index = empty_index(total, width)
    pos = 0
    shards, skipped, kinds = [], [], collections.Counter()
    for d in done:
        n = len(d.rows["id"])
        sl = slice(pos, pos + n)
        index["shard"][sl] = d.number
        for key in ("offset", "id", "length", "data_offset", "parts"):
            index[key][sl] = np.asarray(d.rows[key], dtype=np.uint64)
        if n:
            index["labels"][sl] = np.asarray(d.rows["labels"], dtype=np.float32).reshape(n, width)
        pos += n
        entry = {k: v for k, v in d.entry.items()}
        if options.restart_index:  # issue 7: which of this shard's records carry restart markers
            entry["restart_index"] = {"images": n - d.kinds.get(_NOT_INDEXED, 0),
                                      "verified": _restart_config(options).verify.value}
        shards.append(entry)
        skipped.extend(d.skipped)
        kinds.update(d.kinds)
    if total == 0:
        raise UserError(f"{source.path}: none of the {found} files is a "
                        "decodable image; nothing was written")
    written = total
    try:
        write_index(os.path.join(staging, INDEX_NAME), index)
        converted = {k: v for k, v in sorted(kinds.items()) if k not in ("pass", _NOT_INDEXED)}
        manifest = {
            "format_version": FORMAT_VERSION,
            "fastload_version": __version__,
            "format": options.format.value,
            "name": name,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "records": written,
            "label_width": width,
            "classes": source.classes,
            "source": {"kind": source.kind, "path": source.path, "root": source.root},
            "options": {"format": options.format.value, "shards": options.shards,
                        "shard_size": options.shard_size if options.shards is None else None,
                        "resize": options.resize, "quality": options.quality, "shuffle": options.shuffle,
                        "seed": options.seed, "on_error": options.on_error.value,
                        "restart_index": options.restart_index},
            "shards": shards,
            "index": {"file": INDEX_NAME, "checksum": checksum_file(os.path.join(staging, INDEX_NAME))},
            "counts": {"found": found, "written": written, "skipped": len(skipped),
                       "converted": converted, "passed_through": kinds.get("pass", 0),
                       "ignored_non_image_files": len(source.ignored),
                       "not_restart_indexed": kinds.get(_NOT_INDEXED, 0)},
            "skipped": [{"path": p, "reason": r} for p, r in skipped],
            "ignored": source.ignored[:1000],
            # Set when the engine's lossless restart-marker transcoder ran over the images.
            "restart_index": dict(_restart_manifest(options),
                                  images=written - kinds.get(_NOT_INDEXED, 0)) if options.restart_index else None,
            "plan": fingerprint,
        }
        write_json_atomic(os.path.join(staging, MANIFEST_NAME), manifest)
    except OSError as exc:
        if exc.errno in _USER_WRITE_ERRNOS:
            raise _write_error(exc, staging) from None
        raise


def format_summary(result: PackResult) -> str:
    """The end-of-pack summary printed by ``fastload pack``."""
    if result.up_to_date:
        return (f"{result.out}: already packed by the same command ({result.written} records); nothing to do")
    secs = max(result.seconds, 1e-9)
    m = result.manifest
    lines = [
        f"packed {result.written} records into {len(m['shards'])} {m['format']} shard(s) in {result.out}",
        f"  skipped {len(result.skipped)}" + (
            " (" + ", ".join(f"{n} {r}" for r, n in collections.Counter(
                r.split(":")[0] for _, r in result.skipped).most_common()) + ")" if result.skipped else ""),
        "  converted " + (", ".join(f"{k} {v}" for k, v in result.converted.items()) or "0"),
        f"  {result.bytes_in / 1e6:.1f} MB read, {result.bytes_out / 1e6:.1f} MB written in {secs:.2f} s: "
        f"{result.processed / secs:.0f} images/s, {result.bytes_in / secs / 1e6:.1f} MB/s",
    ]
    if result.resumed_shards:
        lines.append(f"  resumed: {result.resumed_shards} shard(s) kept from an interrupted run")
    for path, reason in result.skipped[:20]:
        lines.append(f"  skipped {path}: {reason}")
    if len(result.skipped) > 20:
        lines.append(f"  ... {len(result.skipped) - 20} more in {MANIFEST_NAME}")
    return "\n".join(lines)


def pack_main(args) -> int:
    """``fastload pack``: build :class:`PackOptions` from parsed arguments, pack, print the summary."""
    if args.shards is not None and args.shard_size is not None:
        raise UserError("give --shards or --shard-size, not both")
    try:
        options = PackOptions(
            format=args.format, shards=args.shards,
            shard_size=parse_size(args.shard_size) if args.shard_size is not None else DEFAULT_SHARD_SIZE,
            workers=args.workers, resize=args.resize, quality=args.quality, shuffle=args.shuffle,
            seed=args.seed, name=args.name, on_error=args.on_error, overwrite=args.overwrite,
            restart_index=args.restart_index, verify=args.verify, root=args.root, progress=not args.quiet)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    result = pack_folder(args.src, args.out, options=options)
    print(format_summary(result))
    return 0
