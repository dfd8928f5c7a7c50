"""``fastload`` command line: builds the parser from every command's module, runs the chosen one.

Commands: ``pack``, ``info``, ``verify``, ``pack-arrays``, ``copy`` (:mod:`fastload.cli.pack`,
:mod:`fastload.cli.info`, :mod:`fastload.cli.verify`, :mod:`fastload.cli.pack_arrays`,
:mod:`fastload.cli.copy`; ``stage`` is its deprecated name) and ``bench``
(its parser lives with the benchmark harness in the repository's ``bench/``; registered by
:mod:`fastload.cli.bench`). User errors (bad paths, bad options, refused overwrites) are
:class:`fastload.errors.UserError`: they print one clear line and exit non-zero, without a traceback.
"""

from __future__ import annotations

import argparse
import sys

from fastload.cli import bench, copy, info, pack, pack_arrays, verify
from fastload.errors import CorruptDatasetError, CorruptRecordError, UserError

__all__ = ["build_parser", "main"]

_COMMANDS = (pack, info, verify, pack_arrays, copy)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``fastload`` parser.

    Args:
        argv: The arguments about to be parsed. When given, the benchmark harness is imported only
            if they name ``bench`` (it is listed for ``--help`` without importing it). None builds
            the full parser.
    """
    parser = argparse.ArgumentParser(
        prog="fastload",
        description="fastload: pack, inspect, verify and benchmark datasets for high-throughput training input",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    for command in _COMMANDS:
        command.add_parser(sub)
    # The top-level parser has only flags without values, so its first positional is the command.
    named = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    bench.add_parser(sub, load=named is None or named == bench.NAME)
    # The usage line lists the commands by their current names only.
    sub.metavar = "{" + ",".join(name for name in sub.choices if name not in copy.DEPRECATED_NAMES) + "}"
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fastload ARGS``; returns the exit status (2 for a user error, 130 when interrupted)."""
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.version:
        from fastload.version import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (UserError, CorruptDatasetError, CorruptRecordError) as exc:
        # A damaged dataset (e.g. `fastload info` on a broken manifest) is reported like a user
        # error: one line naming the file and the field, no traceback.
        print(f"fastload {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastload {args.command}: interrupted", file=sys.stderr)
        return 130
