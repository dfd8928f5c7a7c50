"""`fastload` command line: parses arguments, then calls one public library function per command.

User errors (bad paths, bad options, refused overwrites) are :class:`fastload.errors.UserError`:
they print one clear line and exit non-zero, without a traceback.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import os
import sys
from typing import List, Optional

from fastload.errors import UserError

__all__ = ["main", "build_parser"]


def _add_pack(sub) -> None:
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
    p.add_argument("--on-error", choices=["skip", "fail"], default="skip")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already in OUT")
    p.add_argument("--restart-index", dest="restart_index", action="store_true",
                   help="losslessly add JPEG restart markers so crops decode only the intervals they need")
    p.add_argument("--verify", action="store_true", help="check every transcoded image decodes identically")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_pack)


def _run_pack(args) -> int:
    if "numpy" not in sys.modules:
        # Packing does no linear algebra, but OpenBLAS (loaded with numpy) starts a thread per core
        # that spin-waits (sched_yield) for its first ~0.1 s: CPU taken from the packing threads.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fastload.pack.packer import pack_main
    # What the imports created lives until exit: keep the collector from re-walking it while the
    # pack allocates (a measurable share of a short pack's CPU time otherwise).
    gc.freeze()
    return pack_main(args)


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="which decoder is live; with a path, the dataset's manifest summary")
    p.add_argument("path", nargs="?", help="a fastload dataset folder, a .rec or an LMDB shard")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run_info)


def _run_info(args) -> int:
    from fastload.records.manifest import info_main
    return info_main(args)


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="check checksums and framing (and decode every record with --decode)")
    p.add_argument("path")
    p.add_argument("--decode", action="store_true", help="also decode every record")
    p.set_defaults(func=_run_verify)


def _run_verify(args) -> int:
    from fastload.records.verify import verify_main
    return verify_main(args)


# Commands contributed by other stages: (module, help). A module is imported only when its command
# runs (or for a full parser): `fastload bench` pulls in the whole benchmark harness, which would
# otherwise add its import time to every `fastload pack`.
_CONTRIBUTED = {
    "bench": ("fastload_bench.command", "measure the loader's stages and compare with peer loaders"),
    "pack-arrays": ("fastload.pack.arrays", "store dense .npy / sparse CSR .npz arrays as shards for NDArrayIter"),
}


def _contributed_module(module_name: str):
    """The module, or None when it (or its parent package, e.g. fastload_bench) is not installed."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # A real import bug inside the module must surface.
        if exc.name not in (module_name, module_name.split(".")[0]):
            raise
        return None


def _installed(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The ``fastload`` parser.

    Args:
        argv: The arguments about to be parsed. When given, only the contributed command they
            name is imported; the others are listed (for ``--help``) without importing them.
            None builds the full parser.
    """
    parser = argparse.ArgumentParser(prog="fastload", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    for add in (_add_pack, _add_info, _add_verify):
        add(sub)
    # The top-level parser has only flags without values, so its first positional is the command.
    command = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (module_name, help_text) in _CONTRIBUTED.items():
        if command is None or command == name:
            module = _contributed_module(module_name)
            if module is not None and getattr(module, "add_parser", None) is not None:
                module.add_parser(sub)
        elif _installed(module_name):
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.version:
        from fastload import __version__
        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"fastload {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastload {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
