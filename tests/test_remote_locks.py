"""The shard cache's object locks: exclusive across processes (``flock``) and across the threads of
one process, where a waiting thread wakes as soon as the holder releases instead of polling, and a
forked child never inherits a lock that a parent thread held."""

from __future__ import annotations

import os
import select
import threading

import pytest

import fastload.records.remote.cache as cache_module
from fastload.records.remote.cache import object_lock


def test_a_thread_waiting_for_a_thread_of_its_own_process_wakes_without_polling(tmp_path, monkeypatch):
    holder = object_lock(str(tmp_path), "images-00000.rec")
    assert holder.acquire(1.0)
    polls = []
    real_sleep = cache_module.time.sleep
    monkeypatch.setattr(cache_module.time, "sleep", lambda s: (polls.append(s), real_sleep(s)))
    waiting_calls = []
    waiting = threading.Event()
    result = {}

    def waits():
        waiting_calls.append(1)
        waiting.set()

    def take():
        lock = object_lock(str(tmp_path), "images-00000.rec")
        result["got"] = lock.acquire(30.0, waiting=waits)
        lock.release()

    t = threading.Thread(target=take)
    t.start()
    assert waiting.wait(10), "the second thread neither took the lock nor waited for it"
    assert t.is_alive()  # the second thread waits: the lock is exclusive between threads too
    holder.release()
    t.join(10)
    assert not t.is_alive() and result["got"] is True
    assert waiting_calls  # the stall guard still runs while it waits
    assert polls == []  # it waited on the in-process lock, never on the flock's poll


def test_other_objects_do_not_wait(tmp_path):
    a = object_lock(str(tmp_path), "images-00000.rec")
    b = object_lock(str(tmp_path), "images-00001.rec")
    assert a.acquire(1.0)
    assert b.acquire(0.2)
    a.release()
    b.release()
    b.release()  # idempotent


def test_timeout_on_a_held_lock_returns_false_and_leaves_it_usable(tmp_path):
    holder = object_lock(str(tmp_path), "k")
    assert holder.acquire(1.0)
    other = object_lock(str(tmp_path), "k")
    assert other.acquire(0.1) is False
    holder.release()
    assert other.acquire(1.0) is True
    other.release()


def test_a_waiting_callback_that_raises_leaves_the_lock_free(tmp_path):
    holder = object_lock(str(tmp_path), "k")
    assert holder.acquire(1.0)
    other = object_lock(str(tmp_path), "k")

    def stalled():
        raise RuntimeError("stalled")

    with pytest.raises(RuntimeError, match="stalled"):
        other.acquire(None, waiting=stalled)
    holder.release()
    assert object_lock(str(tmp_path), "k").acquire(1.0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_inherit_a_lock_held_by_a_parent_thread(tmp_path):
    holder = object_lock(str(tmp_path), "images-00000.rec")
    taken, release = threading.Event(), threading.Event()

    def hold():
        holder.acquire(5.0)
        taken.set()
        release.wait(30)
        holder.release()

    t = threading.Thread(target=hold)
    t.start()
    assert taken.wait(10)
    go_r, go_w = os.pipe()
    seen_r, seen_w = os.pipe()  # the child tells the parent it found the lock held
    pid = os.fork()
    if pid == 0:  # child: the parent's thread holds the flock, then releases it
        code = 1
        try:
            os.close(go_w)
            os.close(seen_r)
            lock = object_lock(str(tmp_path), "images-00000.rec")
            if lock.acquire(0.2) is False:  # held by the parent process
                os.write(seen_w, b"x")
                os.read(go_r, 1)
                if lock.acquire(10.0):  # free now: not blocked by the parent thread's in-process lock
                    lock.release()
                    code = 0
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(seen_w)
    try:
        # The child has tried the lock while this process held it (or ended: the pipe is then at
        # EOF, and its exit status tells why).
        select.select([seen_r], [], [], 30)
        release.set()
        t.join(10)
        os.write(go_w, b"x")
    finally:
        release.set()
        os.close(go_w)
        os.close(seen_r)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
