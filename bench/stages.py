"""Benchmarks, fastload side: each stage of the data path alone, then together, plus references.

Stages: read only (records from the mmap'd shards, page cache or tmpfs), the decode engine alone
(full-size decode and the fused train/eval ops at 1..N threads), the whole loader (order, read,
decode, ring, prefetch) and the PyTorch adapter, host-to-device copies. The decode references are
what the decode-speed targets are ratios against: simplejpeg's and Pillow's full-size decode and the
per-image Python pipeline (decode, crop, resize, flip one image at a time).

Every contender works on the same images; bytes read from the dataset are copied out before the
decode-only stages so that those stages measure decoding, not I/O.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .harness import Contender, FunctionContender, Sample, Skip

__all__ = [
    "clear_image_cache",
    "engine_contender",
    "engine_full_contender",
    "h2d_contenders",
    "load_images",
    "loader_contender",
    "pillow_full_contender",
    "python_pipeline_contender",
    "quiesce",
    "read_contender",
    "simplejpeg_full_contender",
    "torch_loader_contender",
]


def _open(path: str):
    try:
        from fastload.records.dataset import open_dataset
    except ImportError as exc:
        raise Skip(f"fastload.records is not available: {exc}") from exc
    return open_dataset(path)


_IMAGES: dict = {}


def load_images(path: str) -> list[bytes]:
    """The encoded image bytes of every record (copied, so decode stages do no I/O).

    Cached per path: a dozen decode contenders share one read-only copy instead of holding a
    dozen (:func:`clear_image_cache` frees it).
    """
    if path not in _IMAGES:
        with _open(path) as ds:
            _IMAGES[path] = [bytes(ds.image(i)) for i in range(len(ds))]
    return _IMAGES[path]


def clear_image_cache() -> None:
    """Drop the cached image bytes of :func:`load_images`."""
    _IMAGES.clear()


def _rss_mb() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process().memory_info().rss / 1e6


def _transform(kind: str, size: int = 224):
    from fastload import transforms

    return transforms.train(size) if kind == "train" else transforms.eval_transform(size)


# --- read ------------------------------------------------------------------------------------


def read_contender(name: str, path: str, *, reference: bool = False, notes: str = "") -> Contender:
    """Every record's image bytes through ``Dataset.image`` and copied out (records/s, GB/s)."""

    def setup():
        ds = _open(path)
        biggest = max((len(ds.image(i)) for i in range(len(ds))), default=0)
        return ds, bytearray(biggest)

    def work(state):
        ds, sink = state
        view = memoryview(sink)
        total = 0
        for i in range(len(ds)):
            rec = ds.image(i)
            n = len(rec)
            view[:n] = rec  # one memcpy per record: proves the bytes were actually read
            total += n
        return len(ds), total

    return FunctionContender(
        name,
        setup=setup,
        work=work,
        teardown=lambda s: s[0].close(),
        group="read",
        threads=1,
        reference=reference,
        unit="records",
        notes=notes,
        inputs=(path,),
    )


# --- decode engine alone -------------------------------------------------------------------


def _decode_api():
    try:
        from fastload import decode
    except ImportError as exc:
        raise Skip(f"fastload.decode is not available: {exc}") from exc
    return decode


class EngineContender(Contender):
    """``fastload.decode.decode_batch`` over pre-read images, batch by batch, into one buffer."""

    def __init__(
        self,
        name: str,
        path: str,
        *,
        kind: str,
        threads: int,
        batch_size: int,
        group: str,
        family: str,
        reference: bool = False,
        notes: str = "",
        size: int = 224,
        layout: str = "NHWC",
    ) -> None:
        super().__init__(name, group=group, family=family, threads=threads, reference=reference, notes=notes)
        self.path, self.kind, self.batch_size, self.size, self.layout = path, kind, batch_size, size, layout
        self._epoch = 0

    def start(self) -> None:
        self._decode = _decode_api()
        self._images = load_images(self.path)
        if not self._images:
            raise Skip(f"{self.path} has no records")
        self._bytes = sum(len(b) for b in self._images)
        self._transform = _transform(self.kind, self.size)
        h, w = self._transform.size
        shape = (self.batch_size, h, w, 3) if self.layout == "NHWC" else (self.batch_size, 3, h, w)
        self._out = np.empty(shape, dtype=np.uint8)
        self.backend = None

    def run(self) -> Sample:
        self._epoch += 1
        n = len(self._images)
        failed = sliced = 0
        t0 = time.perf_counter()
        for s in range(0, n, self.batch_size):
            e = min(n, s + self.batch_size)
            res = self._decode.decode_batch(
                self._images[s:e],
                self._out[: e - s],
                self._transform,
                seed=0,
                epoch=self._epoch,
                indices=np.arange(s, e, dtype=np.int64),
                threads=self.threads,
                layout=self.layout,
            )
            failed += len(res.errors)
            sliced += int(getattr(res, "sliced", 0) or 0)
            self.backend = res.backend
        seconds = time.perf_counter() - t0
        return Sample(
            images=n,
            bytes=self._bytes,
            seconds=seconds,
            extra={"failed": failed, "sliced": sliced, "backend": self.backend},
        )

    def close(self) -> None:
        self._images = []
        self._out = None


