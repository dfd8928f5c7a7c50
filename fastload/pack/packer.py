"""Write stage, the pack driver: :func:`pack_folder`, a folder or ``.lst`` into RecordIO or LMDB shards.

The pack runs in parallel, atomically and resumably.

Images flow through a bounded, ordered pipeline (:mod:`fastload.pack.ordered_pool`): worker threads
read, check/convert and frame batches of files (file I/O, numpy and Pillow release the GIL; with the
C++ engine built, a pass-through batch is read, checked and framed by one GIL-free call into a
reused buffer, :mod:`fastload.pack.framing`); the calling thread writes the records in input order
(:mod:`fastload.pack.shard_writer`). Everything is built in a staging folder and moved into OUT
when complete; a killed pack resumes from its completed shards (:mod:`fastload.pack.staging`).
The index and manifest come last (:mod:`fastload.pack.manifest_writer`).

Hostile or careless sources: only regular files are ever opened, and never with a blocking open
(the folder walk, :func:`fastload.records.folder_tree.scan_folder`, reports FIFOs, devices,
sockets, broken symlinks and directory symlink loops; a ``.lst`` entry is checked by ``stat``; the
readers open with ``O_NONBLOCK`` and check the descriptor). Files larger than a record can hold are
refused from their ``stat``, images whose header declares more than ``max_pixels`` pixels from
their header, in every mode. Every such file goes through ``on_error`` with its reason in the
manifest. Ctrl-C (``KeyboardInterrupt``) stops the pack at any stage within the time of the batch
in flight (tens of milliseconds measured); rerunning the command resumes it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import sys
import time
from typing import Any

import numpy as np
import xxhash

from fastload.errors import OnError, UserError
from fastload.pack.convert import Converted, ConvertOptions, convert_images
from fastload.pack.framing import BufferPool, FramedBatch, Prepared, engine_framing, frame_batch
from fastload.pack.manifest_writer import write_dataset_files
from fastload.pack.options import PackOptions, ShardFormat
from fastload.pack.ordered_pool import ordered_results
from fastload.pack.progress import Progress
from fastload.pack.restart import RestartTranscoder, manifest_settings
from fastload.pack.restart import available as restart_available
from fastload.pack.result import PackResult
from fastload.pack.shard_writer import write_shards
from fastload.pack.sources import open_source
from fastload.pack.staging import (
    USER_WRITE_ERRNOS,
    ShardDone,
    discard_from,
    exclusive,
    finalize,
    load_done,
    prepare_out,
    write_error,
)
from fastload.records import recordio
from fastload.records.folder_tree import Source, SourceItem, read_regular_file
from fastload.records.lmdb_shard import pack_value_header
from fastload.records.manifest import FORMAT_VERSION, MANIFEST_NAME, read_manifest

__all__ = ["pack_folder"]

_PASS_BATCH = 32  # images per worker task when they pass through
_DECODE_BATCH = 8  # images per task when each is decoded (milliseconds each): one engine call, even load
_BATCHES_PER_WORKER = 4  # tasks in flight per worker: bounds the images held in memory


def _resolve_transcoder(options: PackOptions) -> RestartTranscoder | None:
    """The C++ engine's restart-marker transcoder, or None without ``--restart-index``."""
    if not options.restart_index:
        return None
    if not restart_available():
        raise UserError(
            "--restart-index needs the C++ engine (fastload._engine.add_restart_markers), "
            "which is not built; build it with `python setup.py build_ext --inplace`"
        )
    # Verifies the first image and one in 16 (every image with --verify); raises ValueError for an
    # image it cannot transcode, which convert_image stores unchanged and counts as not indexed.
    return RestartTranscoder(options.restart_config())


def _fixed_edges(n: int, shards: int | None) -> list[int] | None:
    """Item boundaries for ``--shards N`` (None: cut by size while writing)."""
    if shards is None:
        return None
    k = min(shards, n)
    return [i * n // k for i in range(k + 1)]


def _fingerprint(
    source: Source, order: np.ndarray, stats: list[tuple[int, int]], options: PackOptions, name: str
) -> str:
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                "v": FORMAT_VERSION,
                "format": options.format.value,
                "resize": options.resize,
                "quality": options.quality,
                "name": name,
                "restart_index": options.restart_index,
                # The transcode settings change the bytes: shards from other settings are not reused.
                "restart": manifest_settings(options.restart_config()) if options.restart_index else None,
                "on_error": options.on_error.value,
                "source": source.path,
                "root": source.root,
                "shards": options.shards,
                "shard_size": None if options.shards else options.shard_size,
                "max_pixels": options.max_pixels,
                "walk_skipped": source.skipped,
            },
            sort_keys=True,
        ).encode()
    )
    for i in order.tolist():
        item = source.items[i]
        h.update(f"{item.id}\t{item.path}\t{item.labels}\t{stats[i][0]}\t{stats[i][1]}\n".encode("utf-8", "replace"))
    return h.hexdigest()


