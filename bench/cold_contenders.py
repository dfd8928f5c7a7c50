"""Measurement stage, cold epochs: contenders that start every repeat with nothing cached, on a slow device.

Each repeat of a contender here: drop the slow device's page cache (unmount and mount, so nothing
on it may be open), build the loader (untimed: listing files, opening shards, loading the index,
locating the records: what a training job does once, before its first epoch), time one epoch,
read the device's counters around the timed epoch, release everything. What the device served
(bytes and requests, from the throttle's cgroup counters) goes into the sample's ``extra`` as
``device_bytes`` and ``device_ios``: MB/s and IOPS seen by the device, and the records each
request carried.

- :class:`ColdLoaderContender`: ``fastload.Loader`` over a packed folder (RecordIO or LMDB), in a
  given order with given read options; ``decode=False`` replaces the decode by a no-op to measure
  the read path alone (the records are still read, checked against their checksums and handed
  over); ``warm=True`` reads the files through the page cache first (untimed): the page-cache rate
  of the same configuration, the reference when decoding is slower than the device.
- :class:`ColdPeerContender`: a peer loader in its own process (:mod:`bench.peers.cold_epochs`),
  built, run and closed each repeat through the peer protocol.
- :class:`LmdbPlainContender`: the plain way to read an LMDB in a shuffled order: py-lmdb's
  ``txn.get`` in a global shuffle (``readahead=False``, as LMDB loaders for training set it), each
  value's image decoded by fastload's engine in batches: LMDB's random access through its memory
  map, one page fault at a time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from .harness import Contender, PeerProcess, Sample, Skip, warm_inputs

__all__ = ["ColdLoaderContender", "ColdPeerContender", "LmdbPlainContender", "read_only_decode"]


def read_only_decode(images, out, transform, **_kwargs) -> Any:
    """A decode with ``decode_batch``'s signature that decodes nothing: the loader's read path alone."""
    return SimpleNamespace(ok=True, errors={}, backend="none (read only)", sliced=0, slice_fallbacks=0, mix=None)


def _counters(device) -> Any:
    return device.counters() if device is not None else None


def _device_extra(device, before, after) -> dict[str, float]:
    if device is None or before is None:
        return {}
    served = after - before
    return {"device_bytes": float(served.bytes), "device_ios": float(served.ios)}


class ColdLoaderContender(Contender):
    """``fastload.Loader`` over ``path``: one cold (or warm) epoch per repeat, built and closed each time.

    Args:
        name: Row label.
        path: A packed fastload folder on the slow device.
        device: The :class:`~bench.slow_device.SlowDevice` (None: no cache drop, no counters).
        config: Keyword arguments of ``LoaderConfig`` besides ``seed`` (shuffle, batch_size,
            num_threads, read_options, block_size, window, ...).
        decode: False measures the read path alone (see :func:`read_only_decode`).
        warm: Read the dataset through the page cache before the epoch (untimed).
        group: The comparison group.
        order: The order's name, for the report.
        notes: Free text.
    """

    def __init__(
        self,
        name: str,
        path: str,
        *,
        device,
        config: dict[str, Any],
        decode: bool = True,
        warm: bool = False,
        group: str,
        order: str,
        threads: int,
        reference: bool = False,
        notes: str = "",
    ) -> None:
        super().__init__(name, group=group, threads=threads, reference=reference, notes=notes)
        self.path, self.device, self.config, self.decode, self.warm, self.order = (
            path,
            device,
            dict(config),
            decode,
            warm,
            order,
        )
        self._epoch = 0
        self._bytes = 0

    def start(self) -> None:
        try:
            from fastload.loader import LoaderConfig
            from fastload.records.dataset import open_dataset
        except ImportError as exc:
            raise Skip(f"fastload is not importable: {exc}") from exc
        LoaderConfig(**self.config)  # a bad setting fails here, not in the middle of the rounds
        with open_dataset(self.path) as ds:
            ends = ds.extents(np.arange(len(ds)))
            self._bytes = int((ends[2] - ends[1]).sum()) if ends is not None else 0

    def run(self) -> Sample:
        from fastload.loader import Loader, LoaderConfig
        from fastload.records.dataset import open_dataset

        self._epoch += 1
        if self.warm:
            if self.device is not None:
                self.device.drop_cache()
            warm_inputs([self.path])
        elif self.device is not None:
            self.device.drop_cache()
        ds = open_dataset(self.path)
        # Where every record lies (an LMDB shard's tree walked once), untimed: a training job
        # keeps its dataset open, so from the second epoch on only the records are read cold.
        ds.extents(np.arange(len(ds)))
        decode: Callable | None = None if self.decode else read_only_decode
        loader = Loader(ds, LoaderConfig(seed=0, **self.config), decode=decode)
        try:
            loader.set_epoch(self._epoch)
            images = 0
            before = _counters(self.device)
            t0 = time.perf_counter()
            for batch in loader:
                images += len(batch.indices)
            seconds = time.perf_counter() - t0
            after = _counters(self.device)
            stats = loader.stats()
        finally:
            loader.close()
            ds.close()
        extra: dict[str, object] = {f"stage_seconds.{k}": float(v) for k, v in stats.seconds.items()}
        extra["input_bound_fraction"] = float(stats.input_bound)
        extra["io_bound_fraction"] = float(getattr(stats, "io_bound", 0.0))
        extra["loader_reads"] = int(getattr(stats, "reads", 0))
        extra["loader_bytes_read"] = int(getattr(stats, "bytes_read", 0))
        extra["skipped_records"] = int(stats.skipped)
        extra.update(_device_extra(self.device, before, after))
        return Sample(images=images, bytes=self._bytes, seconds=seconds, extra=extra)


class ColdPeerContender(Contender):
    """A peer loader built, run for one epoch and closed each repeat (:mod:`bench.peers.cold_epochs`).

    Args:
        name: Row label.
        process: Returns the peer's :class:`~bench.harness.PeerProcess` (started in the throttled
            cgroup: the benchmark process joins it before starting peers).
        kind: The peer factory's kind.
        spec: Its spec.
        device: The slow device (None: no cache drop, no counters).
    """

    def __init__(
        self, name: str, *, process: Callable[[], PeerProcess], kind: str, spec: dict, device, order: str, **kwargs
    ) -> None:
        super().__init__(name, **kwargs)
        self._factory, self.kind, self.spec, self.device, self.order = process, kind, spec, device, order
        self._process: PeerProcess | None = None
        self._id = f"{name}#{id(self)}"
        self._n = 0
        self.info: dict[str, object] = {}

    def _request(self, op: str, **fields) -> dict:
        assert self._process is not None
        reply = self._process.request({"op": op, **fields})
        if not reply.get("ok"):
            if "skip" in reply:
                raise Skip(reply["skip"])
            raise RuntimeError(f"{self.name}: {reply.get('error')}\n{reply.get('traceback', '')}")
        return reply

    def start(self) -> None:
        self._process = self._factory()
        # Build it once to learn now whether it can run here (a missing library is a skip).
        reply = self._request("start", id=self._id, kind=self.kind, spec=self.spec)
        self.info = reply.get("info") or {}
        self._request("close", id=self._id)

    def run(self) -> Sample:
        self._n += 1
        if self.device is not None:
            self.device.drop_cache()
        spec = dict(self.spec, seed=int(self.spec.get("seed", 0)) + self._n)
        self._request("start", id=self._id, kind=self.kind, spec=spec)
        try:
            before = _counters(self.device)
            reply = self._request("run", id=self._id)
            after = _counters(self.device)
        finally:
            self._request("close", id=self._id)
        extra = dict(reply.get("extra") or {})
        extra.update(_device_extra(self.device, before, after))
        return Sample(
            images=int(reply["images"]), bytes=int(reply["bytes"]), seconds=float(reply["seconds"]), extra=extra
        )

    def close(self) -> None:
        self._process = None  # the process is shared; PeerProcesses closes it


class LmdbPlainContender(Contender):
    """py-lmdb ``txn.get`` in a global shuffle + fastload's decode, the first ``records`` of an epoch.

    Args:
        name: Row label.
        path: A fastload LMDB folder (its shards are LMDB environments; keys are 8-byte record numbers).
        device: The slow device.
        records: Records read per repeat (a partial epoch: at a few images per second a whole one
            would take most of an hour on the slowest profile); the rate is images per second.
        threads: Decode threads.
        batch_size: Records decoded per call.
    """

    def __init__(
        self,
        name: str,
        path: str,
        *,
        device,
        records: int,
        threads: int,
        batch_size: int,
        group: str,
        notes: str = "",
    ) -> None:
        super().__init__(name, group=group, threads=threads, notes=notes)
        self.path, self.device, self.records, self.batch_size = path, device, records, batch_size
        self.order = "global"
        self._epoch = 0

    def start(self) -> None:
        try:
            import lmdb  # noqa: F401

            from fastload.records.dataset import open_dataset
        except ImportError as exc:
            raise Skip(f"py-lmdb is not installed: {exc}") from exc
        with open_dataset(self.path) as ds:
            if not ds.kind.endswith("lmdb"):
                raise Skip(f"{self.path} is not an LMDB dataset")
            self._shards = [os.path.join(self.path, ds.manifest["shards"][k]["file"]) for k in range(len(ds.shards))]
            self._starts = ds.shard_starts
            self._n = len(ds)

    def run(self) -> Sample:
        import lmdb

        from fastload import transforms
        from fastload.decode import decode_batch
        from fastload.records.lmdb_shard import encode_key, unpack_value_header

        self._epoch += 1
        if self.device is not None:
            self.device.drop_cache()
        envs = [
            lmdb.open(p, readonly=True, lock=False, readahead=False, meminit=False, subdir=True) for p in self._shards
        ]
        txns = [env.begin(buffers=False) for env in envs]
        order = np.random.default_rng(self._epoch).permutation(self._n)[: self.records]
        shard_of = np.searchsorted(self._starts, order, side="right") - 1
        out = np.empty((self.batch_size, 224, 224, 3), dtype=np.uint8)
        transform = transforms.train(224)
        images = nbytes = 0
        try:
            before = _counters(self.device)
            t0 = time.perf_counter()
            for b in range(0, len(order), self.batch_size):
                idx, shards = order[b : b + self.batch_size], shard_of[b : b + self.batch_size]
                views = []
                for i, s in zip(idx.tolist(), shards.tolist(), strict=True):
                    value = txns[s].get(encode_key(i - int(self._starts[s])))
                    head = unpack_value_header(value)
                    views.append(memoryview(value)[head.image_offset :])
                    nbytes += len(value)
                decode_batch(
                    views,
                    out[: len(views)],
                    transform,
                    seed=0,
                    epoch=self._epoch,
                    indices=idx.astype(np.int64),
                    threads=self.threads,
                )
                images += len(views)
            seconds = time.perf_counter() - t0
            after = _counters(self.device)
        finally:
            for txn in txns:
                txn.abort()
            for env in envs:
                env.close()
        return Sample(images=images, bytes=nbytes, seconds=seconds, extra=_device_extra(self.device, before, after))
