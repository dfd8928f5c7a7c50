"""Write stage on a cluster: ``fastload pack SRC OUT --engine ray``, the same pack as Ray tasks.

The work is cut into item ranges run as Ray tasks; the bytes come from the same calls as the local
pack, so for the same inputs and options the shards are byte-identical to a local ``fastload pack``:

1. **Convert** (one task per range of items): the local pack's own batch conversion
   (:func:`fastload.pack.convert_batch.convert_batch`: the engine's pass-through framing, or its
   ``--resize`` / restart-index transcode, Pillow for the rest), in the same batch sizes. Each task
   writes its framed records (RecordIO) or values (LMDB) back to back into a *segment* file in
   ``OUT/.fastload-staging/ray/``, then a JSON sidecar with every record's sizes and kinds and the
   segment's checksum; both land under temporary names and are renamed when complete.
2. **Cut** (the driver, from the sidecars only): shard boundaries by the local pack's rules
   (``--shards N`` item edges, or the running size with ``--shard-size``), record by record, so every
   shard holds exactly the records the local pack puts in it.
3. **Write** (one task per shard): the shard is written from the segments' bytes through the
   local pack's shard writer (``.partial`` name, fsync, rename, ``.done.json`` sidecar).
4. The driver writes the index and the manifest, then moves the dataset into OUT, as the local pack.

A task whose worker dies (killed, out of memory, node lost) is retried by Ray (``max_retries``); a
rerun of the same command reuses every segment whose checksum still matches and every completed
shard, whichever engine wrote them. The per-task overhead is small next to a task's work (see
``bench/remote_bench.py``): tasks are ranges of hundreds of images.

Where the tasks run: with a local cluster (default, or ``--address`` of a single machine) everything
is on this machine. On a multi-node cluster SRC and OUT must be paths every node sees (a shared
filesystem); a remote OUT (``s3://...``) or SRC is handled by :mod:`fastload.pack.remote_io`
through a local build folder, which then has to be on shared storage too.

Ray is an optional dependency (``pip install 'fastload[ray]'``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.checksum import Checksum, checksum_file
from fastload.errors import OnError, UserError
from fastload.pack.convert_batch import batch_size, convert_batch, convert_options, resolve_transcoder
from fastload.pack.framing import BufferPool, FramedBatch, Prepared
from fastload.pack.input_format import STREAMED, detect_format
from fastload.pack.manifest_writer import write_dataset_files
from fastload.pack.options import PackOptions, ShardFormat
from fastload.pack.plan import dataset_name, fixed_edges, refuse_walk_skips, stat_sources
from fastload.pack.plan import fingerprint as pack_fingerprint
from fastload.pack.restart import RestartTranscoder
from fastload.pack.result import PackResult
from fastload.pack.shard_writer import ShardSink
from fastload.pack.sources import open_source
from fastload.pack.work_folder import (
    USER_WRITE_ERRNOS,
    ShardDone,
    exclusive,
    finalize,
    load_done,
    prepare_out,
    write_error,
)
from fastload.records import recordio
from fastload.records.durable import write_json_atomic
from fastload.records.folder_tree import Source, SourceItem
from fastload.records.manifest import read_manifest

__all__ = ["RayPackResult", "RayPackStats", "format_ray_stats", "pack_with_ray"]

_SEGMENTS = "ray"  # inside the pack's work folder
_SEG_VERSION = 2  # 2: every record carries its XXH3-64 checksum


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("--engine ray needs Ray: pip install 'fastload[ray]'") from None
    return ray


@dataclass
class RayPackStats:
    """What the Ray engine did, for the report and the benchmark.

    Attributes:
        convert_tasks: Conversion tasks run in this run (segments reused are not counted).
        write_tasks: Shard-writing tasks run.
        segments_reused: Segments kept from an earlier run.
        task_seconds: Summed wall time inside the tasks (their own clocks).
        wall_seconds: The driver's wall time for the two task phases.
    """

    convert_tasks: int = 0
    write_tasks: int = 0
    segments_reused: int = 0
    task_seconds: float = 0.0
    wall_seconds: float = 0.0


@dataclass(frozen=True)
class RayPackResult(PackResult):
    """A :class:`PackResult` plus what the Ray engine did (``ray``)."""

    ray: RayPackStats | None = None


def _with_stats(result: PackResult, stats: RayPackStats) -> RayPackResult:
    return RayPackResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(PackResult)}, ray=stats)


# --- phase 1: conversion tasks ---------------------------------------------------------------------


def _segment_paths(work_dir: str, number: int) -> tuple[str, str]:
    base = os.path.join(work_dir, _SEGMENTS, f"seg-{number:06d}")
    return base + ".bin", base + ".json"


def _load_segment(work_dir: str, number: int, start: int, end: int) -> dict[str, Any] | None:
    """A completed segment's sidecar when it covers ``[start, end)`` and its bytes still check."""
    data, meta_path = _segment_paths(work_dir, number)
    try:
        with open(meta_path, "rb") as f:
            meta = json.load(f)
        if meta.get("version") != _SEG_VERSION or meta.get("range") != [start, end]:
            return None
        if os.path.getsize(data) != meta["bytes"] or checksum_file(data) != meta["checksum"]:
            return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _convert_segment(
    work_dir: str,
    number: int,
    start: int,
    batch: list[tuple[SourceItem, int]],
    options: PackOptions,
    label_width: int,
    refused: dict[str, str],
) -> dict[str, Any]:
    """Ray task body: convert items ``start..`` with the local pack's calls into one segment file.

    ``refused``: the segment's files refused from their ``stat`` on the driver (path -> reason).
    """
    t0 = time.perf_counter()
    converting = convert_options(options, resolve_transcoder(options))
    step = batch_size(converting)
    pool = BufferPool(keep=2)
    data_path, meta_path = _segment_paths(work_dir, number)
    tmp = f"{data_path}.{os.getpid()}.partial"
    records: list[list] = []
    digest = Checksum()
    offset = 0
    with open(tmp, "wb") as f:
        for lo in range(0, len(batch), step):
            chunk = batch[lo : lo + step]
            out = convert_batch(chunk, converting, options.format, label_width, pool, refused)
            entries = out.entries() if isinstance(out, FramedBatch) else out
            for entry in entries:
                assert entry is not None  # a batch the engine framed whole has every entry
                result, nread, prepared = entry
                if prepared is None:
                    records.append([None, result.reason, nread])
                    continue
                if options.format is ShardFormat.RECORDIO:
                    pieces, parts = prepared.record.chunks, prepared.record.parts
                else:
                    pieces, parts = [prepared.record], 0
                size = 0
                for piece in pieces:
                    f.write(piece)
                    digest.update(piece)
                    size += len(piece)
                records.append(
                    [
                        result.kind,
                        result.note,
                        nread,
                        prepared.length,
                        prepared.data_offset,
                        parts,
                        offset,
                        size,
                        prepared.checksum,
                    ]
                )
                offset += size
            if isinstance(out, FramedBatch) and out.buffer is not None:
                pool.give(out.buffer)
    os.replace(tmp, data_path)
    meta = {
        "version": _SEG_VERSION,
        "range": [start, start + len(batch)],
        "bytes": offset,
        "checksum": digest.value(),
        "records": records,
        "pid": os.getpid(),
        "seconds": time.perf_counter() - t0,
    }
    write_json_atomic(meta_path, meta, indent=None)
    return meta


