"""Device stage (MXNet): ``ImageRecordIter``, a drop-in ``mx.io.ImageRecordIter`` on the fastload loader.

Reads any ``.rec`` written by MXNet's ``im2rec`` / ``MXIndexedRecordIO`` and fastload dataset folders
(``fastload pack``) through ``fastload.loader.Loader``: order -> zero-copy record views -> one
GIL-free ``decode_batch`` per batch writing the pixels straight into ``mx.cpu_pinned()`` slots.

Arguments: every parameter of MXNet 1.9's ``ImageRecordIter`` is accepted under its name with its
default and parsed as MXNet parses it (:mod:`fastload.mxnet.arguments`; unknown arguments are
ignored with one warning; bad values raise ``MXNetArgumentError``, an ``mx.base.MXNetError``). What
they become:

- reading (:mod:`fastload.mxnet.record_source`): ``path_imgrec`` (a ``.rec`` or a fastload folder),
  ``path_imgidx`` (anywhere), ``path_imglist`` (labels by record id), ``label_width``;
- order: ``shuffle`` with ``seed`` -> a new permutation every epoch, a pure function of
  (seed, epoch); ``shuffle_chunk_size`` / ``shuffle_chunk_seed`` (MXNet's chunk shuffle of a
  ``.rec`` read without an index) -> fastload's block shuffle with blocks of about that many MB;
  ``part_index`` / ``num_parts`` (or a ``dist_*`` ``kvstore``, or ``rank`` / ``num_workers``) ->
  this worker's equal share; ``preprocess_threads`` -> decode threads, capped as MXNet caps them
  (:func:`~fastload.mxnet.arguments.decode_threads`: 1 on 2 cores); ``prefetch_buffer`` ->
  batches decoded ahead;
- pixels (:mod:`fastload.mxnet.augmenter`): the augmenter's arguments -> ``MXNetDefaultAugment``, the
  colour ones -> ``MXNetColorAugment``, ``mean_*``/``std_*``/``scale`` -> ``Normalize``, each run by
  the engine when this build has the spec; ``seed_aug`` (or ``seed``) keys every random draw by
  record and epoch. Until the engine has ``Normalize``, float RGB outputs are normalized with numpy
  on the loader's producer thread right after the decode, into float ring slots
  (``_HostNormalize``); int8 and grayscale outputs are computed by MXNet operators from the slot;
- output: ``data_shape`` ``(3, H, W)`` or ``(1, H, W)`` (grayscale: BT.601 luma of the decoded RGB,
  MXNet decodes libjpeg's Y channel: the same values up to rounding); ``dtype`` ``float32``
  (``(pixel - mean) * scale / std``, or minus ``mean_img``), ``uint8`` (raw pixels; ``mean_*``,
  ``std_*``, ``scale``, ``mean_img`` ignored, as MXNet does), ``int8`` (``pixel - round(mean)``
  saturated to [-128, 127], as MXNet), and ``float16`` (a fastload extension: MXNet 1.9.1 aborts
  with "unknown dtype"); ``data_name`` / ``label_name``; labels ``(batch,)`` for ``label_width=1``,
  else ``(batch, label_width)``.
- ``round_batch=True``: every batch is full and an epoch has ``ceil(records / batch_size)``
  batches; the last one is completed with the first records of the epoch's order and ``pad`` says
  how many (MXNet then starts its next epoch after those records, so its epochs differ in length;
  fastload restarts every epoch at its first record, keeping batch counts equal). ``False``: the
  missing rows are zero pixels (before mean/std) with label 0, ``pad`` says how many and ``index``
  lists the real rows only (MXNet 1.9.1 reports ``pad=0`` there, measured: 48 records,
  ``batch_size=32``, so ``Module.predict`` would return outputs for rows that are no records).
- ``DataBatch.index``: the record ids (IRHeader ``id`` of a ``.rec``, manifest id of a folder).
- ``ctx``: MXNet's ``'cpu'`` / ``'gpu'`` change nothing, as in MXNet. An ``mx.Context`` or a list
  of them makes every batch array a list of per-context copies, each slice copied from pinned
  memory on its own (``work_load_list`` sets the split, as Module's). ``device_id=-1`` puts batches
  in ``mx.cpu()`` memory instead of ``mx.cpu_pinned()``.

Aliases: ``ImageRecordIter_v1`` (MXNet's older implementation of the same arguments and outputs),
``ImageRecordUInt8Iter`` and ``ImageRecordUInt8Iter_v1`` (``dtype='uint8'``),
``ImageRecordInt8Iter`` (``dtype='int8'``).

Batch lifetime: a ``DataBatch`` stays intact for as long as it is kept (``[b.data[0] for b in it]``
is safe, and so is ``Module.fit`` reading the previous batch). The decoded slot is wrapped zero-copy
(:func:`fastload.mxnet.placement.wrap_view`), which holds the slot's lease: ``dtype='uint8'`` RGB data
*is* that NDArray (context ``cpu(0)``: MXNet's zero-copy import labels host memory so), the other
outputs are computed from it into new ``cpu_pinned`` arrays by MXNet operators, labels are copied.
The slot is refilled once the NDArray and every engine operation reading it are gone; a consumer
that keeps many raw batches makes the ring grow, then get fresh memory (:mod:`fastload.batch`).
``round_batch`` padding is decoded by the loader with the rest of the batch (``on_error`` policy,
stats).

Not run on a GPU: on this machine ``mx.cpu(0)``/``mx.cpu(1)`` stand in for devices.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, ClassVar

import mxnet as mx
import numpy as np

import fastload.transforms as transforms
from fastload.errors import LoaderBusy
from fastload.loader import Loader, LoaderConfig
from fastload.mxnet.arguments import MXNetArgumentError, RecordIterArgs, decode_threads, parse_args
from fastload.mxnet.augmenter import aug_seed, color_spec, geometry_spec, normalize_spec
from fastload.mxnet.distributed import resolve_parts
from fastload.mxnet.mean_image import GRAY_WEIGHTS, compute_mean_image, mean_image
from fastload.mxnet.placement import normalize_contexts, numpy_view, place, split_slices, wrap_view
from fastload.mxnet.protocol import BatchIter
from fastload.mxnet.record_source import open_records

__all__ = [
    "ImageRecordInt8Iter",
    "ImageRecordIter",
    "ImageRecordIter_v1",
    "ImageRecordUInt8Iter",
    "ImageRecordUInt8Iter_v1",
]

log = logging.getLogger("fastload.mxnet")

_U32 = 0xFFFFFFFF


class _HostNormalize:
    """MXNet's ``(pixel - mean) * scale / std`` from decoded uint8 pixels into a float slot, on the producer.

    Stands in for the engine's ``Normalize`` while this build lacks it (:func:`augmenter.normalize_spec`
    returns None): it runs right after each batch's decode, on the loader's producer thread, and
    writes the final dtype into the ring slot, so batches are zero-copy and no MXNet operator (nor a
    fresh output array) is needed per batch. Measured on a batch of 128 x 3 x 224 x 224: 55-70 ms
    with numpy against 110-150 ms for MXNet's cast + broadcast_sub + broadcast_mul into a reused array
    (200-265 ms into a new one). Per-channel means use a 256-entry table per channel computed with
    MXNet's float32 arithmetic, so the values are MXNet's bit for bit; a mean image is subtracted
    elementwise.
    """

    def __init__(self, mean: np.ndarray, mult: np.ndarray, dtype: str) -> None:
        self.dtype = np.dtype(dtype)
        self.mult = mult.astype(np.float32).reshape(-1, 1, 1)
        if mean.shape[1:] == (1, 1):
            levels = np.arange(256, dtype=np.float32)[None, :]
            table = (levels - mean.reshape(-1, 1).astype(np.float32)) * self.mult.reshape(-1, 1)
            self.table, self.mean = table.astype(self.dtype), None
        else:
            self.table, self.mean = None, mean.astype(np.float32)

    @property
    def needs_flips(self) -> bool:
        """A mean image is subtracted at each pixel's source position (mirrored for mirrored images)."""
        return self.mean is not None

    def __call__(self, pixels: np.ndarray, out: np.ndarray, flips: np.ndarray | None = None) -> None:
        if self.table is not None:
            for c in range(pixels.shape[1]):
                np.take(self.table[c], pixels[:, c], out=out[:, c])
            return
        mean = np.broadcast_to(self.mean, pixels.shape)
        if flips is not None and flips.any():
            # MXNet subtracts meanimg[i][j] from the source pixel (i, j), then writes it mirrored.
            mean = np.where(flips.reshape(-1, 1, 1, 1), self.mean[..., ::-1], self.mean)
        values = np.subtract(pixels, mean, dtype=np.float32)
        np.multiply(values, self.mult, out=values)
        out[...] = values

    def zero_rows(self, out: np.ndarray) -> None:
        """What a zero pixel becomes (round_batch=False padding rows)."""
        if len(out):
            self(np.zeros((1, *out.shape[1:]), dtype=np.uint8), out[:1])
            out[1:] = out[:1]


