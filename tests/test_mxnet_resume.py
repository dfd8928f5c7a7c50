"""Device stage (MXNet), resumed: what rolls over from one epoch into the next is part of the state.

``NDArrayIter(last_batch_handle='roll_over')`` against ``mx.io.NDArrayIter`` across resets, and its
state: saved anywhere (mid-epoch, at an epoch's end with rows rolled over), restored in a new
iterator (of another part too), it goes on exactly; another part count is refused.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("MXNET_STORAGE_FALLBACK_LOG_VERBOSE", "0")
mx = pytest.importorskip("mxnet")

from resume_matrix import roundtrip

import fastload.mxnet as fm
from fastload.errors import ResumeStateError


def _labels(it, limit=None):
    out = []
    for b in it:
        out.append((b.label[0].asnumpy().astype(np.int64).tolist(), b.pad))
        if limit is not None and len(out) == limit:
            break
    return out


def _rows(n):
    return np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n, dtype=np.float32)


def test_roll_over_matches_mxnet_across_resets():
    x, y = _rows(22)
    theirs = mx.io.NDArrayIter(x, y, batch_size=5, last_batch_handle="roll_over")
    mine = fm.NDArrayIter(x, y, batch_size=5, last_batch_handle="roll_over")
    for epoch in range(4):
        assert _labels(mine) == _labels(theirs), f"epoch {epoch}"
        theirs.reset()
        mine.reset()
    mine.close()


@pytest.mark.parametrize("stop", [0, 2, 4, 5], ids=["epoch-start", "mid-epoch", "last-batch", "after-end"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_state_carries_the_rolled_over_rows(stop, shuffle):
    x, y = _rows(23)
    common = dict(batch_size=5, last_batch_handle="roll_over", shuffle=shuffle, seed=3)
    whole = fm.NDArrayIter(x, y, **common)
    expected = []
    for _ in range(4):
        expected.append(_labels(whole))
        whole.reset()
    whole.close()
    it = fm.NDArrayIter(x, y, **common)
    got = []
    for _ in range(2):  # the second epoch starts with rows rolled over from the first
        got.append(_labels(it))
        it.reset()
    got.append(_labels(it, stop) if stop < 5 else _labels(it))
    state = roundtrip(it.state_dict())
    it.close()
    again = fm.NDArrayIter(x, y, **{**common, "seed": 99})  # the state's seed is the one used
    again.load_state_dict(state)
    got[-1] += _labels(again)
    again.reset()
    got.append(_labels(again))
    assert got == expected
    again.close()


def test_any_parts_state_resumes_every_part_at_that_part_count():
    x, y = _rows(41)
    common = dict(batch_size=4, last_batch_handle="roll_over", shuffle=True, seed=1, num_parts=2)
    parts = [fm.NDArrayIter(x, y, part_index=p, **common) for p in range(2)]
    expected = []
    for p in parts:
        runs = []
        for _ in range(3):
            runs.append(_labels(p))
            p.reset()
        expected.append(runs)
        p.close()
    saver = fm.NDArrayIter(x, y, part_index=0, **common)
    _labels(saver)
    saver.reset()
    _labels(saver, 2)
    state = saver.state_dict()
    saver.close()
    assert state["carry"] > 0  # rows rolled over into this epoch, stored as a count
    other = fm.NDArrayIter(x, y, part_index=1, **common)
    other.load_state_dict(state)
    rest = _labels(other)
    other.reset()
    assert rest == expected[1][1][2:] and _labels(other) == expected[1][2]
    other.close()


def test_another_part_count_or_damage_is_refused_by_name():
    x, y = _rows(30)
    it = fm.NDArrayIter(x, y, batch_size=4, num_parts=2, part_index=0)
    it.next()
    state = it.state_dict()
    it.close()
    three = fm.NDArrayIter(x, y, batch_size=4, num_parts=3, part_index=0)
    with pytest.raises(ResumeStateError, match="num_parts=2.*num_parts=3.*same part count only.*ImageRecordIter"):
        three.load_state_dict(state)
    three.close()
    other = fm.NDArrayIter(x[:, :1], y, batch_size=4, num_parts=2, part_index=0)
    with pytest.raises(ResumeStateError, match="dataset: saved"):
        other.load_state_dict(state)
    damaged = dict(state, batch=3)
    with pytest.raises(ResumeStateError, match="damaged"):
        other.load_state_dict(damaged)
    other.close()
