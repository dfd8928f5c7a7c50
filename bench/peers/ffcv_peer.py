"""Benchmarks, peer: the FFCV loader, run by the interpreter of ``.venv-ffcv``.

FFCV reads its own ``.beton`` file, so the peer converts the benchmark's JPEG folder once when it
starts (untimed; FFCV's writer re-encodes every image as JPEG at ``jpeg_quality``), then times
epochs of ``RandomResizedCropRGBImageDecoder((224, 224))`` + ``RandomHorizontalFlip`` + uint8
NCHW tensors with ``num_workers`` threads and ``OrderOption.RANDOM``. Standard library and FFCV
only: this file runs as a script in its own virtual environment.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script inside another virtual environment
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from protocol import PeerSkip, serve  # type: ignore
else:
    from .protocol import PeerSkip, serve

__all__ = ["FACTORIES"]

_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")


class _Folder:
    """(PIL image, label) pairs of an ImageFolder tree, the input FFCV's DatasetWriter expects."""

    def __init__(self, root: str) -> None:
        classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
        self.items = [
            (os.path.join(dp, f), label)
            for label, c in enumerate(classes)
            for dp, _, files in sorted(os.walk(os.path.join(root, c), followlinks=True))
            for f in sorted(files)
            if f.lower().endswith(_EXTENSIONS)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as im:
            return im.convert("RGB"), label


class _Runner:
    def __init__(self, spec: dict) -> None:
        try:
            from ffcv.fields import IntField, RGBImageField
            from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
            from ffcv.loader import Loader, OrderOption
            from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
            from ffcv.writer import DatasetWriter
        except Exception as exc:
            raise PeerSkip(f"ffcv is not importable by {sys.executable}: {type(exc).__name__}: {exc}") from exc
        threads = int(spec.get("threads", os.cpu_count() or 1))
        size = int(spec.get("size", 224))
        folder = _Folder(spec["root"])
        if not len(folder):
            raise PeerSkip(f"{spec['root']} holds no images")
        self.nbytes = sum(os.path.getsize(p) for p, _ in folder.items)
        self.tmp = tempfile.mkdtemp(prefix="fastload-bench-ffcv-", dir=spec.get("workdir"))
        beton = os.path.join(self.tmp, "data.beton")
        quality = int(spec.get("jpeg_quality", 90))
        writer = DatasetWriter(
            beton,
            {"image": RGBImageField(write_mode="jpg", jpeg_quality=quality), "label": IntField()},
            num_workers=threads,
        )
        writer.from_indexed_dataset(folder)
        self.loader = Loader(
            beton,
            batch_size=int(spec.get("batch_size", 256)),
            num_workers=threads,
            order=OrderOption.RANDOM,
            drop_last=False,
            os_cache=True,
            pipelines={
                "image": [
                    RandomResizedCropRGBImageDecoder((size, size)),
                    RandomHorizontalFlip(),
                    ToTensor(),
                    ToTorchImage(),
                ],
                "label": [IntDecoder(), ToTensor()],
            },
        )
        import ffcv

        self.info = {
            "ffcv": getattr(ffcv, "__version__", "?"),
            "threads": threads,
            "jpeg_quality": quality,
            "beton_bytes": os.path.getsize(beton),
            "inputs": [beton],
        }

    def run(self) -> dict:
        images = 0
        t0 = time.perf_counter()
        for images_batch, _labels in self.loader:
            images += int(images_batch.shape[0])
        return {"images": images, "bytes": self.nbytes, "seconds": time.perf_counter() - t0}

    def close(self) -> None:
        self.loader = None
        shutil.rmtree(self.tmp, ignore_errors=True)


FACTORIES = {"train": _Runner}


if __name__ == "__main__":
    raise SystemExit(serve(FACTORIES))
