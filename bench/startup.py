"""Benchmarks, loader limits: time to the first batch of a million-record dataset, and memory over epochs.

Two targets on the loader are not throughput ratios:

- the first batch of a 1,000,000-record dataset arrives within 1 s of constructing the loader
  (opening loads the index; nothing scans the shards);
- peak RSS over 5 epochs stays within ``(prefetch + 2)`` batches + 300 MB, and does not grow
  (judged on anonymous RSS at the ends of epochs 2 and 5, within 16 MB or 2 %; full RSS per epoch
  is reported beside it).

Both are measured in a fresh interpreter per repeat (``python -m bench.startup ...``), so
imports, allocator state and mappings of earlier contenders never count; the child prints one JSON
line. The million-record dataset is a real fastload RecordIO folder written with fastload's own
``RecordIOWriter`` and index/manifest code; its images are the benchmark's JPEGs re-encoded at 32x32
(q90, about 1 KB each), reused cyclically (record ``i`` carries thumbnail ``i mod N``), so the folder
is about 1.1 GB instead of the ~90 GB of full-size images. It is built once per output folder and
cached (``OUT/cache/``), keyed by the thumbnails' digest.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import time

from .harness import Contender, Sample, Skip

__all__ = [
    "MB",
    "THUMB_QUALITY",
    "THUMB_SIDE",
    "build_records_dataset",
    "first_batch_contender",
    "main",
    "memory_contender",
    "rss_bound_mb",
]

THUMB_SIDE = 32
THUMB_QUALITY = 90
MB = 1e6
_BUILDER_VERSION = 2  # bump when the layout of the built dataset changes (invalidates caches)
_GROWTH_SLACK_MB = 16.0
_GROWTH_SLACK_FRACTION = 0.02


# --- the million-record dataset ------------------------------------------------------------


def _thumbnails(source: str, side: int, quality: int) -> tuple[list[bytes], list[float], list | None]:
    """Every image of ``source`` as a ``side``x``side`` JPEG (Resize + CenterCrop by the engine), and its label."""
    import numpy as np
    from PIL import Image

    from fastload.decode import decode_batch
    from fastload.records.dataset import open_dataset
    from fastload.transforms import eval_transform

    with open_dataset(source) as ds:
        n = len(ds)
        if n == 0:
            raise Skip(f"{source} has no records to build the large dataset from")
        pixels = np.empty((n, side, side, 3), dtype=np.uint8)
        step = 256
        for s in range(0, n, step):
            e = min(n, s + step)
            res = decode_batch(
                [ds.image(i) for i in range(s, e)],
                pixels[s:e],
                eval_transform(side, resize=side),
                seed=0,
                epoch=0,
                indices=np.arange(s, e, dtype=np.int64),
            )
            if res.errors:
                pos, why = next(iter(res.errors.items()))
                raise Skip(f"cannot decode {ds.locate(s + pos)} to build the large dataset: {why}")
        labels = [float(x) for x in np.asarray(ds.labels, dtype=np.float32).reshape(n, -1)[:, 0]]
        classes = (ds.manifest or {}).get("classes") if getattr(ds, "manifest", None) else None
    thumbs = []
    for a in pixels:
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, "JPEG", quality=quality)
        thumbs.append(buf.getvalue())
    return thumbs, labels, classes


def build_records_dataset(
    source: str, cache_dir: str, *, records: int, side: int = THUMB_SIDE, quality: int = THUMB_QUALITY
) -> tuple[str, dict[str, object]]:
    """A fastload RecordIO folder of ``records`` records cycling over ``source``'s images as thumbnails.

    Args:
        source: Any dataset :func:`fastload.open_dataset` opens (the benchmark's packed folder).
        cache_dir: Where built datasets are kept; one is reused when its key matches.
        records: Records to write.
        side: Thumbnail side in pixels.
        quality: JPEG quality of the thumbnails.

    Returns:
        ``(path, info)``; ``info`` says how it was made, its size, and whether it came from the cache.
    """
    import numpy as np

    from fastload.checksum import checksum_bytes, checksum_file
    from fastload.records import recordio
    from fastload.records.durable import write_json_atomic
    from fastload.records.manifest import FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME, empty_index, write_index
    from fastload.version import __version__

    if records < 1:
        raise ValueError(f"records={records} must be >= 1")
    t0 = time.perf_counter()
    thumbs, labels, classes = _thumbnails(source, side, quality)
    digest = hashlib.sha256()
    for b, label in zip(thumbs, labels, strict=False):
        digest.update(len(b).to_bytes(4, "little") + b + repr(label).encode())
    key = f"v{_BUILDER_VERSION}-{records}-{side}px-q{quality}-{digest.hexdigest()[:12]}"
    path = os.path.join(cache_dir, f"records-{key}")
    info: dict[str, object] = {
        "records": records,
        "distinct_images": len(thumbs),
        "side": side,
        "quality": quality,
        "mean_image_bytes": round(sum(len(b) for b in thumbs) / len(thumbs), 1),
    }
    if os.path.exists(os.path.join(path, MANIFEST_NAME)):
        info.update(
            cached=True, bytes=sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)), build_seconds=0.0
        )
        return path, info
    os.makedirs(cache_dir, exist_ok=True)
    # One cached dataset per size: a new source replaces the old one instead of piling up gigabytes.
    for name in os.listdir(cache_dir):
        if name.startswith(f"records-v{_BUILDER_VERSION}-{records}-") or name.endswith(".partial"):
            shutil.rmtree(os.path.join(cache_dir, name), ignore_errors=True)
    building = path + ".partial"
    os.makedirs(building)
    rec_name = "train-00000.rec"
    n = len(thumbs)
    parts = np.zeros(records, dtype=np.uint32)
    with open(os.path.join(building, rec_name), "wb", buffering=8 << 20) as fh:
        writer = recordio.RecordIOWriter(fh)
        for i in range(records):
            j = i % n
            _, k = writer.write(recordio.pack_header(labels[j], i) + thumbs[j], i)
            if k:
                parts[i] = k
    idx_name = "train-00000.idx"
    idx_data = writer.idx_bytes()
    with open(os.path.join(building, idx_name), "wb") as fh:
        fh.write(idx_data)
    lengths = np.asarray([recordio.IR_HEADER_SIZE + len(b) for b in thumbs], dtype=np.uint32)
    cycle = np.arange(records) % n
    index = empty_index(records, 1)
    index["offset"] = np.asarray(writer.offsets, dtype=np.uint64)
    index["id"] = np.arange(records, dtype=np.uint64)
    index["length"] = lengths[cycle]
    index["data_offset"] = recordio.IR_HEADER_SIZE
    index["parts"] = parts
    index["labels"][:, 0] = np.asarray(labels, dtype=np.float32)[cycle]
    write_index(os.path.join(building, INDEX_NAME), index)
    rec_path = os.path.join(building, rec_name)
    manifest = {
        "format_version": FORMAT_VERSION,
        "fastload_version": __version__,
        "format": "recordio",
        "name": os.path.basename(path),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "records": records,
        "label_width": 1,
        "classes": classes,
        "source": {
            "kind": "fastload-bench",
            "path": os.path.abspath(source),
            "root": None,
            "description": f"{n} images of the source as {side}x{side} JPEG q{quality}, "
            f"record i carries image i mod {n}",
        },
        "options": {
            "format": "recordio",
            "shards": 1,
            "shard_size": None,
            "resize": None,
            "quality": quality,
            "shuffle": False,
            "seed": 0,
            "on_error": "raise",
            "restart_index": False,
        },
        "shards": [
            {
                "file": rec_name,
                "records": records,
                "bytes": writer.offset,
                "checksum": checksum_file(rec_path),
                "index_file": idx_name,
                "index_bytes": len(idx_data),
                "index_checksum": checksum_bytes(idx_data),
            }
        ],
        "index": {"file": INDEX_NAME, "checksum": checksum_file(os.path.join(building, INDEX_NAME))},
        "counts": {
            "found": records,
            "written": records,
            "skipped": 0,
            "converted": {},
            "passed_through": records,
            "ignored_non_image_files": 0,
            "not_restart_indexed": 0,
        },
        "skipped": [],
        "ignored": [],
        "restart_index": None,
        "plan": key,
    }
    write_json_atomic(os.path.join(building, MANIFEST_NAME), manifest)  # last: its presence marks completion
    os.replace(building, path)
    info.update(
        cached=False,
        bytes=sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)),
        build_seconds=round(time.perf_counter() - t0, 2),
    )
    return path, info


# --- /proc readings (the child side) --------------------------------------------------------


def _status_kb() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0])
    return out


def _mb(kb: int) -> float:
    return round(kb * 1024 / MB, 1)


def _read_bytes() -> int | None:
    """Bytes this process made the kernel fetch from storage (page-cache hits do not count)."""
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _mapped_resident_kb(suffix: str) -> int:
    """Resident kB of this process's mappings of files whose path ends with ``suffix`` (the shards)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = len(head) >= 6 and head[-1].endswith(suffix)
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


# --- the children ---------------------------------------------------------------------------


def _child_first_batch(args: argparse.Namespace) -> dict:
    t = time.perf_counter()
    import fastload
    import fastload.torch as ft
    from fastload.records.dataset import open_dataset
    from fastload.records.manifest import load_index, read_manifest

    imports = time.perf_counter() - t
    # Set the shards' page-cache state explicitly: repeats of the warm and the evicted variants
    # alternate, so neither may inherit the other's. Evicted: the index stays cached, the shard's
    # pages leave the page cache and the first batch reads its records from storage, as on a
    # machine where the data set was never read. Warm: the shard is read through once (read(),
    # not the mapping, so none of it enters this process's RSS).
    for name in os.listdir(args.path):
        if name.endswith(".rec"):
            fd = os.open(os.path.join(args.path, name), os.O_RDONLY)
            try:
                if args.evict:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                else:
                    chunk = bytearray(8 << 20)
                    with open(fd, "rb", buffering=0, closefd=False) as fh:
                        while fh.readinto(chunk):
                            pass
            finally:
                os.close(fd)
    io0 = _read_bytes()
    t0 = time.perf_counter()
    loader = ft.DataLoader(
        args.path,
        batch_size=args.batch_size,
        shuffle=True,
        transform=fastload.train(args.size),
        num_threads=args.threads,
    )
    t_built = time.perf_counter()
    io1 = _read_bytes()
    rec_kb_built = _mapped_resident_kb(".rec")
    it = iter(loader)
    images, _ = next(it)
    t1 = time.perf_counter()
    io2 = _read_bytes()
    rec_kb_first = _mapped_resident_kb(".rec")
    shape = list(images.shape)
    it.close()
    loader.close()
    # The index load alone, then the whole open (manifest + index + mapping the shards), both warm.
    manifest = read_manifest(args.path)
    t = time.perf_counter()
    load_index(
        os.path.join(args.path, manifest.get("index", {}).get("file", "fastload-index.npy")),
        int(manifest["label_width"]),
        int(manifest["records"]),
    )
    index_load = time.perf_counter() - t
    t = time.perf_counter()
    with open_dataset(args.path) as ds:
        records = len(ds)
    open_seconds = time.perf_counter() - t
    rec_bytes = sum(os.path.getsize(os.path.join(args.path, f)) for f in os.listdir(args.path) if f.endswith(".rec"))
    return {
        "seconds": t1 - t0,
        "construct_seconds": t_built - t0,
        "import_seconds": imports,
        "index_load_seconds": index_load,
        "open_dataset_seconds": open_seconds,
        "records": records,
        "batch_shape": shape,
        "rec_bytes": rec_bytes,
        "rec_resident_kb_after_construct": rec_kb_built,
        "rec_resident_kb_after_first_batch": rec_kb_first,
        "read_bytes_construct": None if io0 is None else io1 - io0,
        "read_bytes_first_batch": None if io0 is None else io2 - io1,
    }


def rss_bound_mb(*, prefetch: int, batch_size: int, size: int = 224) -> float:
    """The loader's memory bound: ``(prefetch + 2)`` uint8 batches of ``size``x``size`` RGB + 300 MB."""
    return (prefetch + 2) * batch_size * 3 * size * size / MB + 300.0


def _child_memory(args: argparse.Namespace) -> dict:
    import fastload

    if args.api == "torch":
        import fastload.torch as ft
    from fastload.loader import Loader, LoaderConfig

    after_imports = _status_kb()
    if args.api == "torch":
        loader = ft.DataLoader(
            args.path,
            batch_size=args.batch_size,
            shuffle=True,
            transform=fastload.train(args.size),
            num_threads=args.threads,
            prefetch=args.prefetch,
        )
    else:
        loader = Loader(
            args.path,
            LoaderConfig(
                batch_size=args.batch_size,
                transform=fastload.train(args.size),
                shuffle="global",
                num_threads=args.threads,
                prefetch=args.prefetch,
                layout="NCHW",
            ),
        )
    after_construct = _status_kb()
    ends: list[dict[str, int]] = []
    epoch_peaks: list[int] = []
    anon_peak = file_peak = 0
    images = 0
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        peak = 0
        for batch in loader:
            images += int((batch[0] if args.api == "torch" else batch.images).shape[0])
            s = _status_kb()
            anon_peak, file_peak = max(anon_peak, s["RssAnon"]), max(file_peak, s["RssFile"])
            peak = max(peak, s["VmRSS"])
        ends.append(_status_kb())
        epoch_peaks.append(max(peak, ends[-1]["VmRSS"]))
    seconds = time.perf_counter() - t0
    final = _status_kb()
    loader.close()
    rss_ends = [_mb(e["VmRSS"]) for e in ends]
    anon_ends = [_mb(e["RssAnon"]) for e in ends]
    a, b = (1, len(ends) - 1) if len(ends) >= 3 else (0, len(ends) - 1)
    # Growth is judged on anonymous memory (heap, ring, allocator), where a leak would show. Full
    # RSS also holds the shard pages of the batches in flight, which done_with() drops batch by
    # batch: a snapshot of it swings by tens of MB with where the producer happens to be.
    slack = max(_GROWTH_SLACK_MB, _GROWTH_SLACK_FRACTION * anon_ends[a])
    return {
        "seconds": seconds,
        "images": images,
        "epochs": args.epochs,
        "rss_peak_mb": _mb(final["VmHWM"]),
        "rss_anon_peak_mb": _mb(anon_peak),
        "rss_file_peak_mb": _mb(file_peak),
        "rss_after_imports_mb": _mb(after_imports["VmRSS"]),
        "rss_anon_after_imports_mb": _mb(after_imports["RssAnon"]),
        "rss_after_construct_mb": _mb(after_construct["VmRSS"]),
        "rss_epoch_end_mb": rss_ends,
        "rss_anon_epoch_end_mb": anon_ends,
        "rss_epoch_peak_mb": [_mb(k) for k in epoch_peaks],
        "rss_growth_mb": round(rss_ends[b] - rss_ends[a], 1),
        "rss_anon_growth_mb": round(anon_ends[b] - anon_ends[a], 1),
        "growth_epochs": [a + 1, b + 1],
        "growth_slack_mb": round(slack, 1),
        "rss_bound_mb": round(rss_bound_mb(prefetch=args.prefetch, batch_size=args.batch_size, size=args.size), 1),
    }


def _child_argv(kind: str, **kwargs) -> list[str]:
    argv = [sys.executable, "-m", "bench.startup", kind]
    for key, value in kwargs.items():
        if isinstance(value, bool):
            argv += [f"--{key.replace('_', '-')}"] if value else []
        else:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def _run_child(argv: list[str], label: str, timeout: float = 900.0) -> dict:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{label}: the measuring process did not finish within {timeout:.0f} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-6:])
        raise RuntimeError(f"{label}: the measuring process exited {proc.returncode}: {tail}")
    return json.loads(lines[-1])


