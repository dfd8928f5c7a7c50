"""Part 5, ``gpu_decode``: the GPU-decode peer, nvJPEG through ``torchvision.io.decode_jpeg(device="cuda")``.

The same files as torch's ImageFolder reads, read into memory first (the file reads are not what is
compared), then per batch: one batched ``decode_jpeg(list, device=...)`` call, and torchvision's
``RandomResizedCrop`` parameters, ``resized_crop`` (antialiased bilinear) and a horizontal flip per
image on the device, stacked into a uint8 ``[B, 3, S, S]`` batch: what fastload's engine produces on
the CPU. Reports images/s for the decode alone and for the whole pipeline, and the host's CPU
seconds per 1,000 images (the decode is not free for the CPU: its Huffman decoding may run there).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from bench.device_check.measure import Recorder, cpu_seconds
from bench.device_check.plan import Config

__all__ = ["run"]


def run(config: Config, rec: Recorder) -> None:
    import torch
    import torchvision
    from torchvision import transforms as T
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as F

    device = torch.device(config.device)
    cuda = device.type == "cuda"
    sizes = config.sizes
    B, S = sizes.batch, sizes.size
    files = sorted(str(p) for p in Path(config.images).glob("*/*") if p.suffix.lower() in (".jpeg", ".jpg"))
    need = B * (sizes.decode_batches + 1)
    files = (files * (need // max(1, len(files)) + 1))[:need]
    encoded = [torchvision.io.read_file(f) for f in files]
    batches = [encoded[i : i + B] for i in range(0, need, B)]
    rng = random.Random(0)
    scale, ratio = [0.08, 1.0], [3 / 4, 4 / 3]
    rec.set("batch", B)
    rec.set("image_size", S)
    rec.set("torchvision", torchvision.__version__)

    def decode(batch):
        return decode_jpeg(batch, mode=ImageReadMode.RGB, device=device)

    def pipeline(batch):
        out = torch.empty((len(batch), 3, S, S), dtype=torch.uint8, device=device)
        for i, img in enumerate(decode(batch)):
            top, left, h, w = T.RandomResizedCrop.get_params(img, scale, ratio)
            crop = F.resized_crop(img, top, left, h, w, [S, S], antialias=True)
            out[i] = crop.flip(-1) if rng.random() < 0.5 else crop
        return out

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def timed(name: str, fn) -> dict[str, Any]:
        fn(batches[0])  # warm-up: nvJPEG handles, kernels, allocator
        sync()
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        images = 0
        for batch in batches[1:]:
            fn(batch)
            images += len(batch)
        sync()
        seconds = time.perf_counter() - t0
        row = {
            "stage": name,
            "images": images,
            "seconds": round(seconds, 3),
            "images_per_s": round(images / seconds, 1),
            "cpu_s_per_1k_images": round(1e3 * (cpu_seconds() - cpu0) / images, 3),
        }
        rec.row("rows", row)
        return row

    timed("decode_jpeg (batched)", decode)
    timed("decode_jpeg + RandomResizedCrop + flip (per image on the device)", pipeline)
    if cuda:
        rec.set("max_memory_gib", round(torch.cuda.max_memory_allocated() / 2**30, 2))
