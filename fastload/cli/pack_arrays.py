"""``fastload pack-arrays OUT --data [NAME=]PATH ... [--label [NAME=]PATH ...]``: arrays as row shards.

Dense ``.npy`` and sparse CSR ``.npz`` inputs, packed by :func:`fastload.pack.arrays.pack_arrays`.
"""

from __future__ import annotations

import argparse

from fastload.cli.sizes import parse_size
from fastload.errors import UserError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fastload pack-arrays``."""
    p = sub.add_parser("pack-arrays", help="store dense .npy / sparse CSR .npz arrays as shards for NDArrayIter")
    p.add_argument("out", help="output folder")
    p.add_argument(
        "--data",
        action="append",
        required=True,
        metavar="[NAME=]PATH",
        help="a data array (.npy or scipy CSR .npz); repeat for several (default name 'data')",
    )
    p.add_argument(
        "--label",
        action="append",
        metavar="[NAME=]PATH",
        help="a label array; repeat for several (default name 'softmax_label')",
    )
    p.add_argument("--shard-size", default="256MB", help="target bytes per shard, e.g. 256MB")
    p.add_argument("--overwrite", action="store_true", help="replace an existing pack-arrays folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _named(values: list[str] | None, default: str) -> dict[str, str]:
    """``[NAME=]PATH`` values as ``{name: path}`` (an unnamed single array takes ``default``)."""
    named: dict[str, str] = {}
    values = values or []
    for i, v in enumerate(values):
        name, sep, path = v.partition("=")
        if not sep:
            name, path = (default if len(values) == 1 else f"_{i}_{default}"), v
        if name in named:
            raise UserError(f"array name {name!r} given twice")
        named[name] = path
    return named


def run(args: argparse.Namespace) -> int:
    """Pack, then print one summary line."""
    from fastload.pack.arrays import ArraysPackConfig, pack_arrays

    try:
        config = ArraysPackConfig(
            data=_named(args.data, "data"),
            labels=_named(args.label, "softmax_label"),
            out=args.out,
            shard_bytes=parse_size(args.shard_size),
            overwrite=args.overwrite,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    manifest = pack_arrays(config, progress=not args.quiet)
    shards = len(manifest["row_starts"]) - 1
    print(f"packed {manifest['num_rows']} rows of {len(manifest['arrays'])} arrays into {shards} shards in {args.out}")
    return 0
