"""Measurement stage, cold epochs from a slow disk: every loader at a throttled device's speed.

Every other benchmark of the project reads from the page cache. This one puts the same generated
images (``tools/make_dataset.py``, ImageNet-like, 4,800 by default) on a throttled loop device
(:mod:`bench.slow_device`) in each form a loader reads: the JPEG folder (torch), fastload RecordIO
and LMDB folders packed with ``--shuffle`` into 16 shards, and one ``.rec`` with its ``.idx``
(MXNet). For each device profile it times cold epochs (the file system unmounted and mounted
before each one, so every byte comes from the device), alternated round by round (A B C, C B A,
...):

- fastload's ``Loader`` in global, block and shard order, from RecordIO and from LMDB, with the
  profile's recommended read options (see ``docs/slow-disks.md``); and in block order with the
  long runs read with ``O_DIRECT`` (``ReadOptions(direct=True)``);
- the same loader with the decode replaced by a no-op (the read path alone), against the device's
  bandwidth bound; and with its records read one ``pread`` at a time (the read path before
  read-ahead);
- the same loader from the page cache (warm): what decoding allows, the reference where decoding
  is slower than the device;
- torch's ``DataLoader`` + torchvision's ``ImageFolder`` over the JPEG files, MXNet's
  ``ImageRecordIter`` with ``shuffle=True`` over the ``.rec``, and py-lmdb's ``txn.get`` in a global
  shuffle (the plain random-access LMDB reader; a partial epoch, it is that slow).

Per row: images/s, the MB/s and requests per second the device served (its cgroup counters),
records per request, and the device's bound for that row: ``min(bandwidth / mean record size,
IOPS x records per request)``. Beside each order, its price in randomness
(:mod:`bench.order_mixing`). Run as ``python -m bench.slow_disk`` or ``fastload bench --suite
slow-disk``; outputs in ``--out``: ``results.json``, ``table.txt``, ``slow_disk.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field

import numpy as np

from .cold_contenders import ColdLoaderContender, ColdPeerContender, LmdbPlainContender
from .harness import Contender, RunConfig, cpu_count, environment, measure, skipped
from .slow_device import PROFILES, SlowDevice, Unsupported, profile_named, unsupported_reason

__all__ = [
    "ORDER_SETTINGS",
    "RECOMMENDED",
    "SlowDiskOptions",
    "main",
    "order_settings_for",
    "read_options_for",
    "run_slow_disk",
]

ORDERS = ("global", "block", "shard")

#: The read options recommended per profile (docs/slow-disks.md): on a disk with few IOPS the bytes
#: between records needed now are worth reading to save requests (gap ~ bandwidth / IOPS).
RECOMMENDED: dict[str, dict[str, int]] = {
    "hdd": {"gap": 1 << 20},
    "cloud-disk": {"gap": 64 << 10},
    "ssd-lite": {"gap": 32 << 10},
}


#: The order settings recommended per profile (docs/slow-disks.md), besides the loader's defaults
#: (block order: 256-record blocks in windows of 8; shard order: windows of 8 shards). Where the
#: device, not the decode, sets the pace, a cold epoch waits for its first window and then keeps
#: decoding and reading in step; windows of a few tens of megabytes do both (measured on hdd and
#: cloud-disk: block 128 x 2 and shard windows of 1 reach 0.92-0.96 of what the slower of the decode
#: and the device allows, 256 x 8 and 8 shards 0.70-0.77), at the price in randomness the mixing
#: table shows. An SSD keeps up with the defaults.
ORDER_SETTINGS: dict[str, dict[str, dict[str, int]]] = {
    "hdd": {"block": {"block_size": 128, "window": 2}, "shard": {"window": 1}},
    "cloud-disk": {"block": {"block_size": 128, "window": 2}, "shard": {"window": 1}},
    "ssd-lite": {},
}


def order_settings_for(profile: str, order: str) -> dict[str, int]:
    """The ``LoaderConfig`` order settings (``block_size``, ``window``) recommended for ``order`` on a profile."""
    return dict(ORDER_SETTINGS.get(profile, {}).get(order, {}))


def settings_label(order: str, settings: dict[str, int]) -> str:
    """How the table names an order with its settings: ``block 128x2``, ``shard 1`` (defaults filled in)."""
    from fastload.loader import LoaderConfig

    defaults = LoaderConfig()
    window = settings.get("window", defaults.window)
    if order == "block":
        return f"block {settings.get('block_size', defaults.block_size)}x{window}"
    if order == "shard":
        return f"shard {window}"
    return order


def read_options_for(profile: str, *, direct: bool = False):
    """The :class:`~fastload.records.readahead.ReadOptions` recommended for a profile (``direct``: with O_DIRECT)."""
    from fastload.records.readahead import ReadOptions

    return ReadOptions(**RECOMMENDED.get(profile, {}), direct=direct)


@dataclass(frozen=True, kw_only=True)
class SlowDiskOptions:
    """What the cold-epoch benchmark runs.

    Args:
        profiles: Device profiles (names in :data:`bench.slow_device.PROFILES`).
        count: Images to generate (at least 4,000 for figures; fewer only for smoke runs).
        classes: Classes of the generated images.
        seed: Generator and pack seed.
        repeats: Timed cold epochs per row (alternated round by round).
        threads: Decode threads and workers (default: every CPU of this process).
        batch_size: Images per batch.
        shards: Shards of the packed folders.
        lmdb_plain_records: Records the py-lmdb row reads per repeat.
        quick: Smoke run: tiny images, one profile unless given, one repeat.
        out: Output folder.
        cache: Where generated images are kept between runs (default ``OUT/cache``).
        workdir: Parent folder of the device's backing file (default: the system's temp folder).
        argv: The command line, for the report.
    """

    profiles: tuple[str, ...] = tuple(PROFILES)
    count: int = 4800
    classes: int = 100
    seed: int = 0
    repeats: int = 3
    threads: int | None = None
    batch_size: int = 256
    shards: int = 16
    lmdb_plain_records: int = 512
    quick: bool = False
    out: str = "bench-out/slow-disk"
    cache: str | None = None
    workdir: str | None = None
    argv: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for p in self.profiles:
            profile_named(p)
        for name in ("count", "classes", "repeats", "batch_size", "shards", "lmdb_plain_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads={self.threads} must be >= 1")


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[slow-disk] {msg}", file=sys.stderr, flush=True)


def _images(opts: SlowDiskOptions, quiet: bool) -> str:
    """The generated ImageFolder tree, made once per (count, classes, seed) in the cache."""
    from tools.make_dataset import make_dataset

    cache = opts.cache or os.path.join(opts.out, "cache")
    name = f"images-n{opts.count}-c{opts.classes}-s{opts.seed}{'-tiny' if opts.quick else ''}"
    root = os.path.join(cache, name)
    if not os.path.exists(root + ".ready"):
        _log(f"generating {opts.count} images into {root} (kept for later runs)", quiet)
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(cache, exist_ok=True)
        make_dataset(root, count=opts.count, seed=opts.seed, classes=opts.classes, tiny=opts.quick, quiet=True)
        open(root + ".ready", "w").close()
    return root


@dataclass
class _Forms:
    images: str
    rec: str
    lmdb: str
    mx_rec: str
    mx_idx: str
    count: int
    image_bytes: int
    record_bytes: int
    labels: np.ndarray
    positions: np.ndarray
    shard_records: list[int]


def _place(src: str, root: str, opts: SlowDiskOptions, quiet: bool) -> _Forms:
    """Copy the images onto the device and pack them there in every form."""
    from fastload.pack.packer import pack_folder
    from fastload.records.dataset import open_dataset

    images = os.path.join(root, "images")
    _log("copying the JPEG folder onto the device", quiet)
    shutil.copytree(src, images)
    common = {"shuffle": True, "seed": opts.seed, "progress": False, "name": "train"}
    _log(f"packing RecordIO and LMDB ({opts.shards} shards each) and one .rec for MXNet", quiet)
    pack_folder(images, os.path.join(root, "rec"), format="recordio", shards=opts.shards, **common)
    pack_folder(images, os.path.join(root, "lmdb"), format="lmdb", shards=opts.shards, **common)
    pack_folder(images, os.path.join(root, "mx"), format="recordio", shards=1, **common)
    mx = sorted(p for p in os.listdir(os.path.join(root, "mx")) if p.endswith(".rec"))[0]
    mx_rec = os.path.join(root, "mx", mx)
    with open_dataset(os.path.join(root, "rec")) as ds:
        shard, start, end = ds.extents(np.arange(len(ds)))
        bases = np.concatenate([[0], np.cumsum([sh.size for sh in ds.shards])])
        positions = bases[shard] + start
        labels = ds.labels[:, 0].astype(np.int64)
        count, record_bytes = len(ds), int((end - start).sum())
        shard_records = np.diff(ds.shard_starts).tolist()
        image_bytes = sum(len(ds.image(i)) for i in range(len(ds)))
    return _Forms(
        images=images,
        rec=os.path.join(root, "rec"),
        lmdb=os.path.join(root, "lmdb"),
        mx_rec=mx_rec,
        mx_idx=os.path.splitext(mx_rec)[0] + ".idx",
        count=count,
        image_bytes=image_bytes,
        record_bytes=record_bytes,
        labels=labels,
        positions=positions,
        shard_records=shard_records,
    )


def _loader_config(
    order: str, opts: SlowDiskOptions, threads: int, read_options, settings: dict[str, int] | None = None
) -> dict:
    return {
        "shuffle": order,
        "batch_size": opts.batch_size,
        "num_threads": threads,
        "read_options": read_options,
        **(settings or {}),
    }


def _contenders(
    profile: str, dev: SlowDevice, forms: _Forms, opts: SlowDiskOptions, threads: int, procs
) -> list[Contender]:
    group = f"cold-{profile}"
    reads = read_options_for(profile)
    opt_note = f"read options: queue depth {reads.queue_depth}, gap {reads.gap >> 10} KiB"
    out: list[Contender] = []

    def loader(name: str, path: str, order: str, **kw) -> ColdLoaderContender:
        read_options = kw.pop("read_options", reads)
        # Every row of an order runs with the profile's recommended settings for it, the page-cache
        # references included (like against like); the defaults rows name theirs.
        settings = kw.pop("settings", order_settings_for(profile, order))
        notes = "; ".join(x for x in (kw.pop("notes", ""), settings_label(order, settings)) if x)
        return ColdLoaderContender(
            name,
            path,
            device=dev,
            config=_loader_config(order, opts, threads, read_options, settings),
            group=group,
            order=kw.pop("key", order),
            threads=threads,
            notes=notes,
            **kw,
        )

    for form, path in (("RecordIO", forms.rec), ("LMDB", forms.lmdb)):
        for order in ORDERS:
            out.append(loader(f"fastload {form}, {order}", path, order, notes=opt_note, reference=False))
    # The long runs read with O_DIRECT (ReadOptions(direct=True)): past the page cache, as large requests
    # as the device takes (docs/slow-disks.md, "Direct I/O").
    direct = read_options_for(profile, direct=True)
    for form, path in (("RecordIO", forms.rec), ("LMDB", forms.lmdb)):
        for order in ("block", "shard"):
            out.append(
                loader(f"fastload {form}, {order}, direct I/O", path, order, read_options=direct, notes=opt_note)
            )
    out.append(
        loader(
            "fastload RecordIO, block, one pread per record",
            forms.rec,
            "block",
            read_options=None,
            notes="records read one at a time on the producer thread, read-ahead by hints (the read path before)",
        )
    )
    for order in ORDERS:
        out.append(loader(f"fastload RecordIO, {order}, read only", forms.rec, order, decode=False, notes=opt_note))
    out.append(loader("fastload LMDB, block, read only", forms.lmdb, "block", decode=False, notes=opt_note))
    for order in ORDERS:
        out.append(loader(f"fastload RecordIO, {order}, page cache", forms.rec, order, warm=True, notes="warm"))
    # Where the profile's recommended settings differ from the loader's defaults, the defaults too
    # (cold and from the page cache, paired with each other): what the recommendation buys.
    for order in ("block", "shard"):
        if order_settings_for(profile, order):
            label = settings_label(order, {})
            for warm, suffix in ((False, ""), (True, ", page cache")):
                out.append(
                    loader(
                        f"fastload RecordIO, {order}, defaults {label.split(' ', 1)[1]}{suffix}",
                        forms.rec,
                        order,
                        settings={},
                        key=f"{order} defaults",
                        warm=warm,
                        notes="warm" if warm else opt_note,
                    )
                )
    out.append(
        ColdPeerContender(
            f"torch DataLoader + ImageFolder (workers={threads})",
            process=procs.factory("cold", [sys.executable, "-m", "bench.peers.cold_epochs"]),
            kind="torch_imagefolder",
            spec={"root": forms.images, "batch_size": opts.batch_size, "workers": threads, "bytes": forms.image_bytes},
            device=dev,
            order="global",
            group=group,
            threads=threads,
            notes="torchvision RandomResizedCrop(224)+flip, PILToTensor, shuffle=True",
        )
    )
    out.append(
        ColdPeerContender(
            f"MXNet ImageRecordIter shuffle=True (preprocess_threads={threads})",
            process=procs.factory("cold", [sys.executable, "-m", "bench.peers.cold_epochs"]),
            kind="mxnet_imagerecorditer",
            spec={"rec": forms.mx_rec, "idx": forms.mx_idx, "batch_size": opts.batch_size, "threads": threads},
            device=dev,
            order="global",
            group=group,
            threads=threads,
            notes="random_resized_crop + rand_mirror, one .rec with its .idx",
        )
    )
    n = min(opts.lmdb_plain_records, forms.count)
    out.append(
        LmdbPlainContender(
            f"py-lmdb txn.get, global shuffle (first {n} records)",
            forms.lmdb,
            device=dev,
            records=n,
            threads=threads,
            batch_size=opts.batch_size,
            group=group,
            notes="lmdb.open(readahead=False): one page fault per 4 KB page; fastload decode",
        )
    )
    return out


def _mixing(forms: _Forms, opts: SlowDiskOptions) -> dict[str, dict[str, float]]:
    """Each order's randomness, at the loader's defaults (keys ``global``, ``block``, ``shard``) and
    at every profile's recommended settings (keys such as ``block 128x2``, ``shard 1``)."""
    from fastload.order import OrderSpec

    from .order_mixing import order_mixing

    starts = tuple(np.concatenate([[0], np.cumsum(forms.shard_records)]).tolist())

    def spec(order: str, settings: dict[str, int]) -> OrderSpec:
        return OrderSpec(
            num_records=forms.count,
            batch_size=opts.batch_size,
            shuffle=order,
            seed=0,
            shard_starts=starts if order == "shard" else None,
            **settings,
        )

    specs = {order: spec(order, {}) for order in ORDERS}
    for profile in opts.profiles:
        for order in ("block", "shard"):
            settings = order_settings_for(profile, order)
            if settings:
                specs.setdefault(settings_label(order, settings), spec(order, settings))
    return order_mixing(specs, forms.labels, forms.positions, epoch=1)