def engine_contender(
    name: str,
    path: str,
    *,
    kind: str = "train",
    threads: int,
    batch_size: int,
    group: str = "decode",
    family: str | None = None,
    reference: bool = False,
    notes: str = "",
    layout: str = "NHWC",
) -> Contender:
    """The fused decode+crop+resize+flip (``kind="train"``) or resize+center-crop (``"eval"``)."""
    return EngineContender(
        name,
        path,
        kind=kind,
        threads=threads,
        batch_size=batch_size,
        group=group,
        family=family or name.rsplit(",", 1)[0],
        reference=reference,
        notes=notes,
        layout=layout,
    )


def _threaded_map(threads: int, fn: Callable[[bytes], object], images: Sequence[bytes]) -> None:
    if threads <= 1:
        for b in images:
            fn(b)
        return
    # Contiguous chunks, one per thread: the pool overhead stays out of the per-image cost.
    chunks = [images[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda chunk: [fn(b) for b in chunk], chunks))


def _full_decode_contender(
    name: str, path: str, *, threads: int, family: str, decode_one: Callable, check: Callable[[], None], notes: str
) -> Contender:
    def setup():
        check()
        images = load_images(path)
        return images, sum(len(b) for b in images)

    def work(state):
        images, nbytes = state
        _threaded_map(threads, decode_one, images)
        return len(images), nbytes

    return FunctionContender(name, setup=setup, work=work, group="decode", family=family, threads=threads, notes=notes)


def engine_full_contender(path: str, *, threads: int) -> Contender:
    """The engine's full-size decode (``decode_image``) in ``threads`` Python threads."""
    state = {}

    def check():
        state["decode"] = _decode_api()

    return _full_decode_contender(
        f"fastload full-size decode, {threads}t",
        path,
        threads=threads,
        family="fastload full-size decode",
        decode_one=lambda b: state["decode"].decode_image(b),
        check=check,
        notes="decode_image per image, Python thread pool",
    )


def simplejpeg_full_contender(path: str, *, threads: int) -> Contender:
    """simplejpeg (libjpeg-turbo) full-size RGB decode: the decode-speed targets' reference."""
    mod = {}

    def check():
        try:
            import simplejpeg
        except ImportError as exc:
            raise Skip(f"simplejpeg is not installed: {exc}") from exc
        mod["sj"] = simplejpeg

    return _full_decode_contender(
        f"simplejpeg full-size decode, {threads}t",
        path,
        threads=threads,
        family="simplejpeg full-size decode",
        decode_one=lambda b: mod["sj"].decode_jpeg(b, colorspace="RGB"),
        check=check,
        notes="simplejpeg.decode_jpeg, GIL released, thread pool",
    )


def pillow_full_contender(path: str, *, threads: int) -> Contender:
    """Pillow full-size RGB decode."""
    from PIL import Image

    def one(b):
        with Image.open(io.BytesIO(b)) as im:
            im.convert("RGB").load()

    return _full_decode_contender(
        f"Pillow full-size decode, {threads}t",
        path,
        threads=threads,
        family="Pillow full-size decode",
        decode_one=one,
        check=lambda: None,
        notes="Image.open(...).convert('RGB'), thread pool",
    )


