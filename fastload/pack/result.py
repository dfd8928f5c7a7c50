"""Write stage, what was done: :class:`PackResult` and the summary ``fastload pack`` prints."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from fastload.records.manifest import MANIFEST_NAME

__all__ = ["PackResult", "format_summary"]


@dataclass(frozen=True)
class PackResult:
    """What a pack did.

    Attributes:
        out: The dataset folder.
        manifest: The manifest written.
        written: Records written.
        skipped: ``[(path, reason)]`` of files left out.
        converted: Conversions per kind (``grayscale``, ``cmyk``, ``png``, ``resized``, ...).
        bytes_in: Source bytes read (this run).
        bytes_out: Shard bytes.
        seconds: Wall time of this run.
        resumed_shards: Shards kept from an interrupted run.
        processed: Images read and converted in this run.
        up_to_date: OUT already held what this command packs: nothing was done.
    """

    out: str
    manifest: dict[str, Any]
    written: int
    skipped: list[tuple[str, str]]
    converted: dict[str, int]
    bytes_in: int
    bytes_out: int
    seconds: float
    resumed_shards: int = 0
    processed: int = 0
    up_to_date: bool = False


def format_summary(result: PackResult) -> str:
    """The end-of-pack summary printed by ``fastload pack``."""
    if result.up_to_date:
        return f"{result.out}: already packed by the same command ({result.written} records); nothing to do"
    secs = max(result.seconds, 1e-9)
    m = result.manifest
    lines = [
        f"packed {result.written} records into {len(m['shards'])} {m['format']} shard(s) in {result.out}",
        f"  skipped {len(result.skipped)}"
        + (
            " ("
            + ", ".join(
                f"{n} {r}" for r, n in collections.Counter(r.split(":")[0] for _, r in result.skipped).most_common()
            )
            + ")"
            if result.skipped
            else ""
        ),
        "  converted " + (", ".join(f"{k} {v}" for k, v in result.converted.items()) or "0"),
        f"  {result.bytes_in / 1e6:.1f} MB read, {result.bytes_out / 1e6:.1f} MB written in {secs:.2f} s: "
        f"{result.processed / secs:.0f} images/s, {result.bytes_in / secs / 1e6:.1f} MB/s",
    ]
    if result.resumed_shards:
        lines.append(f"  resumed: {result.resumed_shards} shard(s) kept from an interrupted run")
    for path, reason in result.skipped[:20]:
        lines.append(f"  skipped {path}: {reason}")
    if len(result.skipped) > 20:
        lines.append(f"  ... {len(result.skipped) - 20} more in {MANIFEST_NAME}")
    return "\n".join(lines)
