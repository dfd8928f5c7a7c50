"""Device stage (torch), state: the sampler and generator states a DataLoader saves and restores.

Also the worker-like RNG scope in which per-sample Python runs with ``num_workers > 0``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


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


class _WorkerLikeRNG:
    """Run per-sample Python the way a torch worker would: its own seeded RNGs, caller's state kept.

    Also one intra-op thread, as torch's worker loop sets (``torch.set_num_threads(1)``): the
    per-sample ops and the ``collate_fn`` (a MixUp / CutMix collate stacks the whole batch) would run
    in a worker process with one thread. With the engine's decode threads on the cores, several
    intra-op threads would wait on each other at every parallel kernel (measured: ``torch.stack``
    of 64 x 3 x 224 x 224 float32 took 1.6 s with 2 threads against 70 ms with one, on 2 busy cores).
    The caller's thread count is restored on exit.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self):
        self._torch = torch.get_rng_state()
        self._py = random.getstate()
        self._np = np.random.get_state()  # noqa: NPY002 - saved and restored around the call, as torch's worker does
        self._threads = torch.get_num_threads()
        torch.manual_seed(self.seed)
        random.seed(self.seed)
        np.random.seed(self.seed & 0xFFFFFFFF)  # noqa: NPY002
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self._threads)
        torch.set_rng_state(self._torch)
        random.setstate(self._py)
        np.random.set_state(self._np)  # noqa: NPY002
