"""The loader's configuration: ``LoaderConfig`` and the checks of its values."""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import fastload.transforms as _transforms
from fastload.batch import Layout
from fastload.errors import OnError
from fastload.order import Even, Shuffle, coerce_enum
from fastload.records.read_options import ReadOptions
from fastload.transforms import train
from fastload.transforms.pipeline import GeometryOp, Pipeline

# Image dtypes a ring slot can hold: raw pixels, or the engine's normalized floats.
IMAGE_DTYPES = (np.dtype(np.uint8), np.dtype(np.float32), np.dtype(np.float16))


def _positive_int(value: object, name: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")


def _transform_types() -> tuple[type, ...]:
    """The transform classes fastload.transforms offers (geometry ops, and a Pipeline when present)."""
    types = tuple(t for t in typing.get_args(_transforms.Transform) if isinstance(t, type))
    if not types and isinstance(_transforms.Transform, type):
        types = (_transforms.Transform,)
    extra = tuple(
        cls
        for cls in (getattr(_transforms, "MXNetDefaultAugment", None), getattr(_transforms, "Pipeline", None))
        if isinstance(cls, type)
    )
    return types + extra


def transform_image_dtype(transform: Any) -> np.dtype[Any] | None:
    """The image dtype a transform writes, when it says: ``output_dtype``, or its ``normalize.dtype``.

    Returns None for transforms that do not declare one (plain geometry ops write uint8).
    """
    declared = getattr(transform, "output_dtype", None)
    if declared is None:
        norm = getattr(transform, "normalize", None)
        declared = getattr(norm, "dtype", None) if norm is not None else None
    return None if declared is None else np.dtype(declared)


def _dtype_or_none(value: Any, name: str) -> np.dtype[Any] | None:
    if value is None:
        return None
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} is not a dtype") from None
    if dtype not in IMAGE_DTYPES:
        raise ValueError(f"{name}={value!r} must be one of {[d.name for d in IMAGE_DTYPES]}")
    return dtype


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How a :class:`Loader` reads, orders, decodes and buffers.

    Args:
        batch_size: Samples per batch.
        transform: The augmentation spec (:mod:`fastload.transforms`); default ``train(224)``.
        shuffle: ``"none"``, ``"global"`` (full permutation), ``"block"`` (block + window shuffle,
            for data larger than RAM) or ``"shard"`` (whole shards per rank, shuffled in windows of
            shards). See docs/slow-disks.md for what each costs in randomness and gains on a disk.
        seed: Non-negative seed of the order and of every random crop.
        drop_last: Drop a final batch smaller than ``batch_size``.
        even: How ranks get equal shares: ``"pad"`` (repeat records) or ``"drop"`` (drop the rest).
        rank: This process's rank.
        world_size: Number of ranks.
        num_threads: Decode threads (None: every CPU this process may use).
        prefetch: Batches decoded ahead of the consumer; the ring starts with ``prefetch + 2`` slots.
        layout: ``"NCHW"`` or ``"NHWC"`` image layout in the slots.
        on_error: ``"skip"`` or ``"raise"`` for bad records (see the module docstring).
        block_size: Records per block for ``shuffle="block"``.
        window: Blocks per shuffle window for ``shuffle="block"``.
        read_ahead: With ``read_options=None``: batches beyond the one being decoded whose records
            are hinted to the OS (``posix_fadvise``).
        read_options: How records are read ahead of the decode
            (:class:`fastload.records.readahead.ReadOptions`: reads in flight, byte budget, the gap
            bridged between neighbouring records): the records of the coming batches in decode
            order, neighbours coalesced into one read, ``queue_depth`` reads in parallel. None reads
            each batch's records one by one on the producer thread (fine from the page cache).
        copy: Hand out detached copies instead of ring views (one memcpy per batch). Not needed for
            safety: ring views are never overwritten while they are alive.
        decode_options: ``fastload.decode.DecodeOptions`` (max_pixels, IDCT, ...); None for defaults.
        max_substitutes: How many following records ``on_error="skip"`` tries before giving up
            on a position (a run of that many bad records is an error).
        trace_path: Write a Chrome-trace JSON of the stages there on :meth:`Loader.close` (and
            whenever :meth:`Loader.save_trace` is called).
        image_dtype: dtype of the images in the slots: ``"uint8"``, ``"float32"`` or ``"float16"``.
            None (default) takes the transform's (a transform that normalizes declares its float
            dtype; plain geometry ops write uint8). Given together with a transform that declares
            another dtype, it is an error.
        max_extra_slots: How many slots the ring may add when the consumer keeps more than two
            batches (None: ``prefetch + 2``, so the ring at most doubles); beyond that, batches come
            in fresh memory (see :mod:`fastload.batch`).
        round_batch: Complete a final partial batch with the first records of the epoch's order
            (repeated as often as needed), as MXNet's ``ImageRecordIter(round_batch=True)``: every
            batch has ``batch_size`` rows, and the repeated rows are read and decoded like the others
            (``on_error``, stats). The epoch's last batch then repeats
            ``len(loader) * batch_size - records in this rank's share`` rows at its end.
        mix: A batch op (``fastload.transforms.MixUp``, ``CutMix`` or ``RandomChoice`` of them;
            torchvision v2 semantics) applied to every batch in the engine's output stage, keyed by
            the batch's first sample in the epoch's order; ``batch.labels`` are then the float32
            ``[B, num_classes]`` soft labels. Substituted bad records are mixed in like the others.
    """

    batch_size: int = 256
    transform: Pipeline | GeometryOp = field(default_factory=train)
    shuffle: Shuffle | str = Shuffle.GLOBAL
    seed: int = 0
    drop_last: bool = False
    even: Even | str = Even.PAD
    rank: int = 0
    world_size: int = 1
    num_threads: int | None = None
    prefetch: int = 2
    layout: Layout | str = Layout.NCHW
    on_error: OnError | str = OnError.SKIP
    block_size: int = 256
    window: int = 8
    read_ahead: int = 2
    read_options: ReadOptions | None = field(default_factory=ReadOptions)
    copy: bool = False
    decode_options: Any = None
    max_substitutes: int = 64
    trace_path: str | None = None
    image_dtype: Any = None
    max_extra_slots: int | None = None
    round_batch: bool = False
    mix: Any = None

    def __post_init__(self) -> None:
        _positive_int(self.batch_size, "batch_size")
        if not isinstance(self.transform, _transform_types()):
            raise ValueError(
                f"transform={self.transform!r} must be a fastload.transforms op "
                "(train(), eval_transform(), RandomResizedCrop, CenterCrop, Resize, RandomCrop, "
                "MXNetDefaultAugment, a Pipeline)"
            )
        object.__setattr__(self, "shuffle", coerce_enum(Shuffle, self.shuffle, "shuffle"))
        object.__setattr__(self, "even", coerce_enum(Even, self.even, "even"))
        object.__setattr__(self, "layout", coerce_enum(Layout, self.layout, "layout"))
        object.__setattr__(self, "on_error", coerce_enum(OnError, self.on_error, "on_error"))
        _positive_int(self.seed, "seed", 0)
        _positive_int(self.world_size, "world_size")
        if (
            isinstance(self.rank, bool)
            or not isinstance(self.rank, (int, np.integer))
            or not 0 <= self.rank < self.world_size
        ):
            raise ValueError(f"rank={self.rank!r} must be an int in [0, world_size={self.world_size})")
        if self.num_threads is not None:
            _positive_int(self.num_threads, "num_threads")
        _positive_int(self.prefetch, "prefetch")
        _positive_int(self.block_size, "block_size")
        _positive_int(self.window, "window")
        _positive_int(self.read_ahead, "read_ahead", 0)
        if self.read_options is not None and not isinstance(self.read_options, ReadOptions):
            raise ValueError(
                f"read_options={self.read_options!r} must be a fastload.records.readahead.ReadOptions or None"
            )
        _positive_int(self.max_substitutes, "max_substitutes")
        if self.max_extra_slots is not None:
            _positive_int(self.max_extra_slots, "max_extra_slots", 0)
        for name in ("drop_last", "copy", "round_batch"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        if self.decode_options is not None:
            from fastload.decode import DecodeOptions

            if not isinstance(self.decode_options, DecodeOptions):
                raise ValueError(f"decode_options={self.decode_options!r} must be a fastload.decode.DecodeOptions")
        if self.trace_path is not None and not isinstance(self.trace_path, (str, os.PathLike)):
            raise ValueError(f"trace_path={self.trace_path!r} must be a path or None")
        if self.mix is not None and not isinstance(
            self.mix, (_transforms.MixUp, _transforms.CutMix, _transforms.RandomChoice)
        ):
            raise ValueError(f"mix={self.mix!r} must be a fastload.transforms MixUp, CutMix or RandomChoice, or None")
        wanted = _dtype_or_none(self.image_dtype, "image_dtype")
        declared = _dtype_or_none(transform_image_dtype(self.transform), "the transform's output dtype")
        if wanted is not None and declared is not None and wanted != declared:
            raise ValueError(f"image_dtype={wanted.name} conflicts with the transform, which writes {declared.name}")
        object.__setattr__(self, "image_dtype", wanted or declared or np.dtype(np.uint8))
