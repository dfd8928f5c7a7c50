"""Measurement stage, storage: a reproducible slow disk, a loop device throttled by the blkio cgroup.

Every figure measured from the page cache says nothing about a cold epoch from a disk that gives a
few hundred or a few thousand reads per second; and a VM's own disk is no such disk when the
hypervisor caches it. :class:`SlowDevice` makes one that behaves the same on every Linux machine
with root, loop devices and the cgroup v1 ``blkio`` controller:

1. a sparse file in a temporary folder, attached to a loop device with direct I/O on (the loop
   device then reads its file with ``O_DIRECT``: no second copy of the data in the page cache);
2. an ext4 file system on it, mounted in the temporary folder;
3. a child cgroup of the blkio hierarchy whose ``blkio.throttle.read_bps_device`` and
   ``read_iops_device`` limit reads of the loop device (its ``major:minor``); the processes that
   read join that cgroup (:meth:`SlowDevice.join`; children they start afterwards are in it too);
4. between epochs the file system's page cache is dropped by unmounting and remounting it
   (:meth:`SlowDevice.drop_cache`: it needs no writable ``/proc/sys/vm/drop_caches``), and a timed
   read of a probe file checks that a read after the drop really reaches the throttled device
   (:meth:`SlowDevice.check_cold`).

What the throttle counts: every request (bio) that reaches the loop device is one I/O whatever its
size, and requests are at most the device's ``max_sectors_kb`` (1,280 KB for a loop device): at
150 I/O per second, only reads of about 1 MB and more reach a 160 MB/s bandwidth. The counters of
what the device served (bytes and requests) come from the cgroup's ``blkio.throttle.io_service_bytes``
and ``io_serviced`` (the reads of the cgroup's processes), and from ``/sys/block/loopN/stat`` (all
reads of the device), see :meth:`SlowDevice.counters`.

Profiles (:data:`PROFILES`): ``hdd`` (150 IOPS, 160 MB/s), ``cloud-disk`` (3,000 IOPS, 125 MB/s:
a general-purpose cloud block volume), ``ssd-lite`` (20,000 IOPS, 500 MB/s: a SATA SSD).

Release: the loop device, the mount, the cgroup and the temporary folder go on :meth:`close`
(context manager exit, also on Ctrl-C and on errors). A kill the process cannot catch (SIGKILL, the
OOM killer) is covered by a janitor: a small process started first, outside the cgroup and in its
own session (a Ctrl-C in the terminal does not reach it), that learns each resource before it is
made and releases whatever is left when its pipe from the owner closes without a clean goodbye.

Where the kernel features are missing (not root, no loop devices, no blkio controller, cgroup v2
only), :func:`unsupported_reason` says so and the constructor raises :class:`Unsupported` with that
reason; the benchmark reports it and the tests skip with it.

This module is standard-library only and runs as a script for the janitor
(``python bench/slow_device.py --janitor``) and for a manual check
(``python -m bench.slow_device --profile hdd``).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = [
    "BLKIO_ROOT",
    "PROFILES",
    "DeviceBusy",
    "DeviceProfile",
    "IoCounters",
    "SlowDevice",
    "Unsupported",
    "profile_named",
    "unsupported_reason",
]

BLKIO_ROOT = "/sys/fs/cgroup/blkio"
_PREFIX = "fastload-slowdisk"
_PROBE_NAME = ".cold-probe"
_PROBE_BYTES = 8 * 1280 * 1024  # eight full-size requests of a loop device


class Unsupported(Exception):
    """The machine cannot make a throttled loop device; the message says why."""


class DeviceBusy(RuntimeError):
    """The file system cannot be unmounted to drop its cache: files on it are still open."""


@dataclass(frozen=True)
class DeviceProfile:
    """Read limits of a slow disk.

    Attributes:
        name: The profile's name.
        iops: Read requests per second.
        bandwidth: Read bytes per second.
    """

    name: str
    iops: int
    bandwidth: int

    def __post_init__(self) -> None:
        if self.iops < 1 or self.bandwidth < 1:
            raise ValueError(f"profile {self.name!r}: iops={self.iops} and bandwidth={self.bandwidth} must be >= 1")

    @property
    def bytes_per_io(self) -> float:
        """Bytes a read must carry for the bandwidth, not the request rate, to be the limit."""
        return self.bandwidth / self.iops

    def describe(self) -> str:
        return f"{self.name}: {self.iops:,} IOPS, {self.bandwidth / 1e6:,.0f} MB/s"


PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        DeviceProfile("hdd", 150, 160_000_000),
        DeviceProfile("cloud-disk", 3_000, 125_000_000),
        DeviceProfile("ssd-lite", 20_000, 500_000_000),
    )
}


def profile_named(name: str | DeviceProfile) -> DeviceProfile:
    """The profile called ``name`` (a :class:`DeviceProfile` passes through).

    Raises:
        ValueError: An unknown name (the message lists the known ones).
    """
    if isinstance(name, DeviceProfile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}") from None


@dataclass(frozen=True)
class IoCounters:
    """Reads a device served: bytes and requests (cumulative; subtract two to get an interval's)."""

    bytes: int
    ios: int

    def __sub__(self, other: IoCounters) -> IoCounters:
        return IoCounters(self.bytes - other.bytes, self.ios - other.ios)


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )


def unsupported_reason() -> str | None:
    """Why a throttled loop device cannot be made here, or None when it can (as far as can be told)."""
    if sys.platform != "linux":
        return f"loop devices and the blkio cgroup are Linux features (this is {sys.platform})"
    if os.geteuid() != 0:
        return "making a loop device, mounting it and writing cgroup limits needs root"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if _tool(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices here (/dev/loop-control is missing: the loop module is not loaded)"
    if not os.path.isfile(os.path.join(BLKIO_ROOT, "blkio.throttle.read_bps_device")):
        if os.path.isfile("/sys/fs/cgroup/cgroup.controllers"):
            return (
                "this machine has cgroup v2 only; the slow device throttles with the cgroup v1 blkio "
                f"controller ({BLKIO_ROOT}/blkio.throttle.read_bps_device)"
            )
        return f"no cgroup v1 blkio controller with throttling ({BLKIO_ROOT}/blkio.throttle.read_bps_device)"
    return None


def _run(argv: list[str], what: str) -> str:
    tool = _tool(argv[0]) or argv[0]
    proc = subprocess.run([tool, *argv[1:]], capture_output=True, text=True)
    if proc.returncode != 0:
        raise OSError(f"{what} failed ({' '.join(argv)}: exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()


def _mounted(path: str) -> bool:
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mounts") as fh:
            return any(line.split()[1] == real for line in fh if len(line.split()) > 1)
    except OSError:
        return False


def _cgroup_of(pid: int) -> str:
    """The blkio cgroup ``pid`` is in, relative to the hierarchy's root ("/" for the root)."""
    with open(f"/proc/{pid}/cgroup") as fh:
        for line in fh:
            _n, controllers, path = line.rstrip("\n").split(":", 2)
            if "blkio" in controllers.split(","):
                return path or "/"
    return "/"


def _move_tasks(src: str, dst: str) -> None:
    """Move every process of cgroup folder ``src`` to ``dst`` (processes that exited meanwhile are fine)."""
    try:
        with open(os.path.join(src, "cgroup.procs")) as fh:
            pids = [line.strip() for line in fh if line.strip()]
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError), open(os.path.join(dst, "cgroup.procs"), "w") as out:
            out.write(pid)


def _wait_tasks_exit(src: str, seconds: float) -> None:
    """Wait until every process still listed in cgroup folder ``src`` has exited (at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    try:
        with open(os.path.join(src, "cgroup.procs")) as fh:
            pids = [int(line) for line in fh if line.strip()]
    except OSError:
        return
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        try:
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)


def _empty_cgroup(path: str) -> None:
    """Move the processes of cgroup folder ``path`` to its parent and remove it.

    A process that is exiting can no longer be moved, and it stays listed until the kernel takes
    it out of its cgroup, after it has closed its files: the janitor, woken by the owner's pipe
    closing, can get there first (EBUSY). Such processes are waited for (their pidfd becomes
    readable once they have left), then the removal is tried again.
    """
    for attempt in range(3):
        _move_tasks(path, os.path.dirname(path))
        try:
            os.rmdir(path)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == 2:
                raise
        _wait_tasks_exit(path, 20.0)


def _release(kind: str, path: str) -> None:
    """Release one resource left by an owner (the janitor's and :meth:`SlowDevice.close`'s step)."""
    if kind == "cgroup":
        if os.path.isdir(path):
            _empty_cgroup(path)
    elif kind == "mount":
        if _mounted(path):
            try:
                _run(["umount", path], "unmounting")
            except OSError:
                # A process still holds a file there (a peer killed with its owner): detach the
                # mount now; the kernel finishes when the last file closes.
                _run(["umount", "-l", path], "lazily unmounting")
    elif kind == "image":
        if os.path.exists(path):
            out = _run(["losetup", "-j", path], "listing loop devices")
            for line in out.splitlines():
                dev = line.split(":", 1)[0].strip()
                if dev:
                    _run(["losetup", "-d", dev], f"detaching {dev}")
    elif kind == "dir":
        shutil.rmtree(path, ignore_errors=True)


def _janitor_main() -> int:
    """Read resources (one JSON object a line) from stdin; on EOF without ``done``, release them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    held: list[tuple[str, str]] = []
    done = False
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("done"):
            done = True
            break
        if msg.get("kind") and msg.get("path"):
            held.append((str(msg["kind"]), str(msg["path"])))
    if done:
        return 0
    # The owner died without closing: release what depends on the rest first.
    order = {"cgroup": 0, "mount": 1, "image": 2, "dir": 3}
    for kind, path in sorted(held, key=lambda kp: order.get(kp[0], 9)):
        try:
            _release(kind, path)
            print(f"slow device janitor: released {kind} {path}", file=sys.stderr)
        except OSError as exc:
            print(f"slow device janitor: could not release {kind} {path}: {exc}", file=sys.stderr)
    return 0


class _Janitor:
    """The owner's side of the janitor process: announce each resource before making it."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--janitor"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            start_new_session=True,  # a Ctrl-C in the terminal goes to the owner only
            close_fds=True,
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def announce(self, kind: str, path: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"kind": kind, "path": path}) + "\n")
        self._proc.stdin.flush()

    def abandon(self) -> None:
        """Close the pipe without a goodbye: the janitor releases what it was told about."""
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def dismiss(self) -> None:
        """Everything was released: tell the janitor and let it exit."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError, ValueError):
                self._proc.stdin.write(json.dumps({"done": True}) + "\n")
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class SlowDevice:
    """A throttled loop device with an ext4 file system, mounted; see the module docstring.

    Args:
        size: Bytes of the device (a sparse file: only what is written takes disk space).
        profile: Initial read limits (a :class:`DeviceProfile` or a name in :data:`PROFILES`); None
            leaves reads unthrottled until :meth:`set_profile`.
        workdir: Parent folder of the backing file and the mount point (default: the system's
            temporary folder). It must be on a file system that supports ``O_DIRECT`` for the loop
            device's direct I/O (not tmpfs); otherwise the device runs without it and
            :attr:`direct_io` is False.

    Attributes:
        mount_point: Where the file system is mounted.
        device: The loop device (``/dev/loopN``).
        major_minor: Its ``major:minor``, the key of the throttle's limits.
        cgroup: The child cgroup's folder.
        direct_io: Whether the loop device reads its file with direct I/O.
        profile: The current limits (None: unthrottled).

    Raises:
        Unsupported: Root, loop devices or the blkio controller are missing, or making the device
            failed (the reason says which step).
    """

    def __init__(self, *, size: int, profile: DeviceProfile | str | None = None, workdir: str | None = None) -> None:
        reason = unsupported_reason()
        if reason is not None:
            raise Unsupported(reason)
        if size < 64 << 20:
            raise ValueError(f"size={size} must be at least 64 MiB")
        self.profile: DeviceProfile | None = None
        self.device = ""
        self.major_minor = ""
        self.direct_io = False
        self._closed = True  # until the janitor and the folder exist: nothing to release before
        self._lock = threading.Lock()
        self._joined: dict[int, str] = {}  # pid -> the blkio cgroup it came from
        self.repairs: list[str] = []  # limits or memberships found lost and set again (see ensure())
        self._janitor = _Janitor()
        try:
            self._folder = tempfile.mkdtemp(prefix=f"{_PREFIX}-", dir=workdir)
        except BaseException:
            self._janitor.dismiss()
            raise
        self._closed = False
        self.mount_point = os.path.join(self._folder, "mnt")
        self._image = os.path.join(self._folder, "device.img")
        self.cgroup = os.path.join(BLKIO_ROOT, f"{_PREFIX}-{os.getpid()}-{os.path.basename(self._folder)[-8:]}")
        try:
            self._janitor.announce("dir", self._folder)
            self._make(size)
            if profile is not None:
                self.set_profile(profile)
        except BaseException as exc:
            self.close()
            if isinstance(exc, OSError):
                raise Unsupported(f"could not make the slow device: {exc}") from exc
            raise

    # --- making and releasing -------------------------------------------------------------------

    def _make(self, size: int) -> None:
        with open(self._image, "wb") as fh:
            fh.truncate(size)
        self._janitor.announce("image", self._image)
        try:
            argv = ["losetup", "--find", "--show", "--direct-io=on", self._image]
            self.device = _run(argv, "attaching a loop device")
        except OSError:
            # The backing file system refuses O_DIRECT (tmpfs): a device without direct I/O still
            # throttles every read of the file system on it; only the memory use doubles.
            self.device = _run(["losetup", "--find", "--show", self._image], "attaching a loop device")
        name = os.path.basename(self.device)
        with open(f"/sys/block/{name}/dev") as fh:
            self.major_minor = fh.read().strip()
        with contextlib.suppress(OSError), open(f"/sys/block/{name}/loop/dio") as fh:
            self.direct_io = fh.read().strip() == "1"
        # No lazy initialisation: it would write in the background during the measurements.
        _run(
            ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.device],
            "making the ext4 file system",
        )
        os.makedirs(self.mount_point)
        self._janitor.announce("mount", self.mount_point)
        self._mount()
        self._janitor.announce("cgroup", self.cgroup)
        os.mkdir(self.cgroup)
        # The probe of check_cold(): full-size requests, never in the page cache after a drop.
        with open(os.path.join(self.mount_point, _PROBE_NAME), "wb") as fh:
            fh.write(os.urandom(_PROBE_BYTES))
            os.fsync(fh.fileno())

    def _mount(self) -> None:
        _run(["mount", "-o", "noatime", self.device, self.mount_point], "mounting the slow device")

    def close(self) -> None:
        """Release the cgroup, the mount, the loop device and the folder (idempotent).

        Processes still in the cgroup (a peer that outlived its owner's bookkeeping) are moved back
        to the parent cgroup first. Raises OSError naming what could not be released, after
        trying everything.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        errors = []
        for pid in list(self._joined):
            with contextlib.suppress(OSError, ProcessLookupError):
                self.leave(pid)
        for kind, path in (
            ("cgroup", self.cgroup),
            ("mount", self.mount_point),
            ("image", self._image),
            ("dir", self._folder),
        ):
            try:
                _release(kind, path)
            except OSError as exc:
                errors.append(f"{kind} {path}: {exc}")
        if errors:
            self._janitor.abandon()  # it retries when its pipe closes, now
            raise OSError("could not release the slow device: " + "; ".join(errors))
        self._janitor.dismiss()

    def __enter__(self) -> SlowDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if not getattr(self, "_closed", True):
                self.close()

    # --- limits and membership ------------------------------------------------------------------

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.cgroup, name), "w") as fh:
            fh.write(value)

    def set_profile(self, profile: DeviceProfile | str | None) -> None:
        """Throttle reads to ``profile`` (None: unthrottled, e.g. to warm the page cache quickly)."""
        self._check_open()
        p = None if profile is None else profile_named(profile)
        self._write("blkio.throttle.read_iops_device", f"{self.major_minor} {p.iops if p else 0}")
        self._write("blkio.throttle.read_bps_device", f"{self.major_minor} {p.bandwidth if p else 0}")
        self.profile = p

    def join(self, pid: int | None = None) -> None:
        """Move process ``pid`` (default: this one, all its threads) into the throttled cgroup.

        Processes it starts afterwards (peers, DataLoader workers) are in the cgroup too.
        """
        self._check_open()
        pid = os.getpid() if pid is None else int(pid)
        if pid not in self._joined:
            self._joined[pid] = _cgroup_of(pid)
        self._write("cgroup.procs", str(pid))

    def leave(self, pid: int | None = None) -> None:
        """Move ``pid`` (default: this process) back to the cgroup it came from."""
        pid = os.getpid() if pid is None else int(pid)
        origin = self._joined.pop(pid, "/")
        target = os.path.join(BLKIO_ROOT, origin.lstrip("/"))
        if not os.path.isdir(target):
            target = BLKIO_ROOT
        with open(os.path.join(target, "cgroup.procs"), "w") as fh:
            fh.write(str(pid))

    def members(self) -> list[int]:
        """The processes in the throttled cgroup now."""
        with open(os.path.join(self.cgroup, "cgroup.procs")) as fh:
            return [int(line) for line in fh if line.strip()]

    # --- cache and counters ---------------------------------------------------------------------

    def ensure(self) -> list[str]:
        """Check that the limits are in force and the joined processes still in the cgroup; restore them.

        A limit that vanished (the kernel keeps it per device and cgroup) would let reads through
        unthrottled and uncounted. Returns what had to be restored (also kept in :attr:`repairs`).
        """
        self._check_open()
        fixed = []
        p = self.profile
        if p is not None:
            for name, want in (("read_iops_device", p.iops), ("read_bps_device", p.bandwidth)):
                with open(os.path.join(self.cgroup, f"blkio.throttle.{name}")) as fh:
                    have = {line.split()[0]: int(line.split()[1]) for line in fh if len(line.split()) == 2}
                if have.get(self.major_minor) != want:
                    self._write(f"blkio.throttle.{name}", f"{self.major_minor} {want}")
                    fixed.append(f"{name} was {have.get(self.major_minor)}, set to {want}")
        members = set(self.members())
        for pid in list(self._joined):
            if pid not in members and os.path.exists(f"/proc/{pid}"):
                self._write("cgroup.procs", str(pid))
                fixed.append(f"pid {pid} had left the cgroup, joined again")
        self.repairs += fixed
        return fixed

    def drop_cache(self) -> None:
        """Drop the file system's cached pages: unmount and mount it again (limits checked first).

        Raises:
            DeviceBusy: Files on it are open (the message names the processes holding them).
        """
        self._check_open()
        self.ensure()
        os.sync()
        try:
            _run(["umount", self.mount_point], "unmounting")
        except OSError as exc:
            raise DeviceBusy(f"cannot drop the slow device's cache: {exc}; held by {self._holders()}") from None
        self._mount()

    def _holders(self) -> str:
        """Which processes hold files under the mount point (for DeviceBusy's message)."""
        found = []
        root = os.path.realpath(self.mount_point) + os.sep
        for pid in filter(str.isdigit, os.listdir("/proc")):
            fd_dir = f"/proc/{pid}/fd"
            with contextlib.suppress(OSError):
                for fd in os.listdir(fd_dir):
                    with contextlib.suppress(OSError):
                        if os.readlink(os.path.join(fd_dir, fd)).startswith(root):
                            found.append(pid)
                            break
        return ", ".join(f"pid {p}" for p in found) or "no process found (a current directory?)"

    def counters(self) -> IoCounters:
        """Reads served to the cgroup's processes on this device (``blkio.throttle.io_service_bytes`` /
        ``io_serviced``, cumulative)."""
        return IoCounters(
            self._cgroup_read("blkio.throttle.io_service_bytes"), self._cgroup_read("blkio.throttle.io_serviced")
        )

    def _cgroup_read(self, name: str) -> int:
        with open(os.path.join(self.cgroup, name)) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 3 and parts[0] == self.major_minor and parts[1] == "Read":
                    return int(parts[2])
        return 0

    def device_counters(self) -> IoCounters:
        """Reads the loop device completed, from every process (``/sys/block/loopN/stat``)."""
        with open(f"/sys/block/{os.path.basename(self.device)}/stat") as fh:
            fields = fh.read().split()
        return IoCounters(int(fields[2]) * 512, int(fields[0]))

    def queue_settings(self) -> dict[str, int]:
        """The loop device's request size limit and read-ahead (KB), for the report."""
        out = {}
        for name in ("max_sectors_kb", "read_ahead_kb"):
            with (
                contextlib.suppress(OSError, ValueError),
                open(f"/sys/block/{os.path.basename(self.device)}/queue/{name}") as fh,
            ):
                out[name] = int(fh.read().strip())
        return out

    def check_cold(self) -> dict[str, float]:
        """Drop the cache, then time reading the probe file cold and again warm.

        The cold read must reach the device (its bytes counted by the throttle, which passes every
        read of the cgroup's processes through the limits :meth:`ensure` checks); the warm one must not.

        Returns:
            ``cold_seconds``, ``warm_seconds``, ``cold_device_bytes``, ``warm_device_bytes``,
            ``probe_bytes`` and, when throttled, ``expected_seconds`` (the profile's time for the
            probe; a burst after an idle period may beat it).

        Raises:
            RuntimeError: The cold read did not reach the device (the cache was not dropped).
        """
        self.drop_cache()
        path = os.path.join(self.mount_point, _PROBE_NAME)
        out: dict[str, float] = {"probe_bytes": float(_PROBE_BYTES)}
        for label in ("cold", "warm"):
            before = self.counters()
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as fh:
                while fh.read(1280 * 1024):
                    pass
            out[f"{label}_seconds"] = time.perf_counter() - t0
            served = self.counters() - before
            out[f"{label}_device_bytes"] = float(served.bytes)
            out[f"{label}_device_ios"] = float(served.ios)
        if os.getpid() in self._joined and out["cold_device_bytes"] < 0.9 * _PROBE_BYTES:
            raise RuntimeError(
                f"a read after dropping the cache reached the device with {out['cold_device_bytes']:.0f} of "
                f"{_PROBE_BYTES} bytes: the page cache was not dropped"
            )
        if self.profile is not None:
            p = self.profile
            # For the report only: the throttle lets a burst of about a tenth of a second's worth
            # through at once after an idle period, so a small probe may take less than this.
            out["expected_seconds"] = max(_PROBE_BYTES / p.bandwidth, 8 / p.iops)
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the slow device is closed")

    def __repr__(self) -> str:
        limits = self.profile.describe() if self.profile else "unthrottled"
        return f"<SlowDevice {self.device} ({self.major_minor}) at {self.mount_point}: {limits}>"


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Make a throttled loop device, check it reads cold, release it.")
    parser.add_argument("--janitor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile", default="hdd", choices=sorted(PROFILES))
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--workdir", help="parent folder of the backing file (default: the system's temp folder)")
    args = parser.parse_args(argv)
    if args.janitor:
        return _janitor_main()
    reason = unsupported_reason()
    if reason is not None:
        print(f"no slow device here: {reason}")
        return 2
    with SlowDevice(size=args.size_mb << 20, profile=args.profile, workdir=args.workdir) as dev:
        dev.join()
        try:
            print(dev, f"direct I/O {'on' if dev.direct_io else 'off'}", dev.queue_settings())
            check = dev.check_cold()
            print(
                f"probe {check['probe_bytes'] / 1e6:.1f} MB: cold {check['cold_seconds']:.3f} s "
                f"({check['cold_device_bytes'] / 1e6:.1f} MB in {check['cold_device_ios']:.0f} requests, at least "
                f"{check.get('expected_seconds', 0):.3f} s expected), warm {check['warm_seconds']:.4f} s "
                f"({check['warm_device_bytes'] / 1e6:.1f} MB from the device)"
            )
        finally:
            dev.leave()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