def python_pipeline_contender(path: str, *, decoder: str, size: int = 224) -> Contender:
    """Decode + RandomResizedCrop + flip one image at a time in Python, one thread.

    ``decoder``: ``"pillow"`` (Pillow decode and resize), ``"simplejpeg"`` (simplejpeg decode, Pillow
    resize) or ``"simplejpeg+cv2"`` (simplejpeg decode, OpenCV area resize). Crop boxes and flips are
    fastload's own (:func:`fastload.transforms.sample_params`), so the work per image matches the engine's.
    """
    from PIL import Image

    def setup():
        from fastload.transforms import sample_params, train

        sj = cv2 = None
        if decoder.startswith("simplejpeg"):
            try:
                import simplejpeg as sj
            except ImportError as exc:
                raise Skip(f"simplejpeg is not installed: {exc}") from exc
        if decoder.endswith("cv2"):
            try:
                import cv2
            except ImportError as exc:
                raise Skip(f"OpenCV (cv2) is not installed: {exc}") from exc
        images = load_images(path)
        out = np.empty((size, size, 3), dtype=np.uint8)
        return {
            "images": images,
            "bytes": sum(len(b) for b in images),
            "sj": sj,
            "cv2": cv2,
            "out": out,
            "t": train(size),
            "sample": sample_params,
            "epoch": 0,
        }

    def work(st):
        st["epoch"] += 1
        t, sample, out, sj, cv2 = st["t"], st["sample"], st["out"], st["sj"], st["cv2"]
        for i, b in enumerate(st["images"]):
            if sj is None:
                im = Image.open(io.BytesIO(b)).convert("RGB")
                w, h = im.size
            else:
                arr = sj.decode_jpeg(b, colorspace="RGB")
                h, w = arr.shape[:2]
            p = sample(w, h, t, seed=0, epoch=st["epoch"], index=i)
            if cv2 is not None:
                x0, y0, x1, y1 = (int(v) for v in p.box)
                crop = cv2.resize(arr[y0:y1, x0:x1], (size, size), interpolation=cv2.INTER_AREA)
                out[...] = crop[:, ::-1] if p.flip else crop
            else:
                if sj is not None:
                    im = Image.fromarray(arr)
                im = im.resize((size, size), Image.BILINEAR, box=p.box)
                if p.flip:
                    im = im.transpose(Image.FLIP_LEFT_RIGHT)
                out[...] = np.asarray(im)
        return len(st["images"]), st["bytes"]

    label = {
        "pillow": "Pillow",
        "simplejpeg": "simplejpeg + Pillow resize",
        "simplejpeg+cv2": "simplejpeg + cv2 resize",
    }[decoder]
    return FunctionContender(
        f"Python per-image pipeline ({label}), 1t",
        setup=setup,
        work=work,
        group="decode",
        family=f"Python per-image pipeline ({label})",
        threads=1,
        notes="decode + crop + resize + flip, one image at a time",
    )


# --- whole loader --------------------------------------------------------------------------


def quiesce(loader) -> None:
    """Stop a ``fastload.Loader``'s producer between repeats.

    The loader keeps decoding into the next epoch when one ends (bounded by its ring). Between two
    timed repeats that work would run while another contender is being timed: it would steal that
    contender's CPU and make fastload's next repeat look faster. Opening a pass and closing it
    before it finishes stops the producer (public API: an unfinished pass stops the stream), so
    every repeat starts cold, as the peers' do.
    """
    iter(loader).close()


class LoaderContender(Contender):
    """``fastload.Loader`` over a packed dataset: one epoch per repeat, uint8 NHWC batches."""

    def __init__(
        self,
        name: str,
        path: str,
        *,
        kind: str,
        threads: int,
        batch_size: int,
        group: str,
        reference: bool = False,
        notes: str = "",
        family: str | None = None,
    ) -> None:
        super().__init__(
            name, group=group, family=family or name, threads=threads, reference=reference, notes=notes, inputs=(path,)
        )
        self.path, self.kind, self.batch_size = path, kind, batch_size
        self._loader = None
        self._epoch = 0

    def start(self) -> None:
        try:
            from fastload.loader import Loader, LoaderConfig
        except ImportError as exc:
            raise Skip(f"fastload.loader is not available: {exc}") from exc
        self._ds = _open(self.path)
        self._bytes = sum(len(self._ds.image(i)) for i in range(len(self._ds)))
        config = LoaderConfig(
            batch_size=self.batch_size,
            transform=_transform(self.kind),
            shuffle="global" if self.kind == "train" else "none",
            seed=0,
            num_threads=self.threads,
            drop_last=False,
            layout="NCHW",
        )
        self._loader = Loader(self._ds, config)

    def run(self) -> Sample:
        self._epoch += 1
        if hasattr(self._loader, "set_epoch"):
            self._loader.set_epoch(self._epoch)
        images = 0
        first = None
        t0 = time.perf_counter()
        for batch in self._loader:
            if first is None:
                first = time.perf_counter() - t0
            images += len(batch.indices)
        seconds = time.perf_counter() - t0
        quiesce(self._loader)
        stats = self._loader.stats()
        # Per-stage seconds and the consumer's waiting fraction: where the loader's time went.
        extra = {f"stage_seconds.{k}": float(v) for k, v in stats.seconds.items()}
        extra["input_bound_fraction"] = float(stats.input_bound)
        extra["io_bound_fraction"] = float(getattr(stats, "io_bound", 0.0))
        extra["loader_reads"] = int(getattr(stats, "reads", 0))
        extra["loader_bytes_read"] = int(getattr(stats, "bytes_read", 0))
        extra["skipped_records"] = int(stats.skipped)
        extra["backend"] = stats.backend
        # Cold-start latency (every repeat starts cold) and this process's resident memory.
        extra["first_batch_ms_mean"] = 1000.0 * (first or 0.0)
        rss = _rss_mb()
        if rss is not None:
            extra["process_rss_mb_max"] = rss
        self._loader.reset_stats()
        return Sample(images=images, bytes=self._bytes, seconds=seconds, extra=extra)

    def close(self) -> None:
        loader, self._loader = self._loader, None
        if loader is not None and hasattr(loader, "close"):
            loader.close()
        ds = getattr(self, "_ds", None)
        if ds is not None:
            ds.close()
            self._ds = None


