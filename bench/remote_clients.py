"""Measurement: which S3 client library fetches shards fastest (obstore vs fsspec/s3fs), against a real
S3 server on loopback (SeaweedFS ``weed mini``, started and stopped here).

The two clients take turns on the same objects (A then B, then B then A, ...), so each per-pair
ratio compares timings seconds apart on a shared, noisy machine; the figures to read are the
median MB/s of each client and the median of the per-pair ratios (obstore time / s3fs time < 1
means obstore is faster).

Cases, each the way the shard cache fetches:

- ``whole -> file``: one GET of a whole object, streamed into a file in ``/dev/shm`` (how a shard
  lands in the cache);
- ``ranges 1 stream``: the object read as consecutive 16 MB ranged GETs, one after the other;
- ``ranges 2 streams``: the same ranges, two requests in flight.

Run: ``python bench/remote_clients.py [--sizes 32,128,256] [--pairs 5] [--json OUT]``
(``--quick`` for the smoke run in the tests: one small object, one pair).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["main", "run"]

RANGE = 16 << 20


def _clients(endpoint: str, bucket: str):
    import obstore
    import s3fs
    from obstore.store import S3Store

    store = S3Store(
        bucket,
        endpoint=endpoint,
        access_key_id="bench",
        secret_access_key="bench",
        region="us-east-1",
        client_options={"allow_http": True, "timeout": "120s"},
    )
    fs = s3fs.S3FileSystem(
        endpoint_url=endpoint,
        key="bench",
        secret="bench",
        client_kwargs={"region_name": "us-east-1"},
        default_block_size=RANGE,
        skip_instance_cache=True,
    )

    def ob_whole(key: str, dest: str) -> int:
        n = 0
        with open(dest, "wb") as f:
            for chunk in obstore.get(store, key).stream(min_chunk_size=8 << 20):
                n += f.write(chunk)
        return n

    def fs_whole(key: str, dest: str) -> int:
        fs.get_file(f"{bucket}/{key}", dest)
        return os.path.getsize(dest)

    def ob_range(key: str, start: int, end: int) -> int:
        return len(obstore.get_range(store, key, start=start, end=end))

    def fs_range(key: str, start: int, end: int) -> int:
        return len(fs.cat_file(f"{bucket}/{key}", start=start, end=end))

    return {"obstore": (ob_whole, ob_range), "s3fs": (fs_whole, fs_range)}, store, fs


def _ranged(read: Callable[[str, int, int], int], key: str, size: int, streams: int, pool: ThreadPoolExecutor) -> int:
    bounds = [(s, min(s + RANGE, size)) for s in range(0, size, RANGE)]
    if streams == 1:
        return sum(read(key, s, e) for s, e in bounds)
    return sum(pool.map(lambda b: read(key, *b), bounds))


def run(*, sizes_mb: list[int], pairs: int, endpoint: str, bucket: str, scratch: str) -> dict[str, object]:
    """Upload one object per size, then time both clients alternately; returns the results dict."""
    import obstore

    clients, store, _ = _clients(endpoint, bucket)
    rows = []
    pool = ThreadPoolExecutor(2)
    try:
        for size_mb in sizes_mb:
            size = size_mb << 20
            key = f"bench/object-{size_mb}MB"
            obstore.put(store, key, os.urandom(size))
            cases = {
                "whole -> file": lambda c, key=key, size=size: clients[c][0](key, os.path.join(scratch, c)),
                "ranges 1 stream": lambda c, key=key, size=size: _ranged(clients[c][1], key, size, 1, pool),
                "ranges 2 streams": lambda c, key=key, size=size: _ranged(clients[c][1], key, size, 2, pool),
            }
            for case, fn in cases.items():
                for c in clients:  # warm-up: connections, imports, the server's caches
                    fn(c)
                times: dict[str, list[float]] = {c: [] for c in clients}
                ratios = []
                for p in range(pairs):
                    order = ["obstore", "s3fs"] if p % 2 == 0 else ["s3fs", "obstore"]
                    for c in order:
                        t0 = time.perf_counter()
                        got = fn(c)
                        times[c].append(time.perf_counter() - t0)
                        if got != size:
                            raise RuntimeError(f"{c} {case}: read {got} bytes of {size}")
                    ratios.append(times["obstore"][-1] / times["s3fs"][-1])
                row = {
                    "size_mb": size_mb,
                    "case": case,
                    "pairs": pairs,
                    "obstore_MBps": size / statistics.median(times["obstore"]) / 1e6,
                    "s3fs_MBps": size / statistics.median(times["s3fs"]) / 1e6,
                    "time_ratio_obstore_over_s3fs": statistics.median(ratios),
                    "ratio_quartiles": _quartiles(ratios),
                }
                rows.append(row)
                print(
                    f"{size_mb:4d} MB  {case:18s} obstore {row['obstore_MBps']:7.0f} MB/s   "
                    f"s3fs {row['s3fs_MBps']:7.0f} MB/s   time obstore/s3fs {row['time_ratio_obstore_over_s3fs']:.2f}x "
                    f"({row['ratio_quartiles'][0]:.2f}-{row['ratio_quartiles'][1]:.2f})",
                    flush=True,
                )
            obstore.delete(store, key)
    finally:
        pool.shutdown()
        for c in clients:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(scratch, c))
    return {"command": " ".join(sys.argv), "endpoint": endpoint, "range_bytes": RANGE, "rows": rows}


def _quartiles(values: list[float]):
    if len(values) < 2:
        return [values[0], values[0]]
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="32,128,256", help="object sizes in MB, comma-separated")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smoke run: one 4 MB object, one pair")
    parser.add_argument("--json", help="write the results there")
    args = parser.parse_args(argv)
    sizes = [4] if args.quick else [int(s) for s in args.sizes.split(",")]
    pairs = 1 if args.quick else args.pairs
    from tools.s3_server import LocalS3Server

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with (
        tempfile.TemporaryDirectory(prefix="fastload-s3-bench-") as data,
        tempfile.TemporaryDirectory(prefix="fastload-s3-bench-", dir=shm) as scratch,
        LocalS3Server(data, bucket="bench") as server,
    ):
        result = run(sizes_mb=sizes, pairs=pairs, endpoint=server.endpoint, bucket="bench", scratch=scratch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    raise SystemExit(main())
