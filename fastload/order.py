"""Which records, in which order: the sample order for (seed, epoch, rank, world_size).

The order is a pure function of its inputs: no state, no global RNG, no environment variables. Every
rank computes the same epoch permutation from ``(seed, epoch)`` and then takes its own contiguous
share of it, so the shares are disjoint and their union covers the epoch.

Steps of the computation, each a function here:

1. :func:`epoch_permutation` -- the whole dataset's order for one epoch:
   ``Shuffle.NONE`` (0, 1, 2, ...), ``Shuffle.GLOBAL`` (a full permutation; right when the data sits
   in RAM or tmpfs) or ``Shuffle.BLOCK`` (the order of blocks of ``block_size`` consecutive records
   is shuffled, then records are shuffled within windows of ``window`` consecutive blocks: reads stay
   mostly sequential, which matters when the data is larger than RAM). ``Shuffle.SHARD`` is the
   shard-aware mode for remote and larger-than-RAM data, described below.
2. :func:`rank_share` -- make the length a multiple of ``world_size`` (``Even.PAD`` repeats records
   from the start of the permutation, as ``DistributedSampler`` does; ``Even.DROP`` drops the tail),
   then cut it into ``world_size`` contiguous equal shares. Every rank therefore gets exactly the
   same number of samples, hence of batches: DDP collectives never hang at the end of an epoch.
3. :func:`batch_bounds` -- cut a share into batches (``drop_last`` drops a final partial batch).

:class:`EpochOrder` bundles the three for a loader and maps a batch number to record indices, which
is all a mid-epoch resume needs: the position is just ``(epoch, batch)``.

Shard-aware order (``Shuffle.SHARD``, :func:`shard_sequence`, :func:`window_shuffle`): every rank
reads a few whole shards at a time, so a node fetches and caches only its own share of the shards.

1. The shards are permuted from ``(seed, epoch)``; the epoch's sequence is their records, shard
   after shard, each shard's records in stored order.
2. ``Even.PAD`` repeats the sequence's last records (the last rank's own shard, so padding fetches
   nothing more); ``Even.DROP`` drops them. The sequence is cut into ``world_size`` contiguous equal
   shares, exactly like the other modes: every rank gets the same number of batches. Ranks of one
   node are consecutive (torchrun numbers them so), so a node's share is a contiguous run of the
   permuted shards: each node and each rank reads its own subset of shards, reassigned every epoch.
   Only the shard at a cut is split, between two neighbouring ranks.
3. Within a rank's share, the records of each window of ``window`` consecutive shards are shuffled
   together (a generator keyed by seed, epoch, rank and world size), so a rank holds about ``window``
   shards open at a time. A pure function of its inputs like the other modes, so resume is exact.

Resuming under another layout (:func:`remaining_sequence`, :class:`EpochOrder` with ``consumed``):
a position inside an epoch is a short list of ``(world_size, samples)`` pairs, each saying "every
rank of a layout of ``world_size`` ranks handed out the first ``samples`` of its share". Because a
layout's shares are a pure function of the sequence it cuts, the records those ranks handed out can
be recomputed from that pair alone, without storing one index: the first pair is taken from the
epoch's own sequence, and each later pair from what remained after the pairs before it (the
remaining records keep their order in the epoch's sequence). The ranks of a new layout cut that
remaining sequence exactly as an epoch is cut (padding with ``Even.PAD``, the tail dropped with
``Even.DROP``; in the shard mode the window shuffle is keyed by the layout's depth in the list too),
so every remaining record is handed out once more across the new ranks, plus at most
``world_size - 1`` padding repeats. Continuing the same layout needs no new pair: its ranks go on
from ``offset`` samples into their shares, with any batch size.
"""

from __future__ import annotations

import enum
import functools
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EpochOrder",
    "Even",
    "OrderSpec",
    "Shuffle",
    "batch_bounds",
    "check_shard_starts",
    "coerce_enum",
    "epoch_permutation",
    "epoch_sequence",
    "handed_out",
    "layout_share",
    "num_batches",
    "rank_share",
    "remaining_sequence",
    "shard_sequence",
    "shards_read",
    "share_length",
    "window_shuffle",
    "window_starts",
]


class Shuffle(str, enum.Enum):
    """How an epoch's records are ordered."""

    NONE = "none"
    GLOBAL = "global"
    BLOCK = "block"
    SHARD = "shard"


