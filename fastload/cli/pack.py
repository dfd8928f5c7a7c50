"""``fastload pack SRC OUT [options]``: pack a folder, a listing, WebDataset tars or parquet into shards.

The flags are :class:`fastload.pack.options.PackOptions`'s fields; the command calls
:func:`fastload.pack.packer.pack_folder` (``--engine ray``: :func:`fastload.pack.ray_engine.pack_with_ray`;
an ``s3://``-style SRC or OUT: :func:`fastload.pack.remote_io.pack_remote`) and prints its summary.
The input formats' rules are the parser's epilog (``fastload pack --help``).
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
    p = sub.add_parser(
        "pack",
        help="pack images (folder, listing, WebDataset tars, parquet) into RecordIO or LMDB shards",
        description="Pack images into RecordIO or LMDB shards plus fastload.json: a class-folder tree, an "
        "im2rec .lst, a CSV or JSONL listing, WebDataset tar shards, Hugging Face parquet or a "
        "datasets save_to_disk folder.",
        epilog=INPUT_RULES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "src",
        help="class-folder tree, .lst / .csv / .jsonl listing, .tar file / folder of tars / brace pattern "
        "(train-{000000..000146}.tar) / s3:// URL, .parquet file or folder, save_to_disk folder",
    )
    p.add_argument("out", help="output folder for the shards and fastload.json")
    p.add_argument(
        "--input-format",
        choices=["folder", "lst", "wds", "parquet", "hf-disk", "csv", "jsonl"],
        help="what SRC is (default: detected, see below)",
    )
    p.add_argument("--root", help="image root for the paths of a .lst, CSV or JSONL listing (default: its folder)")
    p.add_argument("--image-key", help="wds: the image member (default: the first of jpg, jpeg, png, webp)")
    p.add_argument(
        "--label-key",
        help="wds: the label member (cls) or a field of the json member (json.label, json.class_name); "
        "none: unlabeled (default: cls, else json.label)",
    )
    p.add_argument("--image-column", help="parquet / hf-disk: the image column (default: image)")
    p.add_argument("--label-column", help="parquet / hf-disk: the label column (default: label); none: unlabeled")
    p.add_argument("--split", help="hf-disk DatasetDict folder or parquet folder laid out by split (default: train)")
    p.add_argument("--format", choices=["recordio", "lmdb"], default="recordio")
    p.add_argument("--shards", type=int, help="number of shards (not for tars: their size is known only at the end)")
    p.add_argument("--shard-size", help="target shard size, e.g. 512MB (default 512MB)")
    p.add_argument("--workers", type=int, help="parallel readers/converters (default: all cores)")
    p.add_argument("--resize", type=int, help="resize the shorter side to this and re-encode")
    p.add_argument("--quality", type=int, default=95, help="JPEG quality for re-encoded images")
    p.add_argument("--shuffle", action="store_true", help="shuffle record order (with --seed; listed input only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", help="shard name prefix (default: the source folder's name)")
    p.add_argument(
        "--on-error",
        choices=["skip", "fail", "raise"],
        default="skip",
        help="skip bad files / entries (listed in the manifest) or stop at the first ('raise' = 'fail')",
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


INPUT_RULES = """\
input formats (--input-format; detected when not given):
  folder   one sub-folder per class (labels: sorted folder names)
  lst      im2rec .lst: index<TAB>label[<TAB>label...]<TAB>path (any file not named otherwise)
  csv      header path,label (several labels: label_1,label_2,...); one row per image
  jsonl    one object per line: {"path": ..., "label": int | class name | [numbers]}
  wds      WebDataset tars: a .tar (.tar.gz/.tgz/.tar.bz2/.tar.xz), a folder of them, a brace
           pattern (train-{000000..000146}.tar) or an s3:// (gs://, ...) URL of any of these
  parquet  a .parquet file or a folder of them (Hugging Face layout: image {bytes, path} structs)
  hf-disk  a folder written by datasets' save_to_disk (state.json; a DatasetDict takes --split)
  Detected: brace pattern or .tar* -> wds; .parquet -> parquet; .csv -> csv; .jsonl -> jsonl; other
  file -> lst; a folder with state.json / dataset_dict.json -> hf-disk, with .tar files at its top ->
  wds, with .parquet files -> parquet, else folder.

listings (csv, jsonl, lst): paths are relative to the listing's folder (or --root) or absolute.

WebDataset samples: members with the same key (the name up to its first dot) form a sample. The
  image is the first of jpg, jpeg, png, webp (--image-key picks another); the label is --label-key:
  a member (cls: an integer or a class name) or a json field (json.label, json.class_name); default
  cls when the first sample has it, else json.label; --label-key none: no labels.
parquet / hf-disk: --image-column (default image), --label-column (default label; none: no labels),
  class names from the ClassLabel feature in the schema metadata. --split picks a DatasetDict's split
  or a parquet folder's split (default train).

labels: integer labels are kept as they are; class-name labels become indices, in sorted order
  where all names are known up front (a ClassLabel, a CSV or JSONL listing) and in first-seen order
  for a streamed tar; the mapping is the manifest's "classes". A list of numbers is a multi-label
  record. The first good label sets the kind and width; other labels are bad entries.

shards: --shard-size, or --shards N where the number of images is known up front (not for tars).
  Tars and parquet are streamed: read once, front to back, a row group at a time, with bounded
  memory and nothing extracted to disk; --shuffle needs listed input.

bad entries (undecodable bytes, no image member, a null image cell, a missing or bad label) are
  named by file, tar member (train-000003.tar:000123.jpg), parquet file and row (file.parquet: row
  17, from 0) or listing line (list.csv line 7), skipped and listed in the manifest (--on-error skip)
  or fatal (--on-error fail). JPEGs are stored as they are; PNG, WebP, grayscale and CMYK images are
  converted to RGB JPEG. A killed pack (kill -9 included) resumes when the same command is rerun.
"""


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
            input_format=args.input_format,
            image_key=args.image_key,
            label_key=args.label_key,
            image_column=args.image_column,
            label_column=args.label_column,
            split=args.split,
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
