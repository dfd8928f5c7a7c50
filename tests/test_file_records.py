"""Records over a list of image files (what timm's readers map onto): a FIFO or a vanished file
among them is a clear error naming the file, never a reader blocked forever."""

from __future__ import annotations

import os

import pytest

from fastload.errors import CorruptRecordError
from fastload.records.file_records import FileRecords


def test_a_fifo_or_missing_file_is_an_error_naming_it_and_the_hint_never_blocks(tmp_path):
    good = tmp_path / "a.jpg"
    good.write_bytes(b"\xff\xd8 not really a jpeg \xff\xd9")
    fifo = tmp_path / "b.jpg"
    os.mkfifo(fifo)  # no writer: a blocking open or read would never return
    gone = tmp_path / "c.jpg"
    records = FileRecords([str(good), str(fifo), str(gone)], [0, 1, 2])
    records.will_need([0, 1, 2])  # returns: the hint opens without blocking and skips what it cannot open
    assert bytes(records.image(0)) == good.read_bytes()
    with pytest.raises(CorruptRecordError, match="not a regular file") as fifo_error:
        records.image(1)
    assert str(fifo) in str(fifo_error.value)
    with pytest.raises(CorruptRecordError, match="cannot read image file") as gone_error:
        records.image(2)
    assert str(gone) in str(gone_error.value)
    records.close()
