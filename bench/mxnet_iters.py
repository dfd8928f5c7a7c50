"""Benchmarks, MXNet iterators: fastload.mxnet vs MXNet's own, same data, same consumer.

Comparisons:

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

:func:`training_pairs` measures two ratios as paired runs (the two sides alternate epoch by epoch,
:func:`bench.paired.run_pair`), each a :class:`~bench.paired.PairedRatio`:

* MXNet's ``example/image-classification/common/data.py`` training iterator (every argument it
  passes, its argparse defaults, the ``--aug-level 3`` preset: random crop + mirror, HSL jitter,
  rotation, shear, aspect ratio), ``fastload.mxnet.ImageRecordIter`` over ``mx.io.ImageRecordIter``
  with the same arguments and ``preprocess_threads=2`` (target: at least 3x);
* GluonCV's ImageNet training iterator (``--use-rec``) with its colour augmentation (brightness,
  contrast, saturation 0.4, ``pca_noise`` 0.1) over the same without it, both fastload (target: at
  most 20% slower, a ratio of at least 0.83).

:func:`iterator_pairs` adds paired runs of fastload's and MXNet's ImageRecordIter (uint8, and float32
with ImageNet's mean/std) and what keeping every batch costs ``NDArrayIter`` against the usual
take-use-drop loop; ``python -m bench.mxnet_iters pairs REC [N]`` prints them all.

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
from collections.abc import Callable

import numpy as np

from .peers.sparse_data import synthetic_csr

__all__ = [
    "TARGETS",
    "FastloadImageRunner",
    "data_py_train_kwargs",
    "gluoncv_train_kwargs",
    "image_iters",
    "iterator_pairs",
    "make_runner",
    "sparse_iters",
    "training_pairs",
]

_RRC = dict(
    random_resized_crop=True,
    min_random_area=0.08,
    max_random_area=1.0,
    min_aspect_ratio=3.0 / 4.0,
    max_aspect_ratio=4.0 / 3.0,
    rand_mirror=True,
    dtype="uint8",
    round_batch=False,
)


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


def _drain(it, records: int, limit: int | None = None) -> int:
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
        self.nbytes = (
            os.path.getsize(rec)
            if os.path.isfile(rec)
            else sum(os.path.getsize(os.path.join(rec, f)) for f in os.listdir(rec))
        )
        self.limit = spec.get("batches")
        self.it = fm.ImageRecordIter(
            path_imgrec=rec,
            data_shape=(3, size, size),
            batch_size=int(spec.get("batch_size", 256)),
            shuffle=True,
            seed=int(spec.get("seed", 0)),
            preprocess_threads=threads,
            prefetch_buffer=4,
            **_RRC,
        )
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
    def __init__(
        self, rec: str, *, parts: int, batch_size: int, size: int, threads: int, seed: int, limit: int | None
    ) -> None:
        import mxnet as mx

        idx = os.path.splitext(rec)[0] + ".idx"
        total = _idx_records(rec)
        self.records = [_part_records(total, p, parts) for p in range(parts)]
        self.limit = limit
        self.iters = [
            mx.io.ImageRecordIter(
                path_imgrec=rec,
                path_imgidx=idx,
                data_shape=(3, size, size),
                batch_size=batch_size,
                shuffle=True,
                seed=seed + p,
                preprocess_threads=threads,
                prefetch_buffer=4,
                part_index=p,
                num_parts=parts,
                verbose=False,
                **_RRC,
            )
            for p in range(parts)
        ]

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


def _round_robin(contenders: dict[str, Callable[[], int]], repeats: int, warmup: int) -> dict[str, list[float]]:
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            items = contenders[name]()
            rates[name].append(items / (time.perf_counter() - t0))
    return rates


def _rows(rates: dict[str, list[float]], unit: str, notes: dict[str, str]) -> list[dict]:
    return [
        {"name": n, "unit": unit, "samples": s, "median": statistics.median(s), "notes": notes.get(n, "")}
        for n, s in rates.items()
    ]


def image_iters(
    rec: str,
    *,
    batch_size: int = 256,
    size: int = 224,
    threads: int = 2,
    repeats: int = 3,
    warmup: int = 1,
    batches: int | None = None,
    seed: int = 0,
) -> list[dict]:
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
    fl = FastloadImageRunner(
        {"rec": rec, "batch_size": batch_size, "size": size, "threads": threads, "seed": seed, "batches": batches}
    )
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
    return _rows(rates, "images", dict.fromkeys(names, common))


def sparse_iters(
    *,
    rows: int = 256 * 4,
    features: int = 250_000,
    density: float = 0.001,
    batch_size: int = 256,
    repeats: int = 3,
    warmup: int = 1,
    consumer: str = "wait",
    seed: int = 0,
) -> list[dict]:
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
    if rows * features >= 2**31 - 1:
        raise ValueError(
            f"rows={rows} x features={features} = {rows * features:,} elements: MXNet refuses arrays "
            f"(CSR included) of 2**31 - 1 elements or more; use fewer rows"
        )
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
    theirs = mx.io.NDArrayIter(
        mx.nd.sparse.array(x), y, batch_size=batch_size, shuffle=True, last_batch_handle="discard"
    )

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
    return _rows(rates, "batches", dict.fromkeys(names, note))


# --- training-iterator pairs: common/data.py at --aug-level 3, GluonCV's colour augmentation -------

#: check -> minimum paired ratio the targets set.
TARGETS = {
    "data.py --aug-level 3: fastload / MXNet ImageRecordIter": 3.0,
    "GluonCV colour augmentation: with / without (fastload)": 1 / 1.2,
}


def data_py_train_kwargs(
    rec: str, *, aug_level: int = 3, batch_size: int = 128, size: int = 224, threads: int = 2
) -> dict:
    """The training ImageRecordIter arguments of MXNet's common/data.py at its argparse defaults.

    ``--aug-level`` 1 sets random crop and mirror, 2 adds HSL jitter (36, 50, 50), 3 adds rotation
    (10 degrees), shear (0.1) and aspect ratio (0.25), as that script's presets.
    """
    level = {"random_crop": 0, "random_mirror": 0, "h": 0, "s": 0, "l": 0, "rotate": 0, "shear": 0.0, "aspect": 0.0}
    if aug_level >= 1:
        level.update(random_crop=1, random_mirror=1)
    if aug_level >= 2:
        level.update(h=36, s=50, l=50)
    if aug_level >= 3:
        level.update(rotate=10, shear=0.1, aspect=0.25)
    idx = os.path.splitext(rec)[0] + ".idx"
    return dict(
        path_imgrec=rec,
        path_imgidx=idx if os.path.isfile(idx) else "",
        label_width=1,
        mean_r=123.68,
        mean_g=116.779,
        mean_b=103.939,
        std_r=1.0,
        std_g=1.0,
        std_b=1.0,
        data_name="data",
        label_name="softmax_label",
        data_shape=(3, size, size),
        batch_size=batch_size,
        rand_crop=level["random_crop"],
        max_random_scale=1.0,
        pad=0,
        fill_value=127,
        random_resized_crop=0,
        min_random_scale=1.0,
        max_aspect_ratio=level["aspect"],
        min_aspect_ratio=None,
        max_random_area=1.0,
        min_random_area=1.0,
        min_crop_size=-1,
        max_crop_size=-1,
        brightness=0.0,
        contrast=0.0,
        saturation=0.0,
        pca_noise=0.0,
        random_h=level["h"],
        random_s=level["s"],
        random_l=level["l"],
        max_rotate_angle=level["rotate"],
        max_shear_ratio=level["shear"],
        rand_mirror=level["random_mirror"],
        preprocess_threads=threads,
        shuffle=True,
        num_parts=1,
        part_index=0,
    )


def gluoncv_train_kwargs(
    rec: str, *, color: bool = True, batch_size: int = 128, size: int = 224, threads: int = 2
) -> dict:
    """GluonCV's ImageNet training ImageRecordIter (``--use-rec``), with or without its colour jitter."""
    jitter, lighting = (0.4, 0.1) if color else (0.0, 0.0)
    idx = os.path.splitext(rec)[0] + ".idx"
    return dict(
        path_imgrec=rec,
        path_imgidx=idx if os.path.isfile(idx) else "",
        preprocess_threads=threads,
        shuffle=True,
        batch_size=batch_size,
        data_shape=(3, size, size),
        mean_r=123.68,
        mean_g=116.779,
        mean_b=103.939,
        std_r=58.393,
        std_g=57.12,
        std_b=57.375,
        rand_mirror=True,
        random_resized_crop=True,
        max_aspect_ratio=4.0 / 3.0,
        min_aspect_ratio=3.0 / 4.0,
        max_random_area=1,
        min_random_area=0.08,
        brightness=jitter,
        saturation=jitter,
        contrast=jitter,
        pca_noise=lighting,
    )


