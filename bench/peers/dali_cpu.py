"""Benchmarks, peer: NVIDIA DALI's CPU pipeline, run by the interpreter of ``.venv-dali``.

DALI wants numpy 2 and MXNet 1.9.1 wants numpy < 1.24, so this file runs as a plain script in its own
virtual environment (``tools/setup_peer_envs.sh``) and imports nothing from fastload. Pipeline on the
same ``.rec`` as the others: ``fn.readers.mxnet`` (shuffled), then either the region decode
``fn.decoders.image_random_crop`` (torchvision's area/aspect ranges) + ``fn.resize`` to 224x224
(linear, antialiased), or a full decode + ``fn.random_resized_crop``; then a random horizontal flip.
``device_id=None`` keeps everything on the CPU.
"""

from __future__ import annotations

import math
import os
import sys
import time

if __package__ in (None, ""):  # run as a script inside another virtual environment
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from protocol import PeerSkip, serve  # type: ignore
else:
    from .protocol import PeerSkip, serve

__all__ = ["FACTORIES"]


class _Runner:
    def __init__(self, spec: dict) -> None:
        try:
            import nvidia.dali as dali
            from nvidia.dali import fn, pipeline_def, types
        except Exception as exc:
            raise PeerSkip(f"nvidia-dali is not importable by {sys.executable}: {type(exc).__name__}: {exc}") from exc
        rec = spec["rec"]
        idx = spec.get("idx") or os.path.splitext(rec)[0] + ".idx"
        if not (os.path.exists(rec) and os.path.exists(idx)):
            raise PeerSkip(f"DALI's mxnet reader needs {rec} and its .idx")
        batch = int(spec.get("batch_size", 256))
        size = int(spec.get("size", 224))
        region = bool(spec.get("region", True))
        threads = int(spec.get("threads", os.cpu_count() or 1))

        with open(idx) as fh:
            records = sum(1 for line in fh if line.strip())
        self.iterations = max(1, math.ceil(records / batch))
        # DALI's default prefetch depth, but never more batches in flight than an epoch has: a
        # batch still in flight after a repeat would be decoded during another contender's timing.
        self.depth = min(2, self.iterations)

        @pipeline_def(
            batch_size=batch,
            num_threads=threads,
            device_id=None,
            seed=int(spec.get("seed", 0)) + 1,
            prefetch_queue_depth=self.depth,
        )
        def train():
            jpegs, labels = fn.readers.mxnet(path=[rec], index_path=[idx], random_shuffle=True, name="Reader")
            if region:
                images = fn.decoders.image_random_crop(
                    jpegs,
                    device="cpu",
                    output_type=types.RGB,
                    random_area=[0.08, 1.0],
                    random_aspect_ratio=[3 / 4, 4 / 3],
                    num_attempts=10,
                )
                images = fn.resize(
                    images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR, antialias=True
                )
            else:
                images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
                images = fn.random_resized_crop(
                    images,
                    size=[size, size],
                    random_area=[0.08, 1.0],
                    random_aspect_ratio=[3 / 4, 4 / 3],
                    num_attempts=10,
                    interp_type=types.INTERP_LINEAR,
                    antialias=True,
                )
            images = fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5))
            return images, labels

        self.pipe = train()
        self.pipe.build()
        self._primed = False
        self._in_flight = 0
        self.batch = batch
        self.nbytes = int(os.path.getsize(rec) * self.iterations * batch / max(1, records))
        self.info = {"dali": dali.__version__, "threads": threads, "region_decode": region, "records": records}

    def run(self) -> dict:
        # schedule_run/outputs instead of run(): run() leaves a batch in flight when it returns, and
        # that batch would be decoded during the next contender's timed repeat. Here exactly
        # `iterations` batches are scheduled and all of them are consumed inside the timing.
        scheduled = consumed = 0
        in_flight = self._in_flight  # only non-zero when an epoch is shorter than the prefetch depth
        t0 = time.perf_counter()
        while consumed < self.iterations:
            while in_flight < self.depth and scheduled < self.iterations - self._in_flight:
                # The very first schedule_run of a pipelined DALI pipeline queues `depth` batches.
                n = 1 if self._primed else self.depth
                self._primed = True
                self.pipe.schedule_run()
                scheduled += n
                in_flight += n
            self.pipe.outputs()
            consumed += 1
            in_flight -= 1
        seconds = time.perf_counter() - t0
        self._in_flight = in_flight  # set after the loop: the loop's budget uses the value at entry
        return {
            "images": consumed * self.batch,
            "bytes": int(self.nbytes * consumed / self.iterations),
            "seconds": seconds,
        }

    def close(self) -> None:
        self.pipe = None


FACTORIES = {"train": _Runner}


if __name__ == "__main__":
    raise SystemExit(serve(FACTORIES))
