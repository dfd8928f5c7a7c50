"""Benchmarks of scaling out, each side by side in one process with paired (alternating) runs:

- ``loader``: the loader over a dataset in a real S3 server on loopback (SeaweedFS), first epoch
  through a fresh per-node cache and a later epoch from the warm cache, against the same loader on
  the same shards from the local page cache. Targets: first epoch >= 0.80x local, later epochs
  within 5% (>= 0.95x).
- ``ray``: ``fastload pack --resize 256`` on a local Ray cluster with 2 CPUs against the local pack
  with 2 workers (target >= 0.80x images/s), with the cluster's start-up time and the per-task
  overhead (no-op tasks) reported so the reader can extrapolate to N nodes.
- ``copy``: ``fastload copy`` of a ~1 GB dataset into /dev/shm against ``cp -r`` of the same
  folder (target >= 0.70x; the copy also checksums every byte).

Each pair runs A then B, the next B then A; the ratio reported is the median of the per-pair
ratios (throughput B / throughput A), with quartiles. Run:
``python bench/remote_bench.py [--suite loader,ray,copy] [--pairs 5] [--json OUT] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

__all__ = ["bench_copy", "bench_loader", "bench_ray", "main"]


def _quartiles(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]]
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def _pairs(a: Callable[[], float], b: Callable[[], float], pairs: int) -> dict[str, object]:
    """Run ``a`` and ``b`` alternately; each returns a throughput. Median of per-pair ratios b/a."""
    ta, tb, ratios = [], [], []
    for p in range(pairs):
        if p % 2 == 0:
            x = a()
            y = b()
        else:
            y = b()
            x = a()
        ta.append(x)
        tb.append(y)
        ratios.append(y / x)
    return {
        "a_median": statistics.median(ta),
        "b_median": statistics.median(tb),
        "ratio": statistics.median(ratios),
        "quartiles": _quartiles(ratios),
        "pairs": pairs,
        "a_runs": ta,
        "b_runs": tb,
    }


def _say(line: str) -> None:
    print(line, flush=True)


def _cpu_self() -> float:
    """CPU seconds (user + system) this process has used, all threads."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from ``/proc`` (0.0 where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command's ")": state is field 3, utime and stime are fields 14 and 15 (proc(5)).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_loader(work: str, *, images: int, pairs: int, threads: int = 2) -> dict[str, object]:
    """Loader images/s: S3 first epoch and warm epoch vs the local page cache."""
    from fastload.loader import Loader, LoaderConfig
    from fastload.pack.packer import pack_folder
    from fastload.records.dataset import open_dataset
    from fastload.records.remote.dataset import open_remote_dataset
    from fastload.records.remote.storage import RemoteStore
    from fastload.transforms import train
    from tools.make_dataset import make_dataset
    from tools.s3_server import LocalS3Server

    src = os.path.join(work, "images")
    make_dataset(src, count=images, seed=0, workers=2)
    packed = os.path.join(work, "packed")
    pack_folder(src, packed, shards=max(4, images // 250), progress=False)
    shm = tempfile.mkdtemp(prefix="fastload-bench-cache-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    config = LoaderConfig(
        batch_size=64, transform=train(224), shuffle="shard", seed=0, num_threads=threads, prefetch=2, window=2
    )
    results: dict[str, object] = {"images": images, "threads": threads}
    try:
        with LocalS3Server(os.path.join(work, "s3"), bucket="bench") as server:
            url = "s3://bench/packed"
            options = server.storage_options()
            store = RemoteStore(url, options)
            names = sorted(os.listdir(packed))
            for name in sorted(names, key=lambda n: n == "fastload.json"):
                if os.path.isfile(os.path.join(packed, name)):
                    store.put_file(name, os.path.join(packed, name))

            def epoch(ds) -> float:
                t0 = time.perf_counter()
                n = 0
                with Loader(ds, config) as loader:
                    for batch in loader:
                        n += len(batch.indices)
                return n / (time.perf_counter() - t0)

            # CPU seconds of each timed run: where the first epoch's time goes on a small machine.
            cpu: dict[str, list[float]] = {"local": [], "s3_loader": [], "s3_server": []}
            timed = [False]

            def local() -> float:
                with open_dataset(packed) as ds:  # the shards are in the page cache: read before each run
                    for s in ds.shards:
                        with open(s.path, "rb") as f:
                            while f.read(16 << 20):
                                pass
                    c0 = _cpu_self()
                    rate = epoch(ds)
                    if timed[0]:
                        cpu["local"].append(_cpu_self() - c0)
                    return rate

            counter = [0]

            def remote_first() -> float:
                counter[0] += 1
                cache = os.path.join(shm, f"c{counter[0]}")
                c0, s0 = _cpu_self(), _cpu_of(server.proc.pid)
                t0 = time.perf_counter()
                with open_remote_dataset(url, storage_options=options, cache_dir=cache) as ds:
                    n = 0
                    with Loader(ds, config) as loader:
                        for batch in loader:
                            n += len(batch.indices)
                    stats = ds.remote_stats()
                rate = n / (time.perf_counter() - t0)
                if timed[0]:
                    cpu["s3_loader"].append(_cpu_self() - c0)
                    cpu["s3_server"].append(_cpu_of(server.proc.pid) - s0)
                results.setdefault("first_epoch_waits", []).append([stats["waits"], round(stats["waited_seconds"], 3)])
                shutil.rmtree(cache, ignore_errors=True)
                return rate

            warm_cache = os.path.join(shm, "warm")
            with open_remote_dataset(url, storage_options=options, cache_dir=warm_cache) as ds:
                epoch(ds)  # fills the cache

            def remote_warm() -> float:
                with open_remote_dataset(url, storage_options=options, cache_dir=warm_cache) as ds:
                    return epoch(ds)

            local()
            remote_first()
            timed[0] = True
            results["first_epoch_vs_local"] = _pairs(local, remote_first, pairs)
            timed[0] = False
            med = {k: statistics.median(v) for k, v in cpu.items()}
            results["first_epoch_cpu_seconds"] = {
                **med,
                # The first epoch's time if it were bound by CPU alone, relative to local: what two
                # cores can give when the S3 server and the download share them with the decode.
                "cpu_bound_ratio": med["local"] / (med["s3_loader"] + med["s3_server"]),
            }
            results["later_epoch_vs_local"] = _pairs(local, remote_warm, pairs)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    for key, label in (
        ("first_epoch_vs_local", "first epoch from S3"),
        ("later_epoch_vs_local", "later epoch (cache)"),
    ):
        r = results[key]
        _say(
            f"loader  {label:24s} {r['b_median']:8.0f} img/s  local {r['a_median']:8.0f} img/s  "
            f"paired ratio {r['ratio']:.2f}x ({r['quartiles'][0]:.2f}-{r['quartiles'][1]:.2f})"
        )
    c = results["first_epoch_cpu_seconds"]
    _say(
        f"loader  first epoch CPU: local {c['local']:.2f} core-s; from S3 loader {c['s3_loader']:.2f} + "
        f"S3 server {c['s3_server']:.2f} core-s on the same {os.cpu_count()} cores: CPU-bound ratio "
        f"{c['cpu_bound_ratio']:.2f}x"
    )
    waits = results["first_epoch_waits"]
    _say(
        f"loader  first epochs: reads that waited for a shard {[w for w, _ in waits]}, "
        f"seconds waited {[s for _, s in waits]} (the window's first shards at start)"
    )
    return results


def bench_ray(work: str, *, images: int, pairs: int) -> dict[str, object]:
    """Pack --resize 256: Ray with 2 CPUs vs the local pack with 2 workers; cluster start-up; task overhead."""
    import ray

    from fastload.pack.packer import pack_folder
    from fastload.pack.ray_engine import pack_with_ray
    from tools.make_dataset import make_dataset

    src = os.path.join(work, "images")
    if not os.path.isdir(src):
        make_dataset(src, count=images, seed=0, workers=2)
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    startup = time.perf_counter() - t0
    results: dict[str, object] = {"images": images, "cluster_startup_seconds": startup}
    try:

        @ray.remote(num_cpus=1)
        def noop() -> None:
            return None

        ray.get([noop.remote() for _ in range(20)])  # workers started
        n_tasks = 400
        t0 = time.perf_counter()
        ray.get([noop.remote() for _ in range(n_tasks)])
        wall = time.perf_counter() - t0
        # CPU-seconds of overhead per task: each of the 2 CPUs spent wall * 2 / n on each task.
        results["per_task_overhead_ms"] = wall * 2 / n_tasks * 1000
        runs = {"local": 0, "ray": 0}

        def local() -> float:
            runs["local"] += 1
            r = pack_folder(
                src, os.path.join(work, "pack-local"), resize=256, workers=2, progress=False, overwrite=True
            )
            return r.processed / r.seconds

        def on_ray() -> float:
            runs["ray"] += 1
            r = pack_with_ray(src, os.path.join(work, "pack-ray"), resize=256, progress=False, overwrite=True)
            results.setdefault("ray_tasks", []).append([r.ray.convert_tasks, r.ray.write_tasks])
            return r.processed / r.seconds

        local()
        on_ray()
        results["ray_vs_local"] = _pairs(local, on_ray, pairs)
    finally:
        ray.shutdown()
    r = results["ray_vs_local"]
    _say(
        f"ray     pack --resize 256, 2 CPUs  {r['b_median']:8.0f} img/s  local {r['a_median']:8.0f} img/s  "
        f"paired ratio {r['ratio']:.2f}x ({r['quartiles'][0]:.2f}-{r['quartiles'][1]:.2f}); cluster start "
        f"{startup:.1f} s, {results['per_task_overhead_ms']:.2f} ms CPU per task"
    )
    return results


def bench_copy(work: str, *, megabytes: int, pairs: int) -> dict[str, object]:
    """``fastload copy`` into /dev/shm vs ``cp -r`` of the same folder (MB/s)."""
    from fastload.checksum import checksum_bytes
    from fastload.records.remote.node_copy import CopyOptions, copy_dataset

    src = os.path.join(work, "copy-src")
    os.makedirs(src, exist_ok=True)
    shards = 16
    size = max(1, megabytes // shards) << 20
    rng = np.random.default_rng(0)
    entries = []
    for k in range(shards):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        name = f"data-{k:05d}.rec"
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
        entries.append({"file": name, "records": 1, "bytes": size, "checksum": checksum_bytes(data)})
    index = np.zeros(
        shards,
        dtype=[
            ("offset", "<u8"),
            ("id", "<u8"),
            ("shard", "<u4"),
            ("length", "<u4"),
            ("data_offset", "<u4"),
            ("parts", "<u4"),
            ("labels", "<f4", (1,)),
        ],
    )
    index["shard"] = np.arange(shards)
    np.save(os.path.join(src, "fastload-index.npy"), index)
    with open(os.path.join(src, "fastload-index.npy"), "rb") as f:
        idx_sum = checksum_bytes(f.read())
    with open(os.path.join(src, "fastload.json"), "w") as f:
        json.dump(
            {
                "format_version": 2,
                "format": "recordio",
                "name": "data",
                "records": shards,
                "label_width": 1,
                "shards": entries,
                "index": {"file": "fastload-index.npy", "checksum": idx_sum},
            },
            f,
        )
    total = shards * size
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else work

    def warm() -> None:
        for name in os.listdir(src):
            with open(os.path.join(src, name), "rb") as f:
                while f.read(16 << 20):
                    pass

    def cp() -> float:
        warm()
        dest = tempfile.mkdtemp(prefix="fastload-bench-cp-", dir=shm)
        os.rmdir(dest)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", src, dest], check=True)
        rate = total / (time.perf_counter() - t0) / 1e6
        shutil.rmtree(dest)
        return rate

    def copy() -> float:
        warm()
        dest = tempfile.mkdtemp(prefix="fastload-bench-copy-", dir=shm)
        t0 = time.perf_counter()
        copy_dataset(src, dest, CopyOptions(progress=False))
        rate = total / (time.perf_counter() - t0) / 1e6
        shutil.rmtree(dest)
        return rate

    cp()
    copy()
    r = _pairs(cp, copy, pairs)
    _say(
        f"copy    {total / 1e6:.0f} MB into {shm}   {r['b_median']:8.0f} MB/s  cp -r {r['a_median']:8.0f} MB/s  "
        f"paired ratio {r['ratio']:.2f}x ({r['quartiles'][0]:.2f}-{r['quartiles'][1]:.2f})"
    )
    shutil.rmtree(src)
    return {"bytes": total, "copy_vs_cp": r}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="loader,ray,copy")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--copy-mb", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny inputs, one pair")
    parser.add_argument("--json", help="write the results there")
    args = parser.parse_args(argv)
    pairs = 1 if args.quick else args.pairs
    images = 64 if args.quick else args.images
    copy_mb = 32 if args.quick else args.copy_mb
    suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    out: dict[str, object] = {
        "command": " ".join([sys.executable, *sys.argv]),
        "host": os.uname().nodename,
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with tempfile.TemporaryDirectory(prefix="fastload-remote-bench-") as work:
        if "loader" in suites:
            out["loader"] = bench_loader(work, images=images, pairs=pairs)
        if "ray" in suites:
            out["ray"] = bench_ray(work, images=images, pairs=pairs)
        if "copy" in suites:
            out["copy"] = bench_copy(work, megabytes=copy_mb, pairs=pairs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    raise SystemExit(main())
