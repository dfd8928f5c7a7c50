"""The helper process that runs storage calls for a process forked after the storage client started
(obstore is not fork-safe): results, exceptions with their type, attributes and the helper's
traceback, a helper that dies, and a forked child that gets a helper of its own."""

from __future__ import annotations

import os
import signal

import pytest
from forked import run_in_fork

from fastload.records.remote import spawned
from fastload.records.remote.storage import RemoteError, RemoteNotFound, RemoteStore


def test_a_call_runs_in_another_process_and_returns_its_result():
    pid = spawned.call(os.getpid)
    assert isinstance(pid, int) and pid != os.getpid()
    assert spawned.call(os.getpid) == pid  # one helper, reused
    assert spawned.call(divmod, 17, 5) == (3, 2)


def test_exceptions_come_back_with_type_attributes_and_the_helpers_traceback():
    pytest.importorskip("obstore")
    # The helper's own (empty) in-memory store: the object is missing there.
    with pytest.raises(RemoteNotFound) as info:
        spawned.call(RemoteStore.head, RemoteStore("memory:///data"), "missing")
    assert isinstance(info.value, RemoteError)
    assert info.value.url == "memory:///data/missing"
    assert str(info.value) == "memory:///data/missing: HEAD: not found"
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised in the storage helper process" in notes and "def head" not in notes and "storage.py" in notes
    with pytest.raises(KeyError, match="absent"):
        spawned.call(dict.__getitem__, {}, "absent")


def test_a_call_that_does_not_unpickle_in_the_helper_is_an_error_not_a_hang():
    with pytest.raises(ModuleNotFoundError, match="test_remote_spawned"):
        spawned.call(test_a_call_runs_in_another_process_and_returns_its_result)
    assert isinstance(spawned.call(os.getpid), int)  # the helper still answers


def test_a_helper_that_dies_is_reported_and_replaced():
    first = spawned.call(os.getpid)
    with pytest.raises(spawned.HelperLost, match="exited with 3"):
        spawned.call(os._exit, 3)
    second = spawned.call(os.getpid)
    assert second != first
    os.kill(second, signal.SIGKILL)
    try:
        third = spawned.call(os.getpid)
    except spawned.HelperLost as exc:  # the usual case: the call found the helper dead
        assert "exited with -9" in str(exc)
        third = spawned.call(os.getpid)
    assert third not in (first, second)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_helper():
    parent_helper = spawned.call(os.getpid)
    child_pid, child_helper = run_in_fork(lambda: (os.getpid(), spawned.call(os.getpid)))
    assert child_helper not in (parent_helper, child_pid)
    assert spawned.call(os.getpid) == parent_helper  # the parent's helper is untouched