def _prepare(item: SourceItem, image: bytes | memoryview, fmt: ShardFormat, label_width: int) -> Prepared:
    if fmt is ShardFormat.RECORDIO:
        header = recordio.pack_header(item.labels[0] if label_width == 1 else item.labels, item.id)
        digest = xxhash.xxh3_64(header)
        digest.update(image)
        return Prepared(recordio.FramedRecord(image, header), len(header) + len(image), len(header), digest.intdigest())
    header = pack_value_header(item.labels, item.id)
    value = header + image
    return Prepared(value, len(value), len(header), xxhash.xxh3_64_intdigest(value))


def _max_file_bytes(label_width: int) -> int:
    """The largest source file a record can hold: RecordIO's record limit less the header and labels.

    LMDB shards get the same limit, so a dataset packs the same files in either format.
    """
    return recordio.MAX_RECORD_LENGTH - recordio.IR_HEADER_SIZE - 4 * label_width


def _read_reason(exc: OSError) -> str:
    """The skip reason for a file :func:`read_regular_file` refused or could not read."""
    if exc.errno in (errno.EINVAL, errno.EFBIG) and exc.strerror:
        return exc.strerror  # not a regular file / too large: the message says which
    return f"cannot read: {exc.strerror or exc}"


def _convert_batch(
    batch: list[tuple[SourceItem, int]],
    options: ConvertOptions,
    fmt: ShardFormat,
    label_width: int,
    pool: BufferPool,
    refused: dict[str, str],
) -> FramedBatch | list[tuple[Converted, int, Prepared | None]]:
    """Read a batch of files, convert them together (one engine call with ``--resize``), frame them.

    Pass-through RecordIO batches go to the engine's ``frame_files`` first (read, check and frame
    in one GIL-free call): a batch it frames whole is returned as is, for the writer to take in one
    piece; files it leaves take the per-file path below. Files refused when they were listed
    (``refused``: path -> reason, e.g. a FIFO or a file too large for a record) are never opened.
    """
    framed: list[tuple[Converted, int, Prepared | None] | None] = [None] * len(batch)
    blocked = bool(refused) and any(item.path in refused for item, _ in batch)
    if fmt is ShardFormat.RECORDIO and options.resize is None and options.transcode is None and not blocked:
        frame_files = engine_framing()
        if frame_files is not None:
            whole = frame_batch(batch, label_width, frame_files, pool, options.max_pixels)
            if whole.complete:
                return whole
            framed = whole.entries()
    datas: dict[int, bytes] = {}
    results: dict[int, Converted] = {}
    limit = _max_file_bytes(label_width)
    for i, (item, _size) in enumerate(batch):
        if framed[i] is not None:
            continue
        if item.path in refused:
            results[i] = Converted(None, None, refused[item.path])
            continue
        try:
            datas[i] = read_regular_file(item.path, max_bytes=limit)
        except OSError as exc:
            results[i] = Converted(None, None, _read_reason(exc))
    results.update(zip(datas, convert_images(list(datas.values()), options), strict=True))
    out: list[tuple[Converted, int, Prepared | None]] = []
    for i, (item, _) in enumerate(batch):
        entry = framed[i]
        if entry is not None:
            out.append(entry)
            continue
        result = results[i]
        prepared = _prepare(item, result.data, fmt, label_width) if result.data is not None else None
        out.append((result, len(datas.get(i, b"")), prepared))
    return out


