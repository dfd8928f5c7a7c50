"""``fastload pack`` from Hugging Face parquet and ``save_to_disk`` folders: columns, labels, splits, bad rows."""

from __future__ import annotations

import pytest
from ingest_inputs import folder_entries, hf_dataset, image_bytes, records, write_parquet

from fastload.errors import UserError
from fastload.pack.input_format import InputFormat, detect_format
from fastload.pack.packer import pack_folder
from fastload.records.verify import verify_dataset

from conftest import make_jpeg

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def odd(odd_folder):
    return folder_entries(odd_folder)


def test_parquet_packs_like_the_folder(odd_folder, odd, tmp_path):
    entries, classes = odd
    path = write_parquet(entries, tmp_path / "in" / "odd.parquet", classes, rows_per_group=4)
    assert pq.ParquetFile(str(path)).metadata.num_row_groups == 5  # read a row group at a time
    ref = pack_folder(str(odd_folder), str(tmp_path / "ref"), progress=False, workers=2)
    res = pack_folder(str(path), str(tmp_path / "pq"), progress=False, workers=2, shards=3)
    assert records(tmp_path / "pq") == records(tmp_path / "ref")
    assert res.converted == ref.converted and len(res.manifest["shards"]) == 3
    assert res.manifest["classes"] == {c: i for i, c in enumerate(classes)}  # the ClassLabel's names
    names = {e[0]: i for i, e in enumerate(entries)}
    want = {f"{path}: row {names[p.rsplit('/', 1)[1]]}": r for p, r in ref.skipped}
    assert dict(res.skipped) == want and len(want) == 3  # named by file and row
    assert verify_dataset(str(tmp_path / "pq"), decode=True).ok
    src = res.manifest["source"]
    assert src["kind"] == "parquet" and src["image_column"] == "image" and src["label_column"] == "label"


def test_without_jemalloc_the_c_library_pool_decodes_the_same_records(odd, tmp_path, monkeypatch):
    from fastload.pack import arrow_source

    entries, classes = odd
    path = write_parquet(entries, tmp_path / "in" / "odd.parquet", classes, rows_per_group=4)
    pack_folder(str(path), str(tmp_path / "je"), progress=False, workers=2)
    used = []
    real_system = pa.system_memory_pool

    def unavailable():
        raise NotImplementedError("built without jemalloc")

    def system():
        used.append(True)
        return real_system()

    monkeypatch.setattr(pa, "jemalloc_memory_pool", unavailable)
    monkeypatch.setattr(pa, "system_memory_pool", system)
    assert arrow_source._memory_pool(pa).backend_name == "system"
    pack_folder(str(path), str(tmp_path / "sys"), progress=False, workers=2)
    assert len(used) > 1  # the pack's reads took it too
    assert records(tmp_path / "sys") == records(tmp_path / "je")


def test_save_to_disk_and_a_dataset_dict_with_split(odd, tmp_path):
    entries, classes = odd
    ds = hf_dataset(entries, classes)
    ds.save_to_disk(str(tmp_path / "disk"))
    assert detect_format(str(tmp_path / "disk")) is InputFormat.HF_DISK
    pack_folder(str(tmp_path / "disk"), str(tmp_path / "a"), progress=False)
    write_parquet(entries, tmp_path / "p" / "x.parquet", classes)
    pack_folder(str(tmp_path / "p"), str(tmp_path / "ref"), progress=False)
    assert records(tmp_path / "a") == records(tmp_path / "ref")
    dd = datasets.DatasetDict({"train": ds.select(range(10)), "test": ds.select(range(10, len(ds)))})
    dd.save_to_disk(str(tmp_path / "dict"))
    res = pack_folder(str(tmp_path / "dict"), str(tmp_path / "train"), progress=False)
    assert records(tmp_path / "train") == records(tmp_path / "ref")[: res.written]
    assert res.manifest["source"]["split"] == "train" and res.manifest["name"] == "dict-train"
    res = pack_folder(str(tmp_path / "dict"), str(tmp_path / "test"), progress=False, split="test")
    assert records(tmp_path / "test") == records(tmp_path / "ref")[-res.written :]
    with pytest.raises(UserError, match="splits train, test; no split 'val'"):
        pack_folder(str(tmp_path / "dict"), str(tmp_path / "x"), progress=False, split="val")
    with pytest.raises(UserError, match="an Arrow stream .hf-disk. only tells at its end"):
        pack_folder(str(tmp_path / "disk"), str(tmp_path / "y"), progress=False, shards=2)


