"""Device stage (torch): fastload's own sample order as a torch sampler, and the index feed.

:class:`OrderSampler` is fastload's order (:mod:`fastload.order`: a full or block shuffle keyed by
``(seed, epoch)``, every rank's contiguous equal share) behind the ``DistributedSampler`` interface.
Unlike torch's ``DistributedSampler`` it reads the rank and world size from ``torch.distributed``
each time an epoch starts (so it can be built before the process group exists, as Lightning does),
and when nobody calls :meth:`OrderSampler.set_epoch` it moves to the next epoch by itself at every
``iter()`` (a pass cut short by ``break`` or ``limit_train_batches`` counts as an epoch, as a new
``iter()`` of ``RandomSampler`` draws a new permutation). Being a ``DistributedSampler``, Lightning
leaves it in place instead of injecting its own.

:class:`IndexFeed` carries the batches a sampler yields from the consumer's thread (where torch's
DataLoader draws them, so the sampler consumes torch's RNG where torch's would) to the loader's
producer thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sized
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from fastload.order import EpochOrder, Even, OrderSpec, Shuffle, coerce_enum, share_length
from fastload.position import Position, dataset_identity, make_state, order_fingerprint, read_state

__all__ = ["IndexFeed", "OrderSampler", "distributed_rank_world"]


def distributed_rank_world(rank: int | None = None, world_size: int | None = None):
    """``(rank, world_size)``: the given values, else ``torch.distributed``'s when initialized, else (0, 1)."""
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    return int(rank), int(world_size)


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


class _Iteration:
    """What one ``iter()`` of an :class:`OrderSampler` covers, and how far it got."""

    __slots__ = ("epoch", "history", "offset", "total", "world", "yielded")

    def __init__(self, epoch: int, history: tuple, world: int, offset: int, total: int) -> None:
        self.epoch, self.history, self.world, self.offset, self.total = epoch, history, world, offset, total
        self.yielded = 0


