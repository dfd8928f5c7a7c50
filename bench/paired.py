"""Benchmarks, ratio form: two decoders alternated chunk by chunk on the same images.

The interleaved repeats of :func:`bench.harness.measure` compare runs that are seconds
apart, and on a shared 2-vCPU VM the speed a process gets drifts by 10% and more over seconds: the
single-thread ratios the issues set targets on moved between 1.05x and 1.33x from one full run to
the next. Here the two sides of a ratio take turns on the same chunk of images (A then B on one
chunk, B then A on the next), so every ratio compares timings milliseconds apart; the reported
figure is the median of the per-chunk ratios, with their quartiles and the ratio of the summed
times beside it. Drift that lasts longer than a chunk (~0.1 s) cancels out.

The pairs are the single-thread decode ratios the decode-speed and restart-index targets set: fastload's fused
train decode (plain and restart-indexed shards) against simplejpeg's full-size decode of the same images, and
restart-indexed against plain. Restart-indexed records are the same images in the same order
(``fastload pack --restart-index`` of the same folder), so chunk ``i`` holds the same pictures on
both sides. The restart-indexed loader ratio and the pack-versus-copy ratio are paired the same way
one level up: two contenders take turns, one whole run (an epoch, a pack) each (:func:`run_pair`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "NORMALIZED_PAIR_CHECK",
    "PairedRatio",
    "decode_pairs",
    "format_paired",
    "normalized_output_pairs",
    "paired_ratio",
    "run_pair",
]

#: The check name of the normalized-output pairs (``{t}`` = threads).
NORMALIZED_PAIR_CHECK = "fused float32-normalized / uint8 output, RandomResizedCrop(224)+flip NCHW, {t}t"

Work = Callable[[int, int], None]  # decode images [start, stop)


@dataclass
class PairedRatio:
    """``numerator`` throughput over ``denominator`` throughput, from alternated chunks."""

    check: str
    numerator: str
    denominator: str
    median: float
    q1: float
    q3: float
    total: float  # denominator's summed seconds / numerator's summed seconds
    pairs: int
    chunk: int
    skipped: str | None = None
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def paired_ratio(
    check: str,
    numerator: str,
    run_num: Work,
    denominator: str,
    run_den: Work,
    *,
    images: int,
    chunk: int,
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
) -> PairedRatio:
    """Alternate ``run_num`` and ``run_den`` over ``[0, images)`` in chunks, ``rounds`` times.

    The first round is a warm-up (untimed): caches, lazy allocations and the thread pool settle.
    ``clock`` is the timer (seconds).
    """
    if images < chunk:
        chunk = images
    starts = list(range(0, images - chunk + 1, chunk))
    ratios: list[float] = []
    num_total = den_total = 0.0
    for r in range(rounds + 1):
        for k, s in enumerate(starts):
            first_num = (r + k) % 2 == 0
            times = {}
            for side in (True, False) if first_num else (False, True):
                fn = run_num if side else run_den
                t0 = clock()
                fn(s, s + chunk)
                times[side] = clock() - t0
            if r == 0:
                continue
            ratios.append(times[False] / times[True])
            num_total += times[True]
            den_total += times[False]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return PairedRatio(
        check=check,
        numerator=numerator,
        denominator=denominator,
        median=statistics.median(ratios),
        q1=q[0],
        q3=q[2],
        total=den_total / num_total,
        pairs=len(ratios),
        chunk=chunk,
        extra={"numerator_ips": len(ratios) * chunk / num_total, "denominator_ips": len(ratios) * chunk / den_total},
    )


def _engine_work(images: Sequence[bytes], batch: int) -> Work:
    """fastload's fused RandomResizedCrop(224)+flip decode, 1 thread, ``batch`` images per call."""
    from fastload import decode, transforms

    transform = transforms.train(224)
    out = np.empty((batch, 224, 224, 3), dtype=np.uint8)
    epoch = [0]

    def run(start: int, stop: int) -> None:
        epoch[0] += 1
        for s in range(start, stop, batch):
            e = min(stop, s + batch)
            decode.decode_batch(
                images[s:e],
                out[: e - s],
                transform,
                seed=0,
                epoch=epoch[0],
                indices=np.arange(s, e, dtype=np.int64),
                threads=1,
            )

    return run


def _pipeline_work(images: Sequence[bytes], batch: int, *, threads: int, normalize: bool) -> Work:
    """fastload's RandomResizedCrop(224)+flip into NCHW: uint8 pixels, or ImageNet-normalized float32."""
    from fastload import decode, transforms

    norm = transforms.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) if normalize else None
    pipeline = transforms.Pipeline(geometry=transforms.train(224), normalize=norm)
    out = np.empty((batch, 3, 224, 224), dtype=pipeline.output_dtype)
    epoch = [0]

    def run(start: int, stop: int) -> None:
        epoch[0] += 1
        for s in range(start, stop, batch):
            e = min(stop, s + batch)
            decode.decode_batch(
                images[s:e],
                out[: e - s],
                pipeline,
                seed=0,
                epoch=epoch[0],
                indices=np.arange(s, e, dtype=np.int64),
                threads=threads,
            )

    return run


