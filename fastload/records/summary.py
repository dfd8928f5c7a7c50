"""Read stage, description: what ``fastload info PATH`` shows about a dataset.

:func:`describe` reads a fastload folder's manifest (nothing else), or opens any other input
:func:`fastload.records.open_dataset` accepts and reports what it sees; :func:`summarize` turns a
manifest into the human-readable lines.
"""

from __future__ import annotations

import os
from typing import Any

from fastload.checksum import recorded_checksum
from fastload.errors import UserError
from fastload.records.dataset import open_dataset
from fastload.records.manifest import MANIFEST_NAME, read_manifest

__all__ = ["describe", "format_description", "summarize"]


def describe(path: str) -> dict[str, Any]:
    """A dataset's description.

    Returns:
        ``{"manifest": {...}}`` for a fastload folder (its parsed ``fastload.json``); otherwise
        ``{"path", "kind", "records", "label_width", "shards"}`` of what :func:`open_dataset` opened.

    Raises:
        UserError: The path does not exist or is not a dataset.
    """
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file or directory")
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        return {"manifest": read_manifest(path)}
    with open_dataset(path) as ds:
        return {
            "path": path,
            "kind": ds.kind,
            "records": len(ds),
            "label_width": ds.label_width,
            "shards": [s.name for s in ds.shards] if ds.shards else [],
        }


def format_description(description: dict[str, Any]) -> str:
    """The lines ``fastload info PATH`` prints for :func:`describe`'s result."""
    if "manifest" in description:
        return summarize(description["manifest"])
    return "\n".join(f"{k + ':':<14} {v}" for k, v in description.items())


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _obj(value: object) -> dict[str, Any]:
    """An informational manifest field that should be an object (a damaged one shows as empty)."""
    return value if isinstance(value, dict) else {}


def summarize(manifest: dict[str, Any]) -> str:
    """A human-readable multi-line summary of a manifest (checked by :func:`read_manifest` first)."""
    shards = manifest.get("shards", [])
    total = sum(s.get("bytes", 0) for s in shards)
    counts = _obj(manifest.get("counts"))
    lines = [
        f"name:          {manifest.get('name')}",
        f"format:        {manifest.get('format')} (manifest v{manifest.get('format_version')}, "
        f"fastload {manifest.get('fastload_version')})",
        f"records:       {manifest.get('records')}",
        f"shards:        {len(shards)} ({_human_bytes(total)})",
        f"label width:   {manifest.get('label_width')}",
    ]
    classes = _obj(manifest.get("classes"))
    if classes:
        names = list(classes)
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} classes)" if len(names) > 8 else "")
        lines.append(f"classes:       {shown}")
    source = _obj(manifest.get("source"))
    lines.append(f"source:        {source.get('kind')} {source.get('path')}")
    converted = _obj(counts.get("converted"))
    lines.append(f"skipped:       {counts.get('skipped', 0)}")
    if converted:
        lines.append("converted:     " + ", ".join(f"{k} {v}" for k, v in sorted(converted.items())))
    lines.append(f"restart index: {'yes' if manifest.get('restart_index') else 'no'}")
    for s in shards[:20]:
        checksum = (recorded_checksum(s) or "no checksum")[:21]
        lines.append(f"  {s['file']}: {s['records']} records, {_human_bytes(s['bytes'])}, {checksum}")
    if len(shards) > 20:
        lines.append(f"  ... {len(shards) - 20} more shards")
    return "\n".join(lines)
