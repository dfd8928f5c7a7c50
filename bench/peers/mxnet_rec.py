"""Benchmarks, peer: MXNet's C++ ``mx.io.ImageRecordIter`` on the same ``.rec``.

``random_resized_crop=True`` with torchvision's area and aspect ranges is the like-for-like setting
for RandomResizedCrop(224); ``rand_mirror=True`` is the flip; uint8 output. On 2 cores MXNet caps
its decode threads at max(cores/2 - 1, 1), so the ``parts`` variant runs ``num_parts`` iterators
(``part_index`` 0..P-1) concurrently, the usual work-around. Run as
``python -m bench.peers.mxnet_rec`` (it may share the process with fastload's own MXNet
iterator from ``bench/mxnet_iters.py``, so both see the same interpreter and libraries).
"""

from __future__ import annotations

import os
import sys
import threading
import time

if __package__ in (None, ""):  # run as a script by another interpreter (--peer-python torch=/mxnet=)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from protocol import PeerSkip, serve  # type: ignore
    from sparse_data import synthetic_csr  # type: ignore
else:
    from .protocol import PeerSkip, serve
    from .sparse_data import synthetic_csr

__all__ = ["FACTORIES"]


class _Runner:
    def __init__(self, spec: dict) -> None:
        try:
            import mxnet as mx
        except Exception as exc:  # ImportError, or numpy >= 1.24 breaking mxnet at import
            raise PeerSkip(f"mxnet is not importable: {type(exc).__name__}: {exc}") from exc
        rec = spec["rec"]
        idx = spec.get("idx") or os.path.splitext(rec)[0] + ".idx"
        if not os.path.exists(rec):
            raise PeerSkip(f"no RecordIO file {rec}")
        parts = int(spec.get("parts", 1))
        threads = int(spec.get("threads", os.cpu_count() or 1))
        size = int(spec.get("size", 224))
        self.nbytes = os.path.getsize(rec)
        # With round_batch=False MXNet hands out a full-size last batch with pad=0 however few
        # records it holds, so counting batch rows over-counts; an epoch decodes every record once.
        self.records = self._count_records(rec, idx)
        self.iters = [
            mx.io.ImageRecordIter(
                path_imgrec=rec,
                path_imgidx=idx if os.path.exists(idx) else "",
                data_shape=(3, size, size),
                batch_size=int(spec.get("batch_size", 256)),
                shuffle=True,
                seed=int(spec.get("seed", 0)) + p,
                random_resized_crop=True,
                min_random_area=0.08,
                max_random_area=1.0,
                min_aspect_ratio=3.0 / 4.0,
                max_aspect_ratio=4.0 / 3.0,
                rand_mirror=True,
                preprocess_threads=threads,
                prefetch_buffer=4,
                dtype="uint8",
                round_batch=False,
                part_index=p,
                num_parts=parts,
            )
            for p in range(parts)
        ]
        self.info = {"mxnet": mx.__version__, "parts": parts, "preprocess_threads": threads}

    @staticmethod
    def _count_records(rec: str, idx: str) -> int:
        if os.path.exists(idx):
            with open(idx) as fh:
                return sum(1 for line in fh if line.strip())
        from mxnet.recordio import MXRecordIO

        reader, n = MXRecordIO(rec, "r"), 0
        while reader.read() is not None:
            n += 1
        reader.close()
        return n

    @staticmethod
    def _drain(it, counts, slot):
        n = 0
        for batch in it:
            batch.data[0].wait_to_read()  # the same consumer as fastload.mxnet's runner
            n += batch.data[0].shape[0] - (batch.pad or 0)
        counts[slot] = n

    def run(self) -> dict:
        counts = [0] * len(self.iters)
        t0 = time.perf_counter()
        for it in self.iters:
            it.reset()
        if len(self.iters) == 1:
            self._drain(self.iters[0], counts, 0)
        else:
            # The iterators' next() is a ctypes call that drops the GIL, so threads run them in parallel.
            threads = [threading.Thread(target=self._drain, args=(it, counts, i)) for i, it in enumerate(self.iters)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        seconds = time.perf_counter() - t0
        return {
            "images": self.records,
            "bytes": self.nbytes,
            "seconds": seconds,
            "extra": {"batch_rows_seen": sum(counts)},
        }

    def close(self) -> None:
        self.iters = []


def _fastload_mxnet(spec: dict):
    # fastload's own MXNet iterator, measured by the MXNet helper's module when it is present.
    try:
        if __package__ in (None, ""):
            from bench import mxnet_iters  # script mode: needs fastload installed there too
        else:
            from .. import mxnet_iters
    except ImportError as exc:
        raise PeerSkip(f"bench/mxnet_iters.py is not available: {exc}") from exc
    return _Quiesced(mxnet_iters.make_runner(spec))


class _Quiesced:
    """fastload.mxnet's runner, with its loader's producer stopped after every repeat.

    fastload's loader decodes on into the next epoch when one ends; between repeats that work would
    run during another contender's timing (see ``bench.stages.quiesce``).
    """

    def __init__(self, runner) -> None:
        self.runner = runner
        self.info = getattr(runner, "info", {})

    def run(self) -> dict:
        result = self.runner.run()
        loader = getattr(getattr(self.runner, "it", None), "loader", None)
        if loader is not None:
            iter(loader).close()  # an unfinished pass stops the producer
        return result

    def close(self) -> None:
        self.runner.close()


class _SparseRunner:
    """One epoch of CSR batches from ``fastload.mxnet.NDArrayIter`` or ``mx.io.NDArrayIter``.

    The synthetic matrix is drawn from ``seed`` so both implementations, each in its own runner,
    iterate the same data; each batch is consumed by waiting for its data and label.
    """

    def __init__(self, spec: dict) -> None:
        try:
            import mxnet as mx
            import numpy as np
            import scipy.sparse  # noqa: F401  (synthetic_csr builds the rows with it)
        except Exception as exc:
            raise PeerSkip(f"mxnet/scipy are not importable: {type(exc).__name__}: {exc}") from exc
        rows, features = int(spec.get("rows", 256 * 4)), int(spec.get("features", 250_000))
        density, batch = float(spec.get("density", 0.001)), int(spec.get("batch_size", 256))
        rng = np.random.default_rng(int(spec.get("seed", 0)))
        x, y = synthetic_csr(rows, features, density, rng)
        self.nbytes = int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes)
        self.rows_per_epoch = rows
        if spec.get("impl") == "fastload":
            try:
                import fastload.mxnet as fm
            except ImportError as exc:
                raise PeerSkip(f"fastload.mxnet is not available: {exc}") from exc
            self.it = fm.NDArrayIter(
                x, y, batch_size=batch, shuffle=True, seed=int(spec.get("seed", 0)), last_batch_handle="discard"
            )
        else:
            # CSR data only allows last_batch_handle='discard' in MXNet.
            self.it = mx.io.NDArrayIter(
                mx.nd.sparse.array(x), y, batch_size=batch, shuffle=True, last_batch_handle="discard"
            )
        self.info = {"nnz_per_row": x.nnz // rows, "rows": rows, "features": features}

    def run(self) -> dict:
        t0 = time.perf_counter()
        self.it.reset()
        batches = 0
        for batch in self.it:
            batch.data[0].wait_to_read()
            batch.label[0].wait_to_read()
            batches += 1
        seconds = time.perf_counter() - t0
        return {"images": batches, "bytes": self.nbytes, "seconds": seconds}

    def close(self) -> None:
        it, self.it = self.it, None
        if it is not None and hasattr(it, "close"):
            it.close()


FACTORIES = {
    "imagerecorditer": _Runner,
    "fastload_imagerecorditer": _fastload_mxnet,
    "ndarrayiter_csr": _SparseRunner,
}


if __name__ == "__main__":
    raise SystemExit(serve(FACTORIES))
