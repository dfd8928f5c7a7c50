"""The read-ahead's mappings: used again only once every view of them has died, kept up to a cap."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fastload.records.read_buffers import ReadBuffers


def test_a_mapping_is_used_again_once_its_views_have_died():
    bufs = ReadBuffers(cap=8 << 20)
    first = bufs.take(300_000)
    mapping = first.obj
    del first
    again = bufs.take(300_000)
    assert again.obj is mapping
    assert (bufs.mapped, bufs.reused) == (1, 1)
    assert len(again) == 300_000 and not again.readonly


def test_a_mapping_with_a_live_view_is_never_handed_out_again():
    bufs = ReadBuffers(cap=64 << 20)
    view = bufs.take(200_000)
    view[:] = b"\x5a" * len(view)
    kept = memoryview(view)[1000:2000]  # a record's slice, as the read-ahead hands out
    kept_array = np.frombuffer(view[5000:6000], dtype=np.uint8)  # and an array over another
    held = kept.obj
    del view
    for _ in range(50):
        other = bufs.take(200_000)
        assert other.obj is not held
        other[:] = b"\x00" * len(other)
        del other
    assert bytes(kept) == b"\x5a" * 1000
    assert kept_array.tobytes() == b"\x5a" * 1000
    del kept, kept_array
    assert bufs.take(200_000).obj is held  # free once the slice and the array are gone


def test_free_mappings_are_kept_up_to_the_cap_and_cleared():
    bufs = ReadBuffers(cap=1 << 20)
    views = [bufs.take(256 << 10) for _ in range(8)]
    del views
    bufs.take(100 << 10)  # looks at the oldest lent mappings: at most the cap is kept free
    assert 0 < bufs.spare_bytes <= 1 << 20
    bufs.clear()
    assert bufs.spare_bytes == 0


def test_a_small_read_does_not_take_a_much_larger_mapping():
    bufs = ReadBuffers(cap=64 << 20)
    big = bufs.take(8 << 20)
    del big
    small = bufs.take(100 << 10)
    assert len(small.obj) < 1 << 20
    bigger = bufs.take(8 << 20)
    assert len(bigger.obj) >= 8 << 20 and bufs.reused == 1


def test_a_lower_cap_given_with_a_request_applies():
    bufs = ReadBuffers(cap=64 << 20)
    views = [bufs.take(512 << 10) for _ in range(4)]
    del views
    bufs.take(64 << 10, cap=0)
    assert bufs.spare_bytes == 0


@pytest.mark.parametrize("threads", [4])
def test_concurrent_readers_never_share_a_mapping_in_use(threads):
    bufs = ReadBuffers(cap=4 << 20)
    errors: list[str] = []
    start = threading.Barrier(threads)

    def reader(k: int) -> None:
        start.wait()
        pattern = bytes([k + 1])
        for j in range(300):
            n = (64 + 37 * ((j * 7 + k) % 11)) << 10
            view = bufs.take(n)
            view[:] = pattern * n
            keep = memoryview(view)[: n // 2]
            del view
            if bytes(keep[::4096]) != pattern * len(keep[::4096]):
                errors.append(f"reader {k}: a mapping in use was handed to another reader")
                return
            del keep

    workers = [threading.Thread(target=reader, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers)
    assert not errors
    assert bufs.reused > 0
