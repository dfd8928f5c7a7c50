"""Device stage (torch), state: the sampler and generator states a DataLoader saves and restores.

Saved states are plain data (:func:`plain` turns RNG state tensors into strings), so ``torch.save``
with ``weights_only=True``, ``json`` and ``pickle`` all round-trip them. Also the worker-like scope
(seeded RNGs, one intra-op thread) in which per-sample Python runs with ``num_workers > 0``.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from fastload.torch.sampler import OrderSampler, distributed_rank_world

_TENSOR = "torch.Tensor"


def plain(obj: Any) -> Any:
    """``obj`` with every tensor (RNG states) as a small dict of strings and ints; lists for tuples."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        return {
            "type": _TENSOR,
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "bytes": base64.b64encode(t.numpy().tobytes()).decode("ascii"),
        }
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    return obj


def unplain(obj: Any) -> Any:
    """:func:`plain`'s inverse (tensors back; lists stay lists)."""
    if isinstance(obj, dict):
        if obj.get("type") == _TENSOR and set(obj) == {"type", "dtype", "shape", "bytes"}:
            dtype = getattr(torch, str(obj["dtype"]), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"the saved DataLoader state holds a tensor of unknown dtype {obj['dtype']!r}")
            data = bytearray(base64.b64decode(obj["bytes"]))
            return torch.frombuffer(data, dtype=dtype).reshape(obj["shape"]).clone()
        return {k: unplain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unplain(v) for v in obj]
    return obj


def order_sampler(loader: Any) -> OrderSampler | None:
    """The :class:`OrderSampler` the loader draws from (as its sampler or its batch sampler's), if any."""
    for s in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(s, OrderSampler):
            return s
    return None


def world_size(loader: Any) -> int:
    """The world size a loader's torch sampler shards over: a ``DistributedSampler``'s, else the process group's."""
    for s in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(s, DistributedSampler) and not isinstance(s, OrderSampler):
            return int(s.num_replicas)
    return distributed_rank_world()[1]


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


def _samplers(loader: Any) -> list[Any]:
    out: list[Any] = []
    for s in (loader.sampler, loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)):
        if s is not None and all(s is not o for o in out):
            out.append(s)
    return out


def _sampler_states(loader: Any, order_kwargs: dict[str, Any] | None = None) -> list[Any]:
    """Each sampler's ``state_dict()`` when it has one, else its ``epoch`` when it has ``set_epoch``.

    ``order_kwargs``: what an :class:`OrderSampler`'s ``state_dict`` is told (the samples the
    loader handed out of its pass), when given.
    """
    states: list[Any] = []
    for s in _samplers(loader):
        if isinstance(s, OrderSampler) and order_kwargs:
            states.append({"state_dict": s.state_dict(**order_kwargs)})
        elif callable(getattr(s, "state_dict", None)) and callable(getattr(s, "load_state_dict", None)):
            states.append({"state_dict": s.state_dict()})
        elif callable(getattr(s, "set_epoch", None)) and isinstance(getattr(s, "epoch", None), int):
            states.append({"epoch": int(s.epoch)})
        else:
            states.append(None)
    return states


def _load_sampler_states(loader: Any, states: list[Any]) -> None:
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


class _WorkerLike:
    """Run per-sample Python the way a torch worker would, the caller's state kept.

    A torch worker process runs the dataset's transforms and ``collate_fn`` with its own seeded RNGs
    and one intra-op thread (``torch.set_num_threads(1)`` at its start). Both hold here for the
    duration of the call, then the caller's RNG states and thread count come back. The thread
    count matters beyond fidelity: a MixUp / CutMix ``collate_fn`` run with torch's default
    intra-op threads beside the engine's decode threads (and any other busy process) splits each
    batch-sized op over threads the cores cannot all run at once, and every op then waits for a
    descheduled thread: measured 5-10x slower per batch with one core taken by another process.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> _WorkerLike:
        self._torch = torch.get_rng_state()
        self._py = random.getstate()
        self._np = np.random.get_state()  # noqa: NPY002 - saved and restored around the call, as torch's worker does
        self._threads = torch.get_num_threads()
        torch.manual_seed(self.seed)
        random.seed(self.seed)
        np.random.seed(self.seed & 0xFFFFFFFF)  # noqa: NPY002
        if self._threads != 1:
            torch.set_num_threads(1)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._threads != 1:
            torch.set_num_threads(self._threads)
        torch.set_rng_state(self._torch)
        random.setstate(self._py)
        np.random.set_state(self._np)  # noqa: NPY002
