"""Measurement stage, MXNet iterators: fastload.mxnet vs MXNet's own, same data, same consumer.

Two comparisons (the MXNet drop-in targets):

* images: ``fastload.mxnet.ImageRecordIter`` vs ``mx.io.ImageRecordIter`` (one iterator, and two over
  ``num_parts=2`` drained by parallel threads), same ``.rec``, RandomResizedCrop(size) with
  torchvision's area/aspect ranges + mirror, uint8 output, ``preprocess_threads`` each;
* sparse: batches of ``batch_size`` CSR rows (250,000 features at ~0.1% density by default),
  ``fastload.mxnet.NDArrayIter`` vs ``mx.io.NDArrayIter`` (``last_batch_handle='discard'``, the only
  mode MXNet allows for CSR), each batch consumed the same way.

Images are counted the same way for every contender: the records an epoch delivers, taken from the
``.idx`` (each batch counts ``min(batch_size, records not yet delivered)``), never ``rows - pad``:
with ``round_batch=False`` MXNet 1.9.1 returns a full-size last batch with ``pad=0`` whose extra
rows are no records (measured: 48 records, ``batch_size=32`` -> two batches of 32, both ``pad=0``).

:func:`make_runner` is what ``bench.peers.mxnet_rec`` calls for its
``fastload_imagerecorditer`` kind (``run() -> {"images", "bytes", "seconds"}``, ``close()``).
:func:`image_iters` and :func:`sparse_iters` run a whole comparison in this process and return plain
dicts ``{"name", "unit", "samples": [items/s per repeat], "median", "notes"}``; repeats go
round-robin with the order reversed on alternate rounds so drift hits every contender alike.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from .peers.sparse_data import synthetic_csr

__all__ = ["make_runner", "image_iters", "sparse_iters", "FastloadImageRunner"]

_RRC = dict(random_resized_crop=True, min_random_area=0.08, max_random_area=1.0, min_aspect_ratio=3.0 / 4.0,
            max_aspect_ratio=4.0 / 3.0, rand_mirror=True, dtype="uint8", round_batch=False)


def _idx_records(rec: str) -> int:
    """Records of a ``.rec`` by its ``.idx`` (one line per record), which every contender reads."""
    idx = os.path.splitext(rec)[0] + ".idx"
    if not os.path.isfile(idx):
        raise FileNotFoundError(f"{rec}: the benchmark needs its index {idx} (MXNet partitions and counts by it)")
    with open(idx) as fh:
        return sum(1 for line in fh if line.strip())


def _part_records(total: int, part: int, parts: int) -> int:
    """Records MXNet's indexed reader gives ``part_index=part`` of ``num_parts=parts``.

    dmlc splits the index into chunks of ``ceil(total / parts)`` records, the last one shorter
    (measured with MXNet 1.9.1: 10 records over 3 parts -> 4, 4, 2; over 4 parts -> 3, 3, 3, 1).
    """
    step = -(-total // parts)
    return min(step * (part + 1), total) - min(step * part, total)


def _drain(it, records: int, limit: Optional[int] = None) -> int:
    """Records delivered in one epoch of ``it``, whose epoch covers ``records`` records.

    Every batch is consumed the same way for every iterator (wait for its data) and counts the
    records it holds, ``min(rows, records not yet delivered)``: ``pad`` cannot be used, MXNet
    reports ``pad=0`` for the padded last batch when ``round_batch=False``.
    """
    n = 0
    for k, batch in enumerate(it):
        batch.data[0].wait_to_read()
        n += min(batch.data[0].shape[0], records - n)
        if limit is not None and k + 1 >= limit:
            break
    return n


class FastloadImageRunner:
    """One ``fastload.mxnet.ImageRecordIter`` epoch per :meth:`run` (the peer protocol's runner)."""

    def __init__(self, spec: dict) -> None:
        import fastload.mxnet as fm

        rec = spec.get("rec") or spec.get("packed")
        if not rec or not os.path.exists(rec):
            raise FileNotFoundError(f"no dataset for fastload.mxnet.ImageRecordIter: {rec!r}")
        size = int(spec.get("size", 224))
        threads = int(spec.get("threads", os.cpu_count() or 1))
        self.nbytes = os.path.getsize(rec) if os.path.isfile(rec) else sum(
            os.path.getsize(os.path.join(rec, f)) for f in os.listdir(rec))
        self.limit = spec.get("batches")
        self.it = fm.ImageRecordIter(path_imgrec=rec, data_shape=(3, size, size),
                                     batch_size=int(spec.get("batch_size", 256)), shuffle=True,
                                     seed=int(spec.get("seed", 0)), preprocess_threads=threads, prefetch_buffer=4,
                                     **_RRC)
        from fastload.decode import engine_info

        self.info = {"preprocess_threads": threads, "backend": engine_info().get("backend")}
        # One part: an epoch covers every record of the dataset once (the .idx count for a .rec).
        self.records = len(self.it.loader.dataset)

    def run(self) -> dict:
        t0 = time.perf_counter()
        self.it.reset()
        n = _drain(self.it, self.records, self.limit)
        return {"images": n, "bytes": self.nbytes, "seconds": time.perf_counter() - t0}

    def close(self) -> None:
        self.it.close()


def make_runner(spec: dict) -> FastloadImageRunner:
    """The runner ``bench.peers.mxnet_rec`` builds for ``fastload_imagerecorditer``."""
    return FastloadImageRunner(spec)


class _MXImageRunner:
    def __init__(self, rec: str, *, parts: int, batch_size: int, size: int, threads: int, seed: int,
                 limit: Optional[int]) -> None:
        import mxnet as mx

        idx = os.path.splitext(rec)[0] + ".idx"
        total = _idx_records(rec)
        self.records = [_part_records(total, p, parts) for p in range(parts)]
        self.limit = limit
        self.iters = [mx.io.ImageRecordIter(path_imgrec=rec, path_imgidx=idx,
                                            data_shape=(3, size, size), batch_size=batch_size, shuffle=True,
                                            seed=seed + p, preprocess_threads=threads, prefetch_buffer=4,
                                            part_index=p, num_parts=parts, verbose=False, **_RRC)
                      for p in range(parts)]

    def run(self) -> int:
        for it in self.iters:
            it.reset()
        if len(self.iters) == 1:
            return _drain(self.iters[0], self.records[0], self.limit)
        counts = [0] * len(self.iters)

        def work(i):
            limit = None if self.limit is None else -(-self.limit // len(self.iters))
            counts[i] = _drain(self.iters[i], self.records[i], limit)

        # next() is a ctypes call that releases the GIL, so the partitions decode in parallel.
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(self.iters))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts)

    def close(self) -> None:
        self.iters = []