def _seeded_decode(aug_seed: int, post: _HostNormalize | None = None):
    """``decode_batch`` with every random draw keyed by ``aug_seed`` instead of the order's seed.

    With ``post``, the pixels are decoded into a uint8 scratch buffer (reused: the loader calls its
    decode from its one producer thread) and ``post`` writes them into the float ``out``.
    """
    from fastload.decode import decode_batch

    scratch: dict[tuple, np.ndarray] = {}

    def decode(images, out, transform, *, seed: int = 0, **kwargs):
        if post is None:
            return decode_batch(images, out, transform, seed=aug_seed, **kwargs)
        pixels = scratch.get(out.shape)
        if pixels is None:
            pixels = scratch[out.shape] = np.empty(out.shape, dtype=np.uint8)
        if post.needs_flips:
            kwargs["want_params"] = True
        result = decode_batch(images, pixels, transform, seed=aug_seed, **kwargs)
        post(pixels, out, result.flips if post.needs_flips else None)
        return result

    return decode


def _pinned_on(ctx: mx.Context):
    def allocate(shape, dtype):
        nd = mx.nd.empty(tuple(int(s) for s in shape), ctx=ctx, dtype=np.dtype(dtype))
        return numpy_view(nd), nd

    return allocate


class ImageRecordIter(BatchIter):
    """Drop-in ``mx.io.ImageRecordIter``: same argument names, meanings and defaults (see the module doc).

    Required: ``path_imgrec``, ``data_shape`` and ``batch_size``. fastload extras: ``ctx`` as a
    context or a list of them, ``work_load_list``, ``kvstore``, ``rank`` / ``num_workers``;
    :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch exactly.

    Raises:
        MXNetArgumentError: An argument MXNet would refuse, one this build does not support yet at
            that value, or a file that cannot be read (``mx.base.MXNetError`` and ``ValueError``).
    """

    single_array = True
    #: Arguments an alias fixes (``ImageRecordUInt8Iter``: ``dtype='uint8'``).
    alias_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **kwargs: Any) -> None:
        for name, value in self.alias_defaults.items():
            if name in kwargs and str(kwargs[name]) != str(value):
                # MXNet's aliases are separate iterators whose output type is fixed.
                log.warning(
                    "%s ignores %s=%r: it always produces %s=%r", type(self).__name__, name, kwargs[name], name, value
                )
        kwargs = {**kwargs, **self.alias_defaults}
        args = parse_args(kwargs, warn_stacklevel=3)
        super().__init__(args.batch_size)
        self.args = args
        self.loader: Loader | None = None
        self._dataset = None
        self._iter = None
        try:
            self._setup(args)
        except MXNetArgumentError:
            self.close()
            raise
        except ValueError as exc:
            self.close()
            raise MXNetArgumentError(f"{type(self).__name__}: {exc}") from exc

    # -- construction ------------------------------------------------------------------------------

    def _setup(self, args: RecordIterArgs) -> None:
        self.batch_size = int(args.batch_size)
        self.data_shape = tuple(args.data_shape)
        self.channels = self.data_shape[0]
        self.label_width = int(args.label_width)
        self.data_name = args.data_name
        self.label_name = args.label_name
        self.round_batch = bool(args.round_batch)
        self.dtype = args.dtype or "float32"
        self._out_ctx = mx.cpu() if args.device_id == -1 else mx.cpu_pinned(max(0, args.device_id))
        self.part_index, self.num_parts = resolve_parts(
            part_index=args.part_index,
            num_parts=args.num_parts,
            kvstore=args.extras.get("kvstore"),
            rank=args.extras.get("rank"),
            num_workers=args.extras.get("num_workers"),
        )
        self._setup_contexts(args)
        geometry = geometry_spec(args)
        color = color_spec(args, self.dtype)
        normalize = normalize_spec(args, self.dtype)
        self.transform = self._compose(geometry, color, normalize)
        path = os.fspath(args.path_imgrec)
        self._dataset = open_records(
            path_imgrec=path, path_imgidx=args.path_imgidx, path_imglist=args.path_imglist, label_width=self.label_width
        )
        self._aug_seed = aug_seed(args)
        shuffle, order_seed, block_size = self._order(args, path)
        # Float RGB outputs the engine does not normalize yet are normalized on the producer thread,
        # straight into float slots (see _HostNormalize); int8 and grayscale use MXNet operators.
        host = normalize is None and self.dtype in ("float32", "float16") and self.channels == 3
        self.config = LoaderConfig(
            batch_size=self.batch_size,
            transform=self.transform,
            shuffle=shuffle,
            seed=order_seed,
            block_size=block_size,
            drop_last=False,
            even="pad",
            rank=self.part_index,
            world_size=self.num_parts,
            num_threads=decode_threads(args.preprocess_threads),
            prefetch=max(1, int(args.prefetch_buffer)),
            layout="NCHW",
            round_batch=self.round_batch,
            image_dtype=self.dtype if host else None,
        )
        self._mean = None
        if args.mean_img and self.dtype != "uint8":
            pixels = self._compose(geometry, color, None)
            self._mean = mean_image(
                args.mean_img, self.data_shape, lambda: self._compute_mean(pixels), verbose=bool(args.verbose)
            )
        if self._mean is not None and not host and (args.mirror or args.rand_mirror):
            # MXNet subtracts the mean image at each pixel's source position, i.e. mirrored for mirrored
            # images; only the float RGB path (_HostNormalize) knows which images were mirrored.
            raise MXNetArgumentError(
                f"ImageRecordIter: mean_img with mirror/rand_mirror is not yet supported for "
                f"dtype={self.dtype!r} with {self.channels} channel(s) (float32/float16 RGB only)"
            )
        self._setup_normalization(args)
        # Float RGB slots (normalized here or by the engine): also what the padding rows of
        # round_batch=False become, a zero pixel normalized.
        self._float_rgb = (
            self._host_normalize(args) if self.dtype in ("float32", "float16") and self.channels == 3 else None
        )
        self._host = self._float_rgb if host else None
        self.loader = Loader(
            self._dataset,
            self.config,
            allocator=_pinned_on(self._out_ctx),
            decode=_seeded_decode(self._aug_seed, self._host),
        )
        self._ids = getattr(self._dataset, "ids", None)
        self._iter_thread = None
        self._ended = False  # this epoch's batches were all handed out: next() stops until reset()
        self._loaded = False  # at a loaded position, no batch taken since: reset() keeps it
        if args.verbose:
            log.info(
                "ImageRecordIter: %s, %d records, part %d of %d, %s, %d decode threads",
                path,
                len(self._dataset),
                self.part_index,
                self.num_parts,
                self.transform,
                self.config.num_threads,
            )

    def _setup_contexts(self, args: RecordIterArgs) -> None:
        ctx = args.ctx
        work_load_list = args.extras.get("work_load_list")
        self._ctxs = None if isinstance(ctx, str) else normalize_contexts(ctx)
        if self._ctxs is not None:
            self._slices = split_slices(self.batch_size, len(self._ctxs), work_load_list)
        elif work_load_list is not None:
            raise MXNetArgumentError("ImageRecordIter argument work_load_list needs ctx=[mx.Context, ...]")

    @staticmethod
    def _compose(geometry, color, normalize):
        if color is None and normalize is None:
            return geometry
        return transforms.Pipeline(geometry=geometry, ops=(color,) if color is not None else (), normalize=normalize)

    def _order(self, args: RecordIterArgs, path: str):
        """(shuffle mode, order seed, block size) for MXNet's shuffle arguments."""
        seed = args.seed & _U32
        if args.shuffle_chunk_size > 0 and not args.path_imgidx and os.path.isfile(path):
            # MXNet reads a .rec without an index sequentially and shuffles chunks of
            # shuffle_chunk_size MB (keyed by shuffle_chunk_seed), then records within what it read
            # (keyed by seed): fastload's block shuffle, blocks of about as many records.
            per_record = os.path.getsize(path) / max(1, len(self._dataset))
            block = max(1, round((args.shuffle_chunk_size << 20) / max(1.0, per_record)))
            return "block", ((args.shuffle_chunk_seed & _U32) | (seed << 32)), block
        return ("global" if args.shuffle else "none"), seed, 256

    def _compute_mean(self, transform) -> np.ndarray:
        """MXNet's mean image: this part's records once each, through the augmenter, averaged."""
        config = LoaderConfig(
            batch_size=self.batch_size,
            transform=transform,
            shuffle="none",
            seed=0,
            drop_last=False,
            even="pad",
            rank=self.part_index,
            world_size=self.num_parts,
            num_threads=self.config.num_threads,
            prefetch=1,
            layout="NCHW",
        )
        with Loader(self._dataset, config, decode=_seeded_decode(self._aug_seed)) as loader:
            return compute_mean_image(loader, len(self._dataset), self.channels)

    def _host_normalize(self, args: RecordIterArgs) -> _HostNormalize:
        c = self.channels
        mean = np.array([args.mean_r, args.mean_g, args.mean_b][:c], dtype=np.float32).reshape(c, 1, 1)
        std = np.array([args.std_r, args.std_g, args.std_b][:c], dtype=np.float32)
        mult = np.float32(args.scale) / std  # MXNet: contrast_scaled / std with contrast_scaled = scale
        return _HostNormalize(self._mean if self._mean is not None else mean, mult, self.dtype)

    def _setup_normalization(self, args: RecordIterArgs) -> None:
        c = self.channels
        mean = np.array([args.mean_r, args.mean_g, args.mean_b][:c], dtype=np.float32).reshape(1, c, 1, 1)
        std = np.array([args.std_r, args.std_g, args.std_b][:c], dtype=np.float32).reshape(1, c, 1, 1)
        if self._mean is not None:
            mean = self._mean[None]
        ctx = self._out_ctx
        if self.dtype == "int8":
            # MXNet: saturate_cast<int8>(pixel - round(mean)); std and scale do not apply.
            self._sub = mx.nd.array(np.round(mean), ctx=ctx, dtype=np.float32)
            self._mul = None
        elif self.dtype in ("float32", "float16"):
            self._sub = mx.nd.array(mean, ctx=ctx, dtype=np.float32)
            self._mul = mx.nd.array(np.float32(args.scale) / std, ctx=ctx, dtype=np.float32)
            if not np.any(mean != 0) and not np.any(self._mul.asnumpy() != 1):
                self._sub = self._mul = None
        else:
            ignored = {
                k: args[k]
                for k in ("mean_r", "mean_g", "mean_b", "std_r", "std_g", "std_b", "scale", "mean_img")
                if not args.is_default(k)
            }
            if ignored:
                log.warning("ImageRecordIter(dtype='uint8') returns raw pixels and ignores %s, as MXNet does", ignored)
            self._sub = self._mul = None
        self._gray = mx.nd.array(np.asarray(GRAY_WEIGHTS, np.float32).reshape(1, 3, 1, 1), ctx=ctx)

    # -- DataIter interface ------------------------------------------------------------------------

    @property
    def provide_data(self) -> list[mx.io.DataDesc]:
        return [mx.io.DataDesc(self.data_name, (self.batch_size, *self.data_shape), np.dtype(self.dtype).type)]

    @property
    def provide_label(self) -> list[mx.io.DataDesc]:
        shape = (self.batch_size,) if self.label_width == 1 else (self.batch_size, self.label_width)
        return [mx.io.DataDesc(self.label_name, shape, np.float32)]

    def __len__(self) -> int:
        """Batches of the current epoch, or of the next one before it starts (the same for every part).

        With ``round_batch`` epochs differ, as MXNet's: one that starts after records the previous
        epoch's last batch borrowed has fewer.
        """
        if self._iter is not None:
            return len(self._iter.order)
        return self.loader.pass_batches()

    def reset(self) -> None:
        """Start the next epoch (new shuffle and random augmentations).

        After an epoch read to its end, the next one starts after the records its last batch
        borrowed (``round_batch``, as MXNet); after an epoch left early, at the next epoch's first
        record (MXNet: ``BeforeFirst`` of the record reader).
        """
        self._forget_current()
        it, self._iter = self._iter, None
        if it is None and self._loaded:
            pass  # a loop that resets before each epoch, right after load_state_dict: keep the position
        elif self._ended or (it is not None and self._handed_all(it)):
            if it is not None and not it.finished:
                self._see_epoch_end(it)
        else:
            epoch = self.loader.epoch
            if it is not None:
                it.close()
            self.loader.set_epoch(epoch + 1)
        if it is not None:
            it.close()
        self._ended = self._loaded = False

    @staticmethod
    def _handed_all(it) -> bool:
        return it.finished or it.start + it.taken >= len(it.order)

    def _see_epoch_end(self, it) -> None:
        """Take the end marker after an epoch's last batch: the loader then moves to the next epoch itself."""
        import threading

        if self._iter_thread is threading.current_thread():
            with contextlib.suppress(StopIteration):
                next(it)
                raise RuntimeError("ImageRecordIter: a batch after the epoch's last one")  # pragma: no cover
            return
        # The pass belongs to another thread: the same, through the loader's position.
        state = self.loader.state_dict()
        it.close()
        self.loader.load_state_dict(state)

    def _fetch(self) -> mx.io.DataBatch | None:
        if self.loader is None:
            raise RuntimeError("ImageRecordIter is closed")
        if self._ended:
            return None
        self._own_pass()
        if self._ended:
            return None
        try:
            batch = next(self._iter)
        except StopIteration:
            self._ended = True
            return None
        order = self._iter.order
        last = batch.number == len(order) - 1
        if self.round_batch:
            # The rows of the last batch that come from the next epoch's order (MXNet's pad).
            pad = len(order) * self.batch_size - len(order.rest) if last else 0
        else:
            pad = self.batch_size - batch.size
        images = batch.slot_view("images")
        labels = batch.slot_view("labels")
        if batch.size < self.batch_size:
            # round_batch=False: rows past the batch's records hold whatever the slot held before (or
            # never-written memory): give them defined values (zero pixels, label 0).
            if self._float_rgb is not None and images.dtype != np.uint8:
                self._float_rgb.zero_rows(images[batch.size :])
            else:
                images[batch.size :] = 0
            labels[batch.size :] = 0
        # Zero-copy NDArrays over the batch's lease views: the slot is refilled only after they, and
        # every engine operation reading them (the conversions and copies below), are gone.
        data = self._convert(wrap_view(images))
        label = wrap_view(labels)
        if self.label_width == 1:
            label = label.reshape((self.batch_size,))
        if self._ctxs is not None:
            data = place(data, self._ctxs, self._slices)
            label = place(label, self._ctxs, self._slices)
        else:
            label = self._copy_to(label, self._out_ctx)  # labels are small: a copy frees the slot sooner
        # round_batch=False: the padding rows stand for no record, so `index` lists the real rows only.
        rows = np.array(batch.slot_view("indices") if self.round_batch else batch.indices, dtype=np.int64)
        index = rows if self._ids is None else self._ids[rows]
        return mx.io.DataBatch(
            data=[data],
            label=[label],
            pad=pad,
            index=index,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )

    def _own_pass(self) -> None:
        """Make the loader's pass belong to this thread (MXNet iterators have no thread affinity).

        fastload's loader hands a pass's batches to the thread that started it; when ``next()`` comes
        from another thread (a prefetching wrapper, a user moving the iterator), the pass is ended and
        restarted there at the same position (its prefetched batches are decoded again).
        """
        import threading

        me = threading.current_thread()
        it = self._iter
        if it is not None and self._iter_thread is not me and self._handed_all(it):
            # The epoch was read to its end on the other thread: it stays ended here.
            self._iter = None
            if not it.finished:
                self._see_epoch_end(it)
            it.close()
            self._ended = True
            return
        if self._iter is not None and self._iter_thread is not me:
            state = self.loader.state_dict()
            self._iter.close()
            self._iter = None
            self.loader.load_state_dict(state)
        if self._iter is None:
            self._loaded = False
            try:
                self._iter = iter(self.loader)
            except LoaderBusy:  # pragma: no cover - the pass was closed above
                raise
            self._iter_thread = me

    @staticmethod
    def _copy_to(x: mx.nd.NDArray, ctx: mx.Context) -> mx.nd.NDArray:
        out = mx.nd.empty(x.shape, ctx=ctx, dtype=x.dtype)
        x.copyto(out)
        return out

    def _convert(self, images: mx.nd.NDArray) -> mx.nd.NDArray:
        """The decoded batch (a zero-copy NDArray over the slot) as this iterator's output.

        Raw outputs (uint8 RGB, or floats the engine normalized) are that NDArray itself. The others
        are computed by MXNet operators (asynchronous, on MXNet's engine threads) into new arrays on
        the output context (MXNet's operators would put them in ``cpu`` memory).
        """
        if images.dtype != np.uint8:
            # The engine wrote the final values (Normalize in the pipeline).
            return images if images.dtype == np.dtype(self.dtype) else self._cast(images, self.dtype)
        shape = (self.batch_size, self.channels, *self.data_shape[1:])
        x = images
        if self.channels == 1:
            rgb = self._cast(images, "float32")
            mx.nd.broadcast_mul(rgb, self._gray, out=rgb)
            x = mx.nd.empty(shape, ctx=self._out_ctx, dtype="float32")
            mx.nd.sum(rgb, axis=1, keepdims=True, out=x)
            mx.nd.round(x, out=x)  # float32 luma 0..255
        if self.dtype == "uint8":
            return x if x is images else self._cast(x, "uint8")
        out = x if x is not images else self._cast(x, "float32")
        if self.dtype == "int8":
            mx.nd.broadcast_sub(out, self._sub, out=out)
            mx.nd.clip(out, -128, 127, out=out)
            return self._cast(out, "int8")
        if self._sub is not None:
            mx.nd.broadcast_sub(out, self._sub, out=out)
            mx.nd.broadcast_mul(out, self._mul, out=out)
        return out if self.dtype == "float32" else self._cast(out, self.dtype)

    def _cast(self, x: mx.nd.NDArray, dtype: str) -> mx.nd.NDArray:
        out = mx.nd.empty(x.shape, ctx=self._out_ctx, dtype=dtype)
        mx.nd.cast(x, dtype=dtype, out=out)
        return out

    # -- lifecycle -----------------------------------------------------------------------------------

    def stats(self):
        """The loader's per-stage times, images/s and bad-record counts (``fastload.stats.LoaderStats``)."""
        return self.loader.stats()

    def state_dict(self) -> dict[str, Any]:
        """The loader's position (:meth:`fastload.loader.Loader.state_dict`), counted in samples.

        The records the last batch of an epoch borrowed from the next one (``round_batch``) are part
        of it; after an epoch's last batch it is the next epoch's start. A plain, versioned, checked
        dict (:mod:`fastload.position`); any part's state restores every part, under the same or
        another ``num_parts``.
        """
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next ``next()`` continues where that run stopped.

        A ``reset()`` right after loading keeps the position (loops that reset before each epoch);
        a state saved after an epoch's last batch resumes at the next epoch.

        Raises:
            ResumeStateError: Not such a state, a damaged one, or one of another dataset or order.
        """
        self._forget_current()
        if self._iter is not None:
            self._iter.close()
            self._iter = None
        self.loader.load_state_dict(state)
        self._ended, self._loaded = False, True

    def close(self) -> None:
        """Stop the producer and close the records (idempotent)."""
        if self._iter is not None:
            self._iter.close()
            self._iter = None
        if self.loader is not None:
            self.loader.close()
        if self._dataset is not None:
            self._dataset.close()
            self._dataset = None

    def __enter__(self) -> ImageRecordIter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # The loader and its running epoch refer to each other, so only the garbage collector would
        # reclaim them: stop the producer as soon as the iterator itself is dropped.
        with contextlib.suppress(Exception):
            self.close()


class ImageRecordIter_v1(ImageRecordIter):
    """MXNet's ``ImageRecordIter_v1``: the older implementation of the same arguments and outputs."""


class ImageRecordUInt8Iter(ImageRecordIter):
    """MXNet's ``ImageRecordUInt8Iter``: ``ImageRecordIter`` with ``dtype='uint8'`` by default."""

    alias_defaults: ClassVar[dict[str, Any]] = {"dtype": "uint8"}


class ImageRecordUInt8Iter_v1(ImageRecordUInt8Iter):
    """MXNet's ``ImageRecordUInt8Iter_v1``: the same as :class:`ImageRecordUInt8Iter`."""


class ImageRecordInt8Iter(ImageRecordIter):
    """MXNet's ``ImageRecordInt8Iter``: ``ImageRecordIter`` with ``dtype='int8'`` by default."""

    alias_defaults: ClassVar[dict[str, Any]] = {"dtype": "int8"}