class Even(str, enum.Enum):
    """How the epoch is made divisible by the number of ranks."""

    PAD = "pad"
    DROP = "drop"


def coerce_enum(cls, value, name: str):
    """``value`` as a member of the enum ``cls`` (members and their values accepted), else a clear ValueError."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{name}={value!r} must be one of {choices}") from None


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class OrderSpec:
    """Everything the order depends on except the epoch.

    Args:
        num_records: Records in the dataset.
        batch_size: Samples per batch.
        shuffle: ``Shuffle`` member or its name (``"none"``, ``"global"``, ``"block"``).
        seed: Non-negative seed; with the epoch it determines the permutation.
        rank: This process's rank in ``[0, world_size)``.
        world_size: Number of ranks sharing the epoch.
        even: ``Even.PAD`` (repeat records so every record is seen) or ``Even.DROP`` (drop the
            remainder) to give every rank the same number of samples.
        drop_last: Drop a final batch smaller than ``batch_size``.
        block_size: Records per block for ``Shuffle.BLOCK``.
        window: Blocks per shuffling window for ``Shuffle.BLOCK``; shards per window for ``Shuffle.SHARD``.
        shard_starts: ``Shuffle.SHARD`` only: the first record of every shard, then ``num_records``
            (a dataset's ``shard_starts``); records are grouped by shard in index order.
    """

    num_records: int
    batch_size: int
    shuffle: Shuffle | str = Shuffle.GLOBAL
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    even: Even | str = Even.PAD
    drop_last: bool = False
    block_size: int = 256
    window: int = 8
    shard_starts: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_int(self.num_records, "num_records", 1)
        _check_int(self.batch_size, "batch_size", 1)
        _check_int(self.seed, "seed", 0)
        _check_int(self.world_size, "world_size", 1)
        _check_int(self.block_size, "block_size", 1)
        _check_int(self.window, "window", 1)
        if (
            isinstance(self.rank, bool)
            or not isinstance(self.rank, (int, np.integer))
            or not 0 <= self.rank < self.world_size
        ):
            raise ValueError(f"rank={self.rank!r} must be an int in [0, world_size={self.world_size})")
        if not isinstance(self.drop_last, bool):
            raise ValueError(f"drop_last={self.drop_last!r} must be a bool")
        object.__setattr__(self, "shuffle", coerce_enum(Shuffle, self.shuffle, "shuffle"))
        object.__setattr__(self, "even", coerce_enum(Even, self.even, "even"))
        if self.shard_starts is not None:
            object.__setattr__(self, "shard_starts", check_shard_starts(self.shard_starts, self.num_records))
        if self.shuffle is Shuffle.SHARD and self.shard_starts is None:
            raise ValueError(
                "shuffle='shard' needs the dataset's shard layout (shard_starts); this dataset has no shards"
            )
        if self.even is Even.DROP and self.num_records < self.world_size:
            raise ValueError(
                f"even='drop' with {self.num_records} records and world_size={self.world_size} "
                "leaves no record for some ranks; use even='pad'"
            )


def check_shard_starts(starts: Iterable[int], num_records: int) -> tuple[int, ...]:
    """``starts`` as a tuple after checking it: begins at 0, never decreases, ends at ``num_records``.

    Raises:
        ValueError: Otherwise.
    """
    out = tuple(int(x) for x in (starts.tolist() if isinstance(starts, np.ndarray) else starts))
    if len(out) < 2 or out[0] != 0 or out[-1] != num_records or any(b < a for a, b in itertools.pairwise(out)):
        shown = out if len(out) <= 8 else (*out[:4], "...", *out[-2:])
        raise ValueError(f"shard_starts={shown} must start at 0, never decrease and end at num_records={num_records}")
    return out


def _generator(seed: int, epoch: int, *more: int) -> np.random.Generator:
    # SeedSequence mixes every word, so (seed, epoch) and (seed + 1, epoch - 1) are unrelated streams.
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(epoch), *map(int, more)])))


def shard_sequence(shard_starts: Sequence[int], *, seed: int, epoch: int) -> np.ndarray:
    """The shard-aware epoch sequence: shards permuted from ``(seed, epoch)``, records in stored order.

    Returns int64 record indices, a permutation of ``range(shard_starts[-1])``.
    """
    starts = np.asarray(shard_starts, dtype=np.int64)
    _check_int(epoch, "epoch", 0)
    lengths = np.diff(starts)
    order = _generator(seed, epoch).permutation(len(lengths))
    lengths_o = lengths[order]
    ends = np.cumsum(lengths_o)
    # Record k of the sequence is starts[shard] + (k - where that shard begins in the sequence).
    offsets = np.repeat(starts[:-1][order] - (ends - lengths_o), lengths_o)
    return np.arange(int(starts[-1]), dtype=np.int64) + offsets


def _shard_padded(seq: np.ndarray, world_size: int, even: Even | str) -> tuple[np.ndarray, int]:
    """The shard-aware sequence made divisible by ``world_size`` (padding from the tail), and the share length."""
    n, w = len(seq), world_size
    if coerce_enum(Even, even, "even") is Even.PAD:
        per_rank = -(-n // w)
        extra = per_rank * w - n
        if extra:
            # The sequence's last records again: the last rank's own shard, nothing more to fetch.
            seq = np.concatenate([seq, np.resize(seq[::-1], extra)[::-1]])
        return seq, per_rank
    return seq, n // w


def window_shuffle(
    share: np.ndarray, shard_of: np.ndarray, window: int, rng: np.random.Generator, limit: int | None = None
) -> np.ndarray:
    """Shuffle ``share`` within windows of ``window`` consecutive shard runs.

    Args:
        share: Record indices in shard-sequence order.
        shard_of: The shard of each of those records (same length).
        window: Shard runs per window.
        rng: The generator.
        limit: Only the first ``limit`` positions are needed: windows after the one holding position
            ``limit - 1`` are left unshuffled (the windows before are shuffled exactly as without it:
            the generator is drawn window after window).

    Returns:
        A new int64 array.
    """
    out = share.copy()
    if len(out) == 0:
        return out
    run_starts = np.flatnonzero(np.concatenate(([True], shard_of[1:] != shard_of[:-1])))
    bounds = np.append(run_starts[::window], len(out))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=False):
        if limit is not None and lo >= limit:
            break
        rng.shuffle(out[lo:hi])
    return out


@functools.lru_cache(maxsize=4)
def _shard_lookup(shard_starts: tuple[int, ...]) -> np.ndarray:
    """The shard of every record (int32), built once per shard layout: a gather, not a search, per share."""
    starts = np.asarray(shard_starts, dtype=np.int64)
    lookup = np.repeat(np.arange(len(starts) - 1, dtype=np.int32), np.diff(starts))
    lookup.setflags(write=False)
    return lookup


def _shard_of(spec: OrderSpec, records: np.ndarray) -> np.ndarray:
    assert spec.shard_starts is not None  # OrderSpec checks it for Shuffle.SHARD
    return _shard_lookup(spec.shard_starts)[records]


def shards_read(spec: OrderSpec, epochs: Iterable[int], ranks: Iterable[int]) -> list[int]:
    """The shards that ``ranks`` read in ``epochs`` under ``spec`` (sorted shard numbers).

    What ``fastload copy --node-rank`` copies for one node: its ranks are ``range(node_rank *
    local_size, (node_rank + 1) * local_size)``.
    """
    shards = set()
    for epoch in epochs:
        for rank in ranks:
            order = EpochOrder(_replace_rank(spec, rank), epoch)
            shards.update(np.unique(_shard_of(spec, order.share)).tolist())
    return sorted(shards)


def _replace_rank(spec: OrderSpec, rank: int) -> OrderSpec:
    import dataclasses

    return dataclasses.replace(spec, rank=rank)


def epoch_permutation(
    num_records: int, shuffle: Shuffle | str, *, seed: int, epoch: int, block_size: int = 256, window: int = 8
) -> np.ndarray:
    """The order of all records for one epoch, identical on every rank.

    Args:
        num_records: Records in the dataset.
        shuffle: ``Shuffle`` member or name.
        seed: Non-negative seed.
        epoch: Non-negative epoch number.
        block_size: Records per block (``Shuffle.BLOCK`` only).
        window: Blocks per window (``Shuffle.BLOCK`` only).

    Returns:
        int64 array of length ``num_records``, a permutation of ``range(num_records)``.
    """
    shuffle = coerce_enum(Shuffle, shuffle, "shuffle")
    _check_int(epoch, "epoch", 0)
    if shuffle is Shuffle.SHARD:
        raise ValueError("shuffle='shard' orders by shards: use shard_sequence() / EpochOrder with shard_starts")
    if shuffle is Shuffle.NONE:
        return np.arange(num_records, dtype=np.int64)
    rng = _generator(seed, epoch)
    if shuffle is Shuffle.GLOBAL:
        return rng.permutation(num_records).astype(np.int64, copy=False)
    # BLOCK: permute whole blocks, then shuffle records inside each window of consecutive
    # (already permuted) blocks. The last block may be short; it moves like any other.
    order, bounds = _block_layout(num_records, rng, block_size, window)
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=False):
        rng.shuffle(order[lo:hi])
    return order


def _block_layout(
    num_records: int, rng: np.random.Generator, block_size: int, window: int
) -> tuple[np.ndarray, np.ndarray]:
    """Block order's first draw: the records of the permuted blocks, and where its windows start and end."""
    num_blocks = -(-num_records // block_size)
    block_order = rng.permutation(num_blocks)
    starts = block_order * block_size
    lengths = np.minimum(block_size, num_records - starts)
    # Expand blocks to record indices without a Python loop over records.
    ends = np.cumsum(lengths)
    offsets = np.repeat(starts - (ends - lengths), lengths)
    order = np.arange(num_records, dtype=np.int64) + offsets
    # Windows are whole groups of `window` blocks (the short last block may sit anywhere).
    bounds = np.concatenate(([0], ends[window - 1 :: window]))
    if bounds[-1] != num_records:
        bounds = np.append(bounds, num_records)
    return order, bounds


def window_starts(spec: OrderSpec, epoch: int) -> np.ndarray:
    """Where the shuffle windows of this rank's share start, as positions in the share (int64, sorted).

    A window is what the order shuffles together: ``window`` blocks (``Shuffle.BLOCK``) or the
    records of ``window`` shard runs (``Shuffle.SHARD``). Its records are read best together (a
    window's records are a few long runs in the files); the read-ahead cuts its groups there.
    Empty for ``Shuffle.GLOBAL`` (one window: the epoch) and ``Shuffle.NONE``. Does not change
    the order (:class:`EpochOrder`'s output is the same with or without it).
    """
    _check_int(epoch, "epoch", 0)
    if spec.shuffle is Shuffle.SHARD:
        # The rank's share before the window shuffle (which keeps every window where it is).
        padded, per_rank = _shard_padded(epoch_sequence(spec, epoch), spec.world_size, spec.even)
        share = padded[spec.rank * per_rank : (spec.rank + 1) * per_rank]
        if not len(share):
            return np.zeros(0, dtype=np.int64)
        shard_of = _shard_of(spec, share)
        run_starts = np.flatnonzero(np.concatenate(([True], shard_of[1:] != shard_of[:-1])))
        return run_starts[:: spec.window][1:].astype(np.int64)
    if spec.shuffle is not Shuffle.BLOCK:
        return np.zeros(0, dtype=np.int64)
    n = spec.num_records
    _order, bounds = _block_layout(n, _generator(spec.seed, epoch), spec.block_size, spec.window)
    per_rank = _share_len(spec)
    lo = spec.rank * per_rank
    # Padding repeats the permutation from its start: its windows again, shifted by n.
    cycles = -(-(lo + per_rank) // n) + 1
    every = np.concatenate([bounds[:-1] + c * n for c in range(cycles)])
    inside = every[(every > lo) & (every < lo + per_rank)] - lo
    return np.unique(inside).astype(np.int64)


def rank_share(permutation: np.ndarray, *, rank: int, world_size: int, even: Even | str) -> np.ndarray:
    """This rank's contiguous, equal-length share of an epoch permutation.

    Args:
        permutation: The epoch's order (:func:`epoch_permutation`).
        rank: Rank in ``[0, world_size)``.
        world_size: Number of ranks.
        even: ``Even.PAD`` repeats records from the start of the permutation until the length
            divides by ``world_size``; ``Even.DROP`` drops the last ``len % world_size`` records.

    Returns:
        int64 array, the same length on every rank.
    """
    even = coerce_enum(Even, even, "even")
    n = len(permutation)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    per_rank = -(-n // world_size) if even is Even.PAD else n // world_size
    start, stop = rank * per_rank, (rank + 1) * per_rank
    if stop <= n:
        return permutation[start:stop]
    # The padding repeats the permutation cyclically (also when world_size > n); only this share is built.
    return permutation[np.arange(start, stop) % n]


def num_batches(share_len: int, batch_size: int, drop_last: bool) -> int:
    """Batches in a share of ``share_len`` samples."""
    return share_len // batch_size if drop_last else -(-share_len // batch_size)


def batch_bounds(share_len: int, batch_size: int, drop_last: bool, batch: int) -> tuple[int, int]:
    """``(start, stop)`` positions of batch number ``batch`` inside a share."""
    total = num_batches(share_len, batch_size, drop_last)
    if not 0 <= batch < total:
        raise IndexError(f"batch {batch} out of range for an epoch of {total} batches")
    start = batch * batch_size
    return start, min(start + batch_size, share_len)


def share_length(num_records: int, world_size: int, even: Even | str) -> int:
    """Samples in each rank's share when ``num_records`` are cut for ``world_size`` ranks."""
    even = coerce_enum(Even, even, "even")
    return -(-num_records // world_size) if even is Even.PAD else num_records // world_size


def _share_len(spec: OrderSpec) -> int:
    return share_length(spec.num_records, spec.world_size, spec.even)


def epoch_sequence(spec: OrderSpec, epoch: int) -> np.ndarray:
    """The epoch's sequence before it is cut into shares, the same on every rank.

    :func:`epoch_permutation` for ``none`` / ``global`` / ``block``, :func:`shard_sequence` for ``shard``.
    """
    if spec.shuffle is Shuffle.SHARD:
        assert spec.shard_starts is not None  # OrderSpec checks it for Shuffle.SHARD
        return shard_sequence(spec.shard_starts, seed=spec.seed, epoch=epoch)
    return epoch_permutation(
        spec.num_records, spec.shuffle, seed=spec.seed, epoch=epoch, block_size=spec.block_size, window=spec.window
    )


def _layout_generator(spec: OrderSpec, epoch: int, rank: int, world_size: int, level: int) -> np.random.Generator:
    # Level 0 (the epoch's own layout) keeps the key it always had; deeper layouts add their depth.
    more = (rank, world_size) if level == 0 else (rank, world_size, level)
    return _generator(spec.seed, epoch, *more)


def layout_share(
    spec: OrderSpec, epoch: int, sequence: np.ndarray, *, rank: int, world_size: int, level: int = 0
) -> np.ndarray:
    """Rank ``rank``'s share when ``world_size`` ranks cut ``sequence`` (a layout).

    The cut is the epoch's (:func:`rank_share`; the shard mode pads from the tail and shuffles
    within windows of shards). ``level`` is the layout's depth in a resumed epoch (0: the epoch's own
    layout), which keys the shard mode's window shuffle. An empty sequence gives empty shares.

    Returns:
        int64 record indices, the same length on every rank.
    """
    if len(sequence) == 0:
        return np.zeros(0, dtype=np.int64)
    if spec.shuffle is not Shuffle.SHARD:
        return rank_share(sequence, rank=rank, world_size=world_size, even=spec.even)
    padded, per_rank = _shard_padded(sequence, world_size, spec.even)
    return _shard_rank_share(spec, epoch, padded, per_rank, rank, world_size, level)


def _shard_rank_share(
    spec: OrderSpec,
    epoch: int,
    padded: np.ndarray,
    per_rank: int,
    rank: int,
    world_size: int,
    level: int,
    limit: int | None = None,
) -> np.ndarray:
    share = padded[rank * per_rank : (rank + 1) * per_rank]
    rng = _layout_generator(spec, epoch, rank, world_size, level)
    return window_shuffle(share, _shard_of(spec, share), spec.window, rng, limit)


def handed_out(
    spec: OrderSpec, epoch: int, sequence: np.ndarray, *, world_size: int, samples: int, level: int = 0
) -> np.ndarray:
    """The records that every rank of a layout handed out in its first ``samples`` samples.

    Args:
        spec: The order (its rank and world size are not used).
        epoch: Epoch number.
        sequence: The sequence the layout cuts.
        world_size: Ranks of the layout.
        samples: Samples each rank handed out, at most its share's length.
        level: The layout's depth (see :func:`layout_share`).

    Returns:
        int64 record indices (a record handed out twice, as padding, appears twice).

    Raises:
        ValueError: ``samples`` is more than a share of that layout holds.
    """
    n = len(sequence)
    per_rank = share_length(n, world_size, spec.even)
    if samples > per_rank:
        raise ValueError(
            f"{samples} samples per rank were handed out, but {world_size} ranks sharing {n} records "
            f"have {per_rank} each"
        )
    if n == 0 or samples == 0:
        return np.zeros(0, dtype=np.int64)
    if spec.shuffle is Shuffle.SHARD:
        # Padded once for the layout; each share shuffled only as far as its first `samples`.
        padded, per_rank = _shard_padded(sequence, world_size, spec.even)
        return np.concatenate(
            [
                _shard_rank_share(spec, epoch, padded, per_rank, r, world_size, level, samples)[:samples]
                for r in range(world_size)
            ]
        )
    # Shares are contiguous slices of the sequence repeated cyclically (the padding): no share built.
    pos = (np.arange(world_size, dtype=np.int64)[:, None] * per_rank + np.arange(samples, dtype=np.int64)).ravel()
    return sequence[pos % n]


def _check_consumed(consumed: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    out = []
    for k, pair in enumerate(consumed):
        try:
            world, samples = pair
        except (TypeError, ValueError):
            raise ValueError(f"consumed[{k}]={pair!r} must be a (world_size, samples) pair") from None
        out.append(
            (_check_int(world, f"consumed[{k}] world_size", 1), _check_int(samples, f"consumed[{k}] samples", 0))
        )
    return tuple(out)


def remaining_sequence(spec: OrderSpec, epoch: int, consumed: Iterable[Sequence[int]] = ()) -> np.ndarray:
    """The epoch's records not yet handed out, in the order of its sequence.

    Args:
        spec: The order.
        epoch: Epoch number.
        consumed: ``(world_size, samples)`` pairs, oldest first: the layout of the pair at depth
            ``d`` cut the sequence that remained after the pairs before it (see the module docstring).

    Returns:
        int64 record indices, each record at most once.

    Raises:
        ValueError: A pair claims more samples than its layout's shares hold.
    """
    seq = epoch_sequence(spec, epoch)
    for level, (world, samples) in enumerate(_check_consumed(consumed)):
        gone = handed_out(spec, epoch, seq, world_size=world, samples=samples, level=level)
        if len(gone):
            keep = np.ones(spec.num_records, dtype=bool)
            keep[gone] = False
            seq = seq[keep[seq]]
    return seq


class EpochOrder:
    """One rank's batches for one epoch: ``order[k]`` is the int64 record indices of batch ``k``.

    Args:
        spec: The order's parameters (its ``rank`` and ``world_size`` are this layout's).
        epoch: Epoch number.
        consumed: In a resumed epoch, the ``(world_size, samples)`` pairs of the layouts before this
            one (:func:`remaining_sequence`); this layout cuts what they left. Empty: the epoch's
            own layout.
        offset: Samples of this rank's share already handed out; batch 0 starts after them.

    Attributes:
        share: This rank's whole share in this layout (``share[offset:]`` is what the batches cover).
        level: The layout's depth (``len(consumed)``).
    """

    def __init__(self, spec: OrderSpec, epoch: int, *, consumed: Iterable[Sequence[int]] = (), offset: int = 0) -> None:
        self.spec = spec
        self.epoch = _check_int(epoch, "epoch", 0)
        self.consumed = _check_consumed(consumed)
        self.level = len(self.consumed)
        seq = remaining_sequence(spec, epoch, self.consumed) if self.consumed else epoch_sequence(spec, epoch)
        self.remaining = len(seq)
        self.share = layout_share(spec, epoch, seq, rank=spec.rank, world_size=spec.world_size, level=self.level)
        self.offset = _check_int(offset, "offset", 0)
        if self.offset > len(self.share):
            raise ValueError(f"offset={offset} is past the end of this rank's share of {len(self.share)} samples")
        self._len = num_batches(len(self.share) - self.offset, spec.batch_size, spec.drop_last)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, batch: int) -> np.ndarray:
        start, stop = batch_bounds(len(self.share) - self.offset, self.spec.batch_size, self.spec.drop_last, batch)
        return self.share[self.offset + start : self.offset + stop]

    @property
    def rest(self) -> np.ndarray:
        """The samples the batches cover, in order (``share[offset:]``; with ``drop_last``, also the dropped tail)."""
        return self.share[self.offset :]

    def position(self, batches: int) -> int:
        """Samples of the share handed out once ``batches`` batches of this order were (``offset`` included)."""
        if not 0 <= batches <= self._len:
            raise IndexError(f"{batches} batches out of range for an order of {self._len} batches")
        return min(len(self.share), self.offset + batches * self.spec.batch_size)

    @staticmethod
    def batches_per_epoch(spec: OrderSpec) -> int:
        """Batches per (whole, not resumed) epoch for ``spec``: the same for every epoch and every rank."""
        return num_batches(_share_len(spec), spec.batch_size, spec.drop_last)