def _check_platform(*, torch: bool) -> None:
    if not os.path.exists("/proc/self/status") or not os.path.exists("/proc/self/smaps"):
        raise Skip("needs Linux /proc (VmHWM, RssAnon, smaps)")
    # Looked up, not imported: torch stays out of the harness process (the child imports it).
    if torch and importlib.util.find_spec("torch") is None:
        raise Skip("torch is not installed")


# --- contenders ----------------------------------------------------------------------------


class FirstBatchContender(Contender):
    """Seconds from ``fastload.torch.DataLoader(...)`` to its first batch, in a fresh interpreter per repeat.

    ``images`` of a sample is the batch size and ``seconds`` the time to the first batch, so the
    rate column reads "images of the first batch per second"; the seconds are in the samples.
    """

    def __init__(
        self,
        name: str,
        *,
        source: str,
        cache_dir: str,
        records: int,
        threads: int,
        batch_size: int,
        size: int = 224,
        evict: bool = False,
        reference: bool = False,
    ) -> None:
        notes = (
            f"fastload RecordIO folder of {records:,} records: the benchmark images as {THUMB_SIDE}x{THUMB_SIDE} "
            f"JPEG q{THUMB_QUALITY} reused cyclically; fastload.torch.DataLoader(batch {batch_size}, global "
            f"shuffle, train({size}), {threads} threads) in a fresh process; index in the page cache"
            + ("; the .rec evicted from the page cache first" if evict else "; shard pages warm")
        )
        super().__init__(
            name,
            group="startup",
            family="fastload.torch first batch",
            threads=threads,
            reference=reference,
            notes=notes,
        )
        self.source, self.cache_dir, self.records = source, cache_dir, records
        self.batch_size, self.size, self.evict = batch_size, size, evict
        self.path: str | None = None
        self.info: dict[str, object] = {}

    def start(self) -> None:
        _check_platform(torch=True)
        self.path, self.info = build_records_dataset(self.source, self.cache_dir, records=self.records)

    def run(self) -> Sample:
        r = _run_child(
            _child_argv(
                "first-batch",
                path=self.path,
                batch_size=self.batch_size,
                threads=self.threads,
                size=self.size,
                evict=self.evict,
            ),
            self.name,
        )
        extra = {
            "first_batch_ms_mean": 1000 * r["seconds"],
            "construct_ms_mean": 1000 * r["construct_seconds"],
            "index_load_ms_mean": 1000 * r["index_load_seconds"],
            "open_dataset_ms_mean": 1000 * r["open_dataset_seconds"],
            "import_ms_mean": 1000 * r["import_seconds"],
            "records_max": r["records"],
            "rec_mb_max": r["rec_bytes"] / MB,
            "rec_resident_kb_after_construct_max": r["rec_resident_kb_after_construct"],
            "rec_resident_kb_after_first_batch_max": r["rec_resident_kb_after_first_batch"],
        }
        for key in ("read_bytes_construct", "read_bytes_first_batch"):
            if r.get(key) is not None:
                extra[key + "_max"] = r[key]
        return Sample(images=int(r["batch_shape"][0]), bytes=0, seconds=float(r["seconds"]), extra=extra)


