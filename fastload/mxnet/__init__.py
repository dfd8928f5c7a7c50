"""Device stage (MXNet): drop-in ``ImageRecordIter`` and ``NDArrayIter`` and a ``PrefetchingIter``.

Change one line -- ``mx.io.ImageRecordIter(`` -> ``fastload.mxnet.ImageRecordIter(``,
``mx.io.NDArrayIter(`` -> ``fastload.mxnet.NDArrayIter(`` -- and batches are assembled on a
background thread into ``mx.cpu_pinned()`` memory. MXNet's aliases (``ImageRecordIter_v1``,
``ImageRecordUInt8Iter``, ``ImageRecordUInt8Iter_v1``, ``ImageRecordInt8Iter``) are here too. Every
iterator implements MXNet's whole ``DataIter`` protocol (:mod:`fastload.mxnet.protocol`), so
``mx.io.ResizeIter``, ``mx.io.PrefetchingIter`` and ``Module.fit`` drive them as MXNet's own. Only
CPU contexts have run here (no GPU on the development machine); see :mod:`fastload.mxnet.placement`.
"""

from __future__ import annotations

from fastload.mxnet.arguments import MXNetArgumentError, UnknownArgumentWarning
from fastload.mxnet.array_iter import NDArrayIter
from fastload.mxnet.distributed import resolve_parts
from fastload.mxnet.image_iter import (
    ImageRecordInt8Iter,
    ImageRecordIter,
    ImageRecordIter_v1,
    ImageRecordUInt8Iter,
    ImageRecordUInt8Iter_v1,
)
from fastload.mxnet.placement import numpy_view, pinned_allocator, pinned_empty
from fastload.mxnet.prefetch_iter import PrefetchingIter

__all__ = [
    "ImageRecordInt8Iter",
    "ImageRecordIter",
    "ImageRecordIter_v1",
    "ImageRecordUInt8Iter",
    "ImageRecordUInt8Iter_v1",
    "MXNetArgumentError",
    "NDArrayIter",
    "PrefetchingIter",
    "UnknownArgumentWarning",
    "numpy_view",
    "pinned_allocator",
    "pinned_empty",
    "resolve_parts",
]
