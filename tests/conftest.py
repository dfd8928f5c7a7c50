"""Shared test fixtures for every stage: datasets made by tools/make_dataset.py, JPEG bytes, skips.

Everything here is importable from test modules (pytest puts ``tests/`` on ``sys.path`` because the
folder has no ``__init__.py``)::

    from conftest import requires_torch, requires_mxnet, requires_engine, make_jpeg

Fixtures (session-scoped data is made once, in pytest's temporary folder, in well under a second;
treat the folders as read-only, since other tests share them: write outputs under ``tmp_path``):

- ``repo_root``: the repository root (also put on ``sys.path`` and ``PYTHONPATH``, so ``fastload``
  and the checkout's top-level ``bench`` and ``tools`` packages import uninstalled, in subprocesses
  too).
- ``tiny_folder``: ImageFolder tree of 40 small (60-200 px) realistic JPEGs over 3 classes.
- ``odd_folder`` / ``odd_files``: 12 small JPEGs over 3 classes plus the odd files of
  ``make_dataset(odd=True)``; ``odd_files`` maps each kind (``"grayscale"``, ``"cmyk"``,
  ``"progressive"``, ``"png"``, ``"truncated"``, ``"empty"``, ``"text"``) to its absolute path.
- ``realistic_folder``: 24 ImageNet-sized (about 400x350 px, ~90 KB) JPEGs over 4 classes.
- ``jpeg_bytes``: the :func:`make_jpeg` factory.

Waiting helpers (tests synchronize on real signals with a deadline, never on a sleep):

- :func:`join_threads`: joins the threads a predicate selects (a producer that must have stopped).
- :func:`watch_ring`: tells when a loader's producer has run as far ahead as its ring lets it.
- :func:`watch_prefetch`: tells when a prefetch queue's consumer waits, or its producer is blocked.
- :func:`wait_for_returns`: blocks on a bare ring's return queue until its slots are back.
- :func:`wait_for_exit`: waits for any process (ours or not) to exit, through a pidfd.
- :func:`wait_until`: the one polling wait, for state that nothing notifies (a file a subprocess
  writes, a process found by its command line); it fails naming what it waited for.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import queue
import select
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
# Subprocess tests (`python -m fastload ...`) must import this checkout too, from any cwd.
if str(REPO_ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)

# `make sanitize` runs the suite from a copy of the checkout with an ASan + UBSan engine: make sure
# that engine is the one imported, or the job would pass while testing the optimized build.
if os.environ.get("FASTLOAD_EXPECT_SANITIZED") == "1":
    _engine = importlib.import_module("fastload._engine")
    if not _engine.info().get("sanitized") or not _engine.__file__.startswith(str(REPO_ROOT)):
        raise RuntimeError(f"FASTLOAD_EXPECT_SANITIZED=1 but the engine imported is {_engine.__file__}, not sanitized")

from tools.make_dataset import ODD_MANIFEST, encode_jpeg, make_dataset, render_image

__all__ = [
    "HAVE_ENGINE",
    "HAVE_MXNET",
    "HAVE_TORCH",
    "REPO_ROOT",
    "QueueWaits",
    "join_threads",
    "load_odd_manifest",
    "make_jpeg",
    "requires_engine",
    "requires_mxnet",
    "requires_torch",
    "wait_for_exit",
    "wait_for_returns",
    "wait_until",
    "watch_prefetch",
    "watch_ring",
]


def _engine_importable() -> bool:
    try:
        importlib.import_module("fastload._engine")
    except ImportError:
        return False
    return True


# find_spec, not import: importing torch or mxnet costs seconds on every collection.
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_MXNET = importlib.util.find_spec("mxnet") is not None
HAVE_ENGINE = _engine_importable()

requires_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
requires_mxnet = pytest.mark.skipif(not HAVE_MXNET, reason="mxnet is not installed")
requires_engine = pytest.mark.skipif(
    not HAVE_ENGINE, reason="the C++ engine fastload._engine is not built (setup.py build_ext --inplace)"
)


def make_jpeg(
    width: int,
    height: int,
    *,
    quality: int = 90,
    subsampling: str = "4:2:0",
    mode: str = "RGB",
    progressive: bool = False,
    seed: int = 0,
) -> bytes:
    """JPEG bytes of a natural-looking image (cut from real photographs) of an exact size.

    Args:
        width: Width in pixels (any value >= 1, odd sizes welcome).
        height: Height in pixels.
        quality: JPEG quality 1-100.
        subsampling: ``"4:2:0"``, ``"4:2:2"`` or ``"4:4:4"`` (ignored for mode L).
        mode: ``"RGB"``, ``"L"`` (grayscale, one component) or ``"CMYK"``.
        progressive: Write a progressive JPEG.
        seed: Which image; the same arguments always give the same bytes.

    Returns:
        The encoded bytes.
    """
    img = render_image(width, height, seed=seed)
    return encode_jpeg(img, quality=quality, subsampling=subsampling, mode=mode, progressive=progressive)


def load_odd_manifest(root: Path) -> dict[str, Path]:
    """Map each odd-file kind in ``root/odd_files.json`` to the file's absolute path."""
    manifest = json.loads((Path(root) / ODD_MANIFEST).read_text())
    return {entry["kind"]: Path(root) / entry["path"] for entry in manifest["files"]}


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (on ``sys.path`` for the whole session)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """ImageFolder tree: 40 small realistic JPEGs in class_000..class_002 (seed 0)."""
    root = tmp_path_factory.mktemp("data") / "tiny"
    make_dataset(root, count=40, seed=0, classes=3, tiny=True, workers=2)
    return root


