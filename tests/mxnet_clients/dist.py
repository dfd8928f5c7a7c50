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
import time
from typing import List, Optional, Tuple


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_local(worker_cmd: List[str], *, workers: int = 2, servers: int = 1, timeout: float = 240,
                 env: Optional[dict] = None) -> Tuple[List[Optional[int]], str]:
    """Run the job; returns the workers' exit codes (None: killed at the timeout) and their stderr."""
    base = dict(os.environ if env is None else env)
    base.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()), DMLC_NUM_SERVER=str(servers),
                DMLC_NUM_WORKER=str(workers))
    # Importing mxnet in the scheduler and server roles runs their loops until the job ends.
    role_cmd = [sys.executable, "-c", "import mxnet"]
    procs, logs = [], []
    for role, count, cmd in (("scheduler", 1, role_cmd), ("server", servers, role_cmd), ("worker", workers, worker_cmd)):
        for _ in range(count):
            log = open(os.devnull, "w") if role != "worker" else subprocess.PIPE
            procs.append((role, subprocess.Popen(cmd, env=dict(base, DMLC_ROLE=role), stdout=subprocess.DEVNULL,
                                                 stderr=log, text=True)))
            if role != "worker":
                logs.append(log)
    deadline = time.monotonic() + timeout
    codes: List[Optional[int]] = []
    stderr = []
    for role, proc in procs:
        if role != "worker":
            continue
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            codes.append(proc.returncode)
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
    for log in logs:
        log.close()
    return codes, "\n".join(stderr)
