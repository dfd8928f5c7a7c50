"""``fastload bench``: registers the benchmark harness's own parser (``bench/command.py``).

The harness is the repository's ``bench/`` package, which the wheel does not install (it is 4,000
lines of measurement code with its own dependencies, the ``bench`` extra). ``fastload bench`` runs
from a source checkout: an editable install (``pip install -e ".[bench]"``), or ``python -m fastload``
with the checkout on ``sys.path``. From a wheel it says so in one line instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from fastload.errors import UserError

__all__ = ["NAME", "add_parser", "harness"]

NAME = "bench"
_HELP = "measure the loader's stages and compare with peer loaders (from a source checkout)"


def _checkout() -> Path | None:
    """The source checkout this ``fastload`` package was imported from, if it holds ``bench/``."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "bench" / "command.py").is_file() else None


def harness() -> ModuleType | None:
    """``bench.command`` of this checkout (None when fastload runs from an installed wheel)."""
    root = _checkout()
    if root is not None and str(root) not in sys.path:
        # The command's own process: its import path and environment are ours to set. The
        # benchmark's measuring subprocesses (`python -m bench.startup ...`) need the checkout too.
        sys.path.insert(0, str(root))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    try:
        module = importlib.import_module("bench.command")
    except ModuleNotFoundError as exc:
        if exc.name not in ("bench", "bench.command"):
            raise  # a real import error inside the harness must surface
        return None
    return module if hasattr(module, "add_parser") else None


def _unavailable(args: argparse.Namespace) -> int:
    raise UserError(
        "the benchmark harness is not installed with the wheel: it lives in the repository's "
        "bench/ folder; run `fastload bench` from a source checkout "
        '(pip install -e ".[bench]" there)'
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], *, load: bool) -> None:
    """Register ``fastload bench``.

    Args:
        sub: The CLI's sub-command parsers.
        load: Import the harness and register its full parser (when ``bench`` runs or for the full
            parser); otherwise list the command for ``--help`` without importing it (the harness
            adds its import time to every command).
    """
    module = harness() if load else None
    if module is not None:
        module.add_parser(sub)
        return
    if not load:
        sub.add_parser(NAME, help=_HELP)
        return
    # `fastload bench ...` was asked for and the harness is not there: take any arguments (no
    # prefix character, so "--quick" is one of them) and say where the harness is.
    p = sub.add_parser(NAME, help=_HELP, prefix_chars="\0", add_help=False)
    p.add_argument("args", nargs="*")
    p.set_defaults(func=_unavailable)
