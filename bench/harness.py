"""Benchmarks: the one harness every fastload benchmark goes through.

A contender is anything that can do one timed repeat of work over the same images (a loader epoch,
a batch of decodes, a pack command). The harness starts every contender of a group, warms each
up, then runs repeats round-robin with the order reversed on alternate rounds (A B C, C B A, ...)
so slow drift of the machine (thermal state, a noisy neighbour, page-cache churn) lands on every
contender alike. It reports medians and min-max per contender. Contenders that cannot run are
kept in the results as skipped, with the reason; nothing is silently dropped.

Peers whose libraries conflict with fastload's environment live in another interpreter and are
driven through :mod:`.peers.protocol` by :class:`PeerProcess`; to the harness they are contenders
like any other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Contender",
    "FunctionContender",
    "PeerContender",
    "PeerProcess",
    "Result",
    "RunConfig",
    "Sample",
    "Skip",
    "cpu_count",
    "environment",
    "measure",
    "skipped",
    "warm_inputs",
]


class Skip(Exception):
    """A contender cannot run on this machine; the message says why (shown in the report)."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One timed repeat.

    Args:
        images: Items processed (images, records, decodes).
        bytes: Encoded bytes those items came from (for MB/s).
        seconds: Wall time of the repeat, measured around the work only.
        extra: Counters the contender wants recorded (e.g. records that took the sliced path).
    """

    images: int
    bytes: int
    seconds: float
    extra: dict[str, object] = field(default_factory=dict)


class Contender:
    """Base class: override :meth:`start`, :meth:`run` and :meth:`close`.

    Attributes:
        name: Row label in the table.
        group: Which comparison it belongs to (``read``, ``decode``, ``pipeline``, ``pack`` ...).
        family: Series name for the thread-scaling plot (same family, different ``threads``).
        threads: CPU threads/processes the contender was allowed (per-core figures divide by it).
        reference: The row other rows of the group are compared with (fastload's).
        unit: What ``images`` counts (``images``, ``records``).
        notes: Free text for the table and JSON (settings that matter for fairness).
        inputs: Files or folders the contender reads during a repeat; the harness reads them
            through the page cache (untimed) before every repeat, see :func:`warm_inputs`.
    """

    def __init__(
        self,
        name: str,
        *,
        group: str,
        family: str | None = None,
        threads: int = 1,
        reference: bool = False,
        unit: str = "images",
        notes: str = "",
        inputs: Sequence[str] = (),
    ) -> None:
        self.name, self.group, self.family = name, group, family or name
        self.threads, self.reference, self.unit, self.notes = int(threads), reference, unit, notes
        self._inputs = tuple(p for p in inputs if p)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Paths read by a repeat (known after :meth:`start` for contenders that create them)."""
        return self._inputs

    def start(self) -> None:
        """Prepare (allocate, open, spawn); raise :class:`Skip` when the contender cannot run."""

    def run(self) -> Sample:
        """One timed repeat."""
        raise NotImplementedError

    def close(self) -> None:
        """Release everything; idempotent."""


class FunctionContender(Contender):
    """A contender made of plain callables: ``setup() -> state``, ``work(state) -> (images, bytes)``.

    ``work`` is timed with ``time.perf_counter`` around the call.
    """

    def __init__(
        self,
        name: str,
        *,
        setup: Callable[[], object],
        work: Callable[[object], tuple],
        teardown: Callable[[object], None] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(name, **kwargs)
        self._setup, self._work, self._teardown = setup, work, teardown
        self._state = None
        self._started = False

    def start(self) -> None:
        self._state = self._setup()
        self._started = True

    def run(self) -> Sample:
        t0 = time.perf_counter()
        out = self._work(self._state)
        seconds = time.perf_counter() - t0
        images, nbytes = out[0], out[1]
        extra = out[2] if len(out) > 2 else {}
        return Sample(images=int(images), bytes=int(nbytes), seconds=seconds, extra=dict(extra))

    def close(self) -> None:
        if self._started and self._teardown is not None:
            self._started = False
            self._teardown(self._state)
        self._state = None


class PeerProcess:
    """A long-lived peer interpreter speaking :mod:`.peers.protocol` over pipes.

    Args:
        argv: Command starting the peer (its interpreter and module or script).
        label: Name used in error messages.
        env: Extra environment variables.
        timeout: Seconds to wait for any single reply (a hung peer is killed and reported).
    """

    def __init__(
        self, argv: Sequence[str], *, label: str, env: dict[str, str] | None = None, timeout: float = 900.0
    ) -> None:
        self.argv, self.label, self.timeout = list(argv), label, timeout
        full_env = dict(os.environ)
        full_env.update(env or {})
        self._stderr_tail: list[str] = []
        self._lock = threading.Lock()
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                env=full_env,
            )
        except OSError as exc:
            raise Skip(f"cannot start {label} peer ({self.argv[0]}): {exc}") from exc
        # Keep the peer's stderr (library logs) out of the report but available for errors.
        self._drain = threading.Thread(target=self._read_stderr, name=f"{label}-stderr", daemon=True)
        self._drain.start()
        self._closed = False

    def _read_stderr(self) -> None:
        for line in self._proc.stderr:
            self._stderr_tail.append(line.rstrip())
            del self._stderr_tail[:-40]

    def request(self, obj: dict) -> dict:
        """Send one request and wait for its reply."""
        with self._lock:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"{self.label} peer exited with code {self._proc.returncode}: " + " | ".join(self._stderr_tail[-8:])
                )
            self._proc.stdin.write(json.dumps(obj) + "\n")
            self._proc.stdin.flush()
            reply: list[str] = []
            reader = threading.Thread(target=lambda: reply.append(self._proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(self.timeout)
            if reader.is_alive():
                self._proc.kill()
                raise RuntimeError(f"{self.label} peer did not answer {obj.get('op')} within {self.timeout:.0f} s")
            line = reply[0] if reply else ""
            if not line:
                self._proc.wait(timeout=10)
                raise RuntimeError(
                    f"{self.label} peer exited (code {self._proc.returncode}) during "
                    f"{obj.get('op')}: " + " | ".join(self._stderr_tail[-8:])
                )
            return json.loads(line)

    def close(self) -> None:
        """Ask the peer to exit, then make sure it has; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._proc.poll() is None:
                self._proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self._proc.stdin.flush()
                self._proc.wait(timeout=30)
        except Exception:
            pass
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


class PeerContender(Contender):
    """One contender hosted by a :class:`PeerProcess` (several may share a process)."""

    def __init__(self, name: str, *, process: Callable[[], PeerProcess], kind: str, spec: dict, **kwargs) -> None:
        super().__init__(name, **kwargs)
        self._process_factory, self.kind, self.spec = process, kind, spec
        self._process: PeerProcess | None = None
        self._id = f"{name}#{id(self)}"
        self.info: dict[str, object] = {}

    def start(self) -> None:
        self._process = self._process_factory()
        reply = self._process.request({"op": "start", "id": self._id, "kind": self.kind, "spec": self.spec})
        if not reply.get("ok"):
            if "skip" in reply:
                raise Skip(reply["skip"])
            raise RuntimeError(f"{self.name}: {reply.get('error')}\n{reply.get('traceback', '')}")
        self.info = reply.get("info") or {}

    @property
    def inputs(self) -> tuple[str, ...]:
        # The shared dataset forms named in the spec, plus files the peer made itself (FFCV's .beton).
        named = [self.spec.get(k) for k in ("rec", "idx", "root", "packed")]
        named += list(self.info.get("inputs") or ()) if isinstance(self.info, dict) else []
        return tuple(p for p in named if isinstance(p, str) and p)

    def run(self) -> Sample:
        reply = self._process.request({"op": "run", "id": self._id})
        if not reply.get("ok"):
            raise RuntimeError(f"{self.name}: {reply.get('error')}\n{reply.get('traceback', '')}")
        return Sample(
            images=int(reply["images"]),
            bytes=int(reply["bytes"]),
            seconds=float(reply["seconds"]),
            extra=dict(reply.get("extra") or {}),
        )

    def close(self) -> None:
        if self._process is not None:
            process, self._process = self._process, None
            with contextlib.suppress(Exception):
                process.request({"op": "close", "id": self._id})


@dataclass(kw_only=True)
class Result:
    """Everything measured for one contender; the JSON rows and the table are made from these."""

    name: str
    group: str
    family: str
    threads: int
    unit: str = "images"
    reference: bool = False
    notes: str = ""
    skipped: str | None = None
    error: str | None = None
    samples: list[dict[str, float]] = field(default_factory=list)
    median_ips: float | None = None
    min_ips: float | None = None
    max_ips: float | None = None
    median_mbps: float | None = None
    per_core_ips: float | None = None
    ratio_to_reference: float | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.skipped is None and self.error is None and self.median_ips is not None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def skipped(
    name: str, *, group: str, reason: str, family: str | None = None, threads: int = 0, notes: str = ""
) -> Result:
    """A result row for a contender that was never started (missing dependency, no device...)."""
    return Result(name=name, group=group, family=family or name, threads=threads, skipped=reason, notes=notes)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How many times to run things.

    Args:
        repeats: Timed repeats per contender (medians are over these).
        warmup: Untimed repeats per contender before the first timed one (page cache, pools, JIT).
    """

    repeats: int = 5
    warmup: int = 1

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats} must be >= 1")
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup} must be >= 0")


