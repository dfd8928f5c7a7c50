"""Device stage (torch): pinned ring buffers, the float conversion, and per-device copies of a batch.

:func:`pinned_allocator` is the ring's allocator: torch tensors, page-locked when CUDA is available,
whose numpy views the loader decodes into. :class:`Placement` turns the image tensor of a batch into
what the user asked for with fastload's ``device=`` / ``devices=`` extras: a conversion to a float
dtype (``x * scale - shift`` per channel, one fused pass, on the target device) and copies to one or
several devices.

Several devices in one process (``devices=[...]``): every batch is split into ``len(devices)``
contiguous slices (sizes differ by at most one, :func:`split_sizes`); each slice is copied from the
pinned slot straight to its device, on that device's own CUDA stream with ``non_blocking=True``; an
event recorded after the copy is attached to the batch as a fence, and the ring does not refill the
slot before every such event has completed. The consumer's current stream on each device waits for the
copy stream, and the outputs are ``record_stream``-ed to it. Nothing goes through a master device.

What has *not* run on a GPU (this was developed on a CPU-only machine): the CUDA branches -- pinned
allocation, per-device streams and events, ``non_blocking`` copies, ``record_stream``, on-device
conversion. They use only torch's standard calls and are guarded by ``torch.cuda.is_available()``;
the identical split / convert / fence logic is exercised by the tests with ``torch.device("cpu")``
entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

__all__ = [
    "FLOAT_DTYPES",
    "TORCH_DTYPES",
    "FloatOutput",
    "Placement",
    "cuda_release_fences",
    "pinned_allocator",
    "split_sizes",
]

TORCH_DTYPES = {
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.int64): torch.int64,
}
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def pinned_allocator(
    shape: tuple[int, ...], dtype: np.dtype[Any], *, pin: bool | None = None
) -> tuple[NDArray[Any], torch.Tensor]:
    """Allocate a ring buffer as a torch tensor, page-locked when CUDA is available.

    ``torch.empty(..., pin_memory=True)`` raises on a CPU-only build, so pinning is requested only
    when ``torch.cuda.is_available()`` (or when ``pin`` forces it).

    Returns:
        ``(numpy view, tensor)`` sharing the same memory.
    """
    if pin is None:
        pin = torch.cuda.is_available()
    tensor = torch.empty(tuple(shape), dtype=TORCH_DTYPES[np.dtype(dtype)], pin_memory=bool(pin))
    return tensor.numpy(), tensor


def cuda_release_fences() -> list[Any]:
    """The ring's release hook: a CUDA event on each initialized device's current stream.

    Called (on any thread) when a batch's last view dies. Work the consumer queued on those streams
    before that moment -- typically its own ``non_blocking`` copy out of the pinned batch -- is
    finished once the events complete, and the ring waits for them before refilling the slot.
    Without CUDA initialized it returns nothing and costs one call. Devices without a CUDA context
    are skipped (recording there would create one). Untested on a GPU (none here); the tests run
    this logic with stand-ins for ``torch.cuda``.
    """
    cuda = torch.cuda
    if not cuda.is_initialized():
        return []
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    if has_context is not None:
        devices = [d for d in range(cuda.device_count()) if has_context(d)]
    else:
        devices = [cuda.current_device()]
    events = []
    for d in devices:
        event = cuda.Event()
        event.record(cuda.current_stream(d))
        events.append(event)
    return events


def split_sizes(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous slices of ``n`` rows, the first ones larger by one when uneven."""
    base, extra = divmod(n, parts)
    return [base + (1 if p < extra else 0) for p in range(parts)]


