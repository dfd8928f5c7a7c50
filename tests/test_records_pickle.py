"""A dataset pickles as the way to open it again: what a spawned DataLoader worker unpickles is the
same dataset, opened in that process (files, mappings and threads are never copied)."""

from __future__ import annotations

import os
import pickle

import pytest

from fastload.pack.packer import pack_folder
from fastload.records.dataset import open_dataset
from fastload.records.sharded import open_fastload_folder


@pytest.fixture(scope="module")
def packed(tiny_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("pickle") / "packed"
    pack_folder(str(tiny_folder), str(out), shards=3, workers=1, progress=False)
    return out


def _same(a, b):
    assert type(a) is type(b) and len(a) == len(b) and a.kind == b.kind
    assert (a.labels == b.labels).all() and (a.ids == b.ids).all()
    for i in range(len(a)):
        assert bytes(a.image(i)) == bytes(b.image(i))


@pytest.mark.parametrize("what", ["folder", "rec", "idx", "imagefolder"])
def test_a_dataset_from_open_dataset_reopens_when_unpickled(packed, tiny_folder, what, monkeypatch, tmp_path):
    rec = sorted(p for p in os.listdir(packed) if p.endswith(".rec"))[0]
    path = {
        "folder": str(packed),
        "rec": os.path.join(packed, rec),
        "idx": os.path.join(packed, rec[:-4] + ".idx"),
        "imagefolder": str(tiny_folder),
    }[what]
    monkeypatch.chdir(tmp_path)  # paths were made absolute when it was opened
    with open_dataset(os.path.relpath(path)) as ds:
        copy = pickle.loads(pickle.dumps(ds))
        try:
            assert copy is not ds
            _same(ds, copy)
        finally:
            copy.close()
        assert len(ds.image(0)) > 0  # the original is untouched by its copy's close


def test_a_bare_rec_with_its_index_elsewhere_keeps_it(packed, tmp_path):
    rec = sorted(p for p in os.listdir(packed) if p.endswith(".rec"))[0]
    idx = tmp_path / "elsewhere.idx"
    idx.write_bytes((packed / (rec[:-4] + ".idx")).read_bytes())
    with open_dataset(packed / rec, idx_path=idx) as ds, pickle.loads(pickle.dumps(ds)) as copy:
        _same(ds, copy)


def test_a_dataset_built_otherwise_says_why_it_does_not_pickle(packed):
    with (
        open_fastload_folder(str(packed)) as ds,
        pytest.raises(TypeError, match="only datasets from fastload.open_dataset"),
    ):
        pickle.dumps(ds)