def _summarize(result: Result, samples: list[Sample]) -> None:
    rates = [s.images / s.seconds for s in samples if s.seconds > 0]
    mbps = [s.bytes / s.seconds / 1e6 for s in samples if s.seconds > 0]
    result.samples = [{"images": s.images, "bytes": s.bytes, "seconds": round(s.seconds, 6)} for s in samples]
    if rates:
        result.median_ips = statistics.median(rates)
        result.min_ips, result.max_ips = min(rates), max(rates)
        result.median_mbps = statistics.median(mbps)
        result.per_core_ips = result.median_ips / max(1, result.threads)
    # Counters (records sliced, seconds per stage) add up over repeats; keys ending in _fraction or
    # _mean are averaged, keys ending in _max keep the largest value.
    for s in samples:
        for key, value in s.extra.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if key.endswith("_max"):
                    result.extra[key] = max(result.extra.get(key, value), value)
                    continue
                share = value / len(samples) if key.endswith(("_fraction", "_mean")) else value
                result.extra[key] = result.extra.get(key, 0) + share
            else:
                result.extra[key] = value


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)


_WARM_CHUNK = 8 << 20


def warm_inputs(paths: Sequence[str]) -> int:
    """Read ``paths`` (files, or folders recursively) through the page cache; returns bytes read.

    Every timed repeat is meant to start with its input in the page cache (that is what the warm-up
    repeat is for), but a round of a group can outlast the kernel's patience: proactive reclaim
    (e.g. DAMON's ``pageout`` scheme on cloud VMs) evicts page-cache pages that no process maps and
    nobody touched for tens of seconds. A file read by one contender only (a restart-indexed pack,
    FFCV's ``.beton``, a JPEG folder) then comes back from disk on its next repeat while a file
    several contenders share stays warm. Reading every contender's inputs right before its repeat,
    outside the timed region, gives all of them the same cache state. Missing paths are ignored
    (the contender reports its own error).
    """
    total = 0
    buf = bytearray(_WARM_CHUNK)
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            for dirpath, _dirs, names in os.walk(path, followlinks=True):
                files.extend(os.path.join(dirpath, n) for n in names)
        elif os.path.isfile(path):
            files.append(path)
    for path in files:
        try:
            with open(path, "rb", buffering=0) as fh:
                while True:
                    n = fh.readinto(buf)
                    if not n:
                        break
                    total += n
        except OSError:
            continue
    return total


