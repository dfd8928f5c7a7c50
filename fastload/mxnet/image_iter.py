"""Device stage (MXNet): ``ImageRecordIter``, a drop-in ``mx.io.ImageRecordIter`` on the fastload loader.

Reads any ``.rec`` written by MXNet's ``im2rec`` / ``MXIndexedRecordIO`` (its ``.idx`` beside it)
and fastload dataset folders (``fastload pack``), through ``fastload.loader.Loader``: order ->
zero-copy record views -> one GIL-free ``decode_batch`` per batch writing uint8 pixels straight into
``mx.cpu_pinned()`` slots. Conversion to ``float32`` with mean/std/scale runs as MXNet operators on
the engine's threads (asynchronous, vectorized), so it overlaps the training step.

Argument mapping (MXNet's names, meanings and defaults):

- ``random_resized_crop=True`` -> ``RandomResizedCrop(scale=(min_random_area, max_random_area),
  ratio=(min_aspect_ratio, max_aspect_ratio))``; with ``min_aspect_ratio=None`` the ratio range is
  ``[1 - max_aspect_ratio, 1 + max_aspect_ratio]`` as in MXNet. For the usual ImageNet recipe pass
  ``min_random_area=0.08, min_aspect_ratio=3/4, max_aspect_ratio=4/3``.
- ``rand_crop=True`` alone (MXNet: cut a ``data_shape`` window at a random position of the image
  after ``resize``, without rescaling) -> ``RandomResizedCrop`` with the same area/aspect ranges,
  i.e. with MXNet's defaults (area 1, aspect 1) a random square crop of the whole image rescaled
  to ``data_shape``. fastload's engine always resamples a box to the output size; a fixed
  unscaled window is not offered, so crops are random in position but cover the area range given.
- neither -> evaluation: ``resize > 0``: shorter side to ``resize`` then a centered
  ``data_shape`` crop (``CenterCrop(size, resize)``); ``resize <= 0``: the largest centered box of
  the output's aspect ratio resampled to ``data_shape`` (MXNet would cut the center pixels
  without rescaling, which differs when the image is not already ``data_shape`` sized).
- ``rand_mirror`` -> flip with probability 0.5; ``mirror=True`` -> always flipped.
- ``mean_*``/``std_*``/``scale``: ``out = (pixel - mean) / std * scale`` per channel (RGB), as
  MXNet's normalizer; ``dtype='uint8'`` returns the raw pixels and refuses normalization.
- ``round_batch``: every batch is full size (``batch_size`` rows) and an epoch has
  ``ceil(records / batch_size)`` batches, as in MXNet. ``True``: the last partial batch is completed
  with the first records of the epoch's order and ``pad`` says how many, as MXNet does in the first
  epoch (MXNet then starts the next epoch after those records, so its batch count varies from epoch
  to epoch; fastload restarts every epoch at its first record, keeping equal batch counts).
  ``False``: the missing rows are zero pixels (before mean/std) with label 0, ``pad`` says how many
  and ``index`` lists only the ``batch_size - pad`` real rows. MXNet 1.9.1 instead returns
  ``pad=0`` with leftover rows (measured on a 48-record ``.rec``, ``batch_size=32``), which makes
  ``Module.predict`` return outputs for rows that are no records; fastload's ``pad`` keeps those
  out.
- ``DataBatch.index``: the record ids (the IRHeader ``id`` of a ``.rec``, the manifest id of a
  fastload folder) of the batch's rows.
- ``part_index``/``num_parts``, ``kvstore`` (a ``dist_*`` kvstore or its name), ``rank``/
  ``num_workers``: this worker reads its own contiguous share of the epoch permutation; every
  worker gets the same number of batches (``fastload.order``).
- ``ctx``: MXNet's string values (``'cpu'``/``'gpu'``) change nothing, as in MXNet. An
  ``mx.Context`` or a list of them makes every batch array a list of per-context copies, each slice
  copied from pinned memory on its own (``work_load_list`` sets the split, as Module's).

Any other argument raises a ``ValueError`` naming it, unless it is set to MXNet's no-op default.
Batch lifetime: a ``DataBatch`` stays valid for as long as you keep it, as with MXNet's own
iterators (``[b.data[0] for b in it]`` is safe). ``dtype='uint8'`` data wraps the pinned slot
zero-copy (``mx.nd.from_numpy(..., zero_copy=True)``: context ``cpu(0)``, since MXNet's DLPack import
accepts only CPU and GPU memory); the slot is refilled only after that NDArray and every engine
operation still reading it are gone. Float data are cast by the engine into a fresh ``cpu_pinned``
array per batch (MXNet's storage pool recycles the memory), labels are copied; each slot is refilled
only after MXNet's engine has finished every queued operation reading it (copies, casts).

Not run on a GPU: on this machine ``mx.cpu(0)``/``mx.cpu(1)`` stand in for devices.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Sequence

import numpy as np

import mxnet as mx

from fastload.loader import Loader, LoaderConfig
from fastload.mxnet.distributed import resolve_parts
from fastload.mxnet.placement import normalize_contexts, numpy_view, pinned_allocator, place, split_slices, wait_to_write
from fastload.order import EpochOrder
from fastload.transforms import CenterCrop, RandomResizedCrop

__all__ = ["ImageRecordIter", "SUPPORTED_ARGS", "NOOP_DEFAULTS"]

log = logging.getLogger("fastload.mxnet")

SUPPORTED_ARGS = frozenset({
    "path_imgrec", "path_imgidx", "data_shape", "batch_size", "label_width", "shuffle", "seed", "rand_crop",
    "random_resized_crop", "min_random_area", "max_random_area", "min_aspect_ratio", "max_aspect_ratio",
    "rand_mirror", "mirror", "resize", "mean_r", "mean_g", "mean_b", "std_r", "std_g", "std_b", "scale",
    "preprocess_threads", "prefetch_buffer", "part_index", "num_parts", "round_batch", "data_name",
    "label_name", "dtype", "ctx", "work_load_list", "kvstore", "rank", "num_workers", "verbose", "device_id",
})

# MXNet arguments fastload does not implement, accepted only at the value that makes them no-ops.
NOOP_DEFAULTS: Dict[str, Any] = {
    "aug_seq": "aug_default", "max_rotate_angle": 0, "rotate": -1, "max_shear_ratio": 0, "max_crop_size": -1,
    "min_crop_size": -1, "max_random_scale": 1, "min_random_scale": 1, "max_img_size": 1e10, "min_img_size": 0,
    "brightness": 0, "contrast": 0, "saturation": 0, "pca_noise": 0, "random_h": 0, "random_s": 0, "random_l": 0,
    "fill_value": 255, "inter_method": 1, "pad": 0, "mean_img": "", "mean_a": 0, "std_a": 1,
    "max_random_contrast": 0, "max_random_illumination": 0, "shuffle_chunk_size": 0, "shuffle_chunk_seed": 0,
    "path_imglist": "", "seed_aug": None,
}

_DTYPES = ("float32", "float16", "uint8")


class _EngineFence:
    """A ring fence that completes once MXNet's engine has no pending operation on the slot arrays.

    ``query`` is called by the loader's producer thread right before it refills the slot; it blocks
    in ``MXNDArrayWaitToWrite`` until queued reads (device copies, casts) are done, then says True.
    """

    __slots__ = ("arrays",)

    def __init__(self, arrays: Sequence["mx.nd.NDArray"]) -> None:
        self.arrays = arrays

    def query(self) -> bool:
        for a in self.arrays:
            wait_to_write(a)
        return True


def _float(kwargs: Dict[str, Any], name: str, default: float) -> float:
    value = kwargs.pop(name, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be a number") from None


class ImageRecordIter(mx.io.DataIter):
    """Drop-in ``mx.io.ImageRecordIter``: same argument names, meanings and defaults (see the module doc).

    Required: ``path_imgrec`` (a ``.rec`` with its ``.idx``, or a fastload dataset folder),
    ``data_shape`` ``(3, H, W)`` and ``batch_size``. Extras beyond MXNet: ``ctx`` as a context list,
    ``work_load_list``, ``kvstore``, ``rank``/``num_workers``, ``layout`` is always NCHW.
    """

    def __init__(self, **kwargs: Any) -> None:
        unknown = sorted(k for k in kwargs if k not in SUPPORTED_ARGS and k not in NOOP_DEFAULTS)
        if unknown:
            raise ValueError(f"fastload.mxnet.ImageRecordIter does not know the argument(s) {unknown}")
        unsupported = sorted(k for k in kwargs if k in NOOP_DEFAULTS and kwargs[k] != NOOP_DEFAULTS[k])
        if unsupported:
            detail = ", ".join(f"{k}={kwargs[k]!r} (only {NOOP_DEFAULTS[k]!r} is accepted)" for k in unsupported)
            raise ValueError(f"fastload.mxnet.ImageRecordIter does not support {detail}")
        kw = {k: v for k, v in kwargs.items() if k in SUPPORTED_ARGS}
        for req in ("path_imgrec", "data_shape", "batch_size"):
            if req not in kw:
                raise ValueError(f"ImageRecordIter needs {req}=")
        path = os.fspath(kw.pop("path_imgrec"))
        idx = kw.pop("path_imgidx", "")
        if idx and not os.path.isdir(path):
            expected = os.path.splitext(path)[0] + ".idx"
            if os.path.abspath(idx) != os.path.abspath(expected):
                raise ValueError(f"path_imgidx={idx!r}: fastload reads the index beside the record file "
                                 f"({expected}); move or link it there")
        data_shape = tuple(int(s) for s in kw.pop("data_shape"))
        if len(data_shape) != 3 or data_shape[0] != 3 or min(data_shape) <= 0:
            raise ValueError(f"data_shape={data_shape!r} must be (3, height, width): fastload decodes RGB")
        batch_size = kw.pop("batch_size")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive int")
        super().__init__(int(batch_size))
        self.batch_size = int(batch_size)
        self.data_shape = data_shape
        self.label_width = int(kw.pop("label_width", 1))
        self.data_name = str(kw.pop("data_name", "data"))
        self.label_name = str(kw.pop("label_name", "softmax_label"))
        self.round_batch = bool(kw.pop("round_batch", True))
        dtype = kw.pop("dtype", None)
        dtype = "float32" if dtype is None else np.dtype(dtype).name
        if dtype not in _DTYPES:
            raise ValueError(f"dtype={dtype!r} is not supported (one of {_DTYPES}, or None for float32)")
        self.dtype = dtype
        mean = np.array([_float(kw, f"mean_{c}", 0.0) for c in "rgb"], dtype=np.float32)
        std = np.array([_float(kw, f"std_{c}", 1.0) for c in "rgb"], dtype=np.float32)
        scale = _float(kw, "scale", 1.0)
        if np.any(std <= 0):
            raise ValueError(f"std_r/g/b={std.tolist()} must be positive")
        self._normalize = bool(np.any(mean != 0) or np.any(std != 1) or scale != 1)
        if dtype == "uint8" and self._normalize:
            raise ValueError("dtype='uint8' returns raw pixels: mean_*/std_*/scale must keep their defaults")
        self._mean = mx.nd.array(mean.reshape(1, 3, 1, 1), ctx=mx.cpu_pinned(), dtype=dtype)
        self._factor = mx.nd.array((scale / std).reshape(1, 3, 1, 1), ctx=mx.cpu_pinned(), dtype=dtype)
        transform = self._transform(kw, data_shape[1:])
        shuffle = bool(kw.pop("shuffle", False))
        seed = int(kw.pop("seed", 0))
        if seed < 0:
            raise ValueError(f"seed={seed} must be >= 0")
        threads = kw.pop("preprocess_threads", 4)
        prefetch = kw.pop("prefetch_buffer", 4)
        self.part_index, self.num_parts = resolve_parts(
            part_index=kw.pop("part_index", 0), num_parts=kw.pop("num_parts", 1), kvstore=kw.pop("kvstore", None),
            rank=kw.pop("rank", None), num_workers=kw.pop("num_workers", None))
        ctx = kw.pop("ctx", None)
        work_load_list = kw.pop("work_load_list", None)
        kw.pop("verbose", None)
        kw.pop("device_id", None)
        if kw:  # every SUPPORTED_ARGS name is consumed above
            raise AssertionError(f"unhandled arguments {sorted(kw)}")
        self._ctxs = None if isinstance(ctx, str) else normalize_contexts(ctx)
        if isinstance(ctx, str) and ctx not in ("cpu", "gpu"):
            raise ValueError(f"ctx={ctx!r} must be 'cpu', 'gpu', an mx.Context or a list of them")
        if self._ctxs is not None:
            self._slices = split_slices(self.batch_size, len(self._ctxs), work_load_list)
        elif work_load_list is not None:
            raise ValueError("work_load_list needs ctx=[mx.Context, ...]")
        self.config = LoaderConfig(batch_size=self.batch_size, transform=transform,
                                   shuffle="global" if shuffle else "none", seed=seed, drop_last=False, even="pad",
                                   rank=self.part_index, world_size=self.num_parts, num_threads=int(threads),
                                   prefetch=max(1, int(prefetch)), layout="NCHW")
        self.loader = Loader(path, self.config, allocator=pinned_allocator)
        ds_width = self.loader.label_width
        if self.label_width > ds_width:
            raise ValueError(f"label_width={self.label_width} but {path} stores {ds_width} label(s) per record")
        self._ids = getattr(self.loader.dataset, "ids", None)
        self._epoch = 0
        self._iter = None
        self._views: Dict[int, np.ndarray] = {}

    # -- argument mapping --------------------------------------------------------------------------

    @staticmethod
    def _transform(kw: Dict[str, Any], size):
        rrc = bool(kw.pop("random_resized_crop", False))
        rand_crop = bool(kw.pop("rand_crop", False))
        min_area = _float(kw, "min_random_area", 1.0)
        max_area = _float(kw, "max_random_area", 1.0)
        max_aspect = _float(kw, "max_aspect_ratio", 0.0)
        min_aspect = kw.pop("min_aspect_ratio", None)
        ratio = (1.0 - max_aspect, 1.0 + max_aspect) if min_aspect is None else (float(min_aspect), max_aspect)
        flip = 1.0 if bool(kw.pop("mirror", False)) else (0.5 if bool(kw.pop("rand_mirror", False)) else 0.0)
        kw.pop("rand_mirror", None)
        resize = int(kw.pop("resize", -1))
        if rrc or rand_crop:
            if not 0 < min_area <= max_area <= 1:
                raise ValueError(f"min_random_area={min_area}, max_random_area={max_area} must satisfy 0 < min <= max <= 1")
            if not 0 < ratio[0] <= ratio[1]:
                raise ValueError(f"aspect ratio range {ratio} (from min_aspect_ratio/max_aspect_ratio) must be "
                                 "positive and increasing")
            if resize > 0:
                # The engine samples crops on the full image; a prior shorter-side resize only changes
                # the pixel grid the crop is cut from, not the crop's area fraction or aspect.
                log.info("resize=%d before a random crop is implied: crops are taken as area fractions", resize)
            return RandomResizedCrop(size=tuple(size), scale=(min_area, max_area), ratio=ratio, flip=flip)
        if resize > 0 and resize < min(size):
            raise ValueError(f"resize={resize} is smaller than data_shape {tuple(size)}")
        return CenterCrop(size=tuple(size), resize=resize if resize > 0 else None, flip=flip)

    # -- DataIter interface ------------------------------------------------------------------------

    @property
    def provide_data(self) -> List[mx.io.DataDesc]:
        return [mx.io.DataDesc(self.data_name, (self.batch_size,) + self.data_shape, np.dtype(self.dtype), "NCHW")]

    @property
    def provide_label(self) -> List[mx.io.DataDesc]:
        shape = (self.batch_size,) if self.label_width == 1 else (self.batch_size, self.label_width)
        return [mx.io.DataDesc(self.label_name, shape, np.float32, "N" if self.label_width == 1 else "NC")]

    def __len__(self) -> int:
        """Batches per epoch (the same for every part)."""
        return len(self.loader)

    def reset(self) -> None:
        """Start the next epoch (new shuffle and crops when ``shuffle``/random crops are on)."""
        if self._iter is not None:
            self._iter.close()
            self._iter = None
        self._epoch += 1
        self.loader.set_epoch(self._epoch)

    def next(self) -> mx.io.DataBatch:
        if self._iter is None:
            self._iter = iter(self.loader)
        batch = next(self._iter)  # StopIteration ends the epoch, as MXNet's iterators do
        images_nd = batch.owners["images"]
        labels_nd = batch.owners["labels"]
        m = batch.size
        pad = self.batch_size - m
        if pad and self.round_batch:
            self._complete(batch, images_nd, labels_nd, m)
        elif pad:
            # Rows past the batch's records hold whatever the slot held before (or never-written
            # memory): give them defined values so no consumer ever sees stale pixels or labels.
            self._view(images_nd)[m:] = 0
            self._view(labels_nd)[m:] = 0
        batch.add_fence(_EngineFence((images_nd, labels_nd)))
        if self.dtype == "uint8":
            # Zero-copy over the batch's lease view: the slot is not refilled while this NDArray (or
            # an engine operation reading it) is alive.
            data = mx.nd.from_numpy(batch.slot_view("images"), zero_copy=True)
        else:
            # A fresh array per batch (a kept batch is never overwritten), cast by engine operators
            # reading the slot; the fence above holds the slot until they have run.
            data = mx.nd.empty(images_nd.shape, ctx=mx.cpu_pinned(), dtype=self.dtype)
            mx.nd.cast(images_nd, dtype=self.dtype, out=data)
            if self._normalize:
                mx.nd.broadcast_sub(data, self._mean, out=data)
                mx.nd.broadcast_mul(data, self._factor, out=data)
        if self.label_width == 1:
            label = labels_nd.reshape((self.batch_size,)).copy()
        elif self.label_width == labels_nd.shape[1]:
            label = labels_nd.copy()
        else:
            label = mx.nd.slice_axis(labels_nd, axis=1, begin=0, end=self.label_width)
        if self._ctxs is not None:
            data = place(data, self._ctxs, self._slices)
            label = place(label, self._ctxs, self._slices)
        # round_batch=False: the padding rows stand for no record, so `index` lists the real rows only.
        rows = self._view(batch.owners["indices"]) if pad and self.round_batch else batch.indices
        index = rows.copy() if self._ids is None else self._ids[rows]
        return mx.io.DataBatch(data=[data], label=[label], pad=pad, index=index,
                               provide_data=self.provide_data, provide_label=self.provide_label)

    def iter_next(self) -> bool:
        raise NotImplementedError("ImageRecordIter is consumed with next() / iteration")

    def _view(self, nd) -> np.ndarray:
        key = id(nd)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = numpy_view(nd)
        return view

    def _complete(self, batch, images_nd, labels_nd, m: int) -> None:
        """round_batch: fill rows ``[m, batch_size)`` with the epoch's first records, as MXNet pads."""
        from fastload.decode import decode_batch

        share = EpochOrder(self.loader.order_spec, batch.epoch).share
        fill = share[np.arange(self.batch_size - m) % len(share)]
        ds = self.loader.dataset
        images = self._view(images_nd)
        result = decode_batch([ds.image(int(i)) for i in fill], images[m:], self.config.transform,
                              seed=self.config.seed, epoch=batch.epoch, indices=fill,
                              threads=self.config.num_threads, layout="NCHW")
        if not result.ok:
            log.warning("round_batch: %d padding record(s) failed to decode and are left black: %s",
                        len(result.errors), result.errors)
        self._view(labels_nd)[m:] = np.asarray(ds.labels, dtype=np.float32).reshape(len(ds), -1)[fill]
        self._view(batch.owners["indices"])[m:] = fill

    # -- lifecycle -----------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The loader's resume position (epoch, batch) and its order fingerprint."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next ``next()`` continues where that run stopped."""
        if self._iter is not None:
            self._iter.close()
            self._iter = None
        self.loader.load_state_dict(state)
        self._epoch = self.loader.epoch

    def close(self) -> None:
        """Stop the producer and close the dataset (idempotent)."""
        if self._iter is not None:
            self._iter.close()
            self._iter = None
        self.loader.close()

    def __enter__(self) -> "ImageRecordIter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
