"""Shared test code for checkpoint and resume: jobs of in-process ranks that save, stop, and restore elsewhere.

Not a test module. A *path* is one way of loading (``fastload.Loader``, ``OrderSampler``,
``fastload.torch.DataLoader``, the MXNet iterators): an adapter with ``open`` / ``take`` / ``state``
/ ``load`` / ``set_epoch`` / ``close`` (:class:`LoaderPath`). :func:`play` runs one epoch as a
sequence of *jobs*, each a :class:`Job` with its own world size and batch size: a job's ranks
(opened fresh, as after a restart) load the state the previous job's rank 0 saved, take some
batches each (all ranks the same number, as DDP keeps them), and save again. :func:`check_epoch`
then checks what resuming anywhere must give:

- every rank of a job got the same number of batches;
- the records of the epoch were handed out once each across all jobs, plus at most ``world_size``
  padding repeats per job (``drop_last``: at most ``world_size * (batch - 1)`` left out per job
  instead, plus the ``even='drop'`` tail);
- every rank's saved state is the same, and it survives ``json``, ``pickle`` and ``torch.save``;
- after the last job finished the epoch, the next passes are exactly a fresh run's with that job's
  world size and the same seed;
- jobs that all share one world size and batch size give exactly the uninterrupted run's batches.
"""

from __future__ import annotations

import collections
import io
import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Job", "LoaderPath", "Played", "check_epoch", "fresh_passes", "play", "roundtrip"]


@dataclass(frozen=True)
class Job:
    """One job of an epoch.

    Args:
        world: Its number of ranks.
        batch: Its batch size.
        take: Batches each rank takes before the job saves and stops; None: to the end of the pass.
        set_epoch: When the job calls ``set_epoch(epoch)`` around ``load_state_dict``: ``"before"``,
            ``"after"`` or ``"none"``.
    """

    world: int
    batch: int
    take: int | None = None
    set_epoch: str = "before"


class LoaderPath:
    """How one loader is driven by :func:`play`; a subclass per path.

    ``open`` makes one rank's loader (``rank`` of ``world``, batches of ``batch``); ``take`` returns
    the sample ids of up to ``count`` next batches of its current pass (starting one when none is
    open; ``None``: to the pass's end); ``state`` / ``load`` / ``set_epoch`` / ``close`` are the
    loader's own.
    """

    name = "loader"
    #: Records of the dataset the path reads.
    records = 0
    #: The loader pads shares (``even='pad'``) rather than dropping the tail.
    pads = True
    drop_last = False

    def open(self, rank: int, world: int, batch: int) -> Any:
        raise NotImplementedError

    def take(self, handle: Any, count: int | None) -> list[np.ndarray]:
        raise NotImplementedError

    def state(self, handle: Any) -> dict[str, Any]:
        return handle.state_dict()

    def load(self, handle: Any, state: dict[str, Any]) -> None:
        handle.load_state_dict(state)

    def set_epoch(self, handle: Any, epoch: int) -> None:
        handle.set_epoch(epoch)

    def close(self, handle: Any) -> None:
        close = getattr(handle, "close", None)
        if close is not None:
            close()