def measure(contenders: Sequence[Contender], config: RunConfig, *, quiet: bool = False) -> list[Result]:
    """Start, warm up and run ``contenders`` interleaved; always closes them.

    Args:
        contenders: One comparison group (they run alternately, never concurrently).
        config: Repeats and warm-up.
        quiet: No progress lines on stderr.

    Returns:
        One :class:`Result` per contender, in the given order, with ratios to the group's reference.
    """
    results = {
        id(c): Result(
            name=c.name,
            group=c.group,
            family=c.family,
            threads=c.threads,
            unit=c.unit,
            reference=c.reference,
            notes=c.notes,
        )
        for c in contenders
    }
    samples: dict[int, list[Sample]] = {id(c): [] for c in contenders}
    live: list[Contender] = []
    try:
        for c in contenders:
            try:
                _log(f"start {c.group}/{c.name}", quiet)
                c.start()
                live.append(c)
                info = getattr(c, "info", None)
                if isinstance(info, dict) and info:
                    results[id(c)].extra["info"] = dict(info)
            except Skip as exc:
                results[id(c)].skipped = str(exc)
                _log(f"  skipped: {exc}", quiet)
                c.close()
            except Exception as exc:
                results[id(c)].error = f"{type(exc).__name__}: {exc}"
                _log(f"  failed to start: {exc}", quiet)
                c.close()

        def one(c: Contender, timed: bool) -> None:
            if results[id(c)].error is not None:
                return
            warm_inputs(c.inputs)
            try:
                s = c.run()
            except Exception as exc:
                results[id(c)].error = f"{type(exc).__name__}: {exc}"
                _log(f"  {c.name} failed: {exc}", quiet)
                return
            if timed:
                samples[id(c)].append(s)
                _log(f"  {c.name}: {s.images / max(s.seconds, 1e-9):,.0f} {c.unit}/s", quiet)

        for _ in range(config.warmup):
            for c in live:
                one(c, timed=False)
        for r in range(config.repeats):
            order = live if r % 2 == 0 else list(reversed(live))
            _log(f"round {r + 1}/{config.repeats}", quiet)
            for c in order:
                one(c, timed=True)
    finally:
        for c in live:
            try:
                c.close()
            except Exception as exc:
                _log(f"close {c.name}: {exc}", quiet)
    out = []
    for c in contenders:
        r = results[id(c)]
        if r.skipped is None:
            _summarize(r, samples[id(c)])
            if r.median_ips is None and r.error is None:
                r.error = "no timed repeat completed"
        out.append(r)
    apply_ratios(out)
    return out