def loader_contender(
    name: str,
    path: str,
    *,
    kind: str = "train",
    threads: int,
    batch_size: int,
    group: str = "pipeline",
    reference: bool = False,
    notes: str = "",
) -> Contender:
    return LoaderContender(
        name, path, kind=kind, threads=threads, batch_size=batch_size, group=group, reference=reference, notes=notes
    )


class TorchLoaderContender(LoaderContender):
    """``fastload.torch.DataLoader``: the same loader behind torch's interface (uint8 NCHW tensors)."""

    def start(self) -> None:
        try:
            import fastload.torch as ft
        except ImportError as exc:
            raise Skip(f"fastload.torch is not available: {exc}") from exc
        with _open(self.path) as ds:
            self._bytes = sum(len(ds.image(i)) for i in range(len(ds)))
        self._loader = ft.DataLoader(
            self.path,
            batch_size=self.batch_size,
            shuffle=self.kind == "train",
            seed=0,
            transform=_transform(self.kind),
            num_threads=self.threads,
            drop_last=False,
        )

    def run(self) -> Sample:
        self._epoch += 1
        if hasattr(self._loader, "set_epoch"):
            self._loader.set_epoch(self._epoch)
        images = 0
        t0 = time.perf_counter()
        for batch in self._loader:
            images += int(batch[0].shape[0])
        seconds = time.perf_counter() - t0
        quiesce(self._loader.loader)
        return Sample(images=images, bytes=self._bytes, seconds=seconds)


def torch_loader_contender(
    name: str,
    path: str,
    *,
    kind: str = "train",
    threads: int,
    batch_size: int,
    group: str = "pipeline",
    notes: str = "",
) -> Contender:
    return TorchLoaderContender(name, path, kind=kind, threads=threads, batch_size=batch_size, group=group, notes=notes)


# --- host to device ------------------------------------------------------------------------


class H2DContender(Contender):
    """Copy one uint8 batch to the GPU, pinned or pageable source (GB/s in the MB/s column)."""

    def __init__(self, *, pinned: bool, batch_size: int, reference: bool = False) -> None:
        super().__init__(
            f"host-to-device copy, {'pinned' if pinned else 'pageable'}",
            group="h2d",
            family="host-to-device copy",
            reference=reference,
            unit="batches",
            notes=f"uint8 [{batch_size},3,224,224]",
        )
        self.pinned, self.batch_size = pinned, batch_size

    def start(self) -> None:
        import torch

        self._torch = torch
        self._src = torch.empty((self.batch_size, 3, 224, 224), dtype=torch.uint8, pin_memory=self.pinned)
        self._dst = torch.empty_like(self._src, device="cuda")

    def run(self) -> Sample:
        torch, n = self._torch, 20
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            self._dst.copy_(self._src, non_blocking=self.pinned)
        torch.cuda.synchronize()
        return Sample(images=n, bytes=n * self._src.numel(), seconds=time.perf_counter() - t0)

    def close(self) -> None:
        self._src = self._dst = None


def cuda_available() -> str | None:
    """None when a CUDA device is usable from torch, else the reason it is not."""
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/dxg")):
        return "no CUDA device"  # decided without importing torch (seconds, and memory) into the harness
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable: {exc}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def h2d_contenders(batch_size: int) -> list[Contender]:
    return [
        H2DContender(pinned=True, batch_size=batch_size, reference=True),
        H2DContender(pinned=False, batch_size=batch_size),
    ]
