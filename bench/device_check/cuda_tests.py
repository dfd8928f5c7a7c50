"""Part 1, ``cuda_tests``: ``pytest -m cuda`` over ``tests/test_cuda*.py``, outcome per test.

Without CUDA the selected tests are skipped (or, where their body compares with torch's own
DataLoader, run on the CPU): the dry run records exactly that, through the same command.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bench.device_check.measure import Recorder
from bench.device_check.plan import Config

__all__ = ["parse_junit", "run"]


def parse_junit(path: Path) -> list[dict[str, Any]]:
    """Each test case of a JUnit XML report: name, outcome, seconds, and the message of a non-pass."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", None
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = "failed" if kind == "failure" else kind
                text = node.get("message") or node.text or ""
                message = text.strip()[:600]
                break
        tests.append(
            {
                "test": f"{case.get('classname', '')}::{case.get('name', '')}".removeprefix("tests."),
                "outcome": outcome,
                "seconds": round(float(case.get("time") or 0.0), 2),
                **({"message": message} if message else {}),
            }
        )
    return tests


def run(config: Config, rec: Recorder) -> None:
    repo = Path(config.repo)
    files = sorted(str(p.relative_to(repo)) for p in (repo / "tests").glob("test_cuda*.py"))
    xml = Path(config.out) / "cuda-tests.xml"
    xml.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rfEs", "-p", "no:cacheprovider"]
    cmd += ["--junitxml", str(xml), *files]
    rec.set("command", " ".join(["python", *cmd[1:]]))
    try:
        proc = subprocess.run(
            cmd, cwd=repo, capture_output=True, text=True, timeout=max(10.0, config.budget - 10.0), check=False
        )
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or b""
        output, returncode = (raw.decode() if isinstance(raw, bytes) else raw), None
    (Path(config.out) / "cuda-tests.log").write_text(output)
    rec.set("returncode", returncode)
    rec.set("output_tail", "\n".join(output.strip().splitlines()[-12:]))
    tests = parse_junit(xml) if xml.is_file() else []
    rec.set("tests", tests)
    counts = {k: sum(1 for t in tests if t["outcome"] == k) for k in ("passed", "failed", "error", "skipped")}
    rec.set("counts", counts)
    if returncode is None:
        rec.set("status", "error")
        rec.set("error", f"pytest ran past {config.budget - 10:.0f} s")
    elif returncode not in (0, 5) or counts["failed"] or counts["error"]:
        rec.set("status", "failed")
