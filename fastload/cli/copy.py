"""``fastload copy SRC DEST``: copy a packed dataset (or this node's share of it) to node-local storage.

The command calls :func:`fastload.records.remote.node_copy.copy_dataset`. Without
``--node-rank``/``--nnodes`` it copies every shard; with them (or from torchrun's
``GROUP_RANK``/``NODE_RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` when they are set) only the
shards this node's ranks read in the shard-aware order for ``--epochs``.

``fastload stage`` is the command's deprecated name: it takes the same arguments, does the same,
and says once, on stderr, that the command is now ``fastload copy``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastload.errors import UserError

__all__ = ["DEPRECATED_NAMES", "add_parser", "parse_epochs", "run", "storage_options"]

#: Former names of the command, still accepted (with a one-line notice on stderr).
DEPRECATED_NAMES = ("stage",)


def parse_epochs(text: str) -> tuple[int, ...]:
    """``"0"``, ``"0,2"``, ``"0-3"`` (inclusive) or a mix, as epoch numbers.

    Raises:
        UserError: On anything else.
    """
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise UserError(f"--epochs {text!r}: expected epoch numbers like 0, 0,1 or 0-9") from None
    if not out or min(out) < 0:
        raise UserError(f"--epochs {text!r}: expected non-negative epoch numbers")
    return tuple(sorted(set(out)))


def storage_options(pairs: list[str]) -> dict[str, Any]:
    """``--storage-option KEY=VALUE`` pairs as a dict (``true``/``false`` become booleans)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--storage-option {pair!r}: expected KEY=VALUE")
        options[key] = {"true": True, "false": False}.get(value.lower(), value)
    return options


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fastload copy`` and its deprecated name ``fastload stage``."""
    p = sub.add_parser(
        "copy",
        help="copy a packed dataset (local or s3://, gs://, https://), or this node's shards of it, to local storage",
    )
    _add_arguments(p)
    p.set_defaults(func=run)
    for name in DEPRECATED_NAMES:
        # No help line: the listing shows the command once, under its name.
        old = sub.add_parser(name, description="Deprecated name of `fastload copy` (same arguments).")
        _add_arguments(old)
        old.set_defaults(func=_run_deprecated)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="a packed dataset folder or URL")
    p.add_argument("dest", help="destination folder, e.g. /dev/shm/train")
    p.add_argument("--node-rank", type=int, help="this node's number (default: torchrun's GROUP_RANK / NODE_RANK)")
    p.add_argument("--nnodes", type=int, help="number of nodes (default: WORLD_SIZE / LOCAL_WORLD_SIZE)")
    p.add_argument("--nproc-per-node", type=int, help="ranks per node (default: LOCAL_WORLD_SIZE, else 1)")
    p.add_argument("--seed", type=int, default=0, help="the training run's seed (the shard order depends on it)")
    p.add_argument("--epochs", default="0", help="epochs whose shards this node needs: 0, 0,1 or 0-9 (default 0)")
    p.add_argument("--even", choices=["pad", "drop"], default="pad", help="the loader's even= setting")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="storage setting for a remote SRC (endpoint_url=..., region=..., anon=true); repeatable",
    )
    p.add_argument("--threads", type=int, default=4, help="files copied at a time")
    p.add_argument("--overwrite", action="store_true", help="replace a different dataset in DEST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _run_deprecated(args: argparse.Namespace) -> int:
    print(f"fastload {args.command}: deprecated name, use `fastload copy` (same arguments)", file=sys.stderr)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Copy, then print one line of summary."""
    from fastload.records.remote.node_copy import CopyOptions, copy_dataset, node_from_env

    node_rank, nnodes, nproc = args.node_rank, args.nnodes, args.nproc_per_node
    if node_rank is None and nnodes is None:
        env = node_from_env()
        if env is not None:
            node_rank, nnodes, env_nproc = env
            nproc = nproc or env_nproc
    storage = storage_options(args.storage_option)
    try:
        options = CopyOptions(
            node_rank=node_rank,
            nnodes=nnodes,
            nproc_per_node=nproc or 1,
            seed=args.seed,
            epochs=parse_epochs(args.epochs),
            even=args.even,
            storage_options=storage or None,
            threads=args.threads,
            overwrite=args.overwrite,
            progress=not args.quiet,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    result = copy_dataset(args.src, args.dest, options)
    mbps = result.copied_bytes / max(result.seconds, 1e-9) / 1e6
    share = "every shard" if result.complete else f"{result.selected} of {result.shards} shards (this node's)"
    print(
        f"{result.dest}: {share}; {result.copied} file(s) copied ({result.copied_bytes / 1e6:.1f} MB, "
        f"{mbps:.0f} MB/s), {result.kept} already there, {result.seconds:.2f} s"
    )
    return 0