def test_parquet_folder_laid_out_by_split(tmp_path):
    entries = [(f"{i}.jpg", i % 3, make_jpeg(24 + i, 20, seed=i)) for i in range(12)]
    classes = ["a", "b", "c"]
    write_parquet(entries[:4], tmp_path / "ds" / "data" / "train-00000-of-00002.parquet", classes)
    write_parquet(entries[4:8], tmp_path / "ds" / "data" / "train-00001-of-00002.parquet", classes)
    write_parquet(entries[8:], tmp_path / "ds" / "data" / "test-00000-of-00001.parquet", classes)
    res = pack_folder(str(tmp_path / "ds"), str(tmp_path / "train"), progress=False)
    assert [b for _, b in records(tmp_path / "train")] == [e[2] for e in entries[:8]]
    assert res.manifest["source"]["split"] == "train" and res.manifest["source"]["files"] == 2
    pack_folder(str(tmp_path / "ds"), str(tmp_path / "test"), progress=False, split="test")
    assert [b for _, b in records(tmp_path / "test")] == [e[2] for e in entries[8:]]
    with pytest.raises(UserError, match="no parquet files of split 'dev' .test, train."):
        pack_folder(str(tmp_path / "ds"), str(tmp_path / "dev"), progress=False, split="dev")


def test_string_labels_numbers_binary_columns_and_unlabeled(tmp_path):
    jpgs = [make_jpeg(30, 20, seed=i) for i in range(5)]
    names = ["dog", "cat", "emu", "cat", "dog"]
    table = pa.table({"img": pa.array(jpgs, pa.binary()), "name": names, "score": [[i, 0.5] for i in range(5)]})
    pq.write_table(table, str(tmp_path / "t.parquet"), row_group_size=2)
    res = pack_folder(
        str(tmp_path / "t.parquet"), str(tmp_path / "a"), progress=False, image_column="img", label_column="name"
    )
    assert res.manifest["classes"] == {"cat": 0, "dog": 1, "emu": 2}  # all names known up front: sorted
    assert [lab for lab, _ in records(tmp_path / "a")] == [(1.0,), (0.0,), (2.0,), (0.0,), (1.0,)]
    res = pack_folder(
        str(tmp_path / "t.parquet"), str(tmp_path / "b"), progress=False, image_column="img", label_column="score"
    )
    assert res.manifest["label_width"] == 2 and res.manifest["classes"] is None
    assert [lab for lab, _ in records(tmp_path / "b")] == [(float(i), 0.5) for i in range(5)]
    pack_folder(
        str(tmp_path / "t.parquet"), str(tmp_path / "c"), progress=False, image_column="img", label_column="none"
    )
    assert [b for _, b in records(tmp_path / "c")] == jpgs
    with pytest.raises(UserError, match="no image column 'image' .columns: img, name, score.; pass --image-column"):
        pack_folder(str(tmp_path / "t.parquet"), str(tmp_path / "d"), progress=False)
    with pytest.raises(UserError, match="column 'name' is string; expected image structs"):
        pack_folder(str(tmp_path / "t.parquet"), str(tmp_path / "e"), progress=False, image_column="name")
    with pytest.raises(UserError, match="no label column 'label'.*--label-column none"):
        pack_folder(str(tmp_path / "t.parquet"), str(tmp_path / "f"), progress=False, image_column="img")
    with pytest.raises(UserError, match="--image-key does not apply to parquet input|--image-key.*parquet"):
        pack_folder(str(tmp_path / "t.parquet"), str(tmp_path / "g"), progress=False, image_key="jpg")