def normalized_output_pairs(
    images: Sequence[bytes], *, threads: Sequence[int] = (1, 2), chunk: int = 128, rounds: int = 3
) -> list[PairedRatio]:
    """The cost of the engine's fused normalized float32 write: float32 / uint8 throughput, per thread count.

    Both sides decode the same chunk with the same crops (same seed and epoch sequence); only the
    output stage differs. The target (the torch drop-in's): at least 0.90.
    """
    out = []
    batch = min(chunk, 256)
    for t in threads:
        f32 = _pipeline_work(images, batch, threads=t, normalize=True)
        u8 = _pipeline_work(images, batch, threads=t, normalize=False)
        out.append(
            paired_ratio(
                NORMALIZED_PAIR_CHECK.format(t=t),
                f"float32 normalized, {t}t",
                f32,
                f"uint8, {t}t",
                u8,
                images=len(images),
                chunk=chunk,
                rounds=rounds,
            )
        )
    return out


def _simplejpeg_work(images: Sequence[bytes]) -> Work:
    import simplejpeg

    def run(start: int, stop: int) -> None:
        for b in images[start:stop]:
            simplejpeg.decode_jpeg(b, colorspace="RGB")

    return run


def decode_pairs(
    plain: Sequence[bytes], restart: Sequence[bytes] | None, *, chunk: int = 128, rounds: int = 3
) -> list[PairedRatio]:
    """The single-thread decode ratios (fused vs simplejpeg, restart-indexed vs plain), each from alternated chunks."""
    images = min(len(plain), len(restart)) if restart is not None else len(plain)
    batch = min(chunk, 256)
    train = _engine_work(plain, batch)
    out: list[PairedRatio] = []
    why = ""
    try:
        sj: Work | None = _simplejpeg_work(plain)
    except ImportError as exc:
        sj = None
        why = f"simplejpeg is not installed: {exc}"
    names = (
        "fastload engine train, 1t",
        "fastload engine train, restart-indexed, 1t",
        "simplejpeg full-size decode, 1t",
    )
    pairs = [("fused train 1t / simplejpeg full-size 1t", names[0], train, names[2], sj)]
    if restart is not None:
        sliced = _engine_work(restart, batch)
        pairs += [
            ("restart-indexed fused train 1t / simplejpeg full-size 1t", names[1], sliced, names[2], sj),
            ("restart-indexed fused train 1t / plain shards 1t", names[1], sliced, names[0], train),
        ]
    for check, num_name, num, den_name, den in pairs:
        if den is None:
            out.append(
                PairedRatio(
                    check=check,
                    numerator=num_name,
                    denominator=den_name,
                    median=float("nan"),
                    q1=float("nan"),
                    q3=float("nan"),
                    total=float("nan"),
                    pairs=0,
                    chunk=chunk,
                    skipped=why,
                )
            )
            continue
        out.append(paired_ratio(check, num_name, num, den_name, den, images=images, chunk=chunk, rounds=rounds))
    return out


def run_pair(check: str, num, den, *, rounds: int, before: Callable[[object], None] | None = None) -> PairedRatio:
    """Alternate whole runs (``run() -> Sample``: a loader epoch, a pack) of two started contenders.

    The first pair is a warm-up. Each ratio compares two runs back to back (their order swapped
    every pair), instead of two repeats a whole round of other contenders apart. ``before(c)`` runs
    untimed ahead of each of contender ``c``'s runs (e.g. warming its input files).
    """
    ratios: list[float] = []
    num_s = den_s = 0.0
    num_n = den_n = 0
    for r in range(rounds + 1):
        samples = {}
        for side in (True, False) if r % 2 == 0 else (False, True):
            contender = num if side else den
            if before is not None:
                before(contender)
            samples[side] = contender.run()
        if r == 0:
            continue
        a, b = samples[True], samples[False]
        ratios.append((a.images / a.seconds) / (b.images / b.seconds))  # same work: bytes/s ratio too
        num_s, den_s, num_n, den_n = num_s + a.seconds, den_s + b.seconds, num_n + a.images, den_n + b.images
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return PairedRatio(
        check=check,
        numerator=num.name,
        denominator=den.name,
        median=statistics.median(ratios),
        q1=q[0],
        q3=q[2],
        total=(num_n / num_s) / (den_n / den_s),
        pairs=len(ratios),
        chunk=num_n // max(1, len(ratios)),
        extra={"numerator_ips": num_n / num_s, "denominator_ips": den_n / den_s},
    )


def format_paired(rows: Sequence[PairedRatio]) -> str:
    """The section of the text report."""
    if not rows:
        return ""
    lines = [
        "",
        "== paired ratios (the two sides alternate on the same chunk of images, or run by run for "
        "loaders and the pack; median of the per-pair ratios)",
        f"{'ratio':<60} {'median':>7} {'quartiles':>13} {'of sums':>8} {'chunks':>7}",
    ]
    for r in rows:
        if r.skipped:
            lines.append(f"{r.check:<60} skipped: {r.skipped}")
            continue
        lines.append(
            f"{r.check:<60} {r.median:>6.2f}x {r.q1:>5.2f}-{r.q3:<5.2f}x {r.total:>7.2f}x {r.pairs:>4} x {r.chunk}"
        )
    return "\n".join(lines)