@pytest.fixture(scope="session")
def odd_folder(tmp_path_factory) -> Path:
    """12 small JPEGs over 3 classes plus every odd file; ``odd_files.json`` sits at the root."""
    root = tmp_path_factory.mktemp("data") / "odd"
    make_dataset(root, count=12, seed=1, classes=3, tiny=True, odd=True, workers=2)
    return root


@pytest.fixture(scope="session")
def odd_files(odd_folder) -> dict[str, Path]:
    """Odd-file kind -> absolute path inside ``odd_folder``."""
    return load_odd_manifest(odd_folder)


@pytest.fixture(scope="session")
def realistic_folder(tmp_path_factory) -> Path:
    """24 ImageNet-sized JPEGs (about 400x350 px) over 4 classes (seed 2)."""
    root = tmp_path_factory.mktemp("data") / "realistic"
    make_dataset(root, count=24, seed=2, classes=4, workers=2)
    return root


@pytest.fixture
def jpeg_bytes():
    """The :func:`make_jpeg` factory: ``jpeg_bytes(width, height, quality=..., mode=...) -> bytes``."""
    return make_jpeg


# --- waiting on real signals, with deadlines --------------------------------------------------------


def join_threads(select_thread: Callable[[threading.Thread], bool], timeout: float = 10.0) -> list[str]:
    """Join every thread ``select_thread`` picks (again while new ones appear) until ``timeout``.

    Returns:
        The names of the selected threads still alive at the deadline (empty: all ended).
    """
    deadline = time.monotonic() + timeout
    while True:
        alive = [t for t in threading.enumerate() if t is not threading.current_thread() and select_thread(t)]
        left = deadline - time.monotonic()
        if not alive or left <= 0:
            return sorted(t.name for t in alive)
        for t in alive:
            t.join(max(0.0, deadline - time.monotonic()))


