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


# --- ImageRecordIter's round_batch across reset() -------------------------------------------------


def _rec(root, n: int) -> tuple[str, str]:
    """An MXNet-written ``.rec`` / ``.idx`` of ``n`` 8x8 JPEGs; record ``i`` has label and id ``i``."""
    import io

    from PIL import Image

    rec, idx = str(root / f"r{n}.rec"), str(root / f"r{n}.idx")
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (8, 8, 3)).astype(np.uint8)).save(buf, "JPEG")
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i), i, 0), buf.getvalue()))
    writer.close()
    return rec, idx


def _epochs(it, epochs: int) -> list[list[tuple[list[int], int]]]:
    out = []
    for _ in range(epochs):
        out.append(_labels(it))
        it.reset()
    return out


def _implied_pads(epochs, share: int) -> list[list[int]]:
    """The pads the labels imply: rows of an epoch's last batch that belong to the next epoch's order."""
    pads, start = [], 0
    for batches in epochs:
        rows = sum(len(b) for b, _ in batches)
        pad = rows - (share - start)
        assert 0 <= pad < len(batches[0][0]), "an epoch covers what was left of the order, then pads"
        pads.append([0] * (len(batches) - 1) + [pad])
        start = pad
    return pads


@pytest.mark.parametrize(("n", "batch", "parts"), [(72, 16, 1), (72, 16, 2), (72, 10, 2), (50, 7, 1)])
def test_round_batch_carries_into_the_next_epoch_as_mxnet(tmp_path, n, batch, parts):
    rec, idx = _rec(tmp_path, n)
    common = dict(path_imgrec=rec, path_imgidx=idx, data_shape=(3, 8, 8), batch_size=batch, preprocess_threads=1)
    for part in range(parts):
        theirs = mx.io.ImageRecordIter(num_parts=parts, part_index=part, **common)
        expected = _epochs(theirs, 4)  # three resets
        mine = fm.ImageRecordIter(num_parts=parts, part_index=part, **common)
        got = _epochs(mine, 4)
        mine.close()
        # Batch counts and labels as MXNet's, epoch by epoch (72 / 16: 5, 4, 5, 4 batches).
        assert [[b for b, _ in e] for e in got] == [[b for b, _ in e] for e in expected]
        # pad: what the labels imply (MXNet's own field after reset() lands on a random batch).
        assert [[p for _, p in e] for e in got] == _implied_pads(expected, n // parts)
    if (n, batch, parts) == (72, 16, 1):
        assert [len(e) for e in got] == [5, 4, 5, 4]
        assert [e[-1][1] for e in got] == [8, 0, 8, 0]


def test_round_batch_with_shuffle_serves_borrowed_records_once_per_order(tmp_path):
    rec, idx = _rec(tmp_path, 72)
    common = dict(path_imgrec=rec, path_imgidx=idx, data_shape=(3, 8, 8), batch_size=16, preprocess_threads=1)
    theirs = _epochs(mx.io.ImageRecordIter(shuffle=True, seed=3, **common), 4)
    mine_it = fm.ImageRecordIter(shuffle=True, seed=3, **common)
    mine = _epochs(mine_it, 4)
    mine_it.close()
    assert [len(e) for e in mine] == [len(e) for e in theirs] == [5, 4, 5, 4]
    for epochs in (theirs, mine):
        # The padding of epochs 0 and 2 and the next epochs' batches are each one whole order.
        for first in (0, 2):
            rows = [i for b, _ in epochs[first] for i in b]
            borrowed, rest = rows[72:], [i for b, _ in epochs[first + 1] for i in b]
            assert sorted(rows[:72]) == list(range(72)) and sorted(borrowed + rest) == list(range(72))


@pytest.mark.parametrize("stop", [2, 4, 5], ids=["mid-epoch", "before-last", "after-last"])
def test_round_batch_position_is_in_the_state(tmp_path, stop):
    rec, idx = _rec(tmp_path, 72)
    common = dict(
        path_imgrec=rec, path_imgidx=idx, data_shape=(3, 8, 8), batch_size=16, preprocess_threads=1, shuffle=True
    )
    whole = fm.ImageRecordIter(**common)
    expected = _epochs(whole, 4)
    whole.close()
    it = fm.ImageRecordIter(**common)
    got = _epochs(it, 2)  # epoch 2 starts after the 8 records the padding of epoch 1 borrowed
    got.append(_labels(it, stop))
    state = roundtrip(it.state_dict())
    it.close()
    again = fm.ImageRecordIter(**common)
    again.load_state_dict(state)
    if stop == 5:  # the pass had ended: the state is at the next epoch, after what its padding borrowed
        again.reset()
        got.append([])
    got[-1] += _labels(again)
    again.reset()
    if stop < 5:
        got.append(_labels(again))
    assert got == expected[: len(got)]
    again.close()


def test_image_record_iter_restores_under_another_part_count(tmp_path):
    rec, idx = _rec(tmp_path, 72)
    common = dict(path_imgrec=rec, path_imgidx=idx, data_shape=(3, 8, 8), batch_size=4, preprocess_threads=1)
    parts = [fm.ImageRecordIter(num_parts=3, part_index=p, shuffle=True, seed=1, **common) for p in range(3)]
    seen = []
    for p in parts:
        seen += [i for b, _ in _labels(p, 2) for i in b]
    state = parts[0].state_dict()
    for p in parts:
        p.close()
    counts = []
    for p in range(2):
        it = fm.ImageRecordIter(num_parts=2, part_index=p, shuffle=True, seed=1, **common)
        it.load_state_dict(state)
        batches = _labels(it)
        counts.append(len(batches))
        real = [b[: len(b) - pad] for b, pad in batches]
        seen += [i for b in real for i in b]
        it.close()
    assert counts[0] == counts[1]
    assert sorted(seen) == list(range(72))
