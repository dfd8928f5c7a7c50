"""Write stage, one batch of files: read, check, convert and frame them, the same for every pack driver.

The local pack (:mod:`fastload.pack.packer`, worker threads) and the Ray pack
(:mod:`fastload.pack.ray_engine`, Ray tasks) both call :func:`convert_batch` on batches of the same
sizes (:data:`PASS_BATCH`, :data:`DECODE_BATCH`), so their records are the same bytes: framing,
per-record checksums, refusals and their reasons included.
"""

from __future__ import annotations

import errno

import xxhash

from fastload.engine import unavailable_reason
from fastload.errors import UserError
from fastload.pack.convert import BadImage, Converted, ConvertOptions, cheap_info, convert_images
from fastload.pack.framing import (
    BufferPool,
    FramedBatch,
    Prepared,
    engine_buffer_framing,
    engine_framing,
    frame_batch,
    frame_buffers,
    frame_images,
)
from fastload.pack.options import PackOptions, ShardFormat
from fastload.pack.restart import RestartTranscoder
from fastload.pack.restart import available as restart_available
from fastload.records import recordio
from fastload.records.folder_tree import SourceItem, read_regular_file
from fastload.records.lmdb_shard import pack_value_header

__all__ = [
    "DECODE_BATCH",
    "PASS_BATCH",
    "batch_size",
    "convert_batch",
    "convert_buffers",
    "convert_options",
    "max_file_bytes",
    "prepare_record",
    "read_reason",
    "resolve_transcoder",
]

#: Images per batch when they pass through.
PASS_BATCH = 32  # images per worker task when they pass through
#: Images per batch when each is decoded.
DECODE_BATCH = 8  # images per task when each is decoded (milliseconds each): one engine call, even load


def resolve_transcoder(options: PackOptions) -> RestartTranscoder | None:
    """The C++ engine's restart-marker transcoder, or None without ``--restart-index``."""
    if not options.restart_index:
        return None
    if not restart_available():
        raise UserError(f"--restart-index needs the C++ engine: {unavailable_reason()}")
    # Verifies the first image and one in 16 (every image with --verify); raises ValueError for an
    # image it cannot transcode, which convert_image stores unchanged and counts as not indexed.
    return RestartTranscoder(options.restart_config())


def convert_options(options: PackOptions, transcode: RestartTranscoder | None) -> ConvertOptions:
    """What each image goes through for ``options`` (``transcode``: :func:`resolve_transcoder`'s)."""
    return ConvertOptions(
        resize=options.resize, quality=options.quality, transcode=transcode, max_pixels=options.max_pixels
    )


def batch_size(options: ConvertOptions) -> int:
    """Images per batch: big when they pass through, small when each is decoded."""
    return PASS_BATCH if options.resize is None and options.transcode is None else DECODE_BATCH


def prepare_record(
    item: SourceItem, image: bytes | bytearray | memoryview, fmt: ShardFormat, label_width: int
) -> Prepared:
    """The record (RecordIO) or value (LMDB) of one image, with its length, image offset and checksum."""
    if fmt is ShardFormat.RECORDIO:
        header = recordio.pack_header(item.labels[0] if label_width == 1 else item.labels, item.id)
        digest = xxhash.xxh3_64(header)
        digest.update(image)
        return Prepared(recordio.FramedRecord(image, header), len(header) + len(image), len(header), digest.intdigest())
    header = pack_value_header(item.labels, item.id)
    value = header + image
    return Prepared(value, len(value), len(header), xxhash.xxh3_64_intdigest(value))


def max_file_bytes(label_width: int) -> int:
    """The largest source file a record can hold: RecordIO's record limit less the header and labels.

    LMDB shards get the same limit, so a dataset packs the same files in either format.
    """
    return recordio.MAX_RECORD_LENGTH - recordio.IR_HEADER_SIZE - 4 * label_width


def read_reason(exc: OSError) -> str:
    """The skip reason for a file :func:`read_regular_file` refused or could not read."""
    if exc.errno in (errno.EINVAL, errno.EFBIG) and exc.strerror:
        return exc.strerror  # not a regular file / too large: the message says which
    return f"cannot read: {exc.strerror or exc}"


