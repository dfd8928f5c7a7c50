"""``fastload pack`` from tars and parquet in object storage (the loopback S3 server): read in place, never downloaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ingest_inputs import folder_entries, records, write_parquet, write_tars
from remote_fixtures import BUCKET, requires_s3, s3_server  # noqa: F401

from fastload.pack.options import PackOptions
from fastload.pack.packer import pack_folder
from fastload.pack.remote_io import pack_remote
from fastload.records.remote.storage import RemoteStore

pytestmark = requires_s3
pytest.importorskip("webdataset")


@pytest.fixture(scope="module")
def uploaded(s3_server, odd_folder, tmp_path_factory):
    """The odd folder as 4 tars and a parquet file, locally and in the bucket."""
    entries, classes = folder_entries(odd_folder)
    local = tmp_path_factory.mktemp("remote-ingest")
    write_tars(entries, local / "tars", per_tar=5)
    write_parquet(entries, local / "pq" / "train-00000-of-00001.parquet", classes, rows_per_group=4)
    options = s3_server.storage_options()
    for sub in ("tars", "pq"):
        store = RemoteStore(f"s3://{BUCKET}/ingest/{sub}", options)
        for path in sorted((local / sub).iterdir()):
            store.put_file(path.name, str(path))
    return local, options


def test_remote_tars_pack_like_local_ones(uploaded, tmp_path, monkeypatch):
    local, options = uploaded
    ref = pack_folder(str(local / "tars"), str(tmp_path / "ref"), progress=False)
    fetched = []
    real_stream = RemoteStore.stream

    def counted(self, key, start=None, end=None, chunk=1 << 20):
        fetched.append((key, start, end))
        return real_stream(self, key, start, end, chunk)

    monkeypatch.setattr(RemoteStore, "stream", counted)
    url = f"s3://{BUCKET}/ingest/tars/train-{{000000..000003}}.tar"
    res = pack_folder(url, str(tmp_path / "s3"), progress=False, storage_options=options, shard_size=40_000)
    assert records(tmp_path / "s3") == records(tmp_path / "ref")
    # Each tar was read once, front to back, in one streamed GET (the first one also for the label key).
    assert sorted(k for k, s, e in fetched if e is None) == ["train-000000.tar"] * 2 + [
        f"train-00000{i}.tar" for i in (1, 2, 3)
    ]
    assert {s["path"].rsplit("/", 1)[0] for s in res.manifest["skipped"]} == {f"s3://{BUCKET}/ingest/tars"}
    assert len(res.skipped) == len(ref.skipped) == 3
    monkeypatch.undo()
    prefix = pack_folder(
        f"s3://{BUCKET}/ingest/tars", str(tmp_path / "prefix"), progress=False, storage_options=options
    )
    assert records(tmp_path / "prefix") == records(tmp_path / "ref") and prefix.manifest["name"] == "tars"


def test_remote_parquet_and_the_cli(uploaded, s3_server, tmp_path):
    local, options = uploaded
    pack_folder(str(local / "pq"), str(tmp_path / "ref"), progress=False)
    res = pack_remote(
        f"s3://{BUCKET}/ingest/pq",
        str(tmp_path / "s3"),
        options=PackOptions(progress=False, shards=2),
        storage_options=options,
        build_dir=str(tmp_path / "build"),
    )
    assert records(tmp_path / "s3") == records(tmp_path / "ref") and len(res.manifest["shards"]) == 2
    assert not (tmp_path / "build" / "source").exists()  # read in place, nothing downloaded
    env = dict(os.environ, **s3_server.env())
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastload",
            "pack",
            f"s3://{BUCKET}/ingest/tars/train-000001.tar",
            f"s3://{BUCKET}/packs/from-tar",
            "--quiet",
            "--build-dir",
            str(tmp_path / "build-cli"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert f"s3://{BUCKET}/packs/from-tar" in out.stdout and "packed 5 records" in out.stdout
