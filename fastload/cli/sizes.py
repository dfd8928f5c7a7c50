"""Command-line values: byte sizes such as ``512MB`` (``--shard-size`` of ``pack`` and ``pack-arrays``)."""

from __future__ import annotations

import re

from fastload.errors import UserError

__all__ = ["parse_size"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse ``512MB``, ``1.5GiB``, ``64k``, ``1048576`` into bytes (K/M/G/T are powers of 1024).

    Raises:
        UserError: On anything else, or a size under one byte.
    """
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UserError(f"--shard-size {text!r}: expected a size like 512MB, 2GB or 1048576")
    value = float(m.group(1)) * (1024 ** " KMGT".index(m.group(2).upper() or " "))
    if value < 1:
        raise UserError(f"--shard-size {text!r} must be at least 1 byte")
    return int(value)
