"""The ``device`` record: GPU, driver, CPU model, cores, memory, date and versions.

Run in a process of its own (``python -m bench.device_check.environment OUT.json``): it imports
torch, and the driver stays free of it.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

__all__ = ["describe"]


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _fastload_version() -> str | None:
    try:  # the source tree's (not installed on the GPU machine)
        return importlib.import_module("fastload.version").__version__
    except ImportError:
        return None


def _nvidia_smi() -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if len(lines) < 2:
        return {}
    keys = ["name", "driver", "memory", "pcie_gen_max", "pcie_width_max"]
    return dict(zip(keys, (v.strip() for v in lines[1].split(",")), strict=False))


def _torch() -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"cuda_available": False, "cuda_reason": f"torch is not importable: {exc}"}
    info: dict[str, Any] = {"cuda_available": bool(torch.cuda.is_available()), "cuda_runtime": torch.version.cuda}
    if not info["cuda_available"]:
        info["cuda_reason"] = "torch.cuda.is_available() is False"
        return info
    props = torch.cuda.get_device_properties(0)
    info.update(
        gpu_name=props.name,
        gpu_count=torch.cuda.device_count(),
        gpu_memory_gib=round(props.total_memory / 2**30, 1),
        capability=f"{props.major}.{props.minor}",
        multiprocessors=props.multi_processor_count,
        cudnn=torch.backends.cudnn.version(),
    )
    return info


def _engine() -> dict[str, Any]:
    try:
        from fastload.decode import engine_info

        return dict(engine_info())
    except Exception as exc:  # the record says why, the check goes on
        return {"error": f"{type(exc).__name__}: {exc}"}


def describe() -> dict[str, Any]:
    """Everything the report says about the machine."""
    torch_info = _torch()
    smi = _nvidia_smi()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch_info.get("gpu_name") or smi.get("name"),
        "driver": smi.get("driver"),
        "cpu_model": _cpu_model(),
        "cores": usable,
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        **{k: v for k, v in torch_info.items() if k != "gpu_name"},
        "nvidia_smi": smi or None,
        "versions": {
            "fastload": _fastload_version(),
            **{
                name: _version(name)
                for name in ("torch", "torchvision", "numpy", "pillow", "lmdb", "pybind11", "psutil", "pytest")
            },
        },
        "engine": _engine(),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    record = describe()
    text = json.dumps(record, indent=1, default=str)
    if args:
        with open(args[0], "w") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
