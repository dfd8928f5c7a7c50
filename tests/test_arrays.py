"""fastload pack-arrays (writer) and fastload.records.arrays (reader), streamed by fastload.mxnet.NDArrayIter."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest

sp = pytest.importorskip("scipy.sparse")

from fastload.cli.pack_arrays import add_parser
from fastload.cli.sizes import parse_size
from fastload.errors import UserError
from fastload.pack.arrays import ArraysPackConfig, pack_arrays
from fastload.records.arrays import ARRAYS_MANIFEST, open_arrays


@pytest.fixture
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
    tmp, x, dense, _y = inputs
    out = tmp / "packed"
    assert (
        _cli(
            [
                "pack-arrays",
                str(out),
                "--data",
                f"x={tmp / 'x.npz'}",
                "--data",
                f"dense={tmp / 'dense.npy'}",
                "--label",
                str(tmp / "y.npy"),
                "--shard-size",
                "3KB",
                "--quiet",
            ]
        )
        == 0
    )
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
        from fastload.mxnet.array_sources import csr_take_rows

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

    tmp, x, dense, _y = inputs
    out = tmp / "packed"
    pack_arrays(
        ArraysPackConfig(
            data={"x": str(tmp / "x.npz"), "dense": str(tmp / "dense.npy")},
            labels={"softmax_label": str(tmp / "y.npy")},
            out=str(out),
            shard_bytes=2048,
        )
    )
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
    for g, e in zip(got, expected, strict=False):
        np.testing.assert_array_equal(g, e)


def test_fastload_cli_registers_pack_arrays(inputs, capsys):
    from fastload.cli import main

    tmp, *_ = inputs
    assert main(["pack-arrays", str(tmp / "cli-out"), "--data", str(tmp / "x.npz"), "--quiet"]) == 0
    assert "packed 97 rows of 1 arrays" in capsys.readouterr().out
    assert main(["pack-arrays", str(tmp / "cli-out"), "--data", str(tmp / "x.npz"), "--quiet"]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize("engine", [True, False], ids=["engine gather", "python gather"])
def test_every_gather_path_reads_the_same_rows(inputs, monkeypatch, engine):
    import fastload.records.arrays as arrays_mod

    if not engine:
        monkeypatch.setattr(arrays_mod, "_GATHER", None)
    elif arrays_mod._GATHER is None:
        pytest.skip("the C++ extension is not built")
    tmp, x, dense, _ = inputs
    out = tmp / "packed"
    pack_arrays(
        ArraysPackConfig(
            data={"x": str(tmp / "x.npz"), "dense": str(tmp / "dense.npy")}, out=str(out), shard_bytes=parse_size("2KB")
        )
    )
    rng = np.random.default_rng(5)
    with open_arrays(str(out)) as arrays:
        d, c = arrays.array("dense"), arrays.array("x")
        assert len(d.vector.parts) > 3
        for rows in (np.arange(97), rng.integers(0, 97, 64), np.array([96, 95, 0, 1, 2, 40, 41, 41, 0])):
            rows = rows.astype(np.int64)
            got = np.empty((len(rows), 3, 2), np.float32)
            np.testing.assert_array_equal(d.take_into(rows, got), dense[rows])
            np.testing.assert_array_equal(d.vector[rows], dense[rows])
            from fastload.mxnet.array_sources import csr_take_rows

            vals, idx, ptr = csr_take_rows(c.indptr, c.indices, c.data, rows)
            np.testing.assert_array_equal(
                sp.csr_matrix((vals, idx, ptr), shape=(len(rows), 300)).toarray(), x[rows].toarray()
            )
        with pytest.raises(IndexError):
            d.take_into(np.array([97]), np.empty((1, 3, 2), np.float32))


_TRUNCATE_WHILE_READING = r"""
import os, sys
import numpy as np
import fastload.mxnet as fm
from fastload.errors import CorruptRecordError
out, shard = sys.argv[1], sys.argv[2]
it = fm.NDArrayIter(out, batch_size=100, shuffle=True)
it.next()
with open(shard, "r+b") as f:  # a shard truncated under the running iterator
    f.truncate(200)
try:
    for _ in range(50):
        try:
            it.next()
        except StopIteration:
            it.reset()
except CorruptRecordError as e:
    print("REPORTED", e)
finally:
    it.close()
"""


@pytest.mark.parametrize("gather", ["engine", "python"])
def test_a_shard_truncated_under_ndarrayiter_is_an_error_not_sigbus(tmp_path, gather):
    pytest.importorskip("mxnet")
    import subprocess
    import sys

    big = np.random.default_rng(0).random((2000, 256)).astype(np.float32)
    np.save(tmp_path / "big.npy", big)
    out = tmp_path / "packed"
    pack_arrays(ArraysPackConfig(data={"big": str(tmp_path / "big.npy")}, out=str(out), shard_bytes=parse_size("1MB")))
    shard = sorted(out.glob("big-*.npy"))[-1]
    script = tmp_path / "reader.py"
    script.write_text(
        _TRUNCATE_WHILE_READING
        if gather == "engine"
        else _TRUNCATE_WHILE_READING.replace(
            "import fastload.mxnet as fm",
            "import fastload.records.arrays as a; a._GATHER = None\nimport fastload.mxnet as fm",
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(out), str(shard)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]  # a mapped read dies here with SIGBUS (-7)
    assert "REPORTED" in proc.stdout and shard.name in proc.stdout and "short read" in proc.stdout


def test_pack_arrays_reads_fortran_order_and_refuses_damage(tmp_path):
    x = np.asfortranarray(np.arange(60, dtype=np.float32).reshape(12, 5))
    np.save(tmp_path / "f.npy", x)  # np.save keeps Fortran order in the header
    out = tmp_path / "packed"
    pack_arrays(ArraysPackConfig(data={"f": str(tmp_path / "f.npy")}, out=str(out)))
    with open_arrays(str(out)) as arrays:
        got = np.empty((12, 5), np.float32)
        np.testing.assert_array_equal(arrays.array("f").take_into(np.arange(12), got), x)
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY\x01\x00" + b"garbage")
    with pytest.raises(UserError, match="bad.npy: not a readable .npy array"):
        pack_arrays(ArraysPackConfig(data={"b": str(tmp_path / "bad.npy")}, out=str(tmp_path / "o2")))
    np.save(tmp_path / "zero.npy", np.float32(3))
    with pytest.raises(UserError, match="0-d array has no rows"):
        pack_arrays(ArraysPackConfig(data={"z": str(tmp_path / "zero.npy")}, out=str(tmp_path / "o3")))