def _round_robin(contenders: Dict[str, Callable[[], int]], repeats: int, warmup: int) -> Dict[str, List[float]]:
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    rates: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            items = contenders[name]()
            rates[name].append(items / (time.perf_counter() - t0))
    return rates


def _rows(rates: Dict[str, List[float]], unit: str, notes: Dict[str, str]) -> List[dict]:
    return [{"name": n, "unit": unit, "samples": s, "median": statistics.median(s), "notes": notes.get(n, "")}
            for n, s in rates.items()]


def image_iters(rec: str, *, batch_size: int = 256, size: int = 224, threads: int = 2, repeats: int = 3,
                warmup: int = 1, batches: Optional[int] = None, seed: int = 0) -> List[dict]:
    """fastload.mxnet.ImageRecordIter vs MXNet's ImageRecordIter (1 iterator and 2 partitions).

    Args:
        rec: A ``.rec`` with its ``.idx`` beside it (both iterators read this same file).
        batch_size: Images per batch.
        size: Output side (RandomResizedCrop(size) + mirror, uint8).
        threads: ``preprocess_threads`` of every iterator.
        repeats: Timed epochs per contender.
        warmup: Untimed epochs per contender first (page cache, thread pools).
        batches: Stop an epoch after this many batches (smoke runs); None: whole epochs.
        seed: Shuffle seed.

    Returns:
        One dict per contender; ``samples`` are images/s per repeat.
    """
    fl = FastloadImageRunner({"rec": rec, "batch_size": batch_size, "size": size, "threads": threads,
                              "seed": seed, "batches": batches})
    one = _MXImageRunner(rec, parts=1, batch_size=batch_size, size=size, threads=threads, seed=seed, limit=batches)
    two = _MXImageRunner(rec, parts=2, batch_size=batch_size, size=size, threads=threads, seed=seed, limit=batches)
    names = {
        f"fastload.mxnet ImageRecordIter (preprocess_threads={threads})": lambda: fl.run()["images"],
        f"MXNet ImageRecordIter (preprocess_threads={threads})": one.run,
        f"MXNet ImageRecordIter x2 partitions (preprocess_threads={threads})": two.run,
    }
    common = f"RandomResizedCrop({size}) scale=(0.08,1) ratio=(3/4,4/3) + mirror, uint8, batch {batch_size}"
    try:
        rates = _round_robin(names, repeats, warmup)
    finally:
        fl.close()
        one.close()
        two.close()
    return _rows(rates, "images", {n: common for n in names})