class _Sample:
    __slots__ = ("images", "seconds")

    def __init__(self, images: int, seconds: float) -> None:
        self.images, self.seconds = images, seconds


class _IterContender:
    """One iterator, one epoch (or ``batches`` batches) per run, every batch waited for.

    After each run a fastload iterator's producer is stopped (untimed): it would otherwise decode
    on into the next epoch while the other side is timed, stealing that side's CPU and starting
    its own next run with batches ready (``bench.stages.quiesce``).
    """

    def __init__(self, name: str, it, records: int, batches: int | None) -> None:
        self.name, self.it, self.records, self.batches = name, it, records, batches

    def run(self) -> _Sample:
        t0 = time.perf_counter()
        self.it.reset()
        n = _drain(self.it, self.records, self.batches)
        sample = _Sample(n, time.perf_counter() - t0)
        loader = getattr(self.it, "loader", None)
        if loader is not None:
            iter(loader).close()  # an unfinished pass stops the producer
        return sample


def _quiet_fastload(kwargs: dict):
    import warnings

    import fastload.mxnet as fm

    with warnings.catch_warnings():
        # The fallback-geometry and unknown-argument warnings are expected here.
        warnings.simplefilter("ignore")
        return fm.ImageRecordIter(**kwargs)


def training_pairs(
    rec: str,
    *,
    rounds: int = 5,
    batch_size: int = 128,
    size: int = 224,
    threads: int = 2,
    batches: int | None = None,
) -> list:
    """The two training-iterator ratios (see the module docstring), as paired runs.

    Args:
        rec: A ``.rec`` (its ``.idx`` beside it is used when present).
        rounds: Timed pairs per ratio (after one warm-up pair).
        batch_size: Images per batch.
        size: Output side.
        threads: ``preprocess_threads`` of every iterator.
        batches: Stop a run after this many batches (smoke runs); None: whole epochs.

    Returns:
        ``PairedRatio`` s.
    """
    import mxnet as mx

    from .paired import run_pair

    records = _idx_records(rec) if os.path.isfile(os.path.splitext(rec)[0] + ".idx") else None
    common = dict(batch_size=batch_size, size=size, threads=threads)

    def pair(check: str, a: tuple, b: tuple):
        """``a`` over ``b``, each ``(name, iterator)``; both closed afterwards."""
        n = records or len(a[1].loader.dataset)
        try:
            return run_pair(
                check,
                _IterContender(a[0], a[1], n, batches),
                _IterContender(b[0], b[1], n, batches),
                rounds=rounds,
            )
        finally:
            for _, it in (a, b):
                close = getattr(it, "close", None)  # MXNet's iterators have none
                if close is not None:
                    close()

    kwargs = data_py_train_kwargs(rec, aug_level=3, **common)
    out = [
        pair(
            "data.py --aug-level 3: fastload / MXNet ImageRecordIter",
            ("fastload.mxnet ImageRecordIter", _quiet_fastload(kwargs)),
            ("mx.io.ImageRecordIter", mx.io.ImageRecordIter(verbose=False, **kwargs)),
        )
    ]
    out.append(
        pair(
            "GluonCV colour augmentation: with / without (fastload)",
            ("with colour", _quiet_fastload(gluoncv_train_kwargs(rec, color=True, **common))),
            ("without colour", _quiet_fastload(gluoncv_train_kwargs(rec, color=False, **common))),
        )
    )
    return out


