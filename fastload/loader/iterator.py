"""The loader's consumer side: one pass over an epoch, as an iterator of batches."""

from __future__ import annotations

import weakref

from fastload.batch import Batch
from fastload.loader.driver import _Driver, _Pass
from fastload.order import EpochOrder


class _EpochIterator:
    """One pass over an epoch: a handle on the driver's pass state.

    It keeps the loader alive while iterating (``for b in Loader(...)``); the loader refers to it
    only weakly, so no reference cycle keeps a dropped loader (and its ring) alive.
    """

    __slots__ = ("__weakref__", "_driver", "_loader", "_pass")

    def __init__(self, loader: object, driver: _Driver, ps: _Pass) -> None:
        self._loader = loader  # kept alive while iterating; the driver is its ``_driver``
        self._driver = driver
        self._pass = ps
        ps.iterator = weakref.ref(self)

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        """Batches this pass hands out in all (a resumed epoch has fewer than ``len(loader)``)."""
        return self._driver.pass_batches(self._pass) - self._pass.start

    def __next__(self) -> Batch:
        return self._driver.take(self._pass)

    def close(self) -> None:
        """End this pass; a pass that did not finish its epoch stops the producer (idempotent)."""
        self._driver.end_pass(self._pass)

    @property
    def epoch(self) -> int:
        return self._pass.epoch

    @property
    def order(self) -> EpochOrder:
        """The pass's :class:`~fastload.order.EpochOrder` (batch ``k`` of the pass is ``order[k]``)."""
        return self._driver.order(self._pass.cursor)

    @property
    def start(self) -> int:
        return self._pass.start

    @property
    def taken(self) -> int:
        return self._pass.taken

    @property
    def finished(self) -> bool:
        return self._pass.finished
