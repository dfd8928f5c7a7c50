"""The ``fastload`` command line.

One module per command parses its arguments and calls the library's public functions;
:mod:`fastload.cli.dispatch` builds the parser and runs the command.
"""

from fastload.cli.dispatch import build_parser, main

__all__ = ["build_parser", "main"]
