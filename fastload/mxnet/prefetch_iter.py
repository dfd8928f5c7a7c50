"""Queue stage (MXNet): ``PrefetchingIter`` runs any ``mx.io.DataIter`` ahead of training on a thread.

Each wrapped iterator gets its own ``fastload.prefetch.Producer`` (bounded queue, stop event,
exceptions re-raised in the consumer with the producer's traceback), so several iterators also
run in parallel with each other; their batches are combined as ``mx.io.PrefetchingIter`` does (data
lists concatenated, optionally renamed). It implements the whole ``DataIter`` pull protocol
(:mod:`fastload.mxnet.protocol`).

Kept batches: the batches handed out are the wrapped iterators' own, so they stay intact exactly
as long as the wrapped iterator keeps them: forever for fastload's iterators and for Python
iterators that build fresh arrays; MXNet's C++ iterators recycle ``prefetch_buffer`` output buffers
(see ``prefetch``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

import mxnet as mx

from fastload.mxnet.protocol import BatchIter
from fastload.prefetch import Producer

__all__ = ["PrefetchingIter"]


def _rename(descs: Iterable[mx.io.DataDesc], mapping: dict[str, str] | None) -> list[mx.io.DataDesc]:
    if not mapping:
        return list(descs)
    out = []
    for d in descs:
        name = mapping.get(d.name, d.name)
        out.append(mx.io.DataDesc(name, d.shape, d.dtype, d.layout))
    return out


class PrefetchingIter(BatchIter):
    """Overlap one or more ``mx.io.DataIter`` with training.

    Args:
        iters: One iterator or a list of them (their batches are combined, like MXNet's
            ``PrefetchingIter``; all must yield the same number of batches).
        rename_data: Per iterator, a dict renaming its data names.
        rename_label: Per iterator, a dict renaming its label names.
        prefetch: Batches each iterator may run ahead of the consumer. The wrapped iterator's
            batches must stay valid while ``prefetch + 1`` further batches are requested: fastload
            iterators and Python iterators that build fresh arrays allow any depth; MXNet's C++
            iterators recycle ``prefetch_buffer`` (default 4) output buffers, so keep
            ``prefetch`` below that (the default 1 is what ``mx.io.PrefetchingIter`` holds).
    """

    def __init__(
        self,
        iters: mx.io.DataIter | Sequence[mx.io.DataIter],
        rename_data: Sequence[dict[str, str]] | None = None,
        rename_label: Sequence[dict[str, str]] | None = None,
        *,
        prefetch: int = 1,
    ) -> None:
        iters = [iters] if isinstance(iters, mx.io.DataIter) else list(iters)
        if not iters or not all(isinstance(it, mx.io.DataIter) for it in iters):
            raise ValueError("iters must be an mx.io.DataIter or a non-empty list of them")
        for name, ren in (("rename_data", rename_data), ("rename_label", rename_label)):
            if ren is not None and len(ren) != len(iters):
                raise ValueError(f"{name} has {len(ren)} entries for {len(iters)} iterators")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch={prefetch!r} must be an int >= 1")
        super().__init__(iters[0].batch_size)
        self.iters = iters
        self.rename_data = rename_data
        self.rename_label = rename_label
        self._prefetch = prefetch
        self._producers: list[Producer[mx.io.DataBatch]] | None = None
        self._closed = False

    @property
    def provide_data(self) -> list[mx.io.DataDesc]:
        return [
            d
            for i, it in enumerate(self.iters)
            for d in _rename(it.provide_data, self.rename_data[i] if self.rename_data else None)
        ]

    @property
    def provide_label(self) -> list[mx.io.DataDesc]:
        return [
            d
            for i, it in enumerate(self.iters)
            for d in _rename(it.provide_label, self.rename_label[i] if self.rename_label else None)
        ]

    def _start(self) -> list[Producer[mx.io.DataBatch]]:
        def make(it: mx.io.DataIter) -> Callable[[threading.Event], Iterator[mx.io.DataBatch]]:
            def produce(stop: threading.Event) -> Iterator[mx.io.DataBatch]:
                while not stop.is_set():
                    try:
                        batch = it.next()
                    except StopIteration:
                        return
                    yield batch

            return produce

        self._producers = [
            Producer(make(it), maxsize=self._prefetch, name=f"fastload-prefetch-{i}") for i, it in enumerate(self.iters)
        ]
        return self._producers

    def _stop(self) -> None:
        if self._producers is not None:
            for p in self._producers:
                p.close()
            self._producers = None

    def reset(self) -> None:
        """Stop the threads, reset every wrapped iterator; prefetching restarts on the next batch."""
        self._forget_current()
        self._stop()
        for it in self.iters:
            it.reset()

    def _fetch(self) -> mx.io.DataBatch | None:
        if self._closed:
            raise RuntimeError("PrefetchingIter is closed")
        producers = self._producers if self._producers is not None else self._start()
        batches, ended = [], []
        for i, p in enumerate(producers):
            try:
                batches.append(p.get())
            except StopIteration:
                ended.append(i)
        if ended:
            if len(ended) != len(producers):
                raise ValueError(
                    f"wrapped iterators {ended} ended before the others: they must yield the same number of batches"
                )
            return None
        if len(batches) == 1 and not self.rename_data and not self.rename_label:
            return batches[0]
        data = [a for b in batches for a in (b.data or [])]
        label = [a for b in batches for a in (b.label or [])]
        return mx.io.DataBatch(
            data=data,
            label=label,
            pad=batches[0].pad,
            index=batches[0].index,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )

    def close(self) -> None:
        """Stop the background threads (idempotent); the wrapped iterators are left as they are."""
        self._stop()
        self._closed = True

    def __enter__(self) -> PrefetchingIter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