def sparse_iters(*, rows: int = 256 * 4, features: int = 250_000, density: float = 0.001, batch_size: int = 256,
                 repeats: int = 3, warmup: int = 1, consumer: str = "wait", seed: int = 0) -> List[dict]:
    """fastload.mxnet.NDArrayIter vs mx.io.NDArrayIter on the same CSR data, same consumer.

    Args:
        rows: Rows of the synthetic CSR matrix (one epoch); default 1,024 (4 batches of 256).
            ``mx.io.NDArrayIter`` slices CSR data with ``slice_axis``, which has no CSR kernel:
            MXNet's storage fallback densifies the *whole* matrix for every batch and hands out
            dense batches. Its per-batch cost therefore grows with ``rows`` (measured here with
            250,000 features: 512 rows 0.54 s/batch, 1,024 rows 1.25 s/batch, 1.5 GB peak). And
            MXNet's wheel (built without ``USE_INT64_TENSOR_SIZE``) refuses any NDArray, CSR
            included, of ``2**31 - 1`` elements or more: a 10,240 x 250,000 CSR fails at creation.
            The speed-up over MXNet grows with ``rows``; quote it with the size.
        features: Columns.
        density: Fraction of non-zeros per row.
        batch_size: Rows per batch.
        repeats: Timed epochs per contender.
        warmup: Untimed epochs first.
        consumer: ``"wait"`` (wait for the batch's data and label) or ``"dot"`` (a sparse dot with
            a (features, 8) dense weight, like a linear model's forward).
        seed: Data and shuffle seed.

    Returns:
        One dict per contender; ``samples`` are batches/s per repeat.
    """
    import mxnet as mx

    import fastload.mxnet as fm

    if consumer not in ("wait", "dot"):
        raise ValueError(f"consumer={consumer!r} must be 'wait' or 'dot'")
    if rows * features >= 2 ** 31 - 1:
        raise ValueError(f"rows={rows} x features={features} = {rows * features:,} elements: MXNet refuses arrays "
                         f"(CSR included) of 2**31 - 1 elements or more; use fewer rows")
    rng = np.random.default_rng(seed)
    x, y = synthetic_csr(rows, features, density, rng)
    weight = mx.nd.array(rng.random((features, 8), dtype=np.float32)) if consumer == "dot" else None

    def consume(it) -> int:
        n = 0
        for batch in it:
            data = batch.data[0]
            if weight is not None:
                mx.nd.sparse.dot(data, weight).wait_to_read()
            else:
                data.wait_to_read()
            batch.label[0].wait_to_read()
            n += 1
        return n

    mine = fm.NDArrayIter(x, y, batch_size=batch_size, shuffle=True, seed=seed, last_batch_handle="discard")
    theirs = mx.io.NDArrayIter(mx.nd.sparse.array(x), y, batch_size=batch_size, shuffle=True,
                               last_batch_handle="discard")

    def run(it):
        def go() -> int:
            it.reset()
            return consume(it)
        return go

    names = {"fastload.mxnet NDArrayIter (CSR)": run(mine), "MXNet NDArrayIter (CSR)": run(theirs)}
    note = f"{rows} x {features} CSR, {x.nnz // rows} nnz/row, batch {batch_size}, shuffle, consumer={consumer}"
    try:
        rates = _round_robin(names, repeats, warmup)
    finally:
        mine.close()
    return _rows(rates, "batches", {n: note for n in names})


if __name__ == "__main__":  # smoke: python -m bench.mxnet_iters REC (from the repository root)
    import json
    import sys

    out = sparse_iters(rows=256 * 4, features=20_000, repeats=1, warmup=0)
    if len(sys.argv) > 1:
        out += image_iters(sys.argv[1], batch_size=32, size=64, batches=3, repeats=1, warmup=0)
    print(json.dumps(out, indent=1))
