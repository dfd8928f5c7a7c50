"""Device stage (MXNet): the ``mx.io.DataIter`` pull protocol, shared by every fastload iterator.

MXNet code drives iterators two ways: ``next()`` / ``for batch in it`` (``Module.fit``, Gluon
loops), and the pull API that wrappers and subclasses use: ``iter_next()`` moves to the next batch
and says whether there is one, then ``getdata()``, ``getlabel()``, ``getpad()``, ``getindex()``
read it. :class:`BatchIter` implements both on top of one method, ``_fetch()``, and ``next()`` goes
through ``iter_next()`` and the getters, as ``mx.io.DataIter.next`` does, so a subclass that
overrides ``iter_next`` (to stop early, to count) or a getter (to transform data) is obeyed.

What the getters return follows the MXNet class each fastload iterator replaces: Python iterators
(``NDArrayIter``, ``PrefetchingIter``) return lists of arrays; the C++ iterators' wrapper
(``MXDataIter``, behind ``ImageRecordIter``) returns the one data array and the one label array,
and ``next()`` wraps them in lists (:attr:`BatchIter.single_array`).

``default_bucket_key`` is ``None``: no fastload iterator buckets its batches (``ResizeIter`` and
``BucketingModule`` read the attribute when it exists).
"""

from __future__ import annotations

from typing import Any

import mxnet as mx

__all__ = ["BatchIter"]


class BatchIter(mx.io.DataIter):  # type: ignore[misc]  # mxnet ships no type information: its classes are Any
    """``mx.io.DataIter`` with the full pull protocol over :meth:`_fetch`.

    Subclasses implement :meth:`_fetch` (the next ``DataBatch`` or None at the end of the epoch)
    and call :meth:`_forget_current` from ``reset``.
    """

    #: getdata()/getlabel() return one array (MXNet's C++ iterators) instead of a list.
    single_array = False
    default_bucket_key = None

    _current: mx.io.DataBatch | None = None

    def _fetch(self) -> mx.io.DataBatch | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _forget_current(self) -> None:
        self._current = None

    def iter_next(self) -> bool:
        """Move to the next batch; False at the end of the epoch (then ``reset()`` starts the next)."""
        self._current = self._fetch()
        return self._current is not None

    def next(self) -> mx.io.DataBatch:
        """The next batch (``StopIteration`` at the end of the epoch), read through the getters."""
        if not self.iter_next():
            raise StopIteration
        current = self._current
        data, label = self.getdata(), self.getlabel()
        if self.single_array:
            data = [data]
            label = [label] if label is not None else []
        return mx.io.DataBatch(
            data=data,
            label=label,
            pad=self.getpad(),
            index=self.getindex(),
            bucket_key=getattr(current, "bucket_key", None),
            provide_data=getattr(current, "provide_data", None),
            provide_label=getattr(current, "provide_label", None),
        )

    def __next__(self) -> mx.io.DataBatch:
        return self.next()

    def __iter__(self) -> BatchIter:
        return self

    def _batch(self) -> mx.io.DataBatch:
        if self._current is None:
            raise RuntimeError(
                f"{type(self).__name__} has no current batch: call iter_next() (and check that it "
                "returned True) before getdata(), getlabel(), getpad() or getindex()"
            )
        return self._current

    def getdata(self) -> Any:
        """Data of the current batch: a list of arrays (one array for ``single_array`` iterators)."""
        data = self._batch().data
        return data[0] if self.single_array else data

    def getlabel(self) -> Any:
        """Labels of the current batch: a list of arrays (one array, or None, for ``single_array``)."""
        label = self._batch().label
        if self.single_array:
            return label[0] if label else None
        return label

    def getpad(self) -> int:
        """Rows at the end of the current batch that stand for no example."""
        return int(self._batch().pad or 0)

    def getindex(self) -> Any:
        """Indices of the current batch's examples (what the iterator reports as ``DataBatch.index``)."""
        return self._batch().index
