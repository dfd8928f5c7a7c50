"""``fastload pack`` from CSV and JSONL listings, and how SRC's format is detected."""

from __future__ import annotations

import json
import os

import pytest
from ingest_inputs import folder_entries, records
from test_pack import run_cli

from fastload.errors import UserError
from fastload.pack.input_format import InputFormat, detect_format
from fastload.pack.packer import pack_folder
from fastload.records.verify import verify_dataset


def _csv(path, header, rows):
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_csv_listing_packs_like_the_folder(odd_folder, tmp_path):
    entries, _ = folder_entries(odd_folder)
    rel = [os.path.relpath(p, odd_folder) for p in _paths(odd_folder)]
    listing = _csv(
        tmp_path / "list.csv", "path,label,note", [f"{p},{c},x" for p, (_, c, _) in zip(rel, entries, strict=True)]
    )
    ref = pack_folder(str(odd_folder), str(tmp_path / "ref"), progress=False)
    res = pack_folder(str(listing), str(tmp_path / "csv"), progress=False, root=str(odd_folder))
    assert records(tmp_path / "csv") == records(tmp_path / "ref")
    assert res.manifest["classes"] is None and res.manifest["source"]["kind"] == "csv"
    line = {os.path.join(str(odd_folder), p): i + 2 for i, p in enumerate(rel)}
    want = {f"{p} (list.csv line {line[p]})": r for p, r in ref.skipped}
    assert dict(res.skipped) == want and len(want) == 3  # bad files named by path and listing line
    assert verify_dataset(str(tmp_path / "csv")).ok


def _paths(folder):
    from fastload.records.folder_tree import scan_folder

    return [it.path for it in scan_folder(str(folder)).items]


def test_csv_class_names_multi_labels_and_bad_rows(tiny_folder, tmp_path):
    paths = _paths(tiny_folder)[:6]
    names = ["zebra", "ant", "moth", "ant", "zebra", "moth"]
    listing = _csv(
        tmp_path / "n.csv", "label,path", [f"{n},{p}" for n, p in zip(names, paths, strict=True)] + [",", "emu,"]
    )
    res = pack_folder(str(listing), str(tmp_path / "a"), progress=False)
    assert res.manifest["classes"] == {"ant": 0, "moth": 1, "zebra": 2}  # sorted: all names known up front
    assert [lab for lab, _ in records(tmp_path / "a")] == [(2.0,), (0.0,), (1.0,), (0.0,), (2.0,), (1.0,)]
    assert dict(res.skipped) == {"n.csv line 9": "empty path"}
    multi = _csv(
        tmp_path / "m.csv",
        "path,label_1,label_2",
        [f"{p},{i},{i / 2}" for i, p in enumerate(paths)] + [f"{paths[0]},1"],
    )
    res = pack_folder(str(multi), str(tmp_path / "b"), progress=False)
    assert res.manifest["label_width"] == 2
    assert [lab for lab, _ in records(tmp_path / "b")] == [(float(i), i / 2) for i in range(6)]
    assert dict(res.skipped) == {"m.csv line 8": "2 column(s), the header has 3"}
    with pytest.raises(UserError, match="header must name a 'label' column"):
        pack_folder(str(_csv(tmp_path / "x.csv", "path,klass", [f"{paths[0]},1"])), str(tmp_path / "x"), progress=False)
    with pytest.raises(UserError, match="m.csv line 8: 2 column.s., the header has 3 .*--on-error fail"):
        pack_folder(str(multi), str(tmp_path / "c"), progress=False, on_error="fail")


def test_jsonl_listing(tiny_folder, tmp_path):
    paths = _paths(tiny_folder)[:5]
    lines = [
        json.dumps({"path": os.path.relpath(paths[0], tmp_path), "label": "heron"}),
        json.dumps({"path": paths[1], "label": "egret"}),
        "not json",
        json.dumps({"path": paths[2], "label": 3}),  # a number where the labels are class names
        json.dumps({"path": str(tmp_path / "missing.jpg"), "label": "egret"}),
        json.dumps({"path": paths[3], "label": "heron"}),
        json.dumps([1, 2]),
    ]
    listing = tmp_path / "l.jsonl"
    listing.write_text("\n".join(lines) + "\n")
    res = pack_folder(str(listing), str(tmp_path / "out"), progress=False)
    assert res.manifest["classes"] == {"egret": 0, "heron": 1}
    assert [lab for lab, _ in records(tmp_path / "out")] == [(1.0,), (0.0,), (1.0,)]
    skipped = dict(res.skipped)
    assert skipped["l.jsonl line 3"] == "not valid JSON"
    assert skipped["l.jsonl line 4"] == "label is a number where the labels are class names"
    assert skipped["l.jsonl line 7"] == "not a JSON object"
    assert skipped[f"{tmp_path / 'missing.jpg'} (l.jsonl line 5)"].startswith("cannot read")
    numbers = tmp_path / "k.jsonl"
    numbers.write_text("\n".join(json.dumps({"path": p, "label": [i, 1 - i]}) for i, p in enumerate(paths)) + "\n")
    res = pack_folder(str(numbers), str(tmp_path / "num"), progress=False, shards=2)
    assert res.manifest["label_width"] == 2 and len(res.manifest["shards"]) == 2


def test_detection_and_cli(tiny_folder, tmp_path):
    assert detect_format(str(tiny_folder)) is InputFormat.FOLDER
    for name, fmt in [
        ("a.csv", InputFormat.CSV),
        ("a.jsonl", InputFormat.JSONL),
        ("a.lst", InputFormat.LST),
        ("a.txt", InputFormat.LST),
        ("a.parquet", InputFormat.PARQUET),
        ("a.tar", InputFormat.WDS),
        ("a.tar.gz", InputFormat.WDS),
    ]:
        (tmp_path / name).write_bytes(b"")
        assert detect_format(str(tmp_path / name)) is fmt, name
    assert detect_format(str(tmp_path / "t-{000..009}.tar")) is InputFormat.WDS
    assert detect_format("s3://bucket/train-{000000..000146}.tar") is InputFormat.WDS
    assert detect_format("s3://bucket/data/train-00000-of-00001.parquet") is InputFormat.PARQUET
    (tmp_path / "tars").mkdir()
    (tmp_path / "tars" / "s-0.tar").write_bytes(b"")
    assert detect_format(str(tmp_path / "tars")) is InputFormat.WDS
    (tmp_path / "pq" / "data").mkdir(parents=True)
    (tmp_path / "pq" / "data" / "train.parquet").write_bytes(b"")
    assert detect_format(str(tmp_path / "pq")) is InputFormat.PARQUET
    paths = _paths(tiny_folder)[:3]
    listing = _csv(tmp_path / "c.csv", "path,label", [f"{p},{i}" for i, p in enumerate(paths)])
    out = str(tmp_path / "ds")
    res = run_cli("pack", str(listing), out, "--quiet", check=0)
    assert "packed 3 records" in res.stdout
    res = run_cli("pack", str(listing), str(tmp_path / "x"), "--input-format", "jsonl", check=2)
    assert "l.jsonl" not in res.stderr and "no usable rows" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("pack", str(listing), str(tmp_path / "y"), "--input-format", "nope", check=2)
    assert "invalid choice" in res.stderr