# --- phase 2: the cut, exactly as the local writer cuts ---------------------------------------------


@dataclass
class _ShardPlan:
    number: int
    start: int
    end: int = 0
    records: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (item position, segment)
    nbytes: int = 0
    rows: int = 0


def _plan_shards(records: list[list], seg_of: list[int], edges: list[int] | None, shard_size: int) -> list[_ShardPlan]:
    """Shard boundaries for converted ``records`` (one per item, in order), by the local pack's rules."""
    plans: list[_ShardPlan] = []
    cur: _ShardPlan | None = None
    number = pos = 0
    for p, rec in enumerate(records):
        is_record = rec[0] is not None
        if (
            is_record
            and cur is not None
            and edges is None
            and cur.rows
            and cur.nbytes + recordio.framed_size(rec[3]) > shard_size
        ):
            cur.end = pos
            plans.append(cur)
            cur, number = None, number + 1
        if cur is None:
            cur = _ShardPlan(number, pos)
        cur.records.append((p, seg_of[p]))
        if is_record:
            cur.nbytes += recordio.framed_size(rec[3])
            cur.rows += 1
        pos += 1
        if edges is not None and pos == edges[number + 1]:
            cur.end = pos
            plans.append(cur)
            cur, number = None, number + 1
    if cur is not None:
        cur.end = pos
        plans.append(cur)
    return plans


