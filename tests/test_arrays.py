"""fastload pack-arrays (writer) and fastload.records.arrays (reader), streamed by fastload.mxnet.NDArrayIter."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest

sp = pytest.importorskip("scipy.sparse")

from fastload.cli.pack_arrays import add_parser  # noqa: E402
from fastload.cli.sizes import parse_size  # noqa: E402
from fastload.errors import UserError  # noqa: E402
from fastload.pack.arrays import ArraysPackConfig, pack_arrays  # noqa: E402
from fastload.records.arrays import ARRAYS_MANIFEST, open_arrays  # noqa: E402


@pytest.fixture()
def inputs(tmp_path):
    x = sp.random(97, 300, density=0.05, format="csr", dtype=np.float32, random_state=0)
    dense = np.random.default_rng(0).random((97, 3, 2)).astype(np.float32)
    y = np.arange(97, dtype=np.float32)
    sp.save_npz(tmp_path / "x.npz", x)
    np.save(tmp_path / "dense.npy", dense)
    np.save(tmp_path / "y.npy", y)
    return tmp_path, x, dense, y


def _cli(argv):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_pack_and_read_back_every_row(inputs):
    tmp, x, dense, y = inputs
    out = tmp / "packed"
    assert _cli(["pack-arrays", str(out), "--data", f"x={tmp / 'x.npz'}", "--data", f"dense={tmp / 'dense.npy'}",
                 "--label", str(tmp / "y.npy"), "--shard-size", "3KB", "--quiet"]) == 0
    manifest = json.loads((out / ARRAYS_MANIFEST).read_text())
    assert len(manifest["row_starts"]) - 1 > 3  # really sharded
    with open_arrays(str(out)) as arrays:
        assert sorted(arrays.data_names) == ["dense", "x"] and arrays.label_names == ["softmax_label"]
        rows = np.array([96, 0, 50, 50, 13], dtype=np.int64)
        d = arrays.array("dense")
        got = np.empty((5, 3, 2), np.float32)
        np.testing.assert_array_equal(d.take_into(rows, got), dense[rows])
        c = arrays.array("x")
        assert c.stype == "csr" and c.shape == (97, 300)
        from fastload.mxnet.array_iter import csr_take_rows

        vals, idx, ptr = csr_take_rows(c.indptr, c.indices, c.data, rows)
        np.testing.assert_array_equal(sp.csr_matrix((vals, idx, ptr), shape=(5, 300)).toarray(), x[rows].toarray())


def test_refuses_overwrite_and_bad_inputs(inputs):
    tmp, *_ = inputs
    out = tmp / "packed"
    cfg = ArraysPackConfig(data={"x": str(tmp / "x.npz")}, out=str(out))
    pack_arrays(cfg)
    with pytest.raises(UserError, match="--overwrite"):
        pack_arrays(cfg)
    pack_arrays(ArraysPackConfig(data={"x": str(tmp / "x.npz")}, out=str(out), overwrite=True))
    np.save(tmp / "short.npy", np.zeros(5))
    with pytest.raises(UserError, match="different row counts"):
        pack_arrays(ArraysPackConfig(data={"x": str(tmp / "x.npz"), "s": str(tmp / "short.npy")}, out=str(tmp / "o2")))
    (tmp / "a.txt").write_text("1 2 3")
    with pytest.raises(UserError, match=".npy"):
        pack_arrays(ArraysPackConfig(data={"a": str(tmp / "a.txt")}, out=str(tmp / "o3")))
    sp.save_npz(tmp / "coo.npz", sp.random(4, 4, density=0.5, format="coo"))
    with pytest.raises(UserError, match="coo"):
        pack_arrays(ArraysPackConfig(data={"c": str(tmp / "coo.npz")}, out=str(tmp / "o4")))
    other = tmp / "not-arrays"
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    with pytest.raises(UserError, match="refusing"):
        pack_arrays(ArraysPackConfig(data={"x": str(tmp / "x.npz")}, out=str(other), overwrite=True))
    assert (other / "keep.txt").exists()
    assert parse_size("2KB") == 2048 and parse_size("1.5MB") == 1572864
    with pytest.raises(ValueError, match="unique"):
        ArraysPackConfig(data={"x": "a.npy"}, labels={"x": "b.npy"}, out="o")


def test_damaged_shard_names_the_file(inputs):
    tmp, *_ = inputs
    out = tmp / "packed"
    pack_arrays(ArraysPackConfig(data={"dense": str(tmp / "dense.npy")}, out=str(out), shard_bytes=1024))
    victim = sorted(p for p in os.listdir(out) if p.endswith(".npy"))[1]
    np.save(out / victim, np.zeros((1, 3, 2), np.float32))
    with pytest.raises(Exception, match=victim):
        open_arrays(str(out))
    os.unlink(out / victim)
    with pytest.raises(UserError, match="missing"):
        open_arrays(str(out))


def test_ndarrayiter_streams_shards_with_order_parts_and_resume(inputs):
    mx = pytest.importorskip("mxnet")
    import fastload.mxnet as fm

    tmp, x, dense, y = inputs
    out = tmp / "packed"
    pack_arrays(ArraysPackConfig(data={"x": str(tmp / "x.npz"), "dense": str(tmp / "dense.npy")},
                                 labels={"softmax_label": str(tmp / "y.npy")}, out=str(out), shard_bytes=2048))
    seen, counts = [], []
    for part in range(2):
        it = fm.NDArrayIter(str(out), batch_size=8, shuffle=True, seed=4, part_index=part, num_parts=2)
        assert [d.name for d in it.provide_data] == ["dense", "x"]
        n = 0
        for b in it:
            rows = b.label[0].asnumpy().astype(np.int64)  # labels are the row numbers
            assert b.data[1].stype == "csr" and b.data[1].context == mx.cpu_pinned()
            np.testing.assert_array_equal(b.data[1].asnumpy(), x[rows].toarray())
            np.testing.assert_array_equal(b.data[0].asnumpy(), dense[rows])
            seen.extend(rows[: 8 - b.pad].tolist())
            n += 1
        counts.append(n)
        it.close()
    assert counts[0] == counts[1] and set(seen) == set(range(97))
    # Resume mid-epoch from a state_dict: same remaining batches as an uninterrupted run.
    a = fm.NDArrayIter(str(out), batch_size=8, shuffle=True, seed=4)
    expected = [b.label[0].asnumpy().copy() for b in a]
    b_it = fm.NDArrayIter(str(out), batch_size=8, shuffle=True, seed=4)
    got = [b_it.next().label[0].asnumpy().copy() for _ in range(3)]
    state = b_it.state_dict()
    b_it.close()
    c_it = fm.NDArrayIter(str(out), batch_size=8, shuffle=True, seed=0)
    c_it.load_state_dict(state)
    got += [b.label[0].asnumpy().copy() for b in c_it]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_fastload_cli_registers_pack_arrays(inputs, capsys):
    from fastload.cli import main

    tmp, *_ = inputs
    assert main(["pack-arrays", str(tmp / "cli-out"), "--data", str(tmp / "x.npz"), "--quiet"]) == 0
    assert "packed 97 rows of 1 arrays" in capsys.readouterr().out
    assert main(["pack-arrays", str(tmp / "cli-out"), "--data", str(tmp / "x.npz"), "--quiet"]) == 2
    assert "--overwrite" in capsys.readouterr().err
