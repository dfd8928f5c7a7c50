"""Device stage (torch): ``fastload.torch.DataLoader``, torch's DataLoader with the engine behind it.

``fastload.torch.DataLoader`` *is* a ``torch.utils.data.DataLoader`` (a subclass, built by torch's own
``__init__``): the same signature, defaults, attributes (``dataset``, ``batch_size``, ``sampler``,
``batch_sampler``, ``collate_fn``, ...), validation errors and ``len()``. What changes is how a batch
is made when the dataset is one the engine can read (a ``torchvision.datasets.ImageFolder`` /
``DatasetFolder``, a ``Subset`` of one, a fastload dataset, or a path to one) and its transform
compiles (:mod:`fastload.torch.compile`):

1. the sampler and batch sampler run on the caller's thread, as in torch: they decide which indices
   form each batch, in which order, and consume torch's RNG where torch's iterator does (the
   iterator's ``base_seed`` draw when it is created; the sampler's draws at the first ``next()``
   with ``num_workers=0``, at ``iter()`` with workers, which pull ``prefetch_factor * num_workers``
   batches of indices up front);
2. those index batches go to a background thread that reads the records and decodes each batch in
   one engine call, crop / resize / flip fused and the output (normalized float32 / float16, or
   uint8) written by the engine straight into a ring of (pinned) batch buffers
   (:class:`fastload.loader.Loader`);
3. the batch reaches the caller as torch's ``default_collate`` would build it (``[images, targets]``,
   int64 targets), zero-copy from the ring; with a custom ``collate_fn`` the function receives the
   list of ``(image, target)`` samples torch would give it; ops the compiler could not take run per
   sample first, with their own semantics.

Per-sample randomness (crop, flip) comes from the engine's counter-based generator keyed by
``(base_seed, index)``, where ``base_seed`` is drawn from ``generator`` (or torch's global RNG) when
the iterator is created, exactly as torch draws its workers' base seed: ``torch.manual_seed`` /
``generator`` make runs reproducible, and code after the loop sees the RNG state it would see with
torch's DataLoader (with ``num_workers > 0``; per-sample Python ops also see worker-like seeding,
see :class:`DataLoader`). ``seed=`` keys the augmentation by ``(seed, epoch, index)`` instead.

Any other dataset (or a transform with no fixed-size geometry before its first uncompilable op)
is loaded by torch's own DataLoader machinery with the user's arguments; the loader says so once.

Batch lifetime: the tensors handed out are built with ``torch.from_numpy`` from the ring's numpy
views, which hold the batch's lease: a slot is refilled only once every tensor made from it is gone,
so batches the caller keeps (``list(loader)``) stay intact (:mod:`fastload.batch`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
import warnings
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.utils.data
from torch.utils.data import default_collate

from fastload.errors import LoaderClosed
from fastload.loader import Loader, LoaderConfig
from fastload.stats import LoaderStats, Stage
from fastload.torch.compile import Plan, compile_transform
from fastload.torch.datasets import ImageDataset, Source, resolve_source
from fastload.torch.placement import FLOAT_DTYPES, FloatOutput, Placement, cuda_release_fences, pinned_allocator
from fastload.torch.sampler import IndexFeed

__all__ = ["DataLoader"]

log = logging.getLogger("fastload.torch")

_STATE_VERSION = 1
_MASK63 = (1 << 63) - 1


def _is_records(obj) -> bool:
    """A fastload dataset (the records contract), not a torch Dataset."""
    return (
        not isinstance(obj, torch.utils.data.Dataset)
        and hasattr(obj, "image")
        and hasattr(obj, "labels")
        and hasattr(obj, "locate")
    )


def _positive(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` whose batches the fastload engine decodes.

    Positional and keyword arguments up to ``in_order`` are torch's, with torch's defaults, meanings
    and errors (they are handed to ``torch.utils.data.DataLoader.__init__``). On the fast path:
    ``num_workers`` is the number of decode threads (``0`` means one; there are no worker processes,
    so ``worker_init_fn``, ``multiprocessing_context`` and ``persistent_workers`` are validated and
    kept but have nothing to act on); ``pin_memory=True`` allocates the ring in page-locked memory
    when an accelerator is present, and without one warns as torch does; ``timeout`` bounds each wait
    for a batch (``RuntimeError`` as torch's).

    Keyword-only extras (fastload's; torch has none of them):

    Args:
        transform: The transform of a fastload dataset given as ``dataset`` (a path or
            ``fastload.open_dataset(...)``): a torchvision transform or a fastload op
            (``fastload.train(224)``). torchvision datasets keep their own ``transform``.
        seed: Key the per-sample randomness by ``(seed, epoch, index)`` instead of by the iterator's
            ``base_seed``; ``epoch`` is the sampler's (``DistributedSampler.set_epoch``) when it has
            one, else this loader's pass count (:meth:`set_epoch`).
        num_threads: Decode threads (default: ``max(1, num_workers)``).
        prefetch: Batches decoded ahead of the consumer (the ring has ``prefetch + 2`` slots).
        device: Copy each batch to this device (``"cuda"``, ``"cuda:1"``, ``torch.device("cpu")``).
        devices: Several devices; each gets a contiguous slice of every batch (a list per batch).
        memory_format: ``torch.channels_last`` decodes NHWC and hands out channels-last NCHW views.
        channels_last: Shorthand for ``memory_format=torch.channels_last``.
        normalize: ``(mean, std)`` in [0, 1] scale, with a fastload transform op: float output.
        dtype: Output dtype with a fastload transform op (``torch.uint8`` or a float type).
        on_error: ``"raise"`` (torch's behaviour: an unreadable image stops the loop, with an error
            naming the file) or ``"skip"`` (log it once, count it in :meth:`stats`, and decode the
            next readable record in its place, deterministically).
        decode_options: :class:`fastload.decode.DecodeOptions`.
        trace_path: Write a Chrome trace of the loader's stages there on :meth:`close`.
        copy: Hand out copies instead of zero-copy views of the ring.

    Per-sample ops that the engine cannot run (see :mod:`fastload.torch.compile`) run on the
    calling thread; with ``num_workers=0`` they use torch's global RNG as torch's in-process
    loading does, with ``num_workers > 0`` they run under torch, Python and numpy RNGs seeded from
    ``base_seed`` and the batch number (as a worker process would be), leaving the caller's RNG
    state untouched. The same holds for a custom ``collate_fn``.
    """

    def __init__(
        self,
        dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler=None,
        batch_sampler=None,
        num_workers: int = 0,
        collate_fn=None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        transform=None,
        seed: int | None = None,
        num_threads: int | None = None,
        prefetch: int = 2,
        device=None,
        devices: Sequence | None = None,
        memory_format: torch.memory_format | None = None,
        channels_last: bool = False,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        dtype: torch.dtype | None = None,
        on_error: str = "raise",
        decode_options=None,
        trace_path: str | None = None,
        copy: bool = False,
    ) -> None:
        owned_view = isinstance(dataset, (str, os.PathLike)) or _is_records(dataset)
        if owned_view:
            dataset = ImageDataset(dataset, transform=transform)
        elif transform is not None and not (isinstance(dataset, ImageDataset) and dataset.transform is transform):
            raise ValueError(
                "transform= is for fastload datasets given as a path or fastload.open_dataset(); "
                f"{type(dataset).__name__} applies its own transform"
            )
        if isinstance(shuffle, str):
            raise ValueError(
                f"shuffle={shuffle!r} must be a bool; fastload's 'global' / 'block' orders are "
                "fastload.torch.OrderSampler(dataset, shuffle=...) given as sampler="
            )
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        # Every argument is kept under its own name: Lightning re-instantiates loaders from these.
        self.transform = transform
        self.seed = None if seed is None else _positive(seed, "seed", 0)
        self.num_threads = None if num_threads is None else _positive(num_threads, "num_threads")
        self.prefetch = _positive(prefetch, "prefetch")
        self.device, self.devices = device, devices
        self.memory_format, self.channels_last = memory_format, bool(channels_last)
        self.normalize, self.dtype = normalize, dtype
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r} must be 'raise' or 'skip'")
        self.on_error = on_error
        if decode_options is not None:
            from fastload.decode import DecodeOptions

            if not isinstance(decode_options, DecodeOptions):
                raise ValueError(f"decode_options={decode_options!r} must be a fastload.decode.DecodeOptions")
        self.decode_options = decode_options
        self.trace_path = trace_path
        if not isinstance(copy, bool):
            raise ValueError(f"copy={copy!r} must be a bool")
        self.copy = copy
        self._placement_args = self._check_output_extras()
        map_style = self._dataset_kind == torch.utils.data.dataloader._DatasetKind.Map
        source = resolve_source(self.dataset) if map_style else f"{type(self.dataset).__name__} is an IterableDataset"
        self._source: Source | None = source if isinstance(source, Source) else None
        self._fallback_reason: str | None = None if self._source is not None else str(source)
        if self._fallback_reason is not None:
            self._check_fast_only_extras()
            warnings.warn(
                f"fastload: {self._fallback_reason}; this DataLoader loads it with torch's own "
                "DataLoader machinery (no engine acceleration)",
                UserWarning,
                stacklevel=2,
            )
        # A view this loader made from a path is closed with it (a loader re-instantiated from this
        # one, as Lightning does, gets the view as its dataset and does not own it).
        self._owned_view = dataset if owned_view else None
        self._core: Loader | None = None
        self._core_key: tuple | None = None
        # The last pass started (kept, as torchdata's StatefulDataLoader keeps its iterator): its
        # position is what state_dict() saves, also after the caller broke out of the loop.
        self._active: _FastIterator | None = None
        self._next_epoch = 0
        self._explicit_epoch: int | None = None
        self._resume: dict[str, Any] | None = None
        self._warned_plans: set = set()
        self._closed = False

    # --- extras ---------------------------------------------------------------------------

    def _check_output_extras(self) -> dict[str, Any]:
        devices = self.devices
        if self.device is not None and devices is not None:
            raise ValueError("give either device= or devices=, not both")
        if devices is not None:
            if isinstance(devices, (str, torch.device)) or len(devices) == 0:
                raise ValueError(f"devices={devices!r} must be a non-empty list of devices")
            targets: list[torch.device] | None = [torch.device(d) for d in devices]
        elif self.device is not None:
            targets = [torch.device(self.device)]
        else:
            targets = None
        if targets is not None:
            cuda = [d for d in targets if d.type == "cuda"]
            if len(set(cuda)) != len(cuda):
                raise ValueError(f"devices={devices!r} lists a CUDA device twice")
            for d in targets:
                if d.type not in ("cuda", "cpu"):
                    raise ValueError(f"device {d}: only 'cuda' and 'cpu' devices are supported")
                if d.type == "cuda" and not torch.cuda.is_available():
                    raise ValueError(f"device {d} requested but CUDA is not available in this torch build")
        memory_format = self.memory_format
        if self.channels_last:
            if memory_format not in (None, torch.channels_last):
                raise ValueError(f"channels_last=True conflicts with memory_format={memory_format}")
            memory_format = torch.channels_last
        memory_format = torch.contiguous_format if memory_format is None else memory_format
        if memory_format not in (torch.contiguous_format, torch.channels_last):
            raise ValueError(f"memory_format={memory_format} must be torch.contiguous_format or torch.channels_last")
        convert = None
        dtype = self.dtype
        if self.normalize is not None:
            try:
                mean, std = (tuple(float(v) for v in x) for x in self.normalize)
            except (TypeError, ValueError):
                raise ValueError(f"normalize={self.normalize!r} must be (mean, std), three floats each") from None
            if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
                raise ValueError(f"normalize={self.normalize!r} must be (mean, std) with 3 values each and std > 0")
            dtype = torch.float32 if dtype is None else dtype
        else:
            mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        if dtype is not None and dtype != torch.uint8:
            if dtype not in FLOAT_DTYPES:
                raise ValueError(f"dtype={dtype} must be torch.uint8 or a float type")
            convert = FloatOutput(dtype, 1.0 / 255.0, mean, std)
        if (self.normalize is not None or self.dtype is not None) and not self._fastload_op_transform():
            raise ValueError(
                "normalize= / dtype= apply to a fastload transform op (fastload.train(), ...); a "
                "torchvision pipeline says the same with ToTensor() / Normalize()"
            )
        return {"targets": targets, "single": devices is None, "memory_format": memory_format, "convert": convert}

    def _fastload_op_transform(self) -> bool:
        from fastload.torch.compile import is_fastload_transform

        return isinstance(self.dataset, ImageDataset) and is_fastload_transform(self.dataset.transform)

    def _check_fast_only_extras(self) -> None:
        if self._placement_args["targets"] is not None:
            raise ValueError(f"device= / devices= need a dataset the fastload engine reads ({self._fallback_reason})")

    # --- torch's interface --------------------------------------------------------------

    def __iter__(self):
        if self._closed:
            raise LoaderClosed("the DataLoader is closed")
        if self._source is None:
            return super().__iter__()
        plan = self._plan()
        if plan is None:
            return super().__iter__()
        return _FastIterator(self, plan)

    # --- fastload's extras ----------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next.

        Forwarded to the sampler / batch sampler that has ``set_epoch``, and the epoch of
        ``seed=``-keyed randomness when the sampler has none.
        """
        epoch = _positive(epoch, "epoch", 0)
        self._explicit_epoch = epoch
        samplers: tuple[Any, ...] = (self.sampler, self.batch_sampler, getattr(self.batch_sampler, "sampler", None))
        for s in samplers:
            if s is not None and hasattr(s, "set_epoch"):
                s.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: enough for :meth:`load_state_dict` to resume exactly.

        Mid-pass, the state holds the number of batches handed out, the pass's ``base_seed`` and the
        RNG, generator and sampler states from when the pass drew its first indices; between passes
        it holds the samplers' states and the explicit generators' (``generator=``, a sampler's
        ``generator``). Resuming replays the sampler from those states and skips the batches already
        handed out (no image is decoded for them): exact for torch's samplers, ``DistributedSampler``,
        :class:`~fastload.torch.OrderSampler` and samplers with ``state_dict`` / ``load_state_dict``;
        a sampler drawing from Python's or numpy's RNG is not covered. torch's global RNG is restored
        for the replay only (the caller's state is left as it was), so with ``shuffle=True`` and no
        ``generator`` the passes after the resumed one draw from the caller's RNG.
        """
        it = self._active
        position = None
        next_epoch, explicit = self._next_epoch, self._explicit_epoch
        if it is not None and not it.finished:
            if it.snapshot is not None:
                position = {
                    "batches": it.taken,
                    "base_seed": it.base_seed,
                    "epoch": it.epoch,
                    "iteration": it.iteration,
                    "snapshot": it.snapshot,
                }
            else:  # iter() was called but drew nothing yet: resuming starts that pass afresh
                next_epoch, explicit = it.iteration, None
        return {
            "version": _STATE_VERSION,
            "kind": "fastload.torch.DataLoader",
            "fingerprint": self._fingerprint(),
            "next_epoch": next_epoch,
            "explicit_epoch": explicit,
            "samplers": _sampler_states(self),
            "generators": [g.get_state() for g in _generators(self)],
            "position": position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` continues the saved pass.

        Raises:
            ValueError: Not a state of this kind of loader, or one whose dataset length, batch size or
                samplers differ.
        """
        if (
            not isinstance(state, dict)
            or state.get("kind") != "fastload.torch.DataLoader"
            or state.get("version") != _STATE_VERSION
        ):
            raise ValueError(f"not a fastload.torch.DataLoader state (version {_STATE_VERSION})")
        mine = self._fingerprint()
        diff = {k: (state["fingerprint"].get(k), v) for k, v in mine.items() if state["fingerprint"].get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: saved {a!r} != now {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"the saved DataLoader state does not match this DataLoader ({detail})")
        active = self._active
        if active is not None:
            active.close()
        self._next_epoch = int(state["next_epoch"])
        self._explicit_epoch = state.get("explicit_epoch")
        position = state.get("position")
        if position is not None:
            # The pass restarts from the states it began with, then replays its first batches.
            _load_sampler_states(self, position["snapshot"]["samplers"])
            self._resume = position
        else:
            _load_sampler_states(self, state["samplers"])
            _load_generator_states(self, state["generators"])
            self._resume = None

    def stats(self) -> LoaderStats:
        """Per-stage times, images/s and the input-bound fraction of the engine path."""
        if self._core is None:
            raise ValueError(
                "no fast-path iteration has run yet"
                if self._source is not None
                else f"this DataLoader uses torch's machinery ({self._fallback_reason})"
            )
        return self._core.stats()

    @property
    def loader(self) -> Loader | None:
        """The :class:`fastload.loader.Loader` behind the fast path (None before the first pass)."""
        return self._core

    def close(self) -> None:
        """Stop the background thread and free the ring (idempotent). Iterating afterwards raises."""
        if self._closed:
            return
        self._closed = True
        # The engine first: a consumer waiting in next() on another thread then raises LoaderClosed.
        if self._core is not None:
            self._core.close()
        active = self._active
        if active is not None:
            active.close()
        if self._owned_view is not None:
            self._owned_view.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------

    def _fingerprint(self) -> dict[str, Any]:
        try:
            length = len(self)
        except TypeError:
            length = None
        return {
            "dataset": len(self.dataset) if hasattr(self.dataset, "__len__") else None,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "batches": length,
            "sampler": type(self.sampler).__name__,
            "batch_sampler": type(self.batch_sampler).__name__,
        }

    def _plan(self) -> Plan | None:
        """The compiled transform for this pass, or None (with one warning) when nothing compiles."""
        source = self._source
        assert source is not None  # only the fast path (a Source) plans
        transform = source.transform
        if transform is None:
            plan = Plan(geometry=None, stop="the dataset has no transform (it yields PIL images of any size)")
        else:
            plan = compile_transform(transform)
        if plan.geometry is None:
            key = ("torch", plan.stop)
            if key not in self._warned_plans:
                self._warned_plans.add(key)
                self._check_fast_only_extras_for(plan)
                warnings.warn(
                    f"fastload: nothing in {type(self.dataset).__name__}'s transform compiles ({plan.stop}); "
                    "this DataLoader loads it with torch's own DataLoader machinery",
                    UserWarning,
                    stacklevel=3,
                )
            return None
        convert = self._placement_args["convert"]
        if convert is not None and self._placement_args["targets"] is None:
            # normalize= / dtype= with a fastload op and no device: the engine writes the floats. (With
            # a device the uint8 batch is copied and converted there: a quarter of the bytes to move.)
            dtype, scale, mean, std = convert.key
            plan = dataclasses.replace(plan, dtype=dtype, scale=scale, mean=mean, std=std)
        return plan

    def _check_fast_only_extras_for(self, plan: Plan) -> None:
        if self._placement_args["targets"] is not None:
            raise ValueError(f"device= / devices= need a transform the engine runs ({plan.stop})")

    def _core_loader(self, plan: Plan, capacity: int, layout: str) -> Loader:
        pin = bool(self.pin_memory) and torch.cuda.is_available()
        threads = self.num_threads if self.num_threads is not None else max(1, self.num_workers)
        spec, _ = plan.engine_transform()
        key = (spec, capacity, layout, threads, self.prefetch, pin)
        if self._core is not None and self._core_key == key:
            return self._core
        if self._core is not None:
            self._core.close()
            self._core = None
        config = LoaderConfig(
            batch_size=capacity,
            transform=spec,
            shuffle="none",
            num_threads=threads,
            prefetch=self.prefetch,
            layout=layout,
            on_error=self.on_error,
            decode_options=self.decode_options,
            trace_path=self.trace_path,
        )
        hooks = (torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop) if torch.cuda.is_available() else None
        assert self._source is not None  # the fast path runs on a Source
        self._core = Loader(
            self._source.records,
            config,
            allocator=lambda shape, dt: pinned_allocator(shape, dt, pin=pin),
            range_hooks=hooks,
            release_hook=cuda_release_fences,
        )
        self._core_key = key
        return self._core

    def _begin_pass(self) -> tuple[int, int]:
        """``(iteration, epoch)`` of a new pass: the pass counter and the epoch of ``seed=`` keys."""
        iteration = self._explicit_epoch if self._explicit_epoch is not None else self._next_epoch
        self._explicit_epoch = None
        self._next_epoch = iteration + 1
        epoch = iteration
        samplers: tuple[Any, ...] = (self.sampler, getattr(self.batch_sampler, "sampler", None), self.batch_sampler)
        for s in samplers:
            if s is not None and hasattr(s, "set_epoch") and isinstance(getattr(s, "epoch", None), int):
                epoch = int(s.epoch)
                break
        return iteration, epoch


def _generators(loader: Any) -> list[torch.Generator]:
    """The explicit torch generators the samplers (and the loader) draw from, in a fixed order."""
    found: list[torch.Generator] = []
    for obj in (loader, loader.sampler, loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)):
        g = getattr(obj, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not f for f in found):
            found.append(g)
    return found


def _load_generator_states(loader: Any, states: list[torch.Tensor]) -> None:
    gens = _generators(loader)
    if len(gens) != len(states):
        raise ValueError("the saved DataLoader state has a different set of generators")
    for g, state in zip(gens, states, strict=False):
        g.set_state(state)


def _samplers(loader: DataLoader) -> list[Any]:
    out: list[Any] = []
    for s in (loader.sampler, loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)):
        if s is not None and all(s is not o for o in out):
            out.append(s)
    return out


def _sampler_states(loader: Any) -> list[Any]:
    """Each sampler's ``state_dict()`` when it has one, else its ``epoch`` when it has ``set_epoch``."""
    states: list[Any] = []
    for s in _samplers(loader):
        if callable(getattr(s, "state_dict", None)) and callable(getattr(s, "load_state_dict", None)):
            states.append({"state_dict": s.state_dict()})
        elif callable(getattr(s, "set_epoch", None)) and isinstance(getattr(s, "epoch", None), int):
            states.append({"epoch": int(s.epoch)})
        else:
            states.append(None)
    return states


def _load_sampler_states(loader: DataLoader, states: list[Any]) -> None:
    samplers = _samplers(loader)
    if len(states) != len(samplers):
        raise ValueError("the saved DataLoader state has a different set of samplers")
    for s, state in zip(samplers, states, strict=False):
        if state is None:
            continue
        if "state_dict" in state:
            s.load_state_dict(state["state_dict"])
        else:
            s.set_epoch(state["epoch"])


class _WorkerLikeRNG:
    """Run per-sample Python the way a torch worker would: its own seeded RNGs, caller's state kept."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self):
        self._torch = torch.get_rng_state()
        self._py = random.getstate()
        self._np = np.random.get_state()  # noqa: NPY002 - saved and restored around the call, as torch's worker does
        torch.manual_seed(self.seed)
        random.seed(self.seed)
        np.random.seed(self.seed & 0xFFFFFFFF)  # noqa: NPY002
        return self

    def __exit__(self, *exc) -> None:
        torch.set_rng_state(self._torch)
        random.setstate(self._py)
        np.random.set_state(self._np)  # noqa: NPY002


class _FastIterator:
    """One pass of a :class:`DataLoader` on the engine (what ``iter(loader)`` returns)."""

    def __init__(self, loader: DataLoader, plan: Plan) -> None:
        # The iterator never refers to its DataLoader (which refers to it as its last pass): no cycle,
        # so a dropped loader and its decode thread go at once. It keeps what it needs instead.
        self._holder = SimpleNamespace(
            generator=loader.generator, sampler=loader.sampler, batch_sampler=loader.batch_sampler
        )
        self._index_sampler = loader._index_sampler
        self._collate_fn, self._num_workers = loader.collate_fn, loader.num_workers
        self._timeout, self._copy = loader.timeout, loader.copy
        self._warned = loader._warned_plans
        self.plan = plan
        self.finished = False
        self._closed = False
        # torch's _BaseDataLoaderIter.__init__: the pin_memory warnings, then the sampler iterator,
        # then the base seed.
        if loader.pin_memory and loader.pin_memory_device:
            warnings.warn(
                "pin_memory_device is deprecated, the current accelerator will be used as the device,"
                f"ignore pin_memory_device='{loader.pin_memory_device}'.",
                stacklevel=3,
            )
        if loader.pin_memory and not torch.accelerator.is_available():
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, "
                "then device pinned memory won't be used.",
                stacklevel=3,
            )
        self._pin = loader.pin_memory and torch.accelerator.is_available()
        if loader.num_workers > 0 and loader.prefetch_factor is not None and loader.prefetch_factor <= 0:
            raise ValueError("prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter")
        self._auto_collation = loader._auto_collation
        self._sampler_iter = iter(loader._index_sampler)
        resume = loader._resume
        loader._resume = None
        self._resume = resume
        if resume is None:
            self.base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item())
            self.iteration, epoch = loader._begin_pass()
        else:
            self.base_seed = int(resume["base_seed"])
            self.iteration, epoch = int(resume["iteration"]), int(resume["epoch"])
            loader._next_epoch = self.iteration + 1
        self.epoch = epoch
        source = loader._source
        assert source is not None  # the fast path runs on a Source
        self._source = source
        self._index_map = source.index_map
        self._num_records = len(source.records)
        self._dataset_len = len(self._index_map) if self._index_map is not None else self._num_records
        transform_ok = plan.is_tensor and not plan.rest
        self._target_transform = source.target_transform
        self._fast_collate = (
            self._auto_collation
            and loader.collate_fn is default_collate
            and transform_ok
            and self._target_transform is None
        )
        placement = loader._placement_args
        if placement["targets"] is not None and not self._fast_collate:
            raise ValueError(
                "device= / devices= need the default collate_fn, no target_transform and a transform "
                f"the engine runs whole (this pass: {plan.describe()})"
            )
        channels_last = placement["memory_format"] == torch.channels_last
        # Per-sample ops on PIL images want contiguous HWC rows; channels-last output is NHWC too.
        layout = "NHWC" if (plan.kind == "pil" or channels_last) else "NCHW"
        self._layout = layout
        capacity = getattr(loader.batch_sampler, "batch_size", None) if self._auto_collation else 1
        if not isinstance(capacity, int) or capacity < 1:
            capacity = loader.batch_size if isinstance(loader.batch_size, int) and loader.batch_size > 0 else 256
        self._capacity = capacity
        self._core = loader._core_loader(plan, capacity, layout)
        self._convert = plan.engine_transform()[1] if plan.is_float else None
        if placement["targets"] is not None:
            self._convert = None  # converted on each device after the copy (Placement)
        self._placement = (
            Placement(
                placement["targets"],
                single=placement["single"],
                convert=placement["convert"],
                memory_format=placement["memory_format"],
            )
            if placement["targets"]
            else None
        )
        self._feed = IndexFeed()
        seed, aug_epoch = (self.base_seed & _MASK63, 0) if loader.seed is None else (loader.seed, epoch)
        self._batches = self._core.iterate_batches(
            self._feed.batches, seed=seed, epoch=aug_epoch, timeout=loader.timeout if loader.timeout else None
        )
        self._parts: list[int] = []  # engine batches per sampler batch, in order (> 1 when split)
        self._pulled = 0
        self._sampler_done = False
        self.taken = 0
        self.snapshot: dict[str, Any] | None = None
        self._ahead = loader.prefetch + 1
        self._multi_label = source.multi_label
        self._t_rest = 0.0
        self._warn_pending = bool(plan.rest)
        active = loader._active
        if active is not None and active is not self:
            active._superseded = True
        self._superseded: bool = False
        loader._active = self
        if loader.num_workers > 0:
            # torch's multi-process iterator primes prefetch_factor batches per worker at iter().
            self._pull(max(self._ahead, (loader.prefetch_factor or 2) * loader.num_workers))

    # --- the sampler side (caller's thread) -------------------------------------------------

    def _snapshot(self) -> dict[str, Any]:
        return {
            "default": torch.get_rng_state(),
            "generators": [g.get_state() for g in _generators(self._holder)],
            "samplers": _sampler_states(self._holder),
        }

    def _next_indices(self) -> np.ndarray | None:
        try:
            item = next(self._sampler_iter)
        except StopIteration:
            return None
        return self._check_indices(item)

    def _check_indices(self, item) -> np.ndarray:
        if self._auto_collation:
            idx = np.asarray(item if not isinstance(item, torch.Tensor) else item.numpy())
            idx = idx.reshape(-1)
        else:
            idx = np.asarray([int(item)])
        floating = np.issubdtype(idx.dtype, np.floating) or idx.dtype == object
        if idx.size and not np.issubdtype(idx.dtype, np.integer) and floating:
            idx = np.asarray([int(i) for i in idx.tolist()])
        idx = idx.astype(np.int64, copy=False)
        n = self._dataset_len
        idx = np.where(idx < 0, idx + n, idx)  # negative indices count from the end, as list indexing
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"the sampler yielded index {bad}, out of range for a dataset of {n} samples")
        return idx if self._index_map is None else self._index_map[idx]

    def _start(self) -> None:
        """First draw from the sampler: remember the states it starts from (for state_dict)."""
        resume = self._resume
        if resume is None:
            self.snapshot = self._snapshot()
            return
        snap = resume["snapshot"]
        self.snapshot = snap
        user_default = torch.get_rng_state()
        torch.set_rng_state(snap["default"])
        _load_generator_states(self._holder, snap["generators"])
        try:
            # Replay the batches already handed out before the interruption, without decoding them.
            for _ in range(int(resume["batches"])):
                if self._next_indices() is None:
                    break
                self.taken += 1
        finally:
            torch.set_rng_state(user_default)

    def _pull(self, count: int) -> None:
        for _ in range(count):
            if self._sampler_done:
                return
            if self.snapshot is None:
                self._start()
            idx = self._next_indices()
            if idx is None:
                self._sampler_done = True
                self._feed.finish()
                return
            if len(idx) == 0:
                raise ValueError("the batch sampler yielded an empty batch")
            # A batch larger than the ring's slots goes through in slot-sized parts, joined again on
            # the way out (a copy).
            parts = [idx[lo : lo + self._capacity] for lo in range(0, len(idx), self._capacity)]
            for part in parts:
                self._feed.put(part)
            self._parts.append(len(parts))
            self._pulled += 1

    # --- the batch side -------------------------------------------------------------------

    def __iter__(self) -> _FastIterator:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self):
        if self._superseded and not self.finished:
            raise RuntimeError(
                "this DataLoader iterator was superseded by a newer iter() of the same "
                "fastload.torch.DataLoader, which runs one pass at a time"
            )
        if self._core.closed:
            raise LoaderClosed("the DataLoader is closed")
        if self._closed or self.finished:
            raise StopIteration
        try:
            self._pull(self._ahead if self._pulled == 0 else 1)
        except BaseException:  # the sampler's own error (a bad index, ...): the pass ends with it
            self.close()
            raise
        if not self._parts:
            self._finish()
            raise StopIteration
        nparts = self._parts.pop(0)
        timeout = self._timeout
        batches = []
        try:
            for _ in range(nparts):
                batches.append(next(self._batches))
        except TimeoutError:
            self.close()
            raise RuntimeError(f"DataLoader timed out after {timeout} seconds") from None
        except StopIteration:
            self._finish()
            if self._core.closed:
                raise LoaderClosed("the DataLoader was closed while this thread waited for a batch") from None
            if self._closed:  # this pass was closed from another thread
                raise
            raise RuntimeError("the loader ended before the sampler's batches were decoded") from None
        except BaseException:
            self.close()
            raise
        self.taken += 1
        try:
            out = self._deliver(batches)
        except BaseException:
            self.close()
            raise
        return out

    def _deliver(self, batches) -> Any:
        images, labels = self._tensors(batches)
        if self._convert is not None:
            images = self._convert(images)
        if self._copy and images.dtype == torch.uint8 and self._placement is None:
            images = images.clone()
        targets = labels if self._multi_label else labels[:, 0].to(torch.int64)
        if self._fast_collate:
            if self._placement is not None:
                core = self._core
                with core.timer.span(Stage.COPY, batch=batches[0].number):
                    placed = self._placement.place(
                        images, targets, batches[0].add_fence if len(batches) == 1 else (lambda fence: None)
                    )
                return [list(p) for p in placed] if isinstance(placed, list) else list(placed)
            out = [images, targets]
            return _pin(out) if self._pin else out
        out = self._samples_collated(images, targets)
        return _pin(out) if self._pin else out

    def _tensors(self, batches) -> tuple[torch.Tensor, torch.Tensor]:
        if len(batches) == 1:
            b = batches[0]
            images = torch.from_numpy(b.images)
            labels = torch.from_numpy(b.labels)
        else:
            images = torch.from_numpy(np.concatenate([b.images for b in batches]))
            labels = torch.from_numpy(np.concatenate([b.labels for b in batches]))
        if self._layout == "NHWC" and self.plan.kind != "pil":
            images = images.permute(0, 3, 1, 2)  # channels-last strides, no data movement
        return images, labels

    def _samples_collated(self, images: torch.Tensor, targets: torch.Tensor) -> Any:
        plan = self.plan
        n = images.shape[0]
        if plan.kind == "pil":
            from PIL import Image

            arr = images.numpy()
            pics: list[Any] = [Image.fromarray(arr[i]) for i in range(n)]
        else:
            pics = list(images.unbind(0))
            if plan.tv_image:
                from torchvision import tv_tensors

                pics = [tv_tensors.Image(p) for p in pics]
        if self._multi_label:
            tgts: list[Any] = list(targets.unbind(0))
        else:
            tgts = targets.tolist()
        rng = _WorkerLikeRNG((self.base_seed + self.taken) & _MASK63) if self._num_workers > 0 else None
        t0 = time.perf_counter()
        if rng is not None:
            rng.__enter__()
        try:
            if plan.rest:
                pics = [_apply(plan.rest, p) for p in pics]
            if self._target_transform is not None:
                tgts = [self._target_transform(t) for t in tgts]
            samples: list[Any] = list(zip(pics, tgts, strict=False))
            out = self._collate_fn(samples) if self._auto_collation else self._collate_fn(samples[0])
        finally:
            if rng is not None:
                rng.__exit__(None, None, None)
        if self._warn_pending:
            self._warn_pending = False
            seconds = time.perf_counter() - t0
            key = ("rest", plan.describe())
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(
                    f"fastload: {plan.stop}; it and the ops after it run per sample in Python on the "
                    f"calling thread, outside the engine: {seconds * 1e3:.1f} ms for this batch of {n} "
                    f"({seconds / max(n, 1) * 1e6:.0f} us per sample) on top of the engine's decode. "
                    f"Plan: {plan.describe()}",
                    UserWarning,
                    stacklevel=4,
                )
        return out

    def _finish(self) -> None:
        self.finished = True
        self._closed = True

    def close(self) -> None:
        """Stop this pass (idempotent); held batches stay valid."""
        if self._closed:
            return
        self._closed = True
        self._feed.finish()
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


def _apply(ops: Sequence[Any], sample):
    for op in ops:
        sample = op(sample)
    return sample


def _pin(data):
    from torch.utils.data._utils.pin_memory import pin_memory

    acc = torch.accelerator.current_accelerator()
    return pin_memory(data, acc.type if acc is not None else None)