class QueueWaits:
    """Counts the blocking waits on watched queues: a ``get`` on an empty one, a ``put`` on a full one.

    A wait is counted when the call starts and finds nothing to take (no room to put): the caller
    then blocks until something changes. :meth:`mark` and :meth:`wait` tell a test that such a wait
    began after a point it chose. Kinds: ``"get"`` and ``"put"`` on prefetch queues, ``"ring"`` for
    a producer waiting for a ring slot (:class:`RingWatch`).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._counts = {"get": 0, "put": 0, "ring": 0}

    def note(self, kind: str) -> None:
        with self._cond:
            self._counts[kind] += 1
            self._cond.notify_all()

    def mark(self) -> dict[str, int]:
        with self._cond:
            return dict(self._counts)

    def wait(self, kinds: str | tuple[str, ...], since: dict[str, int], timeout: float, what: str) -> None:
        """Wait for a blocking wait of one of ``kinds`` that began after ``since``; fail naming ``what``."""
        kinds = (kinds,) if isinstance(kinds, str) else kinds
        with self._cond:
            if not self._cond.wait_for(lambda: any(self._counts[k] > since[k] for k in kinds), timeout):
                raise AssertionError(f"no {what} within {timeout} s")

    def watched(self, inner: Any, get_kind: str = "get") -> _WatchedQueue:
        return _WatchedQueue(inner, self, get_kind)


class _WatchedQueue:
    """A queue (``queue.Queue`` or ``SimpleQueue``) whose blocking waits are counted by a :class:`QueueWaits`."""

    def __init__(self, inner: Any, waits: QueueWaits, get_kind: str) -> None:
        self._inner, self._waits, self._get_kind = inner, waits, get_kind

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block and self._inner.empty():
            self._waits.note(self._get_kind)
        return self._inner.get(block, timeout)

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        full = getattr(self._inner, "full", None)
        if block and full is not None and full():
            self._waits.note("put")
        self._inner.put(item, block, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class RingWatch:
    """Tells when the producer filling a ring has run as far ahead as it can.

    The producer blocks on the ring's return queue only when it has no slot to fill (every slot is
    held, queued or fenced, or ``ahead`` batches wait); a slot coming back, a batch taken or
    :meth:`~fastload.batch.BatchRing.wake` is put on that queue. A wait that begins with the queue
    empty therefore means the producer has seen every such event and can do nothing more. A
    consumer that keeps batches gets them in fresh memory, which the ring does not bound: that
    producer stops at its full prefetch queue instead, seen through :func:`watch_prefetch`'s waits.
    """

    def __init__(self, ring: Any, waits: QueueWaits | None = None) -> None:
        self._ring = ring
        self._waits = waits or QueueWaits()
        # The producer reads the attribute on every wait; leases made earlier keep the inner queue.
        ring._returns = self._waits.watched(ring._returns, get_kind="ring")

    def wait_idle(self, timeout: float = 10.0, what: str = "wait of the producer for a free slot") -> None:
        """Return once the producer is blocked (on the ring, or on a full prefetch queue) after this call began."""
        since = self._waits.mark()
        self._ring.wake()  # a producer already waiting looks again, and waits again if it still has no slot
        self._waits.wait(("ring", "put"), since, timeout, what)


def watch_ring(ring: Any, waits: QueueWaits | None = None) -> RingWatch:
    """A :class:`RingWatch` on ``ring`` (a :class:`~fastload.batch.BatchRing`, e.g. ``loader.ring``).

    Pass the :func:`watch_prefetch` waits (made before the producer started) when the consumer keeps
    batches: the producer may then block on its prefetch queue rather than on the ring.
    """
    return RingWatch(ring, waits)


def watch_prefetch(monkeypatch: pytest.MonkeyPatch) -> QueueWaits:
    """Count the blocking waits on the queues of every :class:`~fastload.prefetch.Producer` made from now on.

    ``wait("get", ...)``: a consumer waits for an item; ``wait("put", ...)``: the producer thread is
    blocked on a full queue (the generator is not resumed until the put succeeds).
    """
    import fastload.prefetch as prefetch

    waits = QueueWaits()
    namespace = types.SimpleNamespace(
        Queue=lambda maxsize=0: waits.watched(queue.Queue(maxsize)), Empty=queue.Empty, Full=queue.Full
    )
    monkeypatch.setattr(prefetch, "queue", namespace)
    return waits


def wait_for_returns(ring: Any, done: Callable[[Any], bool], timeout: float = 5.0) -> bool:
    """Block on a ring's return queue until ``done(ring)`` holds (checked under the ring's lock).

    For a ring no producer draws from: each lease's finalizer puts its slot on that queue, so this
    wakes exactly when a slot comes back, on whatever thread the lease died.
    """
    deadline = time.monotonic() + timeout
    while True:
        with ring._lock:
            ring._drain_locked()
            if done(ring):
                return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            item = ring._returns.get(timeout=left)
        except queue.Empty:
            continue
        with ring._lock:
            ring._apply_return_locked(item)


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` (a child or not) exits within ``timeout`` s: its pidfd becomes readable.

    A child is not reaped: ``os.waitpid`` it afterwards.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
        return bool(ready)
    finally:
        os.close(fd)


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    what: str,
    every: float = 0.005,
    stop: threading.Event | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something true; fail naming ``what`` at the deadline.

    Only for state that nothing notifies: a file a subprocess writes, a process found by its command
    line. Everything else has a real signal (an event, a join, a queue, a pidfd): wait on that.

    Args:
        predicate: Checked at once, then every ``every`` seconds.
        timeout: Seconds before the wait fails with an AssertionError.
        what: What the wait is for, in the failure message.
        every: Seconds between checks.
        stop: Ends the wait early (returning None) when set.
    """
    pause = stop or threading.Event()
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if stop is not None and stop.is_set():
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        pause.wait(min(every, left))
