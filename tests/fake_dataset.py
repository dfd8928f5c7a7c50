"""Test helper for the loader stages: a tiny in-memory dataset implementing the Records contract.

Not a test module. ``FakeDataset`` holds small JPEGs (odd sizes, one grey) encoded with Pillow; some
records can be made undecodable (``bad``) or unreadable (``unreadable``: ``image()`` raises
``CorruptRecordError`` as a damaged shard would).
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import numpy as np
from PIL import Image

from fastload.errors import CorruptRecordError

__all__ = ["FakeDataset", "jpeg_bytes"]


def jpeg_bytes(height: int, width: int, seed: int, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    # A smooth gradient plus noise: compresses like a photo, differs per seed.
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [(x * 255 // max(1, width - 1)), (y * 255 // max(1, height - 1)), np.full_like(x, seed * 37 % 256)], axis=-1
    )
    pixels = np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels, "RGB")
    if mode != "RGB":
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


class FakeDataset:
    """``n`` small JPEG records; labels are ``i % classes`` (or ``[i, -i]`` when ``label_width=2``).

    Args:
        n: Number of records.
        bad: Indices whose bytes are not an image (decode fails).
        unreadable: Indices whose ``image()`` raises :class:`CorruptRecordError`.
        label_width: 1 or 2.
        classes: Classes for single-label data.
    """

    def __init__(
        self,
        n: int,
        *,
        bad: Iterable[int] = (),
        unreadable: Iterable[int] = (),
        label_width: int = 1,
        classes: int = 10,
    ) -> None:
        self.bad, self.unreadable = set(bad), set(unreadable)
        self._blobs: list[bytes] = []
        for i in range(n):
            if i in self.bad:
                self._blobs.append(b"\xff\xd8\xff\xe0 not a jpeg " + bytes(64))
            else:
                self._blobs.append(jpeg_bytes(24 + (i * 7) % 29, 30 + (i * 5) % 23, i, "L" if i % 11 == 3 else "RGB"))
        if label_width == 1:
            self.labels = (np.arange(n) % classes).astype(np.float32)[:, None]
        else:
            self.labels = np.stack([np.arange(n), -np.arange(n)], axis=1).astype(np.float32)
        self.label_width = label_width
        self.ids = np.arange(n, dtype=np.uint64)
        self.will_need_calls: list[np.ndarray] = []
        self.closed = False

    def __len__(self) -> int:
        return len(self._blobs)

    def image(self, i: int) -> memoryview:
        if i in self.unreadable:
            raise CorruptRecordError("bad framing", shard="fake-00000.rec", record=int(i))
        return memoryview(self._blobs[i])

    def locate(self, i: int) -> str:
        return f"shard fake-00000.rec record {int(i)}"

    def will_need(self, indices) -> None:
        self.will_need_calls.append(np.array(indices, copy=True))

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