class MemoryContender(Contender):
    """Five epochs of the loader in a fresh interpreter: peak RSS (VmHWM), anonymous RSS, RSS per epoch."""

    def __init__(
        self,
        name: str,
        *,
        path: str,
        api: str,
        threads: int,
        batch_size: int,
        prefetch: int = 2,
        epochs: int = 5,
        size: int = 224,
        reference: bool = False,
    ) -> None:
        if api not in ("torch", "loader"):
            raise ValueError(f"api={api!r} must be 'torch' or 'loader'")
        what = "fastload.torch.DataLoader (torch imported)" if api == "torch" else "fastload.Loader (no torch)"
        notes = (
            f"{what}, batch {batch_size}, uint8 {size}x{size} NCHW, prefetch {prefetch}, {epochs} epochs, "
            f"global shuffle, fresh process; peak = VmHWM of the whole process"
        )
        super().__init__(
            name,
            group="memory",
            family=f"{what.split(' ')[0]} memory",
            threads=threads,
            reference=reference,
            notes=notes,
        )
        self.path, self.api, self.batch_size = path, api, batch_size
        self.prefetch, self.epochs, self.size = prefetch, epochs, size

    def start(self) -> None:
        _check_platform(torch=self.api == "torch")

    def run(self) -> Sample:
        r = _run_child(
            _child_argv(
                "memory",
                path=self.path,
                api=self.api,
                batch_size=self.batch_size,
                threads=self.threads,
                prefetch=self.prefetch,
                epochs=self.epochs,
                size=self.size,
            ),
            self.name,
        )
        extra: dict[str, object] = {
            f"{k}_max": v for k, v in r.items() if k.startswith("rss_") and isinstance(v, (int, float))
        }
        extra["growth_slack_mb_max"] = r["growth_slack_mb"]
        extra["rss_epoch_end_mb"] = r["rss_epoch_end_mb"]
        extra["rss_anon_epoch_end_mb"] = r["rss_anon_epoch_end_mb"]
        extra["rss_epoch_peak_mb"] = r["rss_epoch_peak_mb"]
        extra["growth_epochs"] = r["growth_epochs"]
        return Sample(images=int(r["images"]), bytes=0, seconds=float(r["seconds"]), extra=extra)