class OrderSampler(DistributedSampler):
    """fastload's order (``"global"`` / ``"block"`` / ``"shard"`` shuffle, or sequential) sharded over the ranks.

    Args:
        data_source: The dataset (its length, and what identifies its records in a saved state).
        shuffle: ``True`` or ``"global"`` (a full permutation per epoch), ``"block"`` (blocks of
            ``block_size`` records shuffled, then records within windows of ``window`` blocks: reads
            stay mostly sequential, for data larger than RAM), ``"shard"`` (the shard-aware order for
            remote and cached datasets: shards permuted and dealt to the ranks, records shuffled within
            windows of ``window`` shards, so each rank reads whole shards, each once per epoch; needs
            a dataset with ``shard_starts``), ``False`` or ``"none"`` (in order).
        seed: Non-negative seed; the permutation is a pure function of ``(seed, epoch)``.
        rank: This process's rank (default: ``torch.distributed``'s when the epoch starts, else 0).
        world_size: Number of ranks (default: ``torch.distributed``'s when the epoch starts, else 1).
        even: ``"pad"`` (repeat records from the start of the epoch, as ``DistributedSampler``) or
            ``"drop"`` (drop the tail) so that every rank gets the same number of samples.
        block_size: Records per block for ``"block"``.
        window: Blocks per shuffling window for ``"block"``; shards per window for ``"shard"``.

    Resume (:meth:`state_dict` / :meth:`load_state_dict`): the position is counted in samples and
    restores under any world size (:mod:`fastload.position`): with the same one each rank goes on in
    its own share; with another, the new ranks share what was not handed out yet, each the same
    number of samples. A loaded mid-epoch position is used by the ``iter()`` that runs its epoch;
    ``set_epoch`` to that epoch (before or after loading) keeps it, ``set_epoch`` to another drops it.
    """

    def __init__(
        self,
        data_source,
        *,
        shuffle: bool | str = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        even: str = "pad",
        block_size: int = 256,
        window: int = 8,
    ) -> None:
        # DistributedSampler.__init__ is not called: it reads the process group now, this sampler when
        # each epoch starts. The attributes it documents are provided (some as properties).
        if shuffle is True:
            shuffle = "global"
        elif shuffle is False or shuffle is None:
            shuffle = "none"
        self.mode = coerce_enum(Shuffle, shuffle, "shuffle")
        self.dataset = data_source
        self.shuffle = self.mode is not Shuffle.NONE
        self.seed = _check_int(seed, "seed", 0)
        self.even = coerce_enum(Even, even, "even")
        self.drop_last = self.even is Even.DROP
        self.block_size = _check_int(block_size, "block_size", 1)
        self.window = _check_int(window, "window", 1)
        if rank is not None:
            _check_int(rank, "rank", 0)
        if world_size is not None:
            _check_int(world_size, "world_size", 1)
        self._rank, self._world_size = rank, world_size
        self._shard_starts: tuple | None = None
        if self.mode is Shuffle.SHARD:
            starts = getattr(data_source, "shard_starts", None)
            if starts is None:
                starts = getattr(getattr(data_source, "records", None), "shard_starts", None)  # ImageDataset
            if starts is None:
                raise ValueError(
                    f"shuffle='shard' needs a dataset with shard_starts (a fastload dataset), not "
                    f"{type(data_source).__name__}"
                )
            self._shard_starts = tuple(int(s) for s in np.asarray(starts).tolist())
        self.epoch = 0
        self._explicit: int | None = None
        self._started = False
        self._pending: Position | None = None  # a loaded mid-epoch position, for the iter() of its epoch
        self._pending_cache: tuple | None = None
        self._iteration: _Iteration | None = None
        self._identity: tuple[int, str | None] | None = None

    @property
    def num_replicas(self) -> int:  # type: ignore[override]  # read when an epoch starts, not stored
        return distributed_rank_world(self._rank, self._world_size)[1]

    @property
    def rank(self) -> int:  # type: ignore[override]  # read when an epoch starts, not stored
        rank, world = distributed_rank_world(self._rank, self._world_size)
        if not 0 <= rank < world:
            raise ValueError(f"rank={rank} must be in [0, world_size={world})")
        return rank

    @property
    def num_samples(self) -> int:  # type: ignore[override]  # read when an epoch starts, not stored
        n, world = len(cast(Sized, self.dataset)), self.num_replicas
        if self.even is Even.DROP and n < world:
            raise ValueError(
                f"even='drop' with {n} records and world_size={world} leaves some ranks nothing; use even='pad'"
            )
        return share_length(n, world, self.even)

    @property
    def total_size(self) -> int:  # type: ignore[override]  # read when an epoch starts, not stored
        return self.num_samples * self.num_replicas

    def __len__(self) -> int:
        return self.num_samples

    @property
    def upcoming_epoch(self) -> int:
        """The epoch the next ``iter()`` runs (``set_epoch``'s, else the one after the last, else ``epoch``)."""
        if self._explicit is not None:
            return self._explicit
        return self.epoch + 1 if self._started else self.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run ``epoch`` (a loaded position inside ``epoch`` is kept)."""
        self._explicit = _check_int(epoch, "epoch", 0)
        self.epoch = self._explicit
        if self._pending is not None and self._pending.epoch != epoch:
            self._pending = None

    def _spec(self, n: int, rank: int, world: int) -> OrderSpec:
        return OrderSpec(
            num_records=n,
            batch_size=1,
            shuffle=self.mode,
            seed=self.seed,
            rank=rank,
            world_size=world,
            even=self.even,
            block_size=self.block_size,
            window=self.window,
            shard_starts=self._shard_starts,
        )

    def __iter__(self) -> Iterator[int]:
        epoch, self._explicit = self.upcoming_epoch, None
        self.epoch, self._started = epoch, True
        pending, self._pending = self._pending, None
        n = len(cast(Sized, self.dataset))
        if n == 0:
            self._iteration = None
            return iter(())
        rank, world = self.rank, self.num_replicas
        spec = self._spec(n, rank, world)
        history: tuple = ()
        offset = 0
        if pending is not None and pending.epoch == epoch:
            order = self._pending_order(pending, rank, world)
            self._pending_cache = None
            if len(order.rest) == 0:  # nothing left of that epoch for any rank: the next one starts
                epoch = self.epoch = epoch + 1
                order = EpochOrder(spec, epoch)
            else:
                history, offset = pending.plan(world)
        else:
            order = EpochOrder(spec, epoch)
        run = self._iteration = _Iteration(epoch, history, world, offset, len(order.share))
        return _counted(order.rest.tolist(), run)

    def state_dict(self, *, handed_out: int | None = None, finished: bool = False) -> dict[str, Any]:
        """The position in the order, restorable under any world size (:mod:`fastload.position`).

        Args:
            handed_out: Samples of the current ``iter()`` the consumer actually used (a loader that
                draws indices ahead passes its count); default: those this sampler yielded.
            finished: The consumer finished the current ``iter()`` (its epoch is done).
        """
        return make_state(_KIND, self._position(handed_out, finished), self._fingerprint())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a position from :meth:`state_dict` (saved under any world size).

        Raises:
            ResumeStateError: A state of another dataset, seed, shuffle mode or padding, of a newer
                format, or damaged (the message names what differs).
        """
        position, _ = read_state(state, kind=_KIND, fingerprint=self._fingerprint())
        self.epoch = self._explicit = position.epoch
        self._started = True
        self._pending = position if position.consumed else None
        self._iteration = None

    def resumed_samples(self) -> int | None:
        """Samples the next ``iter()`` hands out from a loaded mid-epoch position (None: no such position)."""
        if self._pending is None:
            return None
        return len(self._pending_order(self._pending, self.rank, self.num_replicas).rest)

    def _pending_order(self, pending: Position, rank: int, world: int) -> EpochOrder:
        """A loaded position's order for this rank (computed once per layout)."""
        cached = self._pending_cache
        if cached is None or cached[:3] != (pending, rank, world):
            n = len(cast(Sized, self.dataset))
            cached = self._pending_cache = (pending, rank, world, pending.order(self._spec(n, rank, world)))
        return cached[3]

    def skip_loaded_epoch(self) -> None:
        """Drop a loaded mid-epoch position and run the next epoch instead (nothing of it left to batch)."""
        if self._pending is not None:
            self.epoch = self._explicit = self._pending.epoch + 1
            self._pending = None

    def current(self) -> tuple[int, int, int] | None:
        """``(epoch, samples of this rank's share before the current iter(), samples in the share)``."""
        run = self._iteration
        return None if run is None else (run.epoch, run.offset, run.total)

    def _position(self, handed_out: int | None, finished: bool) -> Position:
        if self._pending is not None:
            return self._pending
        if self._explicit is not None:
            return Position(self._explicit)
        run = self._iteration
        if run is None or run.epoch != self.epoch:
            return Position(self.epoch + 1 if self._started and run is not None else self.epoch)
        used = run.yielded if handed_out is None else _check_int(handed_out, "handed_out", 0)
        samples = run.offset + used
        if samples > run.total:
            raise ValueError(f"handed_out={used}: this iter() holds {run.total - run.offset} samples")
        if finished or samples >= run.total:
            return Position(run.epoch + 1)
        return Position.at(run.epoch, run.history, run.world, samples)

    def _fingerprint(self) -> dict[str, Any]:
        n = len(cast(Sized, self.dataset))
        if self._identity is None or self._identity[0] != n:
            self._identity = (n, dataset_identity(self.dataset))
        return order_fingerprint(self._spec(max(1, n), 0, 1), self._identity[1])

    def __repr__(self) -> str:
        return (
            f"OrderSampler({len(cast(Sized, self.dataset))} records, shuffle={self.mode.value!r}, seed={self.seed}, "
            f"even={self.even.value!r})"
        )


_KIND = "fastload.torch.OrderSampler"


def _counted(indices: list, run: _Iteration) -> Iterator[int]:
    for i in indices:
        run.yielded += 1
        yield i


_END = object()


class IndexFeed:
    """Index batches handed from the consumer's thread to the producer thread, in order.

    The consumer decides how far ahead it pulls from the sampler; the queue itself is unbounded.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()

    def put(self, indices: np.ndarray) -> None:
        self._queue.put(indices)

    def finish(self) -> None:
        """No more batches after the ones already put."""
        self._queue.put(_END)

    def batches(self, stop: threading.Event, poll: float = 0.05) -> Iterator[np.ndarray]:
        """Producer side: the batches as they arrive; returns at the end or once ``stop`` is set."""
        while not stop.is_set():
            try:
                item = self._queue.get(timeout=poll)
            except queue.Empty:
                continue
            if item is _END:
                return
            yield item