def apply_ratios(results: Sequence[Result]) -> None:
    """Set ``ratio_to_reference`` of each row to its median over its group's reference median."""
    refs = {r.group: r for r in results if r.reference and r.ok}
    for r in results:
        ref = refs.get(r.group)
        if r.ok and ref is not None and ref.median_ips:
            r.ratio_to_reference = r.median_ips / ref.median_ips


# --- environment -------------------------------------------------------------------------


def cpu_count() -> int:
    """CPUs this process may run on (affinity), which is what a loader can actually use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_sha(repo: str) -> str | None:
    try:
        sha = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if sha.returncode != 0:
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _version(module: str) -> str | None:
    # Versions from package metadata: importing torch or mxnet here would drag them into the
    # harness process (MXNet and torch in one process is one of the conflicts peers avoid).
    from importlib import metadata

    names = {
        "PIL": "pillow",
        "mxnet": "mxnet",
        "torch": "torch",
        "numpy": "numpy",
        "simplejpeg": "simplejpeg",
        "matplotlib": "matplotlib",
        "lmdb": "lmdb",
        "psutil": "psutil",
    }
    try:
        return metadata.version(names.get(module, module))
    except metadata.PackageNotFoundError:
        return None


def machine_line(env: dict) -> str:
    """The report's line saying where a run ran: CPU, cores, Python, git sha and time, from :func:`environment`."""
    return (
        f"{env.get('cpu_model')}, {env.get('cores')} cores, python {env.get('python')}, git {env.get('git_sha')}, "
        f"{env.get('timestamp')}"
    )


def environment(argv: Sequence[str], *, extra_versions: dict[str, str | None] | None = None) -> dict:
    """Where and with what the benchmark ran: command, host, CPU, cores, versions, git sha, time."""
    versions = {name: _version(name) for name in ("numpy", "torch", "mxnet", "PIL", "simplejpeg", "lmdb", "matplotlib")}
    try:
        import fastload

        versions["fastload"] = fastload.__version__
        from fastload.decode import engine_info

        versions["fastload_engine"] = engine_info()
    except Exception as exc:
        versions.setdefault("fastload_engine", f"unavailable: {type(exc).__name__}: {exc}")
    versions.update(extra_versions or {})
    repo = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    mem = None
    try:
        import psutil

        mem = psutil.virtual_memory().total
    except Exception:
        pass
    return {
        "command": " ".join(argv),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": _cpu_model(),
        "cores": cpu_count(),
        "memory_bytes": mem,
        "git_sha": _git_sha(repo),
        "versions": versions,
    }
