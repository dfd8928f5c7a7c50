"""Parquet image columns read page by page (``fastload.pack.parquet_pages``): Arrow's records, every page form, damage."""

from __future__ import annotations

import os

import pytest
from ingest_inputs import folder_entries, records, write_parquet

from fastload.pack import arrow_source
from fastload.pack.arrow_source import ArrowSource
from fastload.pack.packer import pack_folder
from fastload.pack.parquet_pages import NotPlain, PlainPages, plain_column
from fastload.pack.tar_stream import ChunkPool

from conftest import make_jpeg

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("datasets")

STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _arrow_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the row groups whose images Arrow decodes (the label-only reads are not counted)."""
    seen: list[int] = []
    real = ArrowSource._group_batches

    def spy(self, pf, group, leaves, skip):
        seen.append(group)
        return real(self, pf, group, leaves, skip)

    monkeypatch.setattr(ArrowSource, "_group_batches", spy)
    return seen


def _shards(out) -> dict[str, bytes]:
    return {n: (out / n).read_bytes() for n in sorted(os.listdir(out)) if n.endswith((".rec", ".idx"))}


def _pack_both(src, tmp_path, monkeypatch, **kw):
    """Pack ``src`` through the page reader and through Arrow alone; both results and how many groups Arrow read."""
    seen = _arrow_reads(monkeypatch)
    pages = pack_folder(str(src), str(tmp_path / "pages"), progress=False, **kw)
    by_pages = len(seen)
    monkeypatch.setattr(arrow_source, "plain_column", lambda *a: None)
    arrow = pack_folder(str(src), str(tmp_path / "arrow"), progress=False, **kw)
    assert len(seen) > by_pages  # the second pack did go through Arrow
    return pages, arrow, by_pages


def test_datasets_parquet_is_read_from_its_pages_into_the_same_shards(odd_folder, tmp_path, monkeypatch):
    entries, classes = folder_entries(odd_folder)
    path = write_parquet(entries, tmp_path / "in" / "odd.parquet", classes, rows_per_group=4)
    pages, arrow, by_arrow = _pack_both(path, tmp_path, monkeypatch, workers=2, shards=3)
    assert by_arrow == 0  # every image came from the pages
    assert _shards(tmp_path / "pages") == _shards(tmp_path / "arrow")  # byte for byte
    assert pages.skipped == arrow.skipped and len(pages.skipped) == 3
    assert pages.converted == arrow.converted and pages.written == arrow.written
    assert records(tmp_path / "pages") == records(tmp_path / "arrow")


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("column", ["struct", "binary", "required"])
def test_page_forms_nulls_and_many_pages_per_group(tmp_path, monkeypatch, version, column):
    images = [make_jpeg(24 + i, 16 + i % 5, seed=i) for i in range(23)]
    if column == "struct":
        cells = [{"bytes": b, "path": f"{i}.jpg"} for i, b in enumerate(images)]
        cells[3], cells[4] = None, {"bytes": None, "path": "gone.jpg"}  # a null cell, null bytes
        cells[9:17:2] = [None] * 4  # alternating nulls: bit-packed definition levels
        array = pa.array(cells, STRUCT)
    else:
        cells = list(images)
        if column == "binary":
            cells[2] = cells[7] = None
        array = pa.array(cells, pa.binary() if column == "binary" else pa.large_binary())
    schema = pa.schema([pa.field("image", array.type, nullable=column != "required"), ("label", pa.int64())])
    table = pa.table({"image": array, "label": pa.array([i % 4 for i in range(len(images))])}, schema=schema)
    path = tmp_path / "in" / "t.parquet"
    path.parent.mkdir()
    # Small pages: several per row group, a group boundary inside a run of values.
    pq.write_table(
        table,
        str(path),
        compression="none",
        use_dictionary=False,
        row_group_size=10,
        data_page_size=2000,
        data_page_version=version,
    )
    pages, arrow, by_arrow = _pack_both(path, tmp_path, monkeypatch, workers=2)
    assert by_arrow == 0
    assert _shards(tmp_path / "pages") == _shards(tmp_path / "arrow")
    assert pages.skipped == arrow.skipped and pages.written == arrow.written
    nulls = {i for i, c in enumerate(cells) if c is None or (isinstance(c, dict) and c["bytes"] is None)}
    assert {int(p.rsplit(" ", 1)[1]) for p, _ in pages.skipped} == nulls


@pytest.mark.parametrize(
    "options",
    [{"compression": "snappy"}, {"compression": "none", "use_dictionary": True}],
    ids=["snappy", "dictionary"],
)
def test_other_column_forms_are_read_by_arrow(odd_folder, tmp_path, monkeypatch, options):
    entries, _ = folder_entries(odd_folder)
    cells = [{"bytes": data, "path": name} for name, _, data in entries]
    table = pa.table({"image": pa.array(cells, STRUCT), "label": pa.array([c for _, c, _ in entries])})
    path = tmp_path / "in" / "t.parquet"
    path.parent.mkdir()
    pq.write_table(table, str(path), row_group_size=6, **options)
    meta = pq.ParquetFile(str(path)).metadata
    assert plain_column(meta.row_group(0).column(0), meta.schema.column(0), path.stat().st_size) is None
    seen = _arrow_reads(monkeypatch)
    pack_folder(str(path), str(tmp_path / "out"), progress=False)
    assert len(seen) == meta.num_row_groups
    pack_folder(str(odd_folder), str(tmp_path / "ref"), progress=False)
    assert records(tmp_path / "out") == records(tmp_path / "ref")


def _plain_file(tmp_path, count=30, **kw):
    images = [make_jpeg(20 + i, 18, seed=i) for i in range(count)]
    cells = [{"bytes": b, "path": f"{i}.jpg"} for i, b in enumerate(images)]
    cells[5] = None
    path = tmp_path / "p.parquet"
    pq.write_table(
        pa.table({"image": pa.array(cells, STRUCT)}),
        str(path),
        compression="none",
        use_dictionary=False,
        data_page_size=1500,
        **kw,
    )
    meta = pq.ParquetFile(str(path)).metadata
    span = plain_column(meta.row_group(0).column(0), meta.schema.column(0), path.stat().st_size)
    assert span is not None
    return path, span, [None if c is None else c["bytes"] for c in cells]


def _read(path, span, skip=0) -> list[bytes | None]:
    out: list[bytes | None] = []
    with PlainPages(str(path), ChunkPool()) as pages:
        for row, cells in pages.pages(span, skip):
            assert row == skip + len(out)
            out += [None if c is None else bytes(c) for c in cells]
    return out


def test_pages_from_any_row(tmp_path):
    path, span, cells = _plain_file(tmp_path)
    assert span.rows == len(cells) and span.max_def == 2
    for skip in range(len(cells) + 1):
        assert _read(path, span, skip) == cells[skip:]


def test_the_rest_of_a_group_goes_to_arrow_from_the_first_row_not_read(odd_folder, tmp_path, monkeypatch):
    entries, classes = folder_entries(odd_folder)
    path = write_parquet(entries, tmp_path / "in" / "odd.parquet", classes, rows_per_group=9)
    real = PlainPages._values
    calls = [0]

    def second_page_odd(*args):
        calls[0] += 1
        if calls[0] % 3 == 2:
            raise ValueError("a page in another form")
        return real(*args)

    monkeypatch.setattr(PlainPages, "_values", staticmethod(second_page_odd))
    seen = _arrow_reads(monkeypatch)
    pack_folder(str(path), str(tmp_path / "mixed"), progress=False, workers=2)
    assert seen  # some groups were finished by Arrow
    monkeypatch.setattr(arrow_source, "plain_column", lambda *a: None)
    pack_folder(str(path), str(tmp_path / "arrow"), progress=False, workers=2)
    assert _shards(tmp_path / "mixed") == _shards(tmp_path / "arrow")


def test_damaged_pages_raise_not_plain_and_never_more(tmp_path):
    path, span, cells = _plain_file(tmp_path, count=12)
    good = path.read_bytes()
    step = max(1, (span.end - span.start) // 97)
    for at in range(span.start, span.end, step):
        for junk in (b"\xff" * 6, b"\x00" * 6, b"\x15\x7f\x19\x0c"):
            damaged = bytearray(good)
            damaged[at : at + len(junk)] = junk
            path.write_bytes(bytes(damaged))
            try:
                got = _read(path, span)
            except NotPlain as exc:
                assert 0 <= exc.row <= len(cells)
            else:
                assert len(got) <= len(cells)
    path.write_bytes(good[: (span.start + span.end) // 2])  # cut inside the chunk
    with pytest.raises(NotPlain, match="ends inside it|runs past|does not fit"):
        _read(path, span)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _i32(value: int) -> bytes:
    return bytes([0x15]) + _varint((value << 1) ^ (value >> 63))  # the next field id, type i32


def _page(count: int, values: list[bytes]) -> bytes:
    """A data page v1 written by hand: its compact-protocol header, RLE levels (all defined), PLAIN values."""
    levels = _varint(count << 1) + b"\x01"  # one run of `count` ones
    body = len(levels).to_bytes(4, "little") + levels + b"".join(len(v).to_bytes(4, "little") + v for v in values)
    info = _i32(count) + _i32(0) + _i32(3) + _i32(3) + b"\x00"  # num_values, PLAIN, RLE, RLE
    return _i32(0) + _i32(len(body)) + _i32(len(body)) + bytes([0x2C]) + info + b"\x00" + body  # field 5: struct


def test_a_page_written_by_hand_and_one_claiming_more_values_than_rows(tmp_path):
    from fastload.pack.parquet_pages import PageSpan

    values = [b"abc", b"", b"\xff\xd8" * 50]
    for count, ok in ((3, True), (4, False), (2**31 - 1, False)):
        page = _page(count, values)
        path = tmp_path / f"{count}.bin"
        path.write_bytes(b"PAR1" + page)
        span = PageSpan(4, 4 + len(page), 1, 3)
        if ok:
            assert _read(path, span) == values
        else:
            with pytest.raises(NotPlain, match="rows are left") as caught:
                _read(path, span)
            assert caught.value.row == 0
