"""Measurement stage, peers of the cold-epoch benchmark: torch's DataLoader + ImageFolder, MXNet's ImageRecordIter.

A cold epoch starts with nothing open: the benchmark drops the slow device's page cache (it
unmounts the file system, so no file on it may stay open), then asks the peer to ``start`` (build
the loader: torchvision's ``ImageFolder`` lists the folder, MXNet's iterator opens the ``.rec`` and
reads the ``.idx``), ``run`` one timed epoch and ``close`` (everything released, the workers and
iterator threads gone). Run as ``python -m bench.peers.cold_epochs`` in the throttled cgroup (the
benchmark process joins it before starting peers, and DataLoader workers are children of the peer).

- ``torch_imagefolder``: ``torchvision.datasets.ImageFolder`` with ``RandomResizedCrop(224)``,
  ``RandomHorizontalFlip()``, ``PILToTensor()`` (uint8 CHW), ``DataLoader(shuffle=True,
  num_workers=workers)``: what a PyTorch user trains ImageNet with.
- ``mxnet_imagerecorditer``: ``mx.io.ImageRecordIter(shuffle=True, random_resized_crop=True,
  rand_mirror=True)`` on the single ``.rec`` with its ``.idx`` (the runner of
  :mod:`bench.peers.mxnet_rec`), built inside the timed run: it starts reading as it is built.
"""

from __future__ import annotations

import gc
import os
import sys
import time

if __package__ in (None, ""):  # run as a script by another interpreter
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mxnet_rec  # type: ignore
    from protocol import PeerSkip, serve  # type: ignore
else:
    from . import mxnet_rec
    from .protocol import PeerSkip, serve

__all__ = ["FACTORIES"]


class _TorchImageFolder:
    def __init__(self, spec: dict) -> None:
        try:
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets, transforms
        except Exception as exc:
            raise PeerSkip(f"torch/torchvision are not importable: {type(exc).__name__}: {exc}") from exc
        size = int(spec.get("size", 224))
        self.workers = int(spec.get("workers", os.cpu_count() or 1))
        self.dataset = datasets.ImageFolder(
            spec["root"],
            transform=transforms.Compose(
                [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
            ),
        )
        self.nbytes = int(spec.get("bytes", 0))
        generator = torch.Generator()
        generator.manual_seed(int(spec.get("seed", 0)))
        self.loader = DataLoader(
            self.dataset,
            batch_size=int(spec.get("batch_size", 256)),
            shuffle=True,
            num_workers=self.workers,
            drop_last=False,
            generator=generator,
        )
        self.info = {"torch": torch.__version__, "workers": self.workers, "images": len(self.dataset)}

    def run(self) -> dict:
        images = 0
        t0 = time.perf_counter()
        for batch, _labels in self.loader:
            images += int(batch.shape[0])
        return {"images": images, "bytes": self.nbytes, "seconds": time.perf_counter() - t0}

    def close(self) -> None:
        self.loader = self.dataset = None
        gc.collect()


class _MXNetRecordIter:
    """MXNet's iterator, built inside the timed run: it starts reading and decoding as it is built."""

    def __init__(self, spec: dict) -> None:
        try:
            import mxnet as mx
        except Exception as exc:  # ImportError, or numpy >= 1.24 breaking mxnet at import
            raise PeerSkip(f"mxnet is not importable: {type(exc).__name__}: {exc}") from exc
        if not os.path.exists(spec["rec"]):
            raise PeerSkip(f"no RecordIO file {spec['rec']}")
        self.spec = spec
        self.info = {"mxnet": mx.__version__}

    def run(self) -> dict:
        # ImageRecordIter's prefetcher reads its first batches while it is constructed: building
        # it outside the timed region would hand it part of the epoch for free.
        t0 = time.perf_counter()
        runner = mxnet_rec.FACTORIES["imagerecorditer"](self.spec)
        try:
            result = runner.run()
        finally:
            runner.close()
            del runner
            gc.collect()  # the C++ iterator closes its .rec when the last reference goes
        return dict(result, seconds=time.perf_counter() - t0)

    def close(self) -> None:
        gc.collect()


FACTORIES = {
    "torch_imagefolder": _TorchImageFolder,
    "mxnet_imagerecorditer": _MXNetRecordIter,
}


if __name__ == "__main__":
    raise SystemExit(serve(FACTORIES))
