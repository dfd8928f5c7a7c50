"""Benchmarks, peer side: the line protocol a peer process speaks to the benchmark harness.

Peers whose dependencies conflict with fastload's environment (DALI wants numpy 2, MXNet 1.9.1
wants numpy < 1.24) run in their own interpreter. Such a process stays alive for the whole
benchmark so the harness can interleave it with other contenders (A B A B ...) without paying its
start-up on every repeat. This module is standard-library only: it is imported both as part of
``bench`` and as a plain script beside a peer file inside another virtual environment.

Requests, one JSON object per line on stdin::

    {"op": "start", "id": "dali-train", "kind": "train", "spec": {...}}
    {"op": "run", "id": "dali-train"}
    {"op": "close", "id": "dali-train"}
    {"op": "exit"}

Replies, one JSON object per line on the protocol stream: ``{"ok": true, ...}`` or
``{"ok": false, "skip": "reason"}`` (the peer cannot run here) or ``{"ok": false, "error": "...",
"traceback": "..."}``. A ``run`` reply carries ``images``, ``bytes`` and ``seconds`` measured inside
the peer, so start-up and the pipe never count.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable

__all__ = ["PeerSkip", "serve"]


class PeerSkip(Exception):
    """Raised by a peer factory when the peer cannot run on this machine; the message is the reason."""


def _protocol_stream():
    # Libraries print to stdout (DALI, MXNet's C++ logging goes to stderr but some Python code
    # prints): keep a private copy of the real stdout for replies and point fd 1 at stderr.
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(proto_fd, "w", buffering=1)


def serve(factories: dict[str, Callable[[dict], object]]) -> int:
    """Answer harness requests until ``exit`` or end of input.

    Args:
        factories: ``kind -> factory(spec)``; a factory returns a runner with ``run() -> dict``
            (keys ``images``, ``bytes``, ``seconds``, optional ``extra``) and ``close()``.

    Returns:
        The process exit code.
    """
    out = _protocol_stream()
    runners: dict[str, object] = {}

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "exit":
                reply({"ok": True})
                break
            if op == "start":
                kind = req["kind"]
                if kind not in factories:
                    reply({"ok": False, "error": f"unknown peer kind {kind!r}; known: {sorted(factories)}"})
                    continue
                runners[req["id"]] = factories[kind](req.get("spec") or {})
                reply({"ok": True, "info": getattr(runners[req["id"]], "info", {})})
            elif op == "run":
                result = runners[req["id"]].run()
                reply({"ok": True, **result})
            elif op == "close":
                runner = runners.pop(req["id"], None)
                if runner is not None:
                    runner.close()
                reply({"ok": True})
            else:
                reply({"ok": False, "error": f"unknown op {op!r}"})
        except PeerSkip as exc:
            reply({"ok": False, "skip": str(exc)})
        except Exception as exc:  # every failure goes back to the harness, which decides
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    for runner in runners.values():
        with contextlib.suppress(Exception):
            runner.close()
    return 0
