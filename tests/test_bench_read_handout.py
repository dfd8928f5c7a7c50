"""Smoke run of ``bench.read_handout``: every variant over a tiny packed dataset, rows and medians printed."""

from __future__ import annotations

import json

from test_records_data import tiny_folder  # noqa: F401  (fixture)

from bench import read_handout
from fastload.pack.packer import pack_folder


def test_every_variant_hands_out_the_records(tiny_folder, tmp_path, capsys):
    out = str(tmp_path / "packed")
    pack_folder(str(tiny_folder), out, shards=2, workers=1, progress=False)
    assert read_handout.main([out, "--batches", "3", "--repeats", "1", "--consumers", "2", "--queue-depth", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines[: lines.index("medians:")]]
    assert sorted(r["variant"] for r in rows) == sorted(read_handout.VARIANTS)
    for r in rows:
        assert r["images_s"] > 0 and r["mb_s"] > 0