def pack_folder(src: str, out: str, *, options: PackOptions | None = None, **kwargs: Any) -> PackResult:
    """Pack a class-folder tree or an im2rec ``.lst`` into shards plus ``fastload.json``.

    Args:
        src: Folder with one sub-folder per class, or a ``.lst`` file.
        out: Output folder.
        options: A :class:`PackOptions`; or pass its fields as keyword arguments.
        **kwargs: :class:`PackOptions` fields (when ``options`` is None).

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
    name = (
        options.name
        or re.sub(r"[^A-Za-z0-9._-]", "_", os.path.splitext(os.path.basename(os.path.normpath(source.path)))[0]).lstrip(
            "."
        )
        or "data"
    )
    order = np.arange(len(source.items))
    if options.shuffle:
        order = np.random.default_rng(options.seed).permutation(len(source.items))
    stats = []
    # Files that must not be opened (not regular) or cannot be stored (larger than a record):
    # refused from their stat, without an open, and reported like any other bad file.
    refused: dict[str, str] = {}
    limit = _max_file_bytes(source.label_width)
    for item in source.items:
        try:
            st = os.stat(item.path)
            stats.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((0, 0))
            continue
        if not stat.S_ISREG(st.st_mode):
            refused[item.path] = "not a regular file (a FIFO, device, socket or folder): never opened"
        elif st.st_size > limit:
            refused[item.path] = f"file of {st.st_size} bytes is larger than the {limit}-byte record limit"
    if source.skipped and options.on_error is OnError.RAISE:
        path, reason = source.skipped[0]
        raise UserError(f"{path}: {reason} (on_error='raise', --on-error fail)")
    items = [source.items[i] for i in order.tolist()]
    fingerprint = _fingerprint(source, order, stats, options, name)
    out = os.path.abspath(out)
    if source.kind == "folder" and (out == source.path or out.startswith(source.path + os.sep)):
        raise UserError(f"{out}: the output folder must not be inside the source folder")
    with exclusive(out):
        staging, up_to_date = prepare_out(out, overwrite=options.overwrite, fingerprint=fingerprint)
        if up_to_date:
            manifest = read_manifest(out)
            counts = manifest.get("counts", {})
            return PackResult(
                out=out,
                manifest=manifest,
                written=manifest["records"],
                skipped=[
                    (s["path"], s["reason"])
                    for s in manifest.get("skipped") or []
                    if isinstance(s, dict) and "path" in s and "reason" in s
                ],
                converted=counts.get("converted", {}),
                bytes_in=0,
                bytes_out=sum(s["bytes"] for s in manifest["shards"]),
                seconds=time.perf_counter() - t0,
                up_to_date=True,
            )

        convert_options = ConvertOptions(
            resize=options.resize, quality=options.quality, transcode=transcode, max_pixels=options.max_pixels
        )
        ext = ".rec" if options.format is ShardFormat.RECORDIO else ".lmdb"

        def shard_file(number: int) -> str:
            return f"{name}-{number:05d}{ext}"

        edges = _fixed_edges(len(items), options.shards)
        resumed = processed = bytes_in = 0
        if not os.path.isfile(os.path.join(staging, MANIFEST_NAME)):
            # Shards are written in order, so the completed ones are a prefix; reuse it, redo the rest.
            done: list[ShardDone] = []
            pos = 0
            while pos < len(items):
                d = load_done(staging, len(done), shard_file(len(done)), pos, edges)
                if d is None:
                    break
                done.append(d)
                pos = d.end
            resumed = len(done)
            discard_from(staging, name, resumed)
            workers = options.workers or os.cpu_count() or 1
            progress = Progress(options.progress and sys.stderr.isatty(), len(items))
            progress.skip(pos)
            try:
                sizes = [stats[i][0] for i in order[pos:].tolist()]
                # Big batches for pass-through, where the per-image overhead is what counts; small
                # ones when every image is decoded (milliseconds each: even load on the workers).
                batch = _PASS_BATCH if convert_options.resize is None and transcode is None else _DECODE_BATCH
                # Buffers in flight: the batches the window holds, plus those gathered by the writer.
                window = max(4, workers * _BATCHES_PER_WORKER)  # bounds memory: batches in flight
                pool = BufferPool(keep=window + 4)
                stream = ordered_results(
                    zip(items[pos:], sizes, strict=True),
                    lambda chunk: _convert_batch(
                        chunk, convert_options, options.format, source.label_width, pool, refused
                    ),
                    workers=workers,
                    batch=batch,
                    window=window,
                )
                # The interpreter's GIL switch interval is left alone: shortening it to 0.5 ms once
                # took pass-through packing of 2,000 ImageNet-like files from 0.35 to 0.27 s, but since
                # the engine frames whole batches without the GIL it buys nothing (0.99x paired,
                # quartiles 0.93-1.04x over 30 alternated in-process runs; 1.07x, 0.92-1.09x, on the
                # Python framing path), and it is process-wide state a library must not change.
                try:
                    new = write_shards(
                        staging,
                        items,
                        pos,
                        resumed,
                        shard_file,
                        stream,
                        options,
                        edges,
                        source.label_width,
                        progress,
                        pool,
                    )
                finally:
                    stream.close()
            finally:
                progress.close()
            processed = len(items) - pos
            bytes_in = sum(d.bytes_in for d in new)
            write_dataset_files(staging, source, options, name, fingerprint, done + new)
        try:
            manifest = finalize(out, staging)
        except OSError as exc:
            if exc.errno in USER_WRITE_ERRNOS:
                raise write_error(exc, out) from None
            raise
        counts = manifest["counts"]
        return PackResult(
            out=out,
            manifest=manifest,
            written=manifest["records"],
            skipped=[(s["path"], s["reason"]) for s in manifest["skipped"]],
            converted=counts["converted"],
            bytes_in=bytes_in,
            bytes_out=sum(s["bytes"] for s in manifest["shards"]),
            seconds=time.perf_counter() - t0,
            resumed_shards=resumed,
            processed=processed,
        )
