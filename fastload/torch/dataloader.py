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

The class is here with its argument checks and its state; what a pass runs in the engine is
planned in :mod:`fastload.torch.planning`, a pass is iterated in :mod:`fastload.torch.iteration`, and
the sampler and generator states live in :mod:`fastload.torch.state`.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.utils.data

from fastload.errors import LoaderClosed, ResumeStateError
from fastload.loader import Loader
from fastload.position import Position, make_state, read_state
from fastload.records.read_options import ReadOptions
from fastload.stats import LoaderStats
from fastload.torch.datasets import ImageDataset, Source, resolve_source
from fastload.torch.iteration import _FastIterator
from fastload.torch.planning import _EnginePlanning
from fastload.torch.sampler import OrderSampler

if TYPE_CHECKING:
    from fastload.decode import DecodeOptions
from fastload.torch.state import (
    _generators,
    _load_generator_states,
    _load_sampler_states,
    _sampler_states,
    order_sampler,
    plain,
    unplain,
    world_size,
)

__all__ = ["DataLoader"]

log = logging.getLogger("fastload.torch")

_KIND = "fastload.torch.DataLoader"


def _is_records(obj: object) -> bool:
    """A fastload dataset (the records contract), not a torch Dataset."""
    return (
        not isinstance(obj, torch.utils.data.Dataset)
        and hasattr(obj, "image")
        and hasattr(obj, "labels")
        and hasattr(obj, "locate")
    )


