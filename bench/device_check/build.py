"""Set-up on a bare GPU machine: the carried wheels installed aside, the engine built for its Python.

The carried folder (``tools/prepare_device_carry.sh`` makes it) holds Debian's libjpeg-turbo
packages unpacked into a prefix (``jpeg/usr``), CPython's headers (``python3.12/include``, used only
where the machine's Python has no ``Python.h``) and wheels (``wheels/``). Wheels whose distribution
is missing are installed with ``pip install --no-index --no-deps --target`` into a folder of their
own, put on ``PYTHONPATH``: nothing in the machine's environment (its torch above all) is touched.
The engine is built in place with ``FASTLOAD_JPEG_ROOT`` pointing at the prefix, on every core, with
an rpath to the prefix's library folder, so the built module finds ``libjpeg.so.62`` there at run
time; the check then imports it in a fresh process and records what ``ldd`` resolved.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

__all__ = ["build_engine", "install_wheels"]


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _dist_name(wheel: Path) -> str:
    return wheel.name.split("-", 1)[0]


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def install_wheels(carry: Path, site: Path, *, timeout: float) -> dict[str, Any]:
    """Install the carried wheels of distributions this Python lacks into ``site``.

    Returns:
        What was installed, skipped (already there) or failed, with pip's output on failure.
    """
    wheels = sorted((carry / "wheels").glob("*.whl"))
    needed = [w for w in wheels if not _installed(_dist_name(w))]
    record: dict[str, Any] = {
        "site": str(site),
        "carried": [w.name for w in wheels],
        "already_installed": [_dist_name(w) for w in wheels if w not in needed],
        "installed": [],
    }
    if not needed:
        return record
    site.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--upgrade",
        "--target",
        str(site),
        *map(str, needed),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    record["seconds"] = round(time.perf_counter() - t0, 2)
    if proc.returncode != 0:
        record["error"] = f"pip exited {proc.returncode}: {_tail(proc.stdout + proc.stderr)}"
    else:
        record["installed"] = [_dist_name(w) for w in needed]
    return record


def _engine_probe(repo: Path, env: dict[str, str]) -> dict[str, Any]:
    """Import the engine in a fresh process (the driver never loads it: it may be rebuilt)."""
    code = "import json, fastload._engine as e; print(json.dumps({'file': e.__file__, 'info': e.info()}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, env=env, timeout=60)
    if proc.returncode != 0:
        return {"importable": False, "error": _tail(proc.stderr, 5)}
    import json

    found = json.loads(proc.stdout.strip().splitlines()[-1])
    record = {"importable": True, **found}
    try:
        ldd = subprocess.run(["ldd", found["file"]], capture_output=True, text=True, timeout=30).stdout
        record["libjpeg"] = next((line.strip() for line in ldd.splitlines() if "libjpeg" in line), None)
    except (OSError, subprocess.SubprocessError):
        record["libjpeg"] = None
    return record


def build_engine(
    repo: Path, carry: Path, *, cores: int, env: dict[str, str], log: Path, timeout: float
) -> dict[str, Any]:
    """Build ``fastload._engine`` in place for this Python, against the carried libjpeg-turbo.

    Without a carried prefix nothing is built (a checkout's own engine comes from ``make build``):
    the record says whether an engine imports, and the parts use it or fastload's Pillow path.
    """
    prefix = carry / "jpeg" / "usr"
    carried = (prefix / "include" / "jpeglib.h").is_file()
    record: dict[str, Any] = {"jpeg_root": str(prefix) if carried else None}
    if not carried:
        engine = _engine_probe(repo, env)
        reason = "the checkout's engine imports" if engine["importable"] else "fastload's Pillow path is measured"
        record.update(built=False, reason=f"no carried libjpeg-turbo: {reason}", engine=engine)
        return record
    build_env = dict(env)
    build_env.update(FASTLOAD_REQUIRE_EXTENSION="1", FASTLOAD_BUILD_JOBS=str(max(1, cores)))
    if carried:
        build_env["FASTLOAD_JPEG_ROOT"] = str(prefix)
        libdirs = [d for d in glob.glob(str(prefix / "lib" / "*-linux-gnu")) if glob.glob(f"{d}/libjpeg.so*")]
        rpath = " ".join(f"-Wl,-rpath,{d}" for d in libdirs)
        build_env["LDFLAGS"] = f"{env.get('LDFLAGS', '')} {rpath}".strip()
    include = sysconfig.get_paths()["include"]
    headers = carry / f"python{sys.version_info.major}.{sys.version_info.minor}" / "include"
    if not os.path.isfile(os.path.join(include, "Python.h")) and (headers / "Python.h").is_file():
        # CPPFLAGS: setuptools adds it to the C and the C++ compile lines alike (CFLAGS reaches only
        # the C one in recent versions).
        build_env["CPPFLAGS"] = f"{env.get('CPPFLAGS', '')} -I{headers}".strip()
        record["python_headers"] = str(headers)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
            cwd=repo,
            env=build_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        returncode = None
    record["seconds"] = round(time.perf_counter() - t0, 1)
    log.write_text(output)
    record["log"] = str(log)
    record["setup_says"] = [line for line in output.splitlines() if line.startswith("fastload setup:")][-4:]
    after = _engine_probe(repo, env)
    record["engine"] = after
    if returncode != 0:
        reason = "timed out" if returncode is None else f"exited {returncode}"
        record.update(built=False, error=f"setup.py build_ext {reason}: {_tail(output)}")
    elif not after.get("importable"):
        record.update(built=False, error=f"the built engine does not import: {after.get('error')}")
    else:
        record["built"] = True
    if carried and after.get("importable") and after.get("libjpeg"):
        # The module must resolve the carried library, not one it happened to find on the system.
        record["libjpeg_from_carry"] = bool(re.search(re.escape(str(prefix)), after["libjpeg"]))
    return record
