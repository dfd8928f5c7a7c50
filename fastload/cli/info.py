"""``fastload info [PATH] [--json]``: which decoder is live, or what a dataset holds."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fastload info``."""
    p = sub.add_parser("info", help="which decoder is live; with a path, the dataset's manifest summary")
    p.add_argument("path", nargs="?", help="a fastload dataset folder, a .rec or an LMDB shard")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print :func:`fastload.decode.engine_info`, or :func:`fastload.records.summary.describe` of PATH."""
    if args.path is None:
        from fastload.decode import engine_info

        engine: dict[str, Any] = dict(engine_info())
        if args.json:
            print(json.dumps(engine, indent=2, default=str))
        else:
            print("decoder: " + ", ".join(f"{k}={v}" for k, v in engine.items()))
        return 0
    from fastload.records.summary import describe, format_description

    description = describe(args.path)
    if args.json:
        print(json.dumps(description.get("manifest", description), indent=2))
    else:
        print(format_description(description))
    return 0