def _positive(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


class DataLoader(_EnginePlanning):
    """``torch.utils.data.DataLoader`` whose batches the fastload engine decodes.

    Positional and keyword arguments up to ``in_order`` are torch's, with torch's defaults, meanings
    and errors (they are handed to ``torch.utils.data.DataLoader.__init__``). On the fast path:
    ``num_workers`` is the number of decode threads (``0`` means one) and, for a custom ``collate_fn``
    with ``num_workers >= 2``, of the forked processes that run it (:mod:`fastload.torch.collate_procs`);
    ``worker_init_fn``, ``multiprocessing_context`` and ``persistent_workers`` are validated and kept
    but have nothing to act on; ``pin_memory=True`` allocates the ring in page-locked memory
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
        read_options: :class:`fastload.records.readahead.ReadOptions` for packed shards: how records
            are read ahead of the decode (``ReadOptions(direct=True)`` for a dataset larger than
            the RAM on a local disk, see docs/slow-disks.md). None: the defaults.
        trace_path: Write a Chrome trace of the loader's stages there on :meth:`close`.
        copy: Hand out copies instead of zero-copy views of the ring.

    Per-sample ops that the engine cannot run (see :mod:`fastload.torch.compile`) run on the
    calling thread; with ``num_workers=0`` they use torch's global RNG as torch's in-process
    loading does, with ``num_workers > 0`` they run under torch, Python and numpy RNGs seeded from
    ``base_seed`` and the batch number and with one intra-op thread (as in a worker process),
    leaving the caller's RNG state and thread count untouched. The same holds for a custom
    ``collate_fn``.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: torch.utils.data.Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: torch.utils.data.Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        transform: Any = None,
        seed: int | None = None,
        num_threads: int | None = None,
        prefetch: int = 2,
        device: torch.device | str | int | None = None,
        devices: Sequence[torch.device | str | int] | None = None,
        memory_format: torch.memory_format | None = None,
        channels_last: bool = False,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        dtype: torch.dtype | None = None,
        on_error: str = "raise",
        decode_options: DecodeOptions | None = None,
        read_options: ReadOptions | None = None,
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
        # seed= with shuffle=True and neither a generator nor a sampler: torch's RandomSampler draws
        # from a generator seeded from (seed, epoch) when each pass starts (docs/checkpoint-resume.md).
        self._order_generator: torch.Generator | None = None
        if (
            self.seed is not None
            and shuffle
            and sampler is None
            and batch_sampler is None
            and generator is None
            and isinstance(self.sampler, torch.utils.data.RandomSampler)
            and self.sampler.generator is None
        ):
            self._order_generator = torch.Generator()
            self.sampler.generator = self._order_generator
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
        if read_options is not None and not isinstance(read_options, ReadOptions):
            raise ValueError(f"read_options={read_options!r} must be a fastload.records.readahead.ReadOptions")
        self.read_options = read_options if read_options is not None else ReadOptions()
        self.trace_path = trace_path
        if not isinstance(copy, bool):
            raise ValueError(f"copy={copy!r} must be a bool")
        self.copy = copy
        self._placement_args = self._check_output_extras()
        map_style = self._dataset_kind == torch.utils.data.dataloader._DatasetKind.Map
        source = resolve_source(self.dataset) if map_style else f"{type(self.dataset).__name__} is an IterableDataset"
        self._source = source if isinstance(source, Source) else None
        self._fallback_reason = None if self._source is not None else str(source)
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
        self._core = None
        self._core_key = None
        # The last pass started (kept, as torchdata's StatefulDataLoader keeps its iterator): its
        # position is what state_dict() saves, also after the caller broke out of the loop.
        self._active: _FastIterator | None = None
        self._next_epoch = 0
        self._explicit_epoch = None
        self._resume = None
        self._warned_plans = set()
        self._closed = False

    # --- torch's interface --------------------------------------------------------------

    def __iter__(self) -> Any:  # torch's own iterator, or the engine's _FastIterator
        if self._closed:
            raise LoaderClosed("the DataLoader is closed")
        if self._source is None:
            return self._torch_iter()
        plan = self._plan()
        if plan is None:
            return self._torch_iter()
        it = _FastIterator(self, plan)
        active = self._active
        if active is not None and active is not it:
            active._superseded = True
        self._active = it
        it.prime()
        return it

    # --- fastload's extras ----------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next.

        Forwarded to the sampler / batch sampler that has ``set_epoch``, and the epoch of
        ``seed=``-keyed randomness (and order, see :class:`DataLoader`) when the sampler has none.
        After :meth:`load_state_dict`, ``set_epoch`` of the saved epoch keeps the saved position.
        """
        epoch = _positive(epoch, "epoch", 0)
        self._explicit_epoch = epoch
        if self._resume is not None and int(self._resume.get("epoch", -1)) != epoch:
            self._resume = None  # another epoch than the loaded pass's: it starts from its beginning
        samplers: tuple[Any, ...] = (self.sampler, self.batch_sampler, getattr(self.batch_sampler, "sampler", None))
        for s in samplers:
            if s is not None and hasattr(s, "set_epoch"):
                s.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: enough for :meth:`load_state_dict` to resume exactly.

        A plain dict of ints, strings, lists and dicts (``torch.save`` with ``weights_only=True``,
        ``json``, ``pickle``), versioned and checked on load (:mod:`fastload.position`); see
        ``docs/checkpoint-resume.md``. Only batches handed out count, not those decoded ahead.

        With :class:`~fastload.torch.OrderSampler` the position is the sampler's, counted in samples:
        it restores under another world size, batch size, ``num_workers``, ``num_threads`` or
        ``prefetch``, and every rank saves the same state. With torch's samplers, mid-pass, the
        state holds the number of batches handed out, the pass's ``base_seed`` and the RNG, generator
        and sampler states from when the pass drew its first indices; between passes it holds the
        samplers' states and the explicit generators' (``generator=``, a sampler's ``generator``).
        Resuming replays the sampler from those states and skips the batches already handed out (no
        image is decoded for them): exact for torch's samplers, ``DistributedSampler`` and samplers
        with ``state_dict`` / ``load_state_dict``, at the same world size only; a sampler drawing
        from Python's or numpy's RNG is not covered. torch's global RNG is restored for the replay
        only (the caller's state is left as it was), so with ``shuffle=True`` and neither
        ``generator`` nor ``seed=`` the passes after the resumed one draw from the caller's RNG.
        """
        it = self._active
        sampler = order_sampler(self)
        position: dict[str, Any] = {}
        next_epoch, explicit = self._next_epoch, self._explicit_epoch
        order_kwargs: dict[str, Any] = {}
        if it is not None and not it.finished:
            if it.snapshot is None:  # iter() was called but drew nothing yet: resuming starts that pass afresh
                next_epoch, explicit = it.iteration, None
            elif sampler is None:
                position = {
                    "batches": it.taken,
                    "base_seed": it.base_seed,
                    "epoch": it.epoch,
                    "iteration": it.iteration,
                    "snapshot": plain(it.snapshot),
                }
            else:
                finished = self._order_pass_done(it, sampler)
                order_kwargs = {"handed_out": it.samples, "finished": finished}
                if not finished:
                    position = {"base_seed": it.base_seed, "epoch": it.epoch, "iteration": it.iteration}
        return make_state(
            _KIND,
            Position(int(next_epoch)),
            self._fingerprint(),
            explicit=-1 if explicit is None else int(explicit),
            world=world_size(self),
            samplers=plain(_sampler_states(self, order_kwargs)),
            generators=plain([g.get_state() for g in _generators(self)]),
            position=position,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` continues the saved pass.

        Raises:
            ResumeStateError: Not a state of this kind of loader, a newer format, a damaged state, one
                whose dataset or samplers differ (or batch size, with torch's samplers), or one saved
                under another world size with torch's samplers (the message names ``OrderSampler``,
                which restores under any). A ``ValueError``.
        """
        sampler = order_sampler(self)
        saved_world = state.get("world") if isinstance(state, dict) and state.get("kind") == _KIND else None
        if sampler is None and isinstance(saved_world, int) and saved_world != world_size(self):
            # Named first: the batch counts that differ too follow from it.
            raise ResumeStateError(
                f"the saved DataLoader state was taken with world size {saved_world}, this job has "
                f"{world_size(self)}: torch's samplers ({type(self.sampler).__name__}) resume only at the same "
                "world size; with sampler=fastload.torch.OrderSampler(dataset, ...) a state restores under any"
            )
        saved, values = read_state(
            state,
            kind=_KIND,
            fingerprint=self._fingerprint(),
            extra={"explicit": int, "world": int, "samplers": list, "generators": list, "position": dict},
        )
        active = self._active
        if active is not None:
            active.close()
        position = values["position"]
        try:
            if "snapshot" in position:
                # The pass restarts from the states it began with, then replays its first batches.
                snapshot = unplain(position["snapshot"])
                _load_sampler_states(self, snapshot["samplers"])
                resume: dict[str, Any] | None = {**position, "snapshot": snapshot}
            else:
                _load_sampler_states(self, unplain(values["samplers"]))
                _load_generator_states(self, unplain(values["generators"]))
                resume = dict(position) if position else None
            if resume is not None:
                for key in ("base_seed", "epoch", "iteration"):
                    if not isinstance(resume.get(key), int):
                        raise ValueError(f"position.{key} must be an int")
        except ResumeStateError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeStateError(
                f"the saved DataLoader state is damaged or comes from other samplers: {exc}"
            ) from None
        self._next_epoch = saved.epoch
        self._explicit_epoch = None if values["explicit"] < 0 else values["explicit"]
        self._resume = resume
        if sampler is not None and resume is not None and not self._order_batches_left(sampler):
            # What remains of the saved epoch makes no batch here (drop_last): the next epoch runs.
            sampler.skip_loaded_epoch()
            self._resume = None
            self._next_epoch = int(resume["iteration"]) + 1

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

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------

    def _fingerprint(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "dataset": len(self.dataset) if hasattr(self.dataset, "__len__") else -1,
            "sampler": type(self.sampler).__name__,
            "batch_sampler": type(self.batch_sampler).__name__,
        }
        if order_sampler(self) is None:
            # A replayed sampler needs the same batches; OrderSampler's position is counted in samples.
            try:
                length = len(self)
            except TypeError:
                length = -1
            out.update(batch_size=self.batch_size, drop_last=self.drop_last, batches=length)
        return out

    def _torch_iter(self) -> Iterator[Any]:
        """The iterator of torch's own machinery (datasets or transforms the engine does not take)."""
        if self._order_generator is not None:
            self._begin_pass()  # seeds the order of this pass from (seed, epoch)
        return super().__iter__()

    def _order_pass_done(self, it: _FastIterator, sampler: OrderSampler) -> bool:
        """Whether the pass has handed out every batch its OrderSampler's samples make."""
        if it.handed_all:
            return True
        current = sampler.current()
        if current is None:
            return False
        _, offset, total = current
        return self._too_few(total - offset - it.samples)

    def _order_batches_left(self, sampler: OrderSampler) -> bool:
        if not getattr(self.batch_sampler, "drop_last", False):
            return True  # a loaded position with nothing left moves the sampler to the next epoch itself
        rest = sampler.resumed_samples()
        return rest is None or not self._too_few(rest)

    def _too_few(self, rest: int) -> bool:
        """Whether ``rest`` samples make no further batch (none left, or ``drop_last`` and fewer than a batch)."""
        batch = getattr(self.batch_sampler, "batch_size", None)
        drop = bool(getattr(self.batch_sampler, "drop_last", False))
        return rest <= 0 or (drop and isinstance(batch, int) and rest < batch)
