"""Benchmarks, peer: torch.utils.data.DataLoader with the torchvision-equivalent Pillow pipeline.

torchvision itself does not import beside the CPU torch 2.13.0 on these machines, so the pipeline
is written out with Pillow exactly as torchvision's PIL path runs it: ImageFolder's loader
(``Image.open(...).convert("RGB")``), ``RandomResizedCrop(224)`` (its crop sampling: up to 10 tries
of area in scale and log-uniform aspect, then the clamped centre fallback; crop then bilinear
antialiased resize), ``RandomHorizontalFlip()``, ``PILToTensor`` (uint8 CHW), default collate.
Eval is ``Resize(256)`` + ``CenterCrop(224)``. Run as ``python -m bench.peers.torch_pil``.
"""

from __future__ import annotations

import math
import os
import random
import sys
import time

if __package__ in (None, ""):  # run as a script by another interpreter (--peer-python torch=/mxnet=)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from protocol import PeerSkip, serve  # type: ignore
else:
    from .protocol import PeerSkip, serve

__all__ = ["FACTORIES", "center_crop_box", "list_images", "rrc_params"]

_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def list_images(root: str):
    """``[(path, class_index)]`` the way torchvision's ImageFolder finds them (sorted class folders)."""
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
    if not classes:
        raise PeerSkip(f"{root} has no class sub-folders")
    items = []
    for label, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(_EXTENSIONS):
                    items.append((os.path.join(dirpath, f), label))
    return items


def rrc_params(width: int, height: int, rng: random.Random, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's ``RandomResizedCrop.get_params``: ``(left, top, w, h)``."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_crop_box(width: int, height: int, size: int):
    """torchvision's ``CenterCrop`` box on an image already resized: ``(left, top, right, bottom)``."""
    top = round((height - size) / 2.0)
    left = round((width - size) / 2.0)
    return left, top, left + size, top + size


class _Folder:
    """ImageFolder-style dataset returning ``(uint8 CHW tensor, label)``."""

    def __init__(self, items, train: bool, size: int, resize: int) -> None:
        self.items, self.train, self.size, self.resize = items, train, size, resize

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        import numpy as np
        import torch
        from PIL import Image

        path, label = self.items[i]
        with open(path, "rb") as fh:
            img = Image.open(fh)
            img = img.convert("RGB")
        if self.train:
            # DataLoader seeds Python's `random` differently in each worker, as it seeds torch.
            left, top, w, h = rrc_params(img.width, img.height, random)
            img = img.crop((left, top, left + w, top + h)).resize((self.size, self.size), Image.BILINEAR)
            if random.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
        else:
            w, h = img.size
            if w <= h:
                new = (self.resize, int(self.resize * h / w))
            else:
                new = (int(self.resize * w / h), self.resize)
            img = img.resize(new, Image.BILINEAR).crop(center_crop_box(new[0], new[1], self.size))
        arr = np.asarray(img, dtype=np.uint8)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1), label


class _Runner:
    def __init__(self, spec: dict, train: bool) -> None:
        try:
            import torch
            from torch.utils.data import DataLoader
        except ImportError as exc:
            raise PeerSkip(f"torch is not importable: {exc}") from exc
        items = list_images(spec["root"])
        self.nbytes = sum(os.path.getsize(p) for p, _ in items)
        workers = int(spec.get("workers", os.cpu_count() or 1))
        torch.manual_seed(int(spec.get("seed", 0)))
        self.loader = DataLoader(
            _Folder(items, train, int(spec.get("size", 224)), int(spec.get("resize", 256))),
            batch_size=int(spec.get("batch_size", 256)),
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            drop_last=False,
            pin_memory=bool(spec.get("pin_memory", False)) and torch.cuda.is_available(),
        )
        self.info = {"torch": torch.__version__, "workers": workers, "images": len(items)}

    def run(self) -> dict:
        images = 0
        t0 = time.perf_counter()
        for batch, _labels in self.loader:
            images += batch.shape[0]
        return {"images": images, "bytes": self.nbytes, "seconds": time.perf_counter() - t0}

    def close(self) -> None:
        self.loader = None


FACTORIES = {
    "train": lambda spec: _Runner(spec, train=True),
    "eval": lambda spec: _Runner(spec, train=False),
}


if __name__ == "__main__":
    raise SystemExit(serve(FACTORIES))
