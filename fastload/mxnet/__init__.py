"""Device stage (MXNet): drop-in ``ImageRecordIter`` and ``NDArrayIter`` and a ``PrefetchingIter``.

Change one line -- ``mx.io.ImageRecordIter(`` -> ``fastload.mxnet.ImageRecordIter(``,
``mx.io.NDArrayIter(`` -> ``fastload.mxnet.NDArrayIter(`` -- and batches are assembled on a
background thread into ``mx.cpu_pinned()`` memory. Only CPU contexts have run here (no GPU on the
development machine); see :mod:`fastload.mxnet.placement`.
"""

from __future__ import annotations

from fastload.mxnet.array_iter import NDArrayIter
from fastload.mxnet.distributed import resolve_parts
from fastload.mxnet.placement import numpy_view, pinned_allocator, pinned_empty
from fastload.mxnet.prefetch_iter import PrefetchingIter

from fastload.mxnet.image_iter import ImageRecordIter

__all__ = ["ImageRecordIter", "NDArrayIter", "PrefetchingIter", "numpy_view", "pinned_empty",
           "pinned_allocator", "resolve_parts"]
