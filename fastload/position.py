"""Which records, resumably: a loader's position in the order and the state that saves it.

A position is an epoch and the ``(world_size, samples)`` pairs of :mod:`fastload.order`: each pair
says that every rank of a layout of ``world_size`` ranks handed out the first ``samples`` samples of
its share. The records behind a pair are recomputed from the seed (:func:`fastload.order.remaining_sequence`),
so a position is a few integers whatever the dataset's size, and it means the same thing on every
rank: all ranks of a job save the same state (rank 0's is the one a checkpoint keeps), and any rank
of any later job loads it.

Restoring a position under ``world_size`` ranks (:meth:`Position.plan`):

- the same world size as the last pair: each rank goes on ``samples`` into its share, exactly as an
  uninterrupted run (with any batch size: the position is counted in samples);
- another world size: the new ranks cut the records not yet handed out, as an epoch is cut; the
  last pair joins the list. Two or three resumes in one epoch are a list of two or three pairs.

A pass that finished its epoch saves the next epoch with no pair: the resumed run starts that epoch,
never a pass with no batches.

The state (:func:`make_state`) is a plain dict of ints, strings, lists and dicts (no tensors or
arrays), so ``torch.save`` (``weights_only=True``), ``json`` and ``pickle`` all round-trip it. It
carries its format version, the order's fingerprint (the dataset's identity, seed, shuffle mode,
padding) and a checksum of its own contents; :func:`read_state` checks all of them and raises one
:class:`~fastload.errors.ResumeStateError` naming whatever differs, is missing or mistyped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.checksum import checksum_bytes
from fastload.errors import ResumeStateError
from fastload.order import EpochOrder, Even, OrderSpec, Shuffle, coerce_enum

__all__ = [
    "STATE_VERSION",
    "Position",
    "dataset_identity",
    "make_state",
    "order_fingerprint",
    "read_state",
]

#: The state format this fastload writes and reads.
STATE_VERSION = 2


@dataclass(frozen=True)
class Position:
    """An epoch and the ``(world_size, samples)`` pairs handed out in it, oldest first.

    Attributes:
        epoch: The epoch the next batch comes from.
        consumed: The pairs; the last one is the layout the saving ranks were in. Empty: the
            epoch's start.
    """

    epoch: int = 0
    consumed: tuple[tuple[int, int], ...] = ()

    def plan(self, world_size: int) -> tuple[tuple[tuple[int, int], ...], int]:
        """``(layouts before this one, samples of each share already handed out)`` for ``world_size`` ranks.

        The pairs to give :class:`~fastload.order.EpochOrder` as ``consumed``, and its ``offset``.
        """
        if self.consumed and self.consumed[-1][0] == world_size:
            return self.consumed[:-1], self.consumed[-1][1]
        return self.consumed, 0

    @classmethod
    def at(cls, epoch: int, history: Sequence[tuple[int, int]], world_size: int, samples: int) -> Position:
        """The position of ranks in a layout of ``world_size`` after ``samples`` samples of their shares.

        A layout nobody took a sample from adds no pair: resuming there under any world size is
        the same as resuming before it.
        """
        pairs = tuple((int(w), int(s)) for w, s in history)
        if samples > 0:
            pairs += ((int(world_size), int(samples)),)
        return cls(int(epoch), pairs)

    def order(self, spec: OrderSpec) -> EpochOrder:
        """This rank's order from here: ``spec``'s rank and world size, the rest of :attr:`epoch`.

        Raises:
            ResumeStateError: A pair claims more samples than its layout holds.
        """
        history, offset = self.plan(spec.world_size)
        try:
            return EpochOrder(spec, self.epoch, consumed=history, offset=offset)
        except ValueError as exc:
            raise ResumeStateError(f"the saved position does not fit this dataset's order: {exc}") from None


def dataset_identity(dataset: Any) -> str | None:
    """What identifies a dataset's records: its index checksum, else a digest of its ids and labels.

    A packed dataset's manifest records the checksum of its record index (offsets, ids, labels,
    record checksums): two datasets with the same one hold the same records. Bare inputs (a
    ``.rec`` with its ``.idx``, an unpacked folder) get an XXH3-128 digest of their ids and labels;
    torchvision folders one of their ``(path, target)`` list; a ``Subset`` its indices and its
    dataset's. None when nothing identifies it (then only the number of records is checked).
    """
    manifest = getattr(dataset, "manifest", None)
    if isinstance(manifest, Mapping):
        index = manifest.get("index")
        if isinstance(index, Mapping) and isinstance(index.get("checksum"), str):
            return f"index {index['checksum']}"
    ids, labels = getattr(dataset, "ids", None), getattr(dataset, "labels", None)
    if isinstance(ids, np.ndarray) and isinstance(labels, np.ndarray):
        blob = np.ascontiguousarray(ids, dtype=np.uint64).tobytes() + np.ascontiguousarray(labels, np.float32).tobytes()
        return f"records {checksum_bytes(blob)}"
    records = getattr(dataset, "records", None)  # fastload.torch's ImageDataset
    if records is not None and records is not dataset:
        inner = dataset_identity(records)
        index_map = getattr(dataset, "index_map", None)
        if inner is not None and index_map is not None:
            inner = f"{inner} subset {checksum_bytes(np.ascontiguousarray(index_map, dtype=np.int64).tobytes())}"
        return inner
    indices, base = getattr(dataset, "indices", None), getattr(dataset, "dataset", None)
    if indices is not None and base is not None:  # torch.utils.data.Subset
        inner = dataset_identity(base)
        if inner is None:
            return None
        return f"{inner} subset {checksum_bytes(np.asarray(indices, dtype=np.int64).tobytes())}"
    samples = getattr(dataset, "samples", None)  # torchvision DatasetFolder
    if isinstance(samples, list) and all(isinstance(s, tuple) and len(s) == 2 for s in samples[:1]):
        text = "\n".join(f"{path}\t{target}" for path, target in samples)
        return f"samples {checksum_bytes(text.encode('utf-8', 'surrogatepass'))}"
    return None


def order_fingerprint(spec: OrderSpec, dataset: str | None) -> dict[str, Any]:
    """What a position means only together with: the records and every input of the order but the layout.

    Rank, world size, batch size and ``drop_last`` are left out: a position restores under others.
    """
    out: dict[str, Any] = {
        "dataset": dataset if dataset is not None else "",
        "records": int(spec.num_records),
        "seed": int(spec.seed),
        "shuffle": coerce_enum(Shuffle, spec.shuffle, "shuffle").value,
        "even": coerce_enum(Even, spec.even, "even").value,
    }
    if spec.shuffle is Shuffle.BLOCK:
        out["block_size"] = int(spec.block_size)
    if spec.shuffle in (Shuffle.BLOCK, Shuffle.SHARD):
        out["window"] = int(spec.window)
    if spec.shuffle is Shuffle.SHARD:
        assert spec.shard_starts is not None
        out["shards"] = checksum_bytes(np.asarray(spec.shard_starts, dtype=np.int64).tobytes())
    return out


def _digest(body: Mapping[str, Any]) -> str:
    return checksum_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def make_state(kind: str, position: Position, fingerprint: Mapping[str, Any], /, **extra: Any) -> dict[str, Any]:
    """The state dict of ``position`` for a loader of ``kind`` (see the module docstring).

    ``extra`` values must be ints, strings, lists or dicts of them (checked by a JSON encoding).
    """
    body: dict[str, Any] = {
        "kind": kind,
        "version": STATE_VERSION,
        "epoch": int(position.epoch),
        "consumed": [[int(w), int(s)] for w, s in position.consumed],
        "order": dict(fingerprint),
        **extra,
    }
    body["check"] = _digest(body)
    return body


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_field(state: Mapping[str, Any], key: str, minimum: int, where: str) -> int:
    if key not in state:
        raise ResumeStateError(f"{where}: the key {key!r} is missing")
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ResumeStateError(f"{where}: {key!r} must be an int >= {minimum}, not {_describe(value)}")
    return value


def read_state(
    state: Any, *, kind: str, fingerprint: Mapping[str, Any], extra: Mapping[str, type | tuple[type, ...]] | None = None
) -> tuple[Position, dict[str, Any]]:
    """Check a state of a loader of ``kind`` against this loader's order and return its position.

    Args:
        state: What :func:`make_state` returned (after ``torch.load``, ``json.loads`` or ``pickle``).
        kind: The loader class that reads it.
        fingerprint: This loader's :func:`order_fingerprint`.
        extra: Further keys the state must hold, with their types.

    Returns:
        ``(position, {key: value for the extra keys})``.

    Raises:
        ResumeStateError: Not such a state, a newer format, a damaged or mistyped field, or an
            order that differs (every differing field named, saved value and this loader's).
    """
    where = f"the saved {kind} state"
    if not isinstance(state, Mapping):
        raise ResumeStateError(f"{where} must be a dict (from state_dict()), not {type(state).__name__}")
    if "kind" not in state or "version" not in state:
        missing = [k for k in ("kind", "version") if k not in state]
        raise ResumeStateError(
            f"not a fastload loader state (format {STATE_VERSION}): the key(s) {missing} are missing; "
            f"keys present: {sorted(map(str, state))[:12]}"
        )
    if state["kind"] != kind:
        raise ResumeStateError(f"{where}: this is a state of {_describe(state['kind'])}, not of {kind}")
    version = state["version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise ResumeStateError(f"{where}: 'version' must be an int, not {_describe(version)}")
    if version > STATE_VERSION:
        raise ResumeStateError(
            f"{where} has format {version}, written by a newer fastload; this one reads format "
            f"{STATE_VERSION}: upgrade fastload to resume from it"
        )
    if version < STATE_VERSION:
        raise ResumeStateError(
            f"{where} has format {version}, from an older fastload; this one reads format {STATE_VERSION} "
            "(the position counted in samples, restorable under another world size)"
        )
    check = state.get("check")
    body = {k: v for k, v in state.items() if k != "check"}
    try:
        digest = _digest(body)
    except (TypeError, ValueError) as exc:
        raise ResumeStateError(f"{where} holds something other than ints, strings, lists and dicts: {exc}") from None
    epoch = _int_field(state, "epoch", 0, where)
    consumed_raw = state.get("consumed")
    if consumed_raw is None:
        raise ResumeStateError(f"{where}: the key 'consumed' is missing")
    if not isinstance(consumed_raw, (list, tuple)):
        raise ResumeStateError(f"{where}: 'consumed' must be a list of [world_size, samples] pairs")
    consumed = []
    for k, pair in enumerate(consumed_raw):
        ok = (
            isinstance(pair, (list, tuple))
            and len(pair) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair)
        )
        if not ok:
            raise ResumeStateError(
                f"{where}: consumed[{k}]={_describe(pair)} must be a [world_size, samples] pair of ints >= 1"
            )
        consumed.append((int(pair[0]), int(pair[1])))
    saved = state.get("order")
    if not isinstance(saved, Mapping):
        raise ResumeStateError(f"{where}: the key 'order' (the order's fingerprint) is missing or not a dict")
    values: dict[str, Any] = {}
    for key, types in (extra or {}).items():
        if key not in state:
            raise ResumeStateError(f"{where}: the key {key!r} is missing")
        value = state[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
            raise ResumeStateError(
                f"{where}: {key!r} must be {_type_names(types)}, not {type(value).__name__} {_describe(value)}"
            )
        values[key] = state[key]
    if check != digest:
        raise ResumeStateError(
            f"{where} is damaged: its contents do not match its checksum ('check'); it was changed after "
            "state_dict() wrote it"
        )
    diff = [
        f"{key}: saved {_describe(saved.get(key, '<missing>'))} != now {_describe(value)}"
        for key, value in fingerprint.items()
        if saved.get(key) != value
    ]
    diff += [
        f"{key}: saved {_describe(saved[key])}, not used by this loader's order"
        for key in saved
        if key not in fingerprint
    ]
    if diff:
        raise ResumeStateError(f"{where} comes from another order or dataset ({'; '.join(diff)})")
    return Position(epoch, tuple(consumed)), values


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_names(types: type | tuple[type, ...]) -> str:
    return " or ".join("None" if t is type(None) else t.__name__ for t in _as_tuple(types))