def run_slow_disk(opts: SlowDiskOptions, *, quiet: bool = False) -> dict:
    """Run the benchmark; returns ``{"doc", "text", "paths"}`` (see the module docstring)."""
    from .peers.registry import PeerProcesses
    from .slow_disk_report import render, write_outputs

    threads = opts.threads or cpu_count()
    env = environment(list(opts.argv) or ["python", "-m", "bench.slow_disk"])
    doc: dict = {
        "format": "fastload-slow-disk/1",
        "environment": env,
        "options": {k: v for k, v in asdict(opts).items() if k not in ("argv",)},
        "threads": threads,
        "profiles": {},
        "results": [],
    }
    reason = unsupported_reason()
    if reason is None:
        try:
            _run(opts, doc, threads, quiet, PeerProcesses)
        except Unsupported as exc:
            reason = str(exc)
    if reason is not None:
        _log(f"no slow device: {reason}", quiet)
        doc["skipped"] = reason
        for p in opts.profiles:
            doc["results"].append(skipped("every cold-epoch row", group=f"cold-{p}", reason=reason).to_json())
    doc["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    text = render(doc)
    paths = write_outputs(opts.out, doc, text)
    return {"doc": doc, "text": text, "paths": paths}


def _run(opts: SlowDiskOptions, doc: dict, threads: int, quiet: bool, peer_processes) -> None:
    src = _images(opts, quiet)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
    size = max(256 << 20, 5 * total + (256 << 20))
    with SlowDevice(size=size, workdir=opts.workdir) as dev:
        forms = _place(src, dev.mount_point, opts, quiet)
        doc["dataset"] = {
            "source": f"tools/make_dataset.py --count {opts.count} --classes {opts.classes} --seed {opts.seed}"
            + (" --tiny" if opts.quick else ""),
            "images": forms.count,
            "image_bytes": forms.image_bytes,
            "record_bytes": forms.record_bytes,
            "mean_record_kb": forms.record_bytes / forms.count / 1e3,
            "shards": len(forms.shard_records),
            "device": {"direct_io": dev.direct_io, **dev.queue_settings()},
        }
        doc["mixing"] = _mixing(forms, opts)
        procs = peer_processes()
        dev.join()  # this process and every process it starts from now on read through the throttle
        try:
            for name in opts.profiles:
                profile = profile_named(name)
                dev.set_profile(profile)
                check = dev.check_cold()
                _log(
                    f"{profile.describe()}: cold probe {check['cold_seconds']:.3f} s "
                    f"({check['cold_device_bytes'] / 1e6:.1f} MB from the device), warm {check['warm_seconds']:.4f} s",
                    quiet,
                )
                rows = _contenders(name, dev, forms, opts, threads, procs)
                procs.spawn_all()
                results = measure(rows, RunConfig(repeats=opts.repeats, warmup=0), quiet=quiet)
                for contender, result in zip(rows, results, strict=True):
                    result.extra["order"] = getattr(contender, "order", "")
                doc["profiles"][name] = {
                    "iops": profile.iops,
                    "bandwidth": profile.bandwidth,
                    "cold_check": check,
                    "read_options": RECOMMENDED.get(name, {}),
                    "order_settings": {
                        order: settings_label(order, order_settings_for(name, order)) for order in ("block", "shard")
                    },
                    "repairs": list(dev.repairs),
                }
                dev.repairs.clear()
                doc["results"] += [r.to_json() for r in results]
            doc["paired"] = _page_cache_pair(dev, forms, opts, threads, quiet)
        finally:
            procs.close()
            with contextlib.suppress(OSError):
                dev.leave()


def _page_cache_pair(dev: SlowDevice, forms: _Forms, opts: SlowDiskOptions, threads: int, quiet: bool) -> list:
    """From the page cache: read-ahead against one pread per record, epoch by epoch alternated.

    What the read-ahead costs or gains where there is no disk to wait for (the data in memory).
    """
    from .paired import run_pair

    _log("paired epochs from the page cache: read ahead / one pread per record", quiet)
    dev.set_profile(None)
    out = []
    for order in ("global", "block"):
        sides = [
            ColdLoaderContender(
                name,
                forms.rec,
                device=None,
                config=_loader_config(order, opts, threads, reads),
                warm=True,
                group="page-cache",
                order=order,
                threads=threads,
            )
            for name, reads in (
                ("read ahead", read_options_for("ssd-lite")),
                ("one pread per record", None),
            )
        ]
        for side in sides:
            side.start()
        try:
            pair = run_pair(
                f"page cache, {order} order: read ahead / one pread per record, {threads} threads",
                sides[0],
                sides[1],
                rounds=1 if opts.quick else max(4, 2 * opts.repeats),
            )
        finally:
            for side in sides:
                side.close()
        out.append(pair.to_json())
    return out


def _parse(argv: list[str] | None) -> SlowDiskOptions:
    p = argparse.ArgumentParser(prog="python -m bench.slow_disk", description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated device profiles")
    p.add_argument("--count", type=int, help="images to generate (default 4800; 64 with --quick)")
    p.add_argument("--classes", type=int, help="classes (default 100; 4 with --quick)")
    p.add_argument("--repeats", type=int, help="cold epochs per row (default 3; 1 with --quick)")
    p.add_argument("--threads", type=int, help="decode threads and workers (default: all CPUs)")
    p.add_argument("--batch-size", type=int, help="batch size (default 256; 16 with --quick)")
    p.add_argument("--shards", type=int, help="shards per packed folder (default 16; 4 with --quick)")
    p.add_argument("--lmdb-plain-records", type=int, default=512, help="records the py-lmdb row reads per repeat")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny images, one repeat")
    p.add_argument("--out", default="bench-out/slow-disk", help="output folder")
    p.add_argument("--cache", help="folder keeping the generated images (default OUT/cache)")
    p.add_argument("--workdir", help="parent folder of the device's backing file (default: system temp)")
    a = p.parse_args(argv)
    quick = a.quick
    return SlowDiskOptions(
        profiles=tuple(x.strip() for x in a.profiles.split(",") if x.strip()),
        count=a.count or (64 if quick else 4800),
        classes=a.classes or (4 if quick else 100),
        repeats=a.repeats or (1 if quick else 3),
        threads=a.threads,
        batch_size=a.batch_size or (16 if quick else 256),
        shards=a.shards or (4 if quick else 16),
        lmdb_plain_records=a.lmdb_plain_records,
        quick=quick,
        out=a.out,
        cache=a.cache,
        workdir=a.workdir,
        argv=("python", "-m", "bench.slow_disk", *(argv if argv is not None else sys.argv[1:])),
    )


def main(argv: list[str] | None = None) -> int:
    opts = _parse(argv)
    outcome = run_slow_disk(opts)
    print(outcome["text"])
    print(f"\nwrote {', '.join(outcome['paths'].values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