# --- phase 3: shard-writing tasks ------------------------------------------------------------------


def _write_shard(
    work_dir: str,
    plan: _ShardPlan,
    file: str,
    items: list[SourceItem],
    records: list[list],
    options: PackOptions,
    label_width: int,
) -> tuple[ShardDone, float]:
    """Ray task body: write one shard from segment bytes through the local pack's shard writer."""
    t0 = time.perf_counter()
    segments: dict[int, memoryview] = {}  # a segment is at most a few tens of MB: read it whole
    sink = ShardSink(work_dir, plan.number, file, plan.start, options.format, label_width)
    try:
        for (_, seg), item, rec in zip(plan.records, items, records, strict=True):
            kind, note, nread = rec[0], rec[1], rec[2]
            sink.bytes_in += nread
            if kind is None:
                if options.on_error is OnError.RAISE:  # as the local writer: the first bad file fails the pack
                    raise UserError(f"{item.shown}: {note} (on_error='raise', --on-error fail)")
                sink.skipped.append((item.shown, note or "not stored"))
                continue
            length, data_offset, parts, offset, size, checksum = rec[3:9]
            if seg not in segments:
                with open(_segment_paths(work_dir, seg)[0], "rb") as f:
                    segments[seg] = memoryview(f.read())
            view = segments[seg][offset : offset + size]
            record: recordio.FramedRecord | bytes
            if options.format is ShardFormat.RECORDIO:
                framed = recordio.FramedRecord.whole(view)
                framed.parts = parts  # the framing (parts included) is the segment's, byte for byte
                record = framed
            else:
                record = bytes(view)
            sink.kinds[kind] += 1
            if note:
                sink.kinds[note] += 1
            sink.add(item, Prepared(record, length, data_offset, checksum))
        done = sink.finish(plan.end)
    except BaseException:
        sink.abort()
        raise
    return done, time.perf_counter() - t0


# --- the driver ------------------------------------------------------------------------------------


def _items_per_task(n: int, cpus: int, converting: bool) -> int:
    """Items per conversion task: about four tasks per CPU, within 64..512 (or 4096 passing through).

    Small enough to keep every CPU busy to the end, large enough that the ~ms task overhead
    disappears (hundreds of images: seconds of work when converting).
    """
    target = max(1, math.ceil(n / (4 * max(1, cpus))))
    return int(min(512 if converting else 4096, max(64, target)))