class IteratedPath(LoaderPath):
    """A path whose ``open`` returns ``{"loader": ..., "it": None}``: batches come from iterating the
    loader, one pass at a time; a subclass says how a pass starts and which ids a batch holds."""

    def start_pass(self, handle: dict[str, Any]) -> None:
        """Called before a pass's iterator is made."""

    def ids(self, batch: Any) -> np.ndarray:
        return batch.indices.copy()

    def take(self, handle: Any, count: int | None) -> list[np.ndarray]:
        if count == 0:
            return []
        if handle["it"] is None:
            self.start_pass(handle)
            handle["it"] = iter(handle["loader"])
        out = []
        for batch in handle["it"]:
            out.append(self.ids(batch))
            if count is not None and len(out) == count:
                break
        else:
            handle["it"] = None
        return out

    def state(self, handle: Any) -> dict[str, Any]:
        return handle["loader"].state_dict()

    def load(self, handle: Any, state: dict[str, Any]) -> None:
        handle["loader"].load_state_dict(state)
        handle["it"] = None

    def set_epoch(self, handle: Any, epoch: int) -> None:
        handle["loader"].set_epoch(epoch)
        handle["it"] = None

    def close(self, handle: Any) -> None:
        handle["loader"].close()


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` through ``json``, ``pickle`` and ``torch.save`` (``weights_only=True``) in turn; must be unchanged."""
    out = json.loads(json.dumps(state))
    assert out == state, "the state does not survive json"
    out = pickle.loads(pickle.dumps(out))
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is in the project's environment
        return out
    buf = io.BytesIO()
    torch.save(out, buf)
    buf.seek(0)
    out = torch.load(buf, weights_only=True)
    assert out == state, "the state does not survive torch.save / torch.load(weights_only=True)"
    return out


@dataclass
class Played:
    """What :func:`play` saw: per job, per rank, the id arrays of the batches handed out."""

    jobs: list[Job]
    batches: list[list[list[np.ndarray]]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    after: list[list[list[np.ndarray]]] = field(default_factory=list)

    def ids(self, job: int | None = None) -> np.ndarray:
        """Every id handed out (by one job, or by all)."""
        jobs = range(len(self.batches)) if job is None else [job]
        arrays = [b for j in jobs for rank in self.batches[j] for b in rank]
        return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)


def play(
    path: LoaderPath, epoch: int, jobs: Sequence[Job], *, after: int = 1, state: dict[str, Any] | None = None
) -> Played:
    """Run ``jobs`` one after the other over ``epoch``, then ``after`` more passes of the last job's ranks.

    The first job starts at ``epoch`` (``set_epoch``), or from ``state`` when given. Each later job's
    ranks load the state the previous job's rank 0 saved (after :func:`roundtrip`).
    """
    played = Played(list(jobs))
    for j, job in enumerate(jobs):
        handles = [path.open(r, job.world, job.batch) for r in range(job.world)]
        try:
            for h in handles:
                if j == 0 and state is None:
                    path.set_epoch(h, epoch)
                    continue
                saved = state if j == 0 else played.states[-1]
                if job.set_epoch == "before":
                    path.set_epoch(h, epoch)
                path.load(h, saved)
                if job.set_epoch == "after":
                    path.set_epoch(h, epoch)
            got = [path.take(h, job.take) for h in handles]
            counts = [len(g) for g in got]
            assert len(set(counts)) == 1, f"{path.name}: job {j} ({job}): unequal batch counts per rank {counts}"
            played.batches.append(got)
            states = [roundtrip(path.state(h)) for h in handles]
            for r, s in enumerate(states[1:], 1):
                assert s == states[0], f"{path.name}: job {j}: rank {r} saved another state than rank 0"
            played.states.append(states[0])
            if j == len(jobs) - 1:
                for _ in range(after):
                    more = [path.take(h, None) for h in handles]
                    assert len({len(m) for m in more}) == 1, f"{path.name}: unequal batch counts after the resume"
                    played.after.append(more)
        finally:
            for h in handles:
                path.close(h)
    return played


def fresh_passes(path: LoaderPath, world: int, batch: int, epoch: int, passes: int = 1) -> list[list[list[np.ndarray]]]:
    """``passes`` passes from ``epoch`` of a fresh job of ``world`` ranks: ``[pass][rank][batch]``."""
    out: list[list[list[np.ndarray]]] = [[] for _ in range(passes)]
    for r in range(world):
        h = path.open(r, world, batch)
        try:
            path.set_epoch(h, epoch)
            for p in range(passes):
                out[p].append(path.take(h, None))
        finally:
            path.close(h)
    return out


def same_batches(a: list[list[np.ndarray]], b: list[list[np.ndarray]], what: str) -> None:
    assert len(a) == len(b), f"{what}: {len(a)} ranks against {len(b)}"
    for r, (x, y) in enumerate(zip(a, b, strict=True)):
        assert len(x) == len(y), f"{what}: rank {r} got {len(x)} batches, expected {len(y)}"
        for k, (u, v) in enumerate(zip(x, y, strict=True)):
            assert np.array_equal(u, v), f"{what}: rank {r} batch {k}: {u.tolist()} != {v.tolist()}"


def check_epoch(path: LoaderPath, played: Played, epoch: int, *, finished_in: int | None = None) -> None:
    """The standard checks on ``played`` (see the module docstring).

    Args:
        path: The path played.
        played: What :func:`play` returned; its last job runs to the end of the epoch.
        epoch: The epoch the jobs covered.
        finished_in: The job whose batches ended the epoch when an earlier job than the last one
            did (a state taken after the epoch's last batch); the jobs after it run the next epochs.
    """
    jobs = played.jobs
    end = len(jobs) - 1 if finished_in is None else finished_in
    n = path.records
    counts: collections.Counter = collections.Counter()
    for j in range(end + 1):
        counts.update(played.ids(j).tolist())
    assert set(counts) <= set(range(n)), f"{path.name}: ids outside the dataset"
    repeats = sum(counts.values()) - len(counts)
    missing = n - len(counts)
    worlds = [jobs[j].world for j in range(end + 1)]
    slack_pad = sum(worlds)
    if path.drop_last:
        left = sum(jobs[j].world * (jobs[j].batch - 1) for j in range(end + 1))
        tail = 0 if path.pads else sum(worlds)
        assert missing <= left + tail, f"{path.name}: {missing} records left out, at most {left + tail} allowed"
    elif path.pads:
        assert missing == 0, (
            f"{path.name}: {missing} records of epoch {epoch} never handed out: {sorted(set(range(n)) - set(counts))[:20]}"
        )
    else:
        assert missing <= slack_pad, f"{path.name}: {missing} records dropped, at most {slack_pad} allowed"
    assert repeats <= slack_pad, f"{path.name}: {repeats} repeated samples, at most {slack_pad} allowed"
    last = jobs[-1]
    # The passes after the epoch: exactly a fresh run's with the last job's layout.
    later = played.batches[end + 1 :] + played.after
    if later:
        fresh = fresh_passes(path, last.world, last.batch, epoch + 1, len(later))
        for p, (got, want) in enumerate(zip(later, fresh, strict=True)):
            same_batches(got, want, f"{path.name}: pass {p + 1} after epoch {epoch}")
    # One world size and batch size throughout: exactly the uninterrupted run.
    if len({(jb.world, jb.batch) for jb in jobs[: end + 1]}) == 1:
        (reference,) = fresh_passes(path, jobs[0].world, jobs[0].batch, epoch, 1)
        joined = [[b for j in range(end + 1) for b in played.batches[j][r]] for r in range(jobs[0].world)]
        same_batches(joined, reference, f"{path.name}: resumed at the same world size")
