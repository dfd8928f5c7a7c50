"""The check's data, made on the machine that runs it: ImageNet-like JPEGs, plain and restart-indexed shards.

``tools/make_dataset.py`` writes the ImageFolder tree (torch's DataLoader reads it as users' do),
``fastload pack`` packs it twice, as plain and as restart-indexed shards, all three on every core.
A stamp file records what was made; a second run with the same sizes reuses it (a machine kept warm
between two runs keeps its ignored build folder).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["prepare_data"]

_STAMP = "device-check-data.json"


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd[1:4])}... exited {proc.returncode}:\n{tail}")
    return round(time.perf_counter() - t0, 2)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def prepare_data(
    root: Path, *, images: int, tiny: bool, cores: int, repo: Path, env: dict[str, str], deadline: float
) -> dict[str, Any]:
    """Generate and pack the dataset under ``root`` (or reuse it); returns paths, sizes and seconds.

    Raises:
        RuntimeError: A step failed (its output's end in the message).
        subprocess.TimeoutExpired: The steps ran past ``deadline`` (a ``time.monotonic()`` value).
    """
    spec = {"count": images, "tiny": tiny, "seed": 0, "classes": 100}
    paths = {"images": root / "images", "packed": root / "packed", "packed_restart": root / "packed-restart"}
    record: dict[str, Any] = {**spec, **{k: str(v) for k, v in paths.items()}}
    stamp = root / _STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("spec") == spec:
        record["reused"] = True
        record.update(json.loads(stamp.read_text())["made"])
        return record
    root.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    py = sys.executable
    made: dict[str, Any] = {}
    generate = [py, "tools/make_dataset.py", str(paths["images"]), "--count", str(images), "--seed", "0"]
    generate += ["--classes", str(spec["classes"]), "--workers", str(cores), "--overwrite"]
    if tiny:
        generate.append("--tiny")
    made["generate_seconds"] = _run(generate, cwd=repo, env=env, timeout=left())
    pack = [py, "-m", "fastload", "pack", str(paths["images"])]
    common = ["--workers", str(cores), "--overwrite", "--quiet", "--name", "train"]
    made["pack_seconds"] = _run([*pack, str(paths["packed"]), *common], cwd=repo, env=env, timeout=left())
    made["pack_restart_seconds"] = _run(
        [*pack, str(paths["packed_restart"]), *common, "--restart-index"], cwd=repo, env=env, timeout=left()
    )
    made["jpeg_mb"] = round(_size(paths["images"]) / 1e6, 1)
    made["packed_mb"] = round(_size(paths["packed"]) / 1e6, 1)
    made["packed_restart_mb"] = round(_size(paths["packed_restart"]) / 1e6, 1)
    stamp.write_text(json.dumps({"spec": spec, "made": made}))
    record.update(reused=False, **made)
    return record