def pack_with_ray(
    src: str,
    out: str,
    *,
    options: PackOptions | None = None,
    address: str | None = None,
    items_per_task: int | None = None,
    max_retries: int = 3,
    **kwargs: Any,
) -> RayPackResult:
    """Pack like :func:`fastload.pack.packer.pack_folder`, with the work run as Ray tasks.

    Args:
        src: Class-folder tree or ``.lst`` file (on a path every node sees).
        out: Output folder (on a path every node sees).
        options: :class:`PackOptions` (or its fields as keyword arguments). ``workers`` sets the
            CPUs of a local cluster started here.
        address: A running cluster's address (``ray://host:10001``, ``host:6379``, ``"auto"``);
            None starts a local one for this pack (or uses the one already initialized).
        items_per_task: Items per conversion task (default: about four tasks per CPU, 64-512
            items when converting, up to 4096 passing through).
        max_retries: Times Ray re-runs a task whose worker died.
        **kwargs: :class:`PackOptions` fields (when ``options`` is None).

    Returns:
        A :class:`RayPackResult`: the local pack's result plus ``ray`` (:class:`RayPackStats`).

    Raises:
        UserError: As the local pack; Ray missing.
    """
    ray = _ray()
    if options is None:
        try:
            options = PackOptions(**kwargs)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    elif kwargs:
        raise TypeError("pass either options= or keyword options, not both")
    t0 = time.perf_counter()
    transcode = resolve_transcoder(options)  # fails early, on the driver, when the engine is missing
    fmt = options.input_format or detect_format(src)
    if fmt in STREAMED:
        raise UserError(
            f"--engine ray packs folders and .lst / CSV / JSONL listings; {fmt.value} input is streamed "
            "by the local engine (the default, --engine local)"
        )
    source = open_source(src, options.root, fmt)
    name = dataset_name(source, options)
    order = np.arange(len(source.items))
    if options.shuffle:
        order = np.random.default_rng(options.seed).permutation(len(source.items))
    stats, refused = stat_sources(source)
    refuse_walk_skips(source, options)
    items = [source.items[i] for i in order.tolist()]
    sizes = [stats[i][0] for i in order.tolist()]
    fingerprint = pack_fingerprint(source, order, stats, options, name)
    out = os.path.abspath(out)
    if source.kind == "folder" and (out == source.path or out.startswith(source.path + os.sep)):
        raise UserError(f"{out}: the output folder must not be inside the source folder")
    ray_stats = RayPackStats()
    started_here = False
    with exclusive(out):
        work_dir, up_to_date = prepare_out(out, overwrite=options.overwrite, fingerprint=fingerprint)
        if up_to_date:
            manifest = read_manifest(out)
            counts = manifest.get("counts", {})
            result = PackResult(
                out=out,
                manifest=manifest,
                written=manifest["records"],
                skipped=[(s["path"], s["reason"]) for s in manifest.get("skipped", [])],
                converted=counts.get("converted", {}),
                bytes_in=0,
                bytes_out=sum(s["bytes"] for s in manifest["shards"]),
                seconds=time.perf_counter() - t0,
                up_to_date=True,
            )
            return _with_stats(result, ray_stats)
        if not ray.is_initialized():
            init: dict[str, Any] = dict(
                address=address, include_dashboard=False, log_to_driver=False, configure_logging=False
            )
            if address is None and options.workers:
                init["num_cpus"] = options.workers
            try:
                ray.init(**init)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UserError(f"cannot start or reach the Ray cluster ({address or 'local'}): {exc}") from None
            started_here = True
        try:
            done, resumed, processed, bytes_in = _run(
                ray,
                work_dir,
                source,
                options,
                name,
                items,
                sizes,
                refused,
                transcode,
                items_per_task,
                max_retries,
                ray_stats,
            )
        finally:
            if started_here:
                ray.shutdown()
        write_dataset_files(work_dir, source, options, name, fingerprint, done)
        try:
            manifest = finalize(out, work_dir)
        except OSError as exc:
            if exc.errno in USER_WRITE_ERRNOS:
                raise write_error(exc, out) from None
            raise
    counts = manifest["counts"]
    result = PackResult(
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
    return _with_stats(result, ray_stats)


def _run(
    ray: Any,
    work_dir: str,
    source: Source,
    options: PackOptions,
    name: str,
    items: list[SourceItem],
    sizes: list[int],
    refused: dict[str, str],
    transcode: RestartTranscoder | None,
    items_per_task: int | None,
    max_retries: int,
    ray_stats: RayPackStats,
) -> tuple[list[ShardDone], int, int, int]:
    """Phases 1-3; returns ``(shards done, shards reused, items converted, bytes read)``."""
    n = len(items)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    per_task = items_per_task or _items_per_task(n, cpus, options.resize is not None or transcode is not None)
    os.makedirs(os.path.join(work_dir, _SEGMENTS), exist_ok=True)
    bounds = [*range(0, n, per_task), n]
    convert = ray.remote(num_cpus=1, max_retries=max_retries)(_convert_segment)
    write = ray.remote(num_cpus=1, max_retries=max_retries)(_write_shard)
    metas: dict[int, dict[str, Any]] = {}
    pending: dict[Any, int] = {}
    shard_refs: dict[Any, int] = {}
    t_phase = time.perf_counter()
    progress = _progress(options, n)
    label_width = source.label_width
    try:
        for number, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            meta = _load_segment(work_dir, number, lo, hi)
            if meta is not None:
                metas[number] = meta
                ray_stats.segments_reused += 1
                progress.update(hi - lo)
                continue
            seg_items = items[lo:hi]
            seg_refused = {it.path: refused[it.path] for it in seg_items if it.path in refused}
            ref = convert.remote(
                work_dir, number, lo, list(zip(seg_items, sizes[lo:hi], strict=True)), options, label_width, seg_refused
            )
            pending[ref] = number
        ray_stats.convert_tasks = len(pending)
        processed = sum(bounds[k + 1] - bounds[k] for k in pending.values())
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                number = pending.pop(ref)
                meta = _get(ray, ref)
                metas[number] = meta
                ray_stats.task_seconds += meta["seconds"]
                progress.update(meta["range"][1] - meta["range"][0])
        records: list[list] = []
        seg_of: list[int] = []
        for number in range(len(bounds) - 1):
            records.extend(metas[number]["records"])
            seg_of.extend([number] * len(metas[number]["records"]))
        edges = fixed_edges(n, options.shards)
        plans = _plan_shards(records, seg_of, edges, options.shard_size)
        ext = ".rec" if options.format is ShardFormat.RECORDIO else ".lmdb"
        done: dict[int, ShardDone] = {}
        for plan in plans:
            file = f"{name}-{plan.number:05d}{ext}"
            reused = load_done(work_dir, plan.number, file, plan.start, edges)
            if reused is not None and reused.end == plan.end:
                done[plan.number] = reused
                continue
            positions = [p for p, _ in plan.records]
            ref = write.remote(
                work_dir,
                plan,
                file,
                [items[p] for p in positions],
                [records[p] for p in positions],
                options,
                label_width,
            )
            shard_refs[ref] = plan.number
        ray_stats.write_tasks = len(shard_refs)
        resumed = len(done)
        while shard_refs:
            ready, _ = ray.wait(list(shard_refs), num_returns=1)
            for ref in ready:
                number = shard_refs.pop(ref)
                shard_done, seconds = _get(ray, ref)
                done[number] = shard_done
                ray_stats.task_seconds += seconds
    finally:
        progress.close()
        for ref in list(pending) + list(shard_refs):  # only left when something failed
            ray.cancel(ref, force=True)
    ray_stats.wall_seconds = time.perf_counter() - t_phase
    ordered = [done[k] for k in sorted(done)]
    bytes_in = sum(d.bytes_in for d in ordered)
    return ordered, resumed, processed, bytes_in


def _get(ray: Any, ref: Any) -> Any:
    """A task's result; a task's own error (bad input with ``on_error="fail"``, full disk) re-raised as itself."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        if isinstance(cause, (UserError, OSError)):
            raise cause from None
        raise


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(options: PackOptions, total: int) -> Any:
    if not (options.progress and sys.stderr.isatty()):
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, unit="img", desc="pack (ray)", dynamic_ncols=True, file=sys.stderr)


def format_ray_stats(stats: RayPackStats) -> str:
    """One line for the end of ``fastload pack --engine ray``."""
    tasks = stats.convert_tasks + stats.write_tasks
    return (
        f"  ray: {stats.convert_tasks} conversion task(s), {stats.write_tasks} shard task(s), "
        f"{stats.segments_reused} segment(s) reused; {stats.task_seconds:.2f} s in tasks, "
        f"{stats.wall_seconds:.2f} s wall" + (f" ({tasks} tasks)" if tasks else "")
    )
