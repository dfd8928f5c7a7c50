"""Run an MXNet ``dist_sync`` job on this machine: a scheduler, servers and workers as local processes.

MXNet's ``tools/launch.py --launcher local`` does the same, but its tracker finds a port by binding
9091, 9092, ... and closing the socket before the scheduler binds it: two jobs started at once on a
shared machine (two test suites) can pick the same port and connect to each other's scheduler, and
then hang. Here the port is one the kernel hands out (bind to port 0), so concurrent jobs do not
meet, and every process is killed when the job times out.
"""

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional, Tuple


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_local(worker_cmd: List[str], *, workers: int = 2, servers: int = 1, timeout: float = 240,
                 env: Optional[dict] = None, attempts: int = 2) -> Tuple[List[Optional[int]], str]:
    """Run the job; returns the workers' exit codes (None: killed at the timeout) and their stderr.

    A scheduler or server that dies while the workers run (a port another process took between
    ``free_port()`` and its bind, say) would leave the workers waiting for it until the timeout: the
    job is stopped at once instead, and started again on a fresh port (``attempts`` in all); the
    stderr returned then holds every role's.
    """
    for attempt in range(attempts):
        codes, stderr, infra = _launch_once(worker_cmd, workers=workers, servers=servers, timeout=timeout, env=env)
        if not infra or attempt == attempts - 1:
            return codes, stderr
    raise AssertionError("unreachable")


def _launch_once(worker_cmd: List[str], *, workers: int, servers: int, timeout: float,
                 env: Optional[dict]) -> Tuple[List[Optional[int]], str, bool]:
    base = dict(os.environ if env is None else env)
    base.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()), DMLC_NUM_SERVER=str(servers),
                DMLC_NUM_WORKER=str(workers))
    # Importing mxnet in the scheduler and server roles runs their loops until the job ends.
    role_cmd = [sys.executable, "-c", "import mxnet"]
    procs: List[Tuple[str, subprocess.Popen]] = []
    logs = []
    for role, count, cmd in (("scheduler", 1, role_cmd), ("server", servers, role_cmd), ("worker", workers, worker_cmd)):
        for _ in range(count):
            log = tempfile.TemporaryFile("w+") if role != "worker" else subprocess.PIPE
            procs.append((role, subprocess.Popen(cmd, env=dict(base, DMLC_ROLE=role), stdout=subprocess.DEVNULL,
                                                 stderr=log, text=True)))
            if role != "worker":
                logs.append((role, log))
    workers_procs = [p for role, p in procs if role == "worker"]
    died: List[str] = []

    def watch(role: str, proc: subprocess.Popen) -> None:
        # Wakes when the role's process ends; one that ends before the workers did is a broken job.
        code = proc.wait()
        if code != 0 and any(w.poll() is None for w in workers_procs):
            died.append(f"{role} exited with {code} while the workers ran")
            for w in workers_procs:
                w.kill()

    watchers = [threading.Thread(target=watch, args=(role, p), daemon=True) for role, p in procs if role != "worker"]
    for t in watchers:
        t.start()
    deadline = time.monotonic() + timeout
    codes: List[Optional[int]] = []
    stderr = []
    for proc in workers_procs:
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            codes.append(proc.returncode if not died else None)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            codes.append(None)
        stderr.append(err or "")
    for role, proc in procs:
        if role == "worker":
            continue
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()) if None not in codes else 0.1)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for t in watchers:
        t.join()
    if died or None in codes:
        for role, log in logs:
            log.seek(0)
            stderr.append(f"--- {role} ---\n{log.read()[-2000:]}")
    for _role, log in logs:
        log.close()
    return codes, "\n".join(died + stderr), bool(died)
