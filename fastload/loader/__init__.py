"""The loader stage: order -> records -> decode -> ring -> prefetch, framework-free.

:class:`Loader` ties the stages together. One producer thread (:mod:`fastload.prefetch`) walks this
rank's batches (:mod:`fastload.order`); the records of the coming batches are read ahead in the
order they will be decoded, neighbours coalesced into one read and several reads in flight
(:mod:`fastload.records.readahead`, driven by ``reading``); for each batch it takes a free slot from
the ring (:mod:`fastload.batch`), waits for its records (the ``read_wait`` stage: time bound by
storage) and makes **one** ``decode_batch`` call that writes the pixels straight into the slot. The
consumer iterates :class:`~fastload.batch.Batch` objects whose arrays are views into the slot.

Batch lifetime: a batch is never overwritten while anything made from it is alive. Its arrays
hold a lease on their slot; the slot is refilled only once every array, slice or zero-copy tensor
made from them has been garbage-collected (and the fences attached to it completed). Keeping
batches is safe: the ring grows by up to ``max_extra_slots`` slots, then hands out batches in fresh
memory with one :class:`~fastload.errors.KeptBatchesWarning`. ``copy=True`` still hands out
detached copies (not needed for safety). See :mod:`fastload.batch`.

Position, resume and epochs: iterating the loader runs one epoch. When an epoch is completed the
loader moves to the next one by itself, and :meth:`Loader.set_epoch` sets it explicitly (as with
``DistributedSampler``). The producer does not stop at the end of an epoch: it runs on into the next
one (bounded by the ring), so the next pass starts with batches already decoded; a pass that asks
for another position (abandoned mid-epoch, another ``set_epoch``, a resume) restarts it there.
:meth:`Loader.state_dict` is ``{"epoch", "batch"}`` (plus a fingerprint of everything the order
depends on); after :meth:`Loader.load_state_dict` the next iteration yields exactly the batches an
uninterrupted run would have yielded from that point, because the order and every random crop are
pure functions of ``(seed, epoch, index)``.

Threads and shutdown (one class, ``_Driver``, owns starting, continuing, restarting and stopping
the producer; everything else asks it):

- A pass (``iter(loader)``) belongs to the thread that started it until it is exhausted, closed
  (``iterator.close()``) or dropped. Meanwhile ``next()`` on it from another thread, and
  ``iter(loader)``, ``set_epoch()`` or ``load_state_dict()`` from another thread, raise
  :class:`~fastload.errors.LoaderBusy`. From the owning thread, ``iter()`` / ``set_epoch()`` /
  ``load_state_dict()`` end the open pass and start from the requested position.
  ``state_dict()``, ``stats()`` and ``close()`` work from any thread.
- ``close()`` stops the producer thread (and joins it), frees the ring's memory (a batch still held
  keeps its own slot alive) and closes a dataset the loader opened. It is idempotent. A consumer
  waiting in ``next()`` meanwhile raises :class:`~fastload.errors.LoaderClosed`, and so does every
  later ``next()`` or ``iter()``.
- The loader never refers to its iterators (only weakly), so a dropped loader is freed at once by
  reference counting, without waiting for a garbage-collection pass; its finalizer stops the thread.

Bad records: ``on_error="raise"`` raises :class:`~fastload.errors.DecodeError` naming the sample and
``dataset.locate(i)``; ``on_error="skip"`` logs each bad record once, counts it in
:meth:`Loader.stats`, and fills its position with the next record *in dataset index order*
(``i + 1``, ``i + 2``, ... wrapping) that decodes. That substitute depends only on the data, not on
the batch or resume point, so skipping is deterministic and keeps batches full and batch counts
equal across ranks.

The package's modules, one job each: ``config`` (:class:`LoaderConfig` and its checks), ``pipeline``
(the producer side: produce, fill, substitute), ``reading`` (each batch's records: read ahead or
one by one), ``driver`` (the producer's runs, the passes, the
position, ``close()``), ``iterator`` (one pass as an iterator) and ``loader`` (:class:`Loader`).
"""

from fastload.errors import OnError
from fastload.loader.config import LoaderConfig, transform_image_dtype
from fastload.loader.loader import Loader
from fastload.records.read_options import ReadOptions

__all__ = ["Loader", "LoaderConfig", "OnError", "ReadOptions", "transform_image_dtype"]
