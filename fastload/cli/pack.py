"""``fastload pack SRC OUT [options]``: pack a folder or an im2rec ``.lst`` into shards.

The flags are :class:`fastload.pack.options.PackOptions`'s fields; the command calls
:func:`fastload.pack.packer.pack_folder` (``--engine ray``: :func:`fastload.pack.ray_engine.pack_with_ray`;
an ``s3://``-style SRC or OUT: :func:`fastload.pack.remote_io.pack_remote`) and prints its summary.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from fastload.cli.sizes import parse_size
from fastload.errors import UserError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fastload pack``."""
    p = sub.add_parser("pack", help="pack a JPEG folder or an im2rec .lst into RecordIO or LMDB shards")
    p.add_argument("src", help="folder with one sub-folder per class, or an im2rec .lst file")
    p.add_argument("out", help="output folder for the shards and fastload.json")
    p.add_argument("--root", help="image root for the paths of a .lst file (default: the .lst's folder)")
    p.add_argument("--format", choices=["recordio", "lmdb"], default="recordio")
    p.add_argument("--shards", type=int, help="number of shards")
    p.add_argument("--shard-size", help="target shard size, e.g. 512MB (default 512MB)")
    p.add_argument("--workers", type=int, help="parallel readers/converters (default: all cores)")
    p.add_argument("--resize", type=int, help="resize the shorter side to this and re-encode")
    p.add_argument("--quality", type=int, default=95, help="JPEG quality for re-encoded images")
    p.add_argument("--shuffle", action="store_true", help="shuffle record order (with --seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", help="shard name prefix (default: the source folder's name)")
    p.add_argument(
        "--on-error",
        choices=["skip", "fail", "raise"],
        default="skip",
        help="skip bad files (listed in the manifest) or stop at the first ('raise' = 'fail')",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already in OUT")
    p.add_argument(
        "--restart-index",
        dest="restart_index",
        action="store_true",
        help="losslessly add JPEG restart markers so crops decode only the intervals they need",
    )
    p.add_argument("--verify", action="store_true", help="check every transcoded image decodes identically")
    p.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="refuse images whose header declares more pixels than this (default 89478485, the decoder's)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local (threads, the default) or ray (shard ranges as Ray tasks; pip install 'fastload[ray]')",
    )
    p.add_argument("--address", help="--engine ray: a running Ray cluster's address (default: start a local one)")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="setting for a remote SRC or OUT (endpoint_url=..., region=...); repeatable",
    )
    p.add_argument(
        "--build-dir", help="remote SRC/OUT: local folder to build in (default ~/.cache/fastload/pack-build)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the options from the parsed arguments, pack, print the summary."""
    if args.shards is not None and args.shard_size is not None:
        raise UserError("give --shards or --shard-size, not both")
    if "numpy" not in sys.modules:
        # Packing does no linear algebra, but OpenBLAS (loaded with numpy) starts a thread per core
        # that spin-waits (sched_yield) for its first ~0.1 s: CPU taken from the packing threads.
        # This process is the command's own, so its environment is ours to set.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fastload.pack.options import DEFAULT_SHARD_SIZE, PackOptions
    from fastload.pack.packer import pack_folder
    from fastload.pack.result import format_summary

    try:
        options = PackOptions(
            format=args.format,
            shards=args.shards,
            shard_size=parse_size(args.shard_size) if args.shard_size is not None else DEFAULT_SHARD_SIZE,
            workers=args.workers,
            resize=args.resize,
            quality=args.quality,
            shuffle=args.shuffle,
            seed=args.seed,
            name=args.name,
            on_error=args.on_error,
            overwrite=args.overwrite,
            restart_index=args.restart_index,
            verify=args.verify,
            root=args.root,
            progress=not args.quiet,
            **({} if args.max_pixels is None else {"max_pixels": args.max_pixels}),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    # What the imports created lives until exit: keep the collector from re-walking it while the
    # pack allocates (a measurable share of a short pack's CPU time otherwise).
    gc.freeze()
    from fastload.records.remote.storage import is_remote_url

    if args.address and args.engine != "ray":
        raise UserError("--address applies to --engine ray")
    if is_remote_url(args.src) or is_remote_url(args.out):
        from fastload.cli.copy import storage_options
        from fastload.pack.remote_io import pack_remote

        result = pack_remote(
            args.src,
            args.out,
            options=options,
            engine=args.engine,
            address=args.address,
            storage_options=storage_options(args.storage_option) or None,
            build_dir=args.build_dir,
        )
    elif args.engine == "ray":
        from fastload.pack.ray_engine import pack_with_ray

        result = pack_with_ray(args.src, args.out, options=options, address=args.address)
    else:
        result = pack_folder(args.src, args.out, options=options)
    print(format_summary(result))
    ray = getattr(result, "ray", None)
    if ray is not None:
        from fastload.pack.ray_engine import format_ray_stats

        print(format_ray_stats(ray))
    return 0