# --- paired runs against MXNet, and what keeping batches costs --------------------------------------


class _KeepContender:
    """One NDArrayIter epoch per run, each batch waited for; ``keep`` holds every batch until the end."""

    def __init__(self, name: str, it, keep: bool, batch_size: int) -> None:
        self.name, self.it, self.keep, self.batch_size = name, it, keep, batch_size

    def run(self) -> _Sample:
        kept = []
        t0 = time.perf_counter()
        self.it.reset()
        n = 0
        for batch in self.it:
            batch.data[0].wait_to_read()
            n += self.batch_size
            if self.keep:
                kept.append(batch)
        return _Sample(n, time.perf_counter() - t0)


def iterator_pairs(
    rec: str,
    *,
    rounds: int = 7,
    batch_size: int = 128,
    size: int = 224,
    threads: int = 2,
    rows: int = 20_000,
    features: int = 512,
) -> list:
    """Paired runs: fastload vs MXNet ImageRecordIter (uint8, and float32 with ImageNet mean/std), and
    NDArrayIter's usual loop (take, use, drop) vs keeping every batch of the epoch.

    Args:
        rec: A ``.rec`` with its ``.idx`` beside it.
        rounds: Timed pairs (after one warm-up pair).
        batch_size: Images per batch.
        size: Output side (RandomResizedCrop(size) with torchvision's ranges + mirror).
        threads: ``preprocess_threads`` of both iterators.
        rows: Rows of the dense NDArrayIter input.
        features: Its columns (float32).
    """
    import warnings

    import mxnet as mx

    import fastload.mxnet as fm

    from .paired import run_pair

    records = _idx_records(rec)
    out = []
    for dtype in ("uint8", "float32"):
        kwargs = dict(
            path_imgrec=rec,
            path_imgidx=os.path.splitext(rec)[0] + ".idx",
            data_shape=(3, size, size),
            batch_size=batch_size,
            shuffle=True,
            preprocess_threads=threads,
            prefetch_buffer=4,
            **dict(_RRC, dtype=dtype),
        )
        if dtype != "uint8":
            kwargs.update(mean_r=123.68, mean_g=116.779, mean_b=103.939, std_r=58.393, std_g=57.12, std_b=57.375)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mine = fm.ImageRecordIter(**kwargs)
        theirs = mx.io.ImageRecordIter(verbose=False, **kwargs)
        try:
            out.append(
                run_pair(
                    f"ImageRecordIter RRC{size} {dtype}: fastload / MXNet",
                    _IterContender("fastload.mxnet ImageRecordIter", mine, records, None),
                    _IterContender("mx.io.ImageRecordIter", theirs, records, None),
                    rounds=rounds,
                )
            )
        finally:
            mine.close()
    x = np.random.default_rng(0).random((rows, features), dtype=np.float32)
    y = np.arange(rows, dtype=np.float32)
    usual = fm.NDArrayIter(x, y, batch_size=256, shuffle=True, seed=0)
    kept = fm.NDArrayIter(x, y, batch_size=256, shuffle=True, seed=0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # KeptBatchesWarning is the point here
            out.append(
                run_pair(
                    f"NDArrayIter dense {rows}x{features} batch 256: usual loop / keeping every batch",
                    _KeepContender("usual loop", usual, False, 256),
                    _KeepContender("every batch kept", kept, True, 256),
                    rounds=rounds,
                )
            )
    finally:
        usual.close()
        kept.close()
    return out


if __name__ == "__main__":
    # python -m bench.mxnet_iters [REC]          smoke run of every comparison
    # python -m bench.mxnet_iters pairs REC [N]  paired ratios, N timed pairs (default 7)
    import json
    import sys

    from .paired import format_paired

    if len(sys.argv) > 2 and sys.argv[1] == "pairs":
        rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 7
        rows = iterator_pairs(sys.argv[2], rounds=rounds) + training_pairs(sys.argv[2], rounds=rounds)
        print(format_paired(rows))
        print(json.dumps([r.to_json() for r in rows], indent=1))
    else:
        out = sparse_iters(rows=256 * 4, features=20_000, repeats=1, warmup=0)
        if len(sys.argv) > 1:
            out += image_iters(sys.argv[1], batch_size=32, size=64, batches=3, repeats=1, warmup=0)
            out += [r.to_json() for r in training_pairs(sys.argv[1], rounds=1, batch_size=32, size=64, batches=3)]
        print(json.dumps(out, indent=1))
