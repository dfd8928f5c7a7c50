"""Read stage, remote: storage calls from a forked process, run by a spawned helper process.

obstore runs its requests on a Tokio runtime whose threads live only in the process that started
it. A process forked after that (a torch ``DataLoader`` worker: fork is the default on Linux) has
the runtime's state without its threads, and its first request waits forever, even on a store built
after the fork (obstore is not fork-safe, as its maintainers say). Such a process hands each storage
call to a helper instead: a fresh interpreter (``python -c`` loading this same fastload package),
started on the first call, that runs the call with its own client and sends back the result, or
the exception with the helper's traceback attached as a note. A shard download runs whole in the
helper, which writes the cache file itself (:func:`fastload.records.remote.fetch.fetch_to_file`): the
bytes never cross the socket.

One helper per process, one call at a time. The helper exits when the process that started it
closes its end of the socket (on exit, kill -9 included), and a helper that died is replaced at
the next call.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from fastload.errors import FastloadError

__all__ = ["HelperLost", "call"]


class HelperLost(FastloadError):
    """The helper process died (or could not start) before answering."""


# The helper's first lines: load the fastload package found at argv[1], then serve the socket argv[2].
_BOOT = """
import importlib.util, os, sys
package = sys.argv[1]
spec = importlib.util.spec_from_file_location(
    "fastload", os.path.join(package, "__init__.py"), submodule_search_locations=[package])
module = importlib.util.module_from_spec(spec)
sys.modules["fastload"] = module
spec.loader.exec_module(module)
from fastload.records.remote.spawned import _serve
_serve(int(sys.argv[2]))
"""


class _Helper:
    """One spawned helper process and this process's end of the socket to it."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        # The helper imports this very fastload package (not another one on its path) without
        # putting its folder ahead of the standard library: up from this file, one folder per dot
        # of this module's name.
        package = os.path.abspath(__file__)
        for _ in range(__name__.count(".")):
            package = os.path.dirname(package)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, package, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            ours.close()
            raise HelperLost(f"cannot start the storage helper process ({exc})") from None
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())

    def call(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        try:
            self.conn.send((fn, args, kwargs))
            reply = self.conn.recv()
        except (EOFError, OSError) as exc:
            try:  # the socket closes a moment before the exit status is there
                code = self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
            raise HelperLost(
                f"the storage helper process (pid {self.proc.pid}) "
                + (f"exited with {code}" if code is not None else f"stopped answering ({exc})")
                + f" while running {getattr(fn, '__qualname__', fn)}"
            ) from None
        if reply[0] == "ok":
            return reply[1]
        _, cls, exc_args, state, helper_traceback = reply
        # Rebuilt without calling __init__: fastload's errors take keyword-only arguments (url=).
        error = cls.__new__(cls)
        error.args = exc_args
        error.__dict__.update(state)
        error.add_note(f"raised in the storage helper process (pid {self.proc.pid}):\n{helper_traceback}")
        raise error

    def forget(self) -> None:
        """In a forked child: drop the copy of the parent's socket without touching the helper."""
        with contextlib.suppress(OSError):
            self.conn.close()


_guard = threading.Lock()
_helper: _Helper | None = None


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` in this process's helper and return its result.

    ``fn`` and the arguments must pickle (functions by reference); an exception ``fn`` raises is
    raised here, same type and attributes, with the helper's traceback as a note.

    Raises:
        HelperLost: The helper died or could not be started (the next call starts a new one).
    """
    global _helper
    with _guard:
        if _helper is None or _helper.proc.poll() is not None:
            if _helper is not None:
                _helper.forget()
            _helper = _Helper()
        helper = _helper
        try:
            return helper.call(fn, args, kwargs)
        except HelperLost:
            helper.forget()
            _helper = None
            raise


def _after_fork_in_child() -> None:
    global _guard, _helper
    # The parent's helper answers the parent: a forked child starts its own when it needs one.
    if _helper is not None:
        _helper.forget()
    _guard, _helper = threading.Lock(), None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _serve(fd: int) -> None:
    """The helper's loop: run each call received on ``fd`` and send back its outcome."""
    conn = Connection(fd)
    while True:
        try:
            fn, args, kwargs = conn.recv()
        except EOFError:  # the process that started this helper is gone
            return
        except Exception as exc:  # a call that does not unpickle here
            reply: tuple = ("error", type(exc), exc.args, {}, traceback.format_exc())
        else:
            try:
                reply = ("ok", fn(*args, **kwargs))
            except Exception as exc:
                reply = ("error", type(exc), exc.args, dict(vars(exc)), traceback.format_exc())
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(("error", RuntimeError, (f"unpicklable outcome of a storage call: {exc}",), {}, ""))
        except (BrokenPipeError, ConnectionResetError):
            return
