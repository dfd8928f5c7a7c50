"""``fastload verify PATH [--decode]``: checksums, framing and headers of every record."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]

_SHOWN = 200  # problems printed; the count covers them all


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fastload verify``."""
    p = sub.add_parser("verify", help="check checksums and framing (and decode every record with --decode)")
    p.add_argument("path")
    p.add_argument("--decode", action="store_true", help="also decode every record")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print what :func:`fastload.records.verify.verify_dataset` found; exit 1 when anything is bad."""
    from fastload.records.verify import verify_dataset

    report = verify_dataset(args.path, decode=args.decode)
    for line in report.problems[:_SHOWN]:
        print(f"BAD {line}")
    if len(report.problems) > _SHOWN:
        print(f"... {len(report.problems) - _SHOWN} more problems")
    for note in report.notes:
        print(f"NOTE {note}")
    decoded = f", {report.decoded} decoded" if args.decode else ""
    if report.ok:
        print(f"OK {args.path}: {report.records} records in {report.shards} shard(s) checked{decoded}")
        return 0
    print(f"FAILED {args.path}: {len(report.problems)} problem(s) in {report.records} records{decoded}")
    return 1
