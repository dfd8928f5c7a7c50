"""Write stage, the pack of streamed input: WebDataset tars, parquet files and ``save_to_disk`` folders into shards.

The same pack as a folder's (:mod:`fastload.pack.packer`), fed from a stream instead of a list of
files: a reader thread reads the input front to back (:mod:`fastload.pack.read_ahead`; a tar once,
parquet a row group at a time, nothing extracted to disk), the converter threads check, convert and
frame the images already in memory (:func:`fastload.pack.convert_batch.convert_buffers`: JPEGs
pass through, checked and framed by one engine call per batch and written from where they were
read; PNG / WebP / grayscale / CMYK are transcoded, ``--resize`` and ``--restart-index`` as for
files), and the calling thread writes the shards in input order
(:mod:`fastload.pack.shard_writer`), in the same work folder with the same atomic move into OUT
(:mod:`fastload.pack.work_folder`) and the same index and manifest
(:mod:`fastload.pack.manifest_writer`). Memory stays bounded: at most a few hundred samples are in
flight between the reader and the writer.

Shards: by ``--shard-size`` as the records are written (a tar's sample count is unknown until its
end, so ``--shards N`` is refused for tars); parquet and ``save_to_disk`` input, whose row counts
are known up front, also take ``--shards N``.

Resume after a kill (``kill -9`` included): each completed shard's sidecar records where the input
goes on after its last sample (for a tar: which tar and the byte offset of the next sample's first
header; for parquet: the row) and the label state there (the class names numbered so far). A rerun
of the same command keeps the completed shards, starts reading where the last one ended (earlier
tars and row groups are not read again) and writes the rest: the same bytes as an uninterrupted run,
because shards are cut by the records alone.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from fastload.errors import UserError
from fastload.pack.convert_batch import batch_size, convert_buffers, convert_options, resolve_transcoder
from fastload.pack.framing import BufferPool
from fastload.pack.input_format import InputFormat
from fastload.pack.manifest_writer import write_dataset_files
from fastload.pack.options import PackOptions, ShardFormat
from fastload.pack.ordered_pool import ordered_results
from fastload.pack.plan import fixed_edges, output_settings
from fastload.pack.progress import Progress
from fastload.pack.read_ahead import read_ahead
from fastload.pack.result import PackResult
from fastload.pack.sample_labels import Labels
from fastload.pack.shard_writer import write_shards
from fastload.pack.stream_sample import Sample, StreamSource
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
from fastload.records.folder_tree import Source, SourceItem
from fastload.records.manifest import MANIFEST_NAME, read_manifest
from fastload.records.remote.storage import is_remote_url

__all__ = ["open_stream_source", "pack_stream"]

# Batches in flight beyond one per worker: one being written, one ready for the writer. Fewer than
# a folder pack's: a streamed sample holds its bytes (a tar chunk, an Arrow batch) until written,
# so every batch in flight is memory read ahead, and fresh memory faults page by page (2,000
# ImageNet-like images from tars, 2 workers: 8 batches in flight faulted 57 MB of read chunks, 4
# batches 33 MB; the whole command's CPU time 0.46 s against 0.40 s).
_SPARE_BATCHES = 2
_SETTLE = 1024  # samples read at most to learn the label width before writing starts


def _refuse(options: PackOptions, fmt: InputFormat) -> None:
    """Options that do not apply to streamed input of format ``fmt``."""
    flag = fmt.value
    if options.shuffle:
        raise UserError(
            f"--shuffle needs the whole input listed up front; {flag} input is packed in its own order "
            "(shuffle when loading: the loader's order is seeded and exact)"
        )
    if options.root:
        raise UserError("--root only applies to a .lst, CSV or JSONL listing")
    if fmt is InputFormat.WDS:
        wrong = [f for f in ("image_column", "label_column", "split") if getattr(options, f) is not None]
    else:
        wrong = [f for f in ("image_key", "label_key") if getattr(options, f) is not None]
    if wrong:
        flags = ", ".join("--" + w.replace("_", "-") for w in wrong)
        raise UserError(f"{flags} do(es) not apply to {flag} input")


def open_stream_source(
    src: str, fmt: InputFormat, options: PackOptions, storage_options: Mapping[str, Any] | None = None
) -> StreamSource:
    """The streamed source of ``src`` (format ``fmt``) with the options that apply to it.

    Raises:
        UserError: Options that do not apply, or an unusable input.
    """
    _refuse(options, fmt)
    source: StreamSource
    if fmt is InputFormat.WDS:
        if options.shards is not None:
            raise UserError(
                "--shards needs the number of samples up front, which a tar only tells at its end: "
                "use --shard-size for WebDataset input"
            )
        from fastload.pack.wds_source import WdsSource

        source = WdsSource(
            src, image_key=options.image_key, label_key=options.label_key, storage_options=storage_options
        )
    else:
        from fastload.pack.arrow_source import ArrowSource

        source = ArrowSource(
            src,
            kind=fmt.value,
            image_column=options.image_column,
            label_column=options.label_column,
            split=options.split,
            storage_options=storage_options,
        )
    if options.shards is not None and source.total is None:
        raise UserError(
            f"--shards needs the number of rows up front, which an Arrow stream ({fmt.value}) only tells at "
            "its end: use --shard-size"
        )
    return source


def _fingerprint(source: StreamSource, options: PackOptions, name: str, fmt: InputFormat) -> str:
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                **output_settings(options, name, source.path),
                "input_format": fmt.value,
                "image_key": options.image_key,
                "label_key": options.label_key,
                "image_column": options.image_column,
                "label_column": options.label_column,
                "split": options.split,
            },
            sort_keys=True,
        ).encode()
    )
    for line in source.identity():
        h.update(line.encode("utf-8", "surrogateescape") + b"\n")
    return h.hexdigest()


class _Marks:
    """Where the input goes on after the samples the writer is at: what a shard's sidecar records at its end.

    The reader thread stamps each sample with the number of class names known after it
    (:attr:`Sample.names`); the batches pass through :meth:`watch` on their way to the writer, which
    asks for the point after a shard's last sample (:meth:`cursor`): a shard ends inside the batch
    being written or right after the one before it, so those two are kept.
    """

    def __init__(self, source: StreamSource) -> None:
        self.source = source
        self.recent: collections.deque[list[tuple[SourceItem, Sample]]] = collections.deque(maxlen=2)

    def watch(self, stream: Iterator[tuple[list[Any], Any]]) -> Iterator[tuple[list[Any], Any]]:
        for chunk, out in stream:
            self.recent.append(chunk)
            yield chunk, out

    def cursor(self, end: int) -> dict[str, Any] | None:
        for chunk in reversed(self.recent):
            first = chunk[0][0].id
            if first < end <= first + len(chunk):
                sample = chunk[end - 1 - first][1]
                if sample.after is None:
                    return None  # no place to start again right after it (inside a damaged tar)
                return {"source": sample.after, "labels": self.source.labels.state(sample.names)}
        return None


def _resume(
    work_dir: str, shard_file: Any, edges: list[int] | None
) -> tuple[list[ShardDone], int, dict[str, Any] | None]:
    """The completed shards of an interrupted pack (a prefix), the position after them, their cursor."""
    done: list[ShardDone] = []
    pos = 0
    cursor: dict[str, Any] | None = None
    while edges is None or pos < edges[-1]:
        d = load_done(work_dir, len(done), shard_file(len(done)), pos, edges)
        if d is None or not isinstance(d.cursor, dict) or not isinstance(d.cursor.get("source"), dict):
            break
        try:
            Labels.from_state(d.cursor["labels"])
        except (KeyError, TypeError, AttributeError):
            break  # a sidecar without a usable label state: the shard is written again
        done.append(d)
        pos, cursor = d.end, d.cursor
    return done, pos, cursor


def _settle(samples: Iterator[Sample], labels: Labels) -> tuple[list[Sample], int]:
    """Read ahead until the label width is known (the first good label); returns what was read and the width."""
    head: list[Sample] = []
    while labels.width is None and len(head) < _SETTLE:
        sample = next(samples, None)
        if sample is None:
            break
        head.append(sample)
    return head, labels.width or 1


def pack_stream(
    src: str,
    out: str,
    *,
    fmt: InputFormat,
    options: PackOptions,
    storage_options: Mapping[str, Any] | None = None,
) -> PackResult:
    """Pack a streamed input (see the module docstring) into shards plus ``fastload.json``.

    Args:
        src: Tar file, folder, brace pattern or URL; parquet file or folder; ``save_to_disk`` folder.
        out: Output folder.
        fmt: ``InputFormat.WDS``, ``PARQUET`` or ``HF_DISK``.
        options: The pack's options.
        storage_options: Settings for a remote SRC.

    Returns:
        A :class:`PackResult`.

    Raises:
        UserError: Bad input or options, refused overwrite, unwritable output, full disk, or a bad
            entry with ``on_error="fail"``.
    """
    t0 = time.perf_counter()
    transcode = resolve_transcoder(options)
    source = open_stream_source(src, fmt, options, storage_options)
    name = options.name or source.name
    fingerprint = _fingerprint(source, options, name, fmt)
    out = os.path.abspath(out)
    local = os.path.abspath(src)
    if not is_remote_url(src) and (out == local or out.startswith(local + os.sep)):
        raise UserError(f"{out}: the output folder must not be inside the source folder")
    ext = ".rec" if options.format is ShardFormat.RECORDIO else ".lmdb"

    def shard_file(number: int) -> str:
        return f"{name}-{number:05d}{ext}"

    with exclusive(out):
        work_dir, up_to_date = prepare_out(out, overwrite=options.overwrite, fingerprint=fingerprint)
        if up_to_date:
            manifest = read_manifest(out)
            return PackResult(
                out=out,
                manifest=manifest,
                written=manifest["records"],
                skipped=[(s["path"], s["reason"]) for s in manifest.get("skipped") or [] if isinstance(s, dict)],
                converted=manifest.get("counts", {}).get("converted", {}),
                bytes_in=0,
                bytes_out=sum(s["bytes"] for s in manifest["shards"]),
                seconds=time.perf_counter() - t0,
                up_to_date=True,
            )
        edges = fixed_edges(source.total, options.shards) if options.shards is not None and source.total else None
        resumed = processed = bytes_in = 0
        if not os.path.isfile(os.path.join(work_dir, MANIFEST_NAME)):
            done, pos, cursor = _resume(work_dir, shard_file, edges)
            resumed = len(done)
            discard_from(work_dir, name, resumed)
            if cursor is not None:
                source.labels = Labels.from_state(cursor["labels"])
            new, processed = _write(source, work_dir, name, shard_file, options, edges, pos, cursor, resumed, transcode)
            bytes_in = sum(d.bytes_in for d in new)
            done += new
            described = Source(
                kind=fmt.value,
                path=source.path,
                root=source.path,
                items=[],
                classes=source.labels.classes(),
                label_width=source.labels.width or 1,
            )
            write_dataset_files(work_dir, described, options, name, fingerprint, done, source.describe())
        try:
            manifest = finalize(out, work_dir)
        except OSError as exc:
            if exc.errno in USER_WRITE_ERRNOS:
                raise write_error(exc, out) from None
            raise
    return PackResult(
        out=out,
        manifest=manifest,
        written=manifest["records"],
        skipped=[(s["path"], s["reason"]) for s in manifest["skipped"]],
        converted=manifest["counts"]["converted"],
        bytes_in=bytes_in,
        bytes_out=sum(s["bytes"] for s in manifest["shards"]),
        seconds=time.perf_counter() - t0,
        resumed_shards=resumed,
        processed=processed,
    )


def _write(
    source: StreamSource,
    work_dir: str,
    name: str,
    shard_file: Any,
    options: PackOptions,
    edges: list[int] | None,
    pos: int,
    cursor: dict[str, Any] | None,
    number: int,
    transcode: Any,
) -> tuple[list[ShardDone], int]:
    """Read, convert and write the samples from ``pos`` on; returns the new shards and the samples read."""
    converting = convert_options(options, transcode)
    workers = options.workers or os.cpu_count() or 1
    batch = batch_size(converting)
    window = workers + _SPARE_BATCHES
    # The reader stays one batch ahead of the converters: the bytes its samples view (a tar chunk,
    # an Arrow batch) stay alive until written, and every megabyte in flight is one more fresh
    # megabyte to fault in.
    depth, group = 1, batch
    marks = _Marks(source)
    # Framed batches' buffers come back once written: the batches in flight, plus those gathered.
    pool = BufferPool(keep=window + 4)
    samples = iter(source.samples(pos, cursor["source"] if cursor is not None else None))
    count = [0]

    def noted() -> Iterator[tuple[SourceItem, Sample]]:
        # Runs on the reader thread, in input order: the sample's labels and resume point are
        # settled before the next one is read.
        head, width = _settle(samples, source.labels)
        if source.labels.width is None:
            source.labels.width = width  # no good label yet: later ones must have this width
        zeros = (0.0,) * width
        p = pos
        try:
            for sample in _chain(head, samples):
                sample.names = len(source.labels.names)
                yield SourceItem(p, sample.name, sample.labels or zeros), sample
                p += 1
        finally:
            closer = getattr(samples, "close", None)
            if closer is not None:
                closer()  # its open files, a remote GET
        count[0] = p - pos

    total = source.total - pos if source.total is not None else None
    items = read_ahead(noted(), depth=depth, group=group)
    progress = Progress(options.progress and sys.stderr.isatty(), total)
    try:
        first = next(items, None)  # the label width is settled once the first item is out
        width = source.labels.width or 1

        def convert(chunk: list[tuple[SourceItem, Sample]]) -> Any:
            out = convert_buffers(
                [(item, s.data, s.reason) for item, s in chunk], converting, options.format, width, pool
            )
            for _, s in chunk:
                # The records hold what they need: the samples (kept for their resume points) let go
                # of the bytes read, so the reader's chunk buffers are free again sooner.
                s.data = None
            return out

        stream = ordered_results(
            _chain([first] if first is not None else [], items),
            convert,
            workers=workers,
            batch=batch,
            window=window,
        )
        try:
            new = write_shards(
                work_dir,
                [],
                pos,
                number,
                shard_file,
                marks.watch(stream),
                options,
                edges,
                width,
                progress,
                pool,
                marks.cursor,
            )
        finally:
            stream.close()
    finally:
        items.close()
        progress.close()
    return new, count[0]


def _chain(head: list[Any], rest: Iterator[Any]) -> Iterator[Any]:
    yield from head
    yield from rest