def test_bad_rows_are_named_by_file_and_row(tmp_path):
    good = make_jpeg(40, 30, seed=3)
    images = [
        {"bytes": good, "path": "a.jpg"},
        None,  # a null image cell
        {"bytes": None, "path": "elsewhere.jpg"},  # no bytes
        {"bytes": b"\xff\xd8\xff garbage", "path": "c.jpg"},  # undecodable
        {"bytes": image_bytes("L", "JPEG"), "path": "gray.jpg"},
        {"bytes": image_bytes("RGB", "WEBP"), "path": "x.webp"},
        {"bytes": good, "path": "d.jpg"},
    ]
    labels = [0, 1, 0, 1, 7, 1, None]  # 7: not one of the 2 classes; None: no label
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    meta = {
        b"huggingface": b'{"info": {"features": {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": ["x", "y"]}}}}'
    }
    table = pa.table(
        {"image": pa.array(images, struct), "label": pa.array(labels, pa.int64())}
    ).replace_schema_metadata(meta)
    path = tmp_path / "in" / "bad.parquet"
    path.parent.mkdir()
    pq.write_table(table, str(path), row_group_size=3)
    res = pack_folder(str(path), str(tmp_path / "out"), progress=False)
    skipped = dict(res.skipped)
    assert skipped[f"{path}: row 1"] == "null image cell (no image bytes)"
    assert skipped[f"{path}: row 2"] == "null image cell (no image bytes)"
    assert "not an image" in skipped[f"{path}: row 3"] or "undecodable" in skipped[f"{path}: row 3"]
    assert skipped[f"{path}: row 4"] == "label 7 is not a class index in [0, 2)"
    assert skipped[f"{path}: row 6"] == "no label (null)"
    assert res.written == 2 and res.converted == {"webp": 1}
    assert [lab for lab, _ in records(tmp_path / "out")] == [(0.0,), (1.0,)]
    with pytest.raises(UserError, match=rf"{path}: row 1: null image cell .*--on-error fail"):
        pack_folder(str(path), str(tmp_path / "fail"), progress=False, on_error="fail")


def test_damaged_parquet_files_are_bad_entries_and_the_others_are_read(tmp_path):
    entries = [(f"{i}.jpg", i % 2, make_jpeg(30 + i, 20, seed=i)) for i in range(12)]
    folder = tmp_path / "in"
    good = write_parquet(entries[:4], folder / "a.parquet", ["x", "y"], rows_per_group=2)
    cut = write_parquet(entries[4:8], folder / "b.parquet", ["x", "y"], rows_per_group=2)
    cut.write_bytes(cut.read_bytes()[:-100])  # no footer: the file cannot be opened
    hurt = write_parquet(entries[8:], folder / "c.parquet", ["x", "y"], rows_per_group=2)
    second = pq.ParquetFile(str(hurt)).metadata.row_group(1).column(0)
    data = bytearray(hurt.read_bytes())
    start = second.dictionary_page_offset or second.data_page_offset
    data[start : start + 16] = b"\xff" * 16  # the second row group's first page header
    hurt.write_bytes(bytes(data))
    res = pack_folder(str(folder), str(tmp_path / "out"), progress=False)
    skipped = dict(res.skipped)
    assert skipped[str(cut)].startswith("cannot read (")
    assert (
        skipped[f"{hurt}: row 2 on"].startswith("cannot read (")
        and "the rest of this file is skipped" in skipped[f"{hurt}: row 2 on"]
    )
    assert [b for _, b in records(tmp_path / "out")] == [e[2] for e in entries[:4] + entries[8:10]]
    assert good.exists()
