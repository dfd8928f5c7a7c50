"""Device stage for PyTorch: ``fastload.torch.DataLoader``, pinned slots, per-device copies, DDP.

A thin adapter over :class:`fastload.loader.Loader`: it supplies the ring's allocator (pinned torch
tensors when CUDA is available), reads rank and world size from ``torch.distributed``, and turns each
ring batch into torch tensors on the target device(s).

Drop-in use::

    loader = fastload.torch.DataLoader("train-packed/", batch_size=256, shuffle=True,
                                       transform=fastload.train(224), device="cuda",
                                       normalize=((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                                       dtype=torch.float16)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:
            ...

Output: ``(images, labels)``; images are uint8 NCHW by default (``channels_last=True`` gives the
same logical NCHW shape with channels-last strides, decoded that way, without a transpose). With
``dtype`` a float type, the uint8 batch is copied to the device first and converted there (values
scaled to [0, 1] as ``ToTensor``, then ``normalize=(mean, std)`` if given, in that [0, 1] scale).
Labels are int64 ``[B]`` for single-label datasets and float32 ``[B, W]`` for multi-label ones.

Without ``device``/``devices`` the tensors are CPU views of a ring slot (``torch.from_numpy`` of the
batch's views): they stay valid for as long as you keep them, as torch's own batches do. The slot
is refilled only after the last tensor sharing its memory is freed (:mod:`fastload.batch`); keeping
many batches (``list(loader)``) makes the ring grow to its bound, then batches come in fresh memory
with one warning. ``copy=True`` still yields owned copies. With a device, the outputs are fresh
device tensors the caller owns.

A ``non_blocking`` copy of your own out of a pinned batch (``x.to("cuda", non_blocking=True)``) is
safe too: when a batch's last reference dies and CUDA is initialized, the loader records an event
on the current stream of every CUDA device that has a context (:func:`cuda_release_fences`; the
stream current *on the thread where the reference dies*, normally the training loop's), and the slot
is not refilled before those events complete.

Several devices in one process (``devices=[...]``): every batch is split into ``len(devices)``
contiguous slices (sizes differ by at most one); each slice is copied from the pinned slot straight to
its device, on that device's own CUDA stream with ``non_blocking=True``; an event recorded after the
copy is attached to the slot, and the ring does not refill the slot before every such event has
completed. The consumer's current stream on each device waits for the copy stream, and the outputs are
``record_stream``-ed to it. Nothing goes through a master device. The iterator then yields a list of
``(images, labels)``, one per device.

What has *not* run on a GPU (this was developed on a CPU-only machine, torch 2.13 CPU build): the
CUDA branches -- pinned allocation, per-device streams and events, ``non_blocking`` copies,
``record_stream``, on-device conversion, NVTX ranges, the release hook's events. They use only torch's
standard calls and are guarded by ``torch.cuda.is_available()`` / ``torch.cuda.is_initialized()``; the
identical split / convert / fence logic is exercised by the tests with ``torch.device("cpu")`` entries
and stand-in events.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from fastload.batch import Batch, Layout
from fastload.loader import Loader, LoaderConfig
from fastload.stats import LoaderStats, Stage
from fastload.transforms import Transform, train

__all__ = ["DataLoader", "pinned_allocator", "split_sizes", "cuda_release_fences"]

_TORCH_DTYPES = {np.dtype(np.uint8): torch.uint8, np.dtype(np.float32): torch.float32,
                 np.dtype(np.float16): torch.float16, np.dtype(np.int64): torch.int64}
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def pinned_allocator(shape: Tuple[int, ...], dtype: np.dtype, *, pin: Optional[bool] = None) -> Tuple[np.ndarray, torch.Tensor]:
    """Allocate a ring buffer as a torch tensor, page-locked when CUDA is available.

    ``torch.empty(..., pin_memory=True)`` raises on a CPU-only build, so pinning is requested only
    when ``torch.cuda.is_available()`` (or when ``pin`` forces it).

    Returns:
        ``(numpy view, tensor)`` sharing the same memory.
    """
    if pin is None:
        pin = torch.cuda.is_available()
    tensor = torch.empty(tuple(shape), dtype=_TORCH_DTYPES[np.dtype(dtype)], pin_memory=bool(pin))
    return tensor.numpy(), tensor


def cuda_release_fences() -> List[Any]:
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


def split_sizes(n: int, parts: int) -> List[int]:
    """Sizes of ``parts`` contiguous slices of ``n`` rows, the first ones larger by one when uneven."""
    base, extra = divmod(n, parts)
    return [base + (1 if p < extra else 0) for p in range(parts)]


def _distributed_rank_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    return int(rank), int(world_size)


def _shuffle_mode(shuffle: Union[bool, str]) -> str:
    if shuffle is True:
        return "global"
    if shuffle is False or shuffle is None:
        return "none"
    return shuffle


class DataLoader:
    """A streaming image loader yielding torch tensors; argument names follow ``torch.utils.data.DataLoader``.

    Args:
        dataset_or_path: A fastload dataset (``fastload.open_dataset``) or a path it accepts: a packed
            folder, a ``.rec`` file, an LMDB folder, or an unpacked ImageFolder tree.
        batch_size: Samples per batch.
        shuffle: ``True`` (``"global"``), ``False`` (``"none"``), or ``"global"`` / ``"block"`` / ``"none"``.
        seed: Seed of the order and the random crops.
        drop_last: Drop a final partial batch.
        transform: A :mod:`fastload.transforms` op (default ``fastload.train(224)``).
        num_threads: Decode threads (default: all usable CPUs). ``num_workers`` is an alias
            (``num_workers=0`` means one thread).
        prefetch: Batches decoded ahead.
        device: Target device (``"cuda"``, ``"cuda:1"``, ``torch.device("cpu")``) or None for CPU
            views of the ring.
        devices: Several target devices; each gets its own slice of every batch (see module docs).
        memory_format: ``torch.contiguous_format`` (default) or ``torch.channels_last``.
        channels_last: Shorthand for ``memory_format=torch.channels_last``.
        normalize: ``(mean, std)`` per channel in [0, 1] scale, applied on the device; implies a
            float ``dtype`` (float32 unless given).
        dtype: Output image dtype: ``torch.uint8`` (default) or a float type (converted on the device).
        rank: This process's rank (default: ``torch.distributed`` when initialized, else 0).
        world_size: Number of ranks (default: ``torch.distributed`` when initialized, else 1).
        num_workers: Alias of ``num_threads``.
        pin_memory: Pin the ring (default: when a CUDA device is targeted and CUDA is available).
        on_error: ``"skip"`` or ``"raise"`` for bad records.
        copy: Yield owned copies instead of ring views when no device is given (not needed for
            safety: ring views are never overwritten while a tensor made from them is alive).
        even: ``"pad"`` or ``"drop"``: how ranks get equal shares.
        **options: Further :class:`fastload.loader.LoaderConfig` fields (``block_size``, ``window``,
            ``read_ahead``, ``decode_options``, ``trace_path``, ``max_substitutes``).
    """

    def __init__(self, dataset_or_path, batch_size: int = 256, shuffle: Union[bool, str] = True, seed: int = 0,
                 drop_last: bool = False, transform: Optional[Transform] = None, num_threads: Optional[int] = None,
                 prefetch: int = 2, device=None, devices: Optional[Sequence] = None, memory_format=None,
                 channels_last: bool = False, normalize: Optional[Tuple[Sequence[float], Sequence[float]]] = None,
                 dtype: Optional[torch.dtype] = None, rank: Optional[int] = None, world_size: Optional[int] = None, *,
                 num_workers: Optional[int] = None, pin_memory: Optional[bool] = None, on_error: str = "skip",
                 copy: bool = False, even: str = "pad", **options: Any) -> None:
        if num_workers is not None:
            if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
                raise ValueError(f"num_workers={num_workers!r} must be an int >= 0")
            threads = max(1, num_workers)
            if num_threads is not None and num_threads != threads:
                raise ValueError(f"num_threads={num_threads} and num_workers={num_workers} disagree; give one")
            num_threads = threads
        if device is not None and devices is not None:
            raise ValueError("give either device= or devices=, not both")
        if devices is not None:
            if isinstance(devices, (str, torch.device)) or len(devices) == 0:
                raise ValueError(f"devices={devices!r} must be a non-empty list of devices")
            self.devices: Optional[List[torch.device]] = [torch.device(d) for d in devices]
        elif device is not None:
            self.devices = [torch.device(device)]
        else:
            self.devices = None
        self._single = devices is None
        if self.devices is not None:
            cuda_devices = [d for d in self.devices if d.type == "cuda"]
            if len(set(cuda_devices)) != len(cuda_devices):
                raise ValueError(f"devices={devices!r} lists a CUDA device twice")
            for d in self.devices:
                if d.type == "cuda" and not torch.cuda.is_available():
                    raise ValueError(f"device {d} requested but CUDA is not available in this torch build")
                if d.type not in ("cuda", "cpu"):
                    raise ValueError(f"device {d}: only 'cuda' and 'cpu' devices are supported")
        if channels_last:
            if memory_format not in (None, torch.channels_last):
                raise ValueError(f"channels_last=True conflicts with memory_format={memory_format}")
            memory_format = torch.channels_last
        memory_format = torch.contiguous_format if memory_format is None else memory_format
        if memory_format not in (torch.contiguous_format, torch.channels_last):
            raise ValueError(f"memory_format={memory_format} must be torch.contiguous_format or torch.channels_last")
        self.memory_format = memory_format
        if normalize is not None:
            try:
                mean, std = (tuple(float(v) for v in x) for x in normalize)
            except (TypeError, ValueError):
                raise ValueError(f"normalize={normalize!r} must be (mean, std), three floats each") from None
            if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
                raise ValueError(f"normalize={normalize!r} must be (mean, std) with 3 values each and std > 0")
            self._normalize: Optional[Tuple[Tuple[float, ...], Tuple[float, ...]]] = (mean, std)
            dtype = torch.float32 if dtype is None else dtype
        else:
            self._normalize = None
        if dtype is not None and dtype != torch.uint8 and dtype not in _FLOAT_DTYPES:
            raise ValueError(f"dtype={dtype} must be torch.uint8 or a float type")
        self.dtype = torch.uint8 if dtype is None else dtype
        rank, world_size = _distributed_rank_world(rank, world_size)
        cuda_targets = self.devices is not None and any(d.type == "cuda" for d in self.devices)
        if pin_memory is None:
            pin_memory = cuda_targets and torch.cuda.is_available()
        if pin_memory and not torch.cuda.is_available():
            raise ValueError("pin_memory=True needs CUDA; this torch build has none")
        self.pin_memory = bool(pin_memory)
        config = LoaderConfig(batch_size=batch_size, transform=transform if transform is not None else train(),
                              shuffle=_shuffle_mode(shuffle), seed=seed, drop_last=drop_last, even=even, rank=rank,
                              world_size=world_size, num_threads=num_threads, prefetch=prefetch,
                              layout=Layout.NHWC if memory_format == torch.channels_last else Layout.NCHW,
                              on_error=on_error, copy=copy and self.devices is None, **options)
        hooks = (torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop) if torch.cuda.is_available() else None
        pin = self.pin_memory
        self.loader = Loader(dataset_or_path, config, allocator=lambda shape, dt: pinned_allocator(shape, dt, pin=pin),
                             range_hooks=hooks, release_hook=cuda_release_fences)
        self.dataset = self.loader.dataset
        self.batch_size = batch_size
        self.multi_label = self.loader.label_width > 1
        self._streams: Dict[torch.device, Any] = {}
        if self.devices is not None and torch.cuda.is_available():
            for d in self.devices:
                if d.type == "cuda":
                    # One copy stream per device so devices never serialize behind each other.
                    self._streams[d] = torch.cuda.Stream(device=d)
        self._affine: Dict[Tuple[torch.device, torch.dtype], Tuple[torch.Tensor, torch.Tensor]] = {}

    # --- torch DataLoader-like API ----------------------------------------------------------

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> "_TorchIterator":
        # Not stored on self: the iterator refers to the loader, and a reference back would be a
        # cycle that keeps closed loaders (and their rings) alive until a full garbage collection.
        return _TorchIterator(self, iter(self.loader))

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next (as ``DistributedSampler.set_epoch``)."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def stats(self) -> LoaderStats:
        """Per-stage time, images/s and input-bound fraction (:class:`fastload.stats.LoaderStats`)."""
        return self.loader.stats()

    def close(self) -> None:
        """Stop the background thread and free the ring; idempotent."""
        self.loader.close()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- batch -> tensors -------------------------------------------------------------------

    def _host_tensors(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
        # From the batch's views, never the allocator's owner tensors: the tensors then hold the
        # batch's lease, so the slot is not refilled while they are alive (fastload.batch).
        images = torch.from_numpy(batch.images)
        if self.memory_format == torch.channels_last:
            # NHWC memory seen as NCHW with channels-last strides: no data movement.
            images = images.permute(0, 3, 1, 2)
        return images, torch.from_numpy(batch.labels)

    def _labels_out(self, labels: torch.Tensor) -> torch.Tensor:
        return labels if self.multi_label else labels[:, 0].to(torch.int64)

    def _convert(self, images: torch.Tensor) -> torch.Tensor:
        if self.dtype == torch.uint8:
            return images
        out = images.to(self.dtype)
        if self._normalize is None:
            return out.div_(255.0)
        key = (out.device, self.dtype)
        if key not in self._affine:
            mean, std = (torch.tensor(v, dtype=torch.float64) for v in self._normalize)
            # (x / 255 - mean) / std == x * scale - shift, one fused pass on the device.
            scale = (1.0 / (255.0 * std)).to(device=out.device, dtype=self.dtype).view(1, 3, 1, 1)
            shift = (mean / std).to(device=out.device, dtype=self.dtype).view(1, 3, 1, 1)
            self._affine[key] = (scale, shift)
        scale, shift = self._affine[key]
        return out.mul_(scale).sub_(shift)

    def _deliver(self, batch: Batch):
        images, labels = self._host_tensors(batch)
        if self.devices is None:
            if self.dtype != torch.uint8:
                images = self._convert(images)  # no device: the conversion can only run here
            return images, self._labels_out(labels)
        outputs = []
        timer = self.loader.timer
        with timer.span(Stage.COPY, batch=batch.number):
            lo = 0
            for device, size in zip(self.devices, split_sizes(batch.size, len(self.devices))):
                img, lab = images[lo:lo + size], labels[lo:lo + size]
                lo += size
                if device.type == "cuda":
                    outputs.append(self._copy_cuda(batch, img, lab, device))
                else:
                    # CPU target: a real copy, so the output owns its memory like a device tensor.
                    img_d = img.clone(memory_format=self.memory_format)
                    outputs.append((self._convert(img_d), self._labels_out(lab.clone())))
        return outputs[0] if self._single else outputs

    def _copy_cuda(self, batch: Batch, img: torch.Tensor, lab: torch.Tensor, device: torch.device):
        """Untested on a GPU (none here): copy one slice on ``device``'s own stream and fence the slot."""
        stream = self._streams[device]
        with torch.cuda.device(device), torch.cuda.stream(stream):
            img_d = img.to(device, non_blocking=True)
            lab_d = lab.to(device, non_blocking=True)
            img_d = self._convert(img_d)
            lab_d = self._labels_out(lab_d)
            done = torch.cuda.Event()
            done.record(stream)
        # The host slot is refilled only once this copy has finished.
        batch.add_fence(done)
        current = torch.cuda.current_stream(device)
        current.wait_stream(stream)
        # Made on the copy stream, used on the consumer's: keep the allocator from reusing them early.
        img_d.record_stream(current)
        lab_d.record_stream(current)
        return img_d, lab_d


class _TorchIterator:
    """One epoch of tensors; wraps the loader's epoch iterator."""

    def __init__(self, owner: DataLoader, inner) -> None:
        self._owner, self._inner = owner, inner

    def __iter__(self) -> "_TorchIterator":
        return self

    def __len__(self) -> int:
        return len(self._inner)

    def __next__(self):
        batch = next(self._inner)
        try:
            return self._owner._deliver(batch)
        except BaseException:
            self._inner.close()
            raise

    def close(self) -> None:
        self._inner.close()
