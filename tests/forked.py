"""Test helper: run a function in a forked child of the test process and get its result back."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from typing import Any


def run_in_fork(fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a forked child; its JSON-able result, or AssertionError with the child's error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            try:
                out = {"result": fn()}
            except BaseException:
                out = {"error": traceback.format_exc()}
            os.write(w, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, f"the forked child failed ({status})"
    out = json.loads(data)
    assert "error" not in out, "in the forked child:\n" + out.get("error", "")
    return out["result"]
