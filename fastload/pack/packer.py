"""Write stage, the pack driver: :func:`pack_folder`, a folder or ``.lst`` into RecordIO or LMDB shards.

The pack runs in parallel, atomically and resumably.

Images flow through a bounded, ordered pipeline (:mod:`fastload.pack.ordered_pool`): worker threads
read, check/convert and frame batches of files (file I/O, numpy and Pillow release the GIL; with the
C++ engine built, a pass-through batch is read, checked and framed by one GIL-free call into a
reused buffer, :mod:`fastload.pack.framing`); the calling thread writes the records in input order
(:mod:`fastload.pack.shard_writer`). Everything is built in a work folder and moved into OUT
when complete; a killed pack resumes from its completed shards (:mod:`fastload.pack.work_folder`).
The index and manifest come last (:mod:`fastload.pack.manifest_writer`).

Hostile or careless sources: only regular files are ever opened, and never with a blocking open
(the folder walk, :func:`fastload.records.folder_tree.scan_folder`, reports FIFOs, devices,
sockets, broken symlinks and directory symlink loops; a ``.lst`` entry is checked by ``stat``; the
readers open with ``O_NONBLOCK`` and check the descriptor). Files larger than a record can hold are
refused from their ``stat``, images whose header declares more than ``max_pixels`` pixels from
their header, in every mode. Every such file goes through ``on_error`` with its reason in the
manifest. Ctrl-C (``KeyboardInterrupt``) stops the pack at any point within the time of the batch
in flight (tens of milliseconds measured); rerunning the command resumes it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fastload.errors import UserError
from fastload.pack.convert_batch import batch_size, convert_batch, convert_options, resolve_transcoder
from fastload.pack.framing import BufferPool
from fastload.pack.input_format import STREAMED, detect_format
from fastload.pack.manifest_writer import write_dataset_files
from fastload.pack.options import PackOptions, ShardFormat
from fastload.pack.ordered_pool import ordered_results
from fastload.pack.plan import dataset_name, fixed_edges, refuse_walk_skips, stat_sources
from fastload.pack.plan import fingerprint as pack_fingerprint
from fastload.pack.progress import Progress
from fastload.pack.result import PackResult
from fastload.pack.shard_writer import write_shards
from fastload.pack.sources import open_source
from fastload.pack.work_folder import (
    USER_WRITE_ERRNOS,
    ShardDone,
    discard_from,
    exclusive,
    finalize,
    load_done,
    prepare_out,
    write_error,
)
from fastload.records.manifest import MANIFEST_NAME, read_manifest

__all__ = ["pack_folder"]

_BATCHES_PER_WORKER = 4  # tasks in flight per worker: bounds the images held in memory


def pack_folder(
    src: str,
    out: str,
    *,
    options: PackOptions | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> PackResult:
    """Pack a class-folder tree, a listing, WebDataset tars or parquet into shards plus ``fastload.json``.

    Folders, ``.lst``, CSV and JSONL listings are packed here; WebDataset tars, parquet and
    ``save_to_disk`` folders are streamed by :func:`fastload.pack.stream_pack.pack_stream`
    (``options.input_format``, or detected: :func:`fastload.pack.input_format.detect_format`).

    Args:
        src: Folder with one sub-folder per class, a ``.lst`` / ``.csv`` / ``.jsonl`` listing, tars
            (a file, folder, brace pattern or URL), a parquet file or folder, a ``save_to_disk`` folder.
        out: Output folder.
        options: A :class:`PackOptions`; or pass its fields as keyword arguments.
        storage_options: Settings for a remote (``s3://`` ...) tar or parquet SRC.
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
    src, out = os.fspath(src), os.fspath(out)
    fmt = options.input_format or detect_format(src, storage_options)
    if fmt in STREAMED:
        from fastload.pack.stream_pack import pack_stream

        return pack_stream(src, out, fmt=fmt, options=options, storage_options=storage_options)
    for flag in ("image_key", "label_key", "image_column", "label_column", "split"):
        if getattr(options, flag) is not None:
            raise UserError(f"--{flag.replace('_', '-')} does not apply to {fmt.value} input")
    t0 = time.perf_counter()
    transcode = resolve_transcoder(options)
    source = open_source(src, options.root, fmt)
    name = dataset_name(source, options)
    order = np.arange(len(source.items))
    if options.shuffle:
        order = np.random.default_rng(options.seed).permutation(len(source.items))
    stats, refused = stat_sources(source)
    refuse_walk_skips(source, options)
    items = [source.items[i] for i in order.tolist()]
    fingerprint = pack_fingerprint(source, order, stats, options, name)
    out = os.path.abspath(out)
    if source.kind == "folder" and (out == source.path or out.startswith(source.path + os.sep)):
        raise UserError(f"{out}: the output folder must not be inside the source folder")
    with exclusive(out):
        work_dir, up_to_date = prepare_out(out, overwrite=options.overwrite, fingerprint=fingerprint)
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

        converting = convert_options(options, transcode)
        ext = ".rec" if options.format is ShardFormat.RECORDIO else ".lmdb"

        def shard_file(number: int) -> str:
            return f"{name}-{number:05d}{ext}"

        edges = fixed_edges(len(items), options.shards)
        resumed = processed = bytes_in = 0
        if not os.path.isfile(os.path.join(work_dir, MANIFEST_NAME)):
            # Shards are written in order, so the completed ones are a prefix; reuse it, redo the rest.
            done: list[ShardDone] = []
            pos = 0
            while pos < len(items):
                d = load_done(work_dir, len(done), shard_file(len(done)), pos, edges)
                if d is None:
                    break
                done.append(d)
                pos = d.end
            resumed = len(done)
            discard_from(work_dir, name, resumed)
            workers = options.workers or os.cpu_count() or 1
            progress = Progress(options.progress and sys.stderr.isatty(), len(items))
            progress.skip(pos)
            try:
                sizes = [stats[i][0] for i in order[pos:].tolist()]
                # Big batches for pass-through, where the per-image overhead is what counts; small
                # ones when every image is decoded (milliseconds each: even load on the workers).
                batch = batch_size(converting)
                # Buffers in flight: the batches the window holds, plus those gathered by the writer.
                window = max(4, workers * _BATCHES_PER_WORKER)  # bounds memory: batches in flight
                pool = BufferPool(keep=window + 4)
                stream = ordered_results(
                    zip(items[pos:], sizes, strict=True),
                    lambda chunk: convert_batch(chunk, converting, options.format, source.label_width, pool, refused),
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
                        work_dir,
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
            write_dataset_files(work_dir, source, options, name, fingerprint, done + new)
        try:
            manifest = finalize(out, work_dir)
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