def convert_batch(
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
    limit = max_file_bytes(label_width)
    for i, (item, _size) in enumerate(batch):
        if framed[i] is not None:
            continue
        if item.path in refused:
            results[i] = Converted(None, None, refused[item.path])
            continue
        try:
            datas[i] = read_regular_file(item.path, max_bytes=limit)
        except OSError as exc:
            results[i] = Converted(None, None, read_reason(exc))
    results.update(zip(datas, convert_images(list(datas.values()), options), strict=True))
    out: list[tuple[Converted, int, Prepared | None]] = []
    for i, (item, _) in enumerate(batch):
        entry = framed[i]
        if entry is not None:
            out.append(entry)
            continue
        result = results[i]
        prepared = prepare_record(item, result.data, fmt, label_width) if result.data is not None else None
        out.append((result, len(datas.get(i, b"")), prepared))
    return out


def _passes(data: bytes | memoryview, max_pixels: int) -> bool:
    """Whether :func:`fastload.pack.convert.convert_image` would store ``data`` untouched (a checked colour JPEG)."""
    try:
        return cheap_info(data, max_pixels)[1]
    except BadImage:
        return False


def convert_buffers(
    batch: list[tuple[SourceItem, bytes | memoryview | None, str | None]],
    options: ConvertOptions,
    fmt: ShardFormat,
    label_width: int,
    pool: BufferPool | None = None,
) -> FramedBatch | list[tuple[Converted, int, Prepared | None]]:
    """Check, convert and frame a batch of images already in memory (a tar's members, a parquet column).

    Each entry is ``(item, image bytes, reason)``: with a reason (a bad entry found while reading),
    the entry is reported with it and its bytes are not looked at. A pass-through RecordIO batch goes
    to the engine's ``frame_buffers`` first (check and frame in one GIL-free call,
    :func:`fastload.pack.framing.frame_images`): a batch it frames whole is returned as is, for the
    writer to take in one piece, as the engine's framed batches of files; images it leaves take the
    per-image path below. Without the engine, a batch of JPEGs that all pass through is framed into
    one buffer in Python (:func:`fastload.pack.framing.frame_buffers`). Otherwise the result has
    :func:`convert_batch`'s per-file form, so the shard writer takes both alike.
    """
    limit = max_file_bytes(label_width)
    framed: list[tuple[Converted, int, Prepared | None] | None] = [None] * len(batch)
    streaming = (
        fmt is ShardFormat.RECORDIO and options.resize is None and options.transcode is None and pool is not None
    )
    engine = engine_buffer_framing() if streaming else None
    if engine is not None:
        assert pool is not None
        # Bad entries and images too large for a record are the per-image path's to report.
        picks = [i for i, (_, data, reason) in enumerate(batch) if reason is None and data and len(data) <= limit]
        if picks:
            images = [(item, data) for item, data, _ in (batch[i] for i in picks) if data is not None]
            whole = frame_images(images, label_width, engine, pool, options.max_pixels)
            if len(picks) == len(batch) and whole.complete:
                return whole
            for i, entry in zip(picks, whole.entries(), strict=True):
                framed[i] = entry
    # Without the engine, the usual batch: colour JPEGs that pass through, framed into one buffer.
    passing = (
        streaming
        and engine is None
        and all(
            reason is None and data is not None and len(data) <= limit and _passes(data, options.max_pixels)
            for _, data, reason in batch
        )
    )
    if passing:
        assert pool is not None
        framed_here = frame_buffers([(item, data) for item, data, _ in batch if data is not None], label_width, pool)
        if framed_here is not None:
            return framed_here
    results: dict[int, Converted] = {}
    datas: dict[int, bytes | memoryview] = {}
    for i, (_item, data, reason) in enumerate(batch):
        if framed[i] is not None:
            continue
        if reason is not None or data is None:
            results[i] = Converted(None, None, reason or "no image bytes")
        elif len(data) > limit:
            results[i] = Converted(
                None, None, f"image of {len(data)} bytes is larger than the {limit}-byte record limit"
            )
        else:
            datas[i] = data
    results.update(zip(datas, convert_images(list(datas.values()), options), strict=True))
    out: list[tuple[Converted, int, Prepared | None]] = []
    for i, (item, data, _) in enumerate(batch):
        entry = framed[i]
        if entry is not None:
            out.append(entry)
            continue
        result = results[i]
        prepared = prepare_record(item, result.data, fmt, label_width) if result.data is not None else None
        out.append((result, len(data) if data is not None else 0, prepared))
    return out