class FloatOutput:
    """``out = x * scale - shift`` per channel, in ``dtype``: ToTensor / ConvertImageDtype / Normalize.

    Args:
        dtype: The float dtype of the output.
        scale: Multiplier of the uint8 pixel values (``1/255`` for ToTensor).
        mean: Per-channel mean subtracted after scaling (zeros when there is no Normalize).
        std: Per-channel std divided by after that (ones when there is no Normalize).
    """

    def __init__(self, dtype: torch.dtype, scale: float, mean: Sequence[float], std: Sequence[float]) -> None:
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype={dtype} must be a float dtype")
        self.dtype = dtype
        mean64 = torch.tensor(list(mean), dtype=torch.float64)
        std64 = torch.tensor(list(std), dtype=torch.float64)
        # (x * scale - mean) / std == x * (scale / std) - mean / std: one multiply-subtract pass.
        self._scale64 = (scale / std64).view(1, -1, 1, 1)
        self._shift64 = (mean64 / std64).view(1, -1, 1, 1)
        self._cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.key = (dtype, float(scale), tuple(float(v) for v in mean), tuple(float(v) for v in std))

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """A new ``dtype`` tensor (NCHW logical shape, same memory format as ``images``)."""
        key = images.device
        if key not in self._cache:
            self._cache[key] = (
                self._scale64.to(device=key, dtype=self.dtype),
                self._shift64.to(device=key, dtype=self.dtype),
            )
        scale, shift = self._cache[key]
        out = images.to(self.dtype)
        return out.mul_(scale).sub_(shift)


class Placement:
    """Where a batch's tensors go: the ring's CPU memory, one device, or a slice per device.

    Args:
        devices: Target devices, or None to hand out CPU tensors.
        single: True when the user gave ``device=`` (one ``(images, labels)``), False for ``devices=``
            (a list of them).
        convert: The float conversion, or None to keep the decoded dtype.
        memory_format: ``torch.contiguous_format`` or ``torch.channels_last`` for device copies.
    """

    def __init__(
        self,
        devices: list[torch.device] | None,
        *,
        single: bool,
        convert: FloatOutput | None,
        memory_format: torch.memory_format,
    ) -> None:
        self.devices, self.single, self.convert, self.memory_format = devices, single, convert, memory_format
        self._streams: dict[torch.device, Any] = {}
        if devices is not None and torch.cuda.is_available():
            for d in devices:
                if d.type == "cuda":
                    # One copy stream per device so devices never serialize behind each other.
                    self._streams[d] = torch.cuda.Stream(device=d)

    def host(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs without a device: the CPU tensors, converted to float when asked (a new tensor)."""
        if self.convert is not None:
            images = self.convert(images)
        return images, labels

    def place(self, images: torch.Tensor, labels: torch.Tensor, fence: Callable[[torch.cuda.Event], None]) -> Any:
        """Copy ``images``/``labels`` to the target devices; ``fence(event)`` guards the source slot."""
        outputs = []
        lo = 0
        devices = self.devices or []
        for device, size in zip(devices, split_sizes(images.shape[0], len(devices)), strict=False):
            img, lab = images[lo : lo + size], labels[lo : lo + size]
            lo += size
            if device.type == "cuda":
                outputs.append(self._copy_cuda(img, lab, device, fence))
            else:
                # CPU target: a real copy, so the output owns its memory like a device tensor.
                img_d = img.clone(memory_format=self.memory_format)
                outputs.append((self.convert(img_d) if self.convert is not None else img_d, lab.clone()))
        return outputs[0] if self.single else outputs

    def _copy_cuda(
        self, img: torch.Tensor, lab: torch.Tensor, device: torch.device, fence: Callable[[torch.cuda.Event], None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Untested on a GPU (none here): copy one slice on ``device``'s own stream and fence the slot."""
        stream = self._streams[device]
        with torch.cuda.device(device), torch.cuda.stream(stream):
            img_d = img.to(device, non_blocking=True)
            lab_d = lab.to(device, non_blocking=True)
            if self.convert is not None:
                img_d = self.convert(img_d)
            done = torch.cuda.Event()
            done.record(stream)
        # The host slot is refilled only once this copy has finished.
        fence(done)
        current = torch.cuda.current_stream(device)
        current.wait_stream(stream)
        # Made on the copy stream, used on the consumer's: keep the allocator from reusing them early.
        img_d.record_stream(current)
        lab_d.record_stream(current)
        return img_d, lab_d