def first_batch_contender(
    name: str,
    *,
    source: str,
    cache_dir: str,
    records: int,
    threads: int,
    batch_size: int,
    evict: bool = False,
    reference: bool = False,
) -> Contender:
    """Time to the first batch on a ``records``-record dataset built from ``source`` (cached in ``cache_dir``)."""
    return FirstBatchContender(
        name,
        source=source,
        cache_dir=cache_dir,
        records=records,
        threads=threads,
        batch_size=batch_size,
        evict=evict,
        reference=reference,
    )


def memory_contender(
    name: str, *, path: str, api: str, threads: int, batch_size: int, prefetch: int = 2, reference: bool = False
) -> Contender:
    """Peak and per-epoch RSS over 5 epochs of ``api`` (``"torch"`` or ``"loader"``) on ``path``."""
    return MemoryContender(
        name, path=path, api=api, threads=threads, batch_size=batch_size, prefetch=prefetch, reference=reference
    )


# --- the child's command line ---------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.startup first-batch|memory ...``: one measurement, one JSON line on stdout."""
    p = argparse.ArgumentParser(prog="bench.startup")
    sub = p.add_subparsers(dest="kind", required=True)
    fb = sub.add_parser("first-batch")
    fb.add_argument("--evict", action="store_true")
    mem = sub.add_parser("memory")
    mem.add_argument("--api", choices=("torch", "loader"), default="torch")
    mem.add_argument("--prefetch", type=int, default=2)
    mem.add_argument("--epochs", type=int, default=5)
    for q in (fb, mem):
        q.add_argument("--path", required=True)
        q.add_argument("--batch-size", type=int, default=256)
        q.add_argument("--threads", type=int, default=None)
        q.add_argument("--size", type=int, default=224)
    args = p.parse_args(argv)
    if args.kind == "memory" and args.epochs < 1:
        p.error(f"--epochs {args.epochs} must be >= 1")
    result = _child_first_batch(args) if args.kind == "first-batch" else _child_memory(args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
