"""Fuzz targets: the decoder (plain and restart-indexed), the RecordIO / .idx / manifest / index
readers, the LMDB reader and NDArrayIter's CSR input, fed mutated inputs by hypothesis.

What each target asserts: the process survives (no crash, no hang), every failure is the reader's
own clear exception (``CorruptDatasetError``, ``CorruptRecordError``, ``UserError``, or a per-image
decode status), and whatever is accepted reads back consistently.

In the suite each target runs a bounded number of examples from hypothesis's deterministic
(derandomized) stream: a few seconds each. By hand, for longer and with fresh randomness::

    FASTLOAD_FUZZ_EXAMPLES=20000 FASTLOAD_FUZZ_RANDOM=1 python -m pytest -q tests/test_fuzz.py

Under AddressSanitizer + UndefinedBehaviorSanitizer (the engine built by ``make sanitize``)::

    make sanitize SAN_TESTS=tests/test_fuzz.py
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastload.errors import CorruptDatasetError, CorruptRecordError, UserError
from fastload.pack.packer import pack_folder
from fastload.records import recordio
from fastload.records.dataset import open_dataset
from fastload.records.manifest import INDEX_NAME, MANIFEST_NAME
from fastload.records.summary import describe, format_description
from fastload.records.verify import verify_dataset

from conftest import HAVE_ENGINE, HAVE_MXNET, make_jpeg

_EXAMPLES = os.environ.get("FASTLOAD_FUZZ_EXAMPLES")


def fuzz(examples: int) -> settings:
    """Hypothesis settings of a target: ``examples`` in the suite (a few seconds), or the environment's."""
    return settings(
        max_examples=int(_EXAMPLES) if _EXAMPLES else examples,
        derandomize=os.environ.get("FASTLOAD_FUZZ_RANDOM") != "1",
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


READER_ERRORS = (CorruptDatasetError, CorruptRecordError, UserError)


@st.composite
def mutated(draw, data: bytes, *, max_edits: int = 12):
    """``data`` with a few bytes overwritten, ranges deleted or duplicated, and maybe cut short."""
    out = bytearray(data)
    for _ in range(draw(st.integers(0, max_edits))):
        if not out:
            break
        kind = draw(st.sampled_from(["byte", "byte", "byte", "delete", "repeat", "ff"]))
        pos = draw(st.integers(0, len(out) - 1))
        if kind == "byte":
            out[pos] = draw(st.integers(0, 255))
        elif kind == "ff":  # marker-like bytes are where JPEG and framing parsers branch
            out[pos] = 0xFF
        elif kind == "delete":
            del out[pos : pos + draw(st.integers(1, 64))]
        else:
            n = draw(st.integers(1, 64))
            out[pos:pos] = out[pos : pos + n]
    if draw(st.booleans()) and out:
        del out[draw(st.integers(0, len(out))) :]
    return bytes(out)


# --- the decoder ---------------------------------------------------------------------------------


def _seed_jpegs() -> list[bytes]:
    return [
        make_jpeg(64, 48, seed=1),
        make_jpeg(33, 47, subsampling="4:4:4", progressive=True, seed=2),
        make_jpeg(40, 40, mode="L", seed=3),
        make_jpeg(50, 30, subsampling="4:2:2", seed=4),
    ]


def _restart_indexed() -> list[bytes]:
    from fastload.pack.restart import transcode

    return [transcode(j)[0] for j in _seed_jpegs()[:2]]


SEEDS = _seed_jpegs()
RESTART = _restart_indexed() if HAVE_ENGINE else []


def _decode_all(images: list[bytes]) -> None:
    from fastload.decode import decode_batch
    from fastload.transforms import CenterCrop, RandomResizedCrop, Resize

    for transform in (RandomResizedCrop(size=(24, 24)), CenterCrop(size=(16, 16), resize=20), Resize(size=(8, 12))):
        out = np.zeros((len(images), *transform.size, 3), dtype=np.uint8)
        res = decode_batch(
            images, out, transform, seed=0, epoch=0, indices=np.arange(len(images), dtype=np.int64), threads=2
        )
        assert res.status.shape == (len(images),)
        for pos in np.flatnonzero(res.status).tolist():
            assert isinstance(res.errors[pos], str) and res.errors[pos]


@fuzz(300)
@given(st.data())
def test_fuzz_decoder_plain(data):
    images = [data.draw(mutated(j), label=f"image{k}") for k, j in enumerate(SEEDS)]
    _decode_all(images)


@pytest.mark.skipif(not HAVE_ENGINE, reason="restart indexing needs the C++ engine")
@fuzz(300)
@given(st.data())
def test_fuzz_decoder_restart_indexed(data):
    images = [data.draw(mutated(j), label=f"image{k}") for k, j in enumerate(RESTART)]
    _decode_all(images + RESTART)  # damaged slices beside intact ones in one batch


# --- RecordIO and .idx -------------------------------------------------------------------------------


def _small_rec() -> tuple[bytes, bytes]:
    payloads = [recordio.pack_header(float(k % 3), 100 + k) + make_jpeg(16 + k, 12, seed=k) for k in range(5)]
    payloads[2] = recordio.pack_header(2.0, 102) + b"\0" * 4 + recordio._MAGIC_BYTES + b"tail"  # a split record
    path = Path(tempfile.mkdtemp(prefix="fastload-fuzz-"))
    try:
        with open(path / "x.rec", "wb") as f:
            w = recordio.RecordIOWriter(f)
            for k, p in enumerate(payloads):
                w.write(p, k)
        return (path / "x.rec").read_bytes(), w.idx_bytes()
    finally:
        shutil.rmtree(path)


REC, IDX = _small_rec()


def _read_everything(path: str) -> None:
    """Open, read every record, describe and verify: only the readers' own errors may come out."""
    try:
        with open_dataset(path) as ds:
            assert ds.labels.shape == (len(ds), ds.label_width)
            for i in range(len(ds)):
                try:
                    bytes(ds.image(i))
                    bytes(ds.payload(i))
                except CorruptRecordError:
                    pass
    except READER_ERRORS:
        pass
    with contextlib.suppress(READER_ERRORS):
        format_description(describe(path))
    report = verify_dataset(path)
    assert report.records >= 0 and all(isinstance(p, str) for p in report.problems)


@fuzz(400)
@given(st.data())
def test_fuzz_recordio_and_idx(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("rec")
    (folder / "x.rec").write_bytes(data.draw(mutated(REC), label="rec"))
    if data.draw(st.booleans(), label="with idx"):
        (folder / "x.idx").write_bytes(data.draw(mutated(IDX, max_edits=4), label="idx"))
    _read_everything(str(folder / "x.rec"))


# --- manifest, index and LMDB of packed datasets ----------------------------------------------------


@pytest.fixture(scope="module")
def packed_pair(tmp_path_factory):
    src = tmp_path_factory.mktemp("fuzz-src")
    for label in range(2):
        (src / f"c{label}").mkdir()
        for k in range(6):
            side = 20 + 7 * k  # two LMDB overflow pages for the larger ones, inline values for none
            (src / f"c{label}" / f"{k}.jpg").write_bytes(make_jpeg(side * 3, side * 2, seed=10 * label + k))
    out = {}
    for fmt in ("recordio", "lmdb"):
        out[fmt] = tmp_path_factory.mktemp(f"fuzz-{fmt}") / "ds"
        pack_folder(str(src), str(out[fmt]), format=fmt, shards=2, progress=False, workers=1)
    return out


def _copy(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest, dirs_exist_ok=True)
    return dest


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


@st.composite
def damaged_manifest(draw, manifest: dict):
    """The manifest with a few fields replaced by arbitrary JSON values or removed (nested ones too)."""
    doc = json.loads(json.dumps(manifest))
    for _ in range(draw(st.integers(1, 3))):
        target = doc
        keys = ["shards", 0] if draw(st.booleans()) else []
        if draw(st.booleans()):
            keys = ["index"]
        for key in keys:
            if (isinstance(target, dict) and key in target) or (isinstance(target, list) and target):
                target = target[key] if isinstance(target, dict) or isinstance(key, int) else target
        if not isinstance(target, dict) or not target:
            continue
        field = draw(st.sampled_from(sorted(target)))
        if draw(st.integers(0, 4)) == 0:
            del target[field]
        else:
            target[field] = draw(_JSON)
    return doc


@fuzz(80)
@given(st.data())
def test_fuzz_manifest(packed_pair, tmp_path_factory, data):
    fmt = data.draw(st.sampled_from(["recordio", "lmdb"]), label="format")
    folder = _copy(packed_pair[fmt], tmp_path_factory.mktemp("manifest"))
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    if data.draw(st.integers(0, 9), label="raw") == 0:
        raw = data.draw(mutated((folder / MANIFEST_NAME).read_bytes(), max_edits=6), label="raw bytes")
        (folder / MANIFEST_NAME).write_bytes(raw)
    else:
        (folder / MANIFEST_NAME).write_text(json.dumps(data.draw(damaged_manifest(manifest), label="manifest")))
    _read_everything(str(folder))


@fuzz(120)
@given(st.data())
def test_fuzz_index(packed_pair, tmp_path_factory, data):
    fmt = data.draw(st.sampled_from(["recordio", "lmdb"]), label="format")
    folder = _copy(packed_pair[fmt], tmp_path_factory.mktemp("index"))
    raw = (folder / INDEX_NAME).read_bytes()
    header = 10 + struct.unpack_from("<H", raw, 8)[0]
    if data.draw(st.booleans(), label="in header"):  # the text numpy parses, or the rows after it
        damaged = data.draw(mutated(raw[:header], max_edits=6), label="header") + raw[header:]
    else:
        damaged = raw[:header] + data.draw(mutated(raw[header:], max_edits=8), label="rows")
    (folder / INDEX_NAME).write_bytes(damaged)
    _read_everything(str(folder))


@fuzz(120)
@given(st.data())
def test_fuzz_lmdb(packed_pair, tmp_path_factory, data):
    folder = _copy(packed_pair["lmdb"], tmp_path_factory.mktemp("lmdb"))
    shard = sorted(p for p in folder.iterdir() if p.name.endswith(".lmdb"))[0]
    raw = (shard / "data.mdb").read_bytes()
    page = 4096
    # Aim most edits at page headers and node tables, where the walker's checks are.
    edits = data.draw(
        st.lists(st.tuples(st.integers(0, len(raw) // page - 1), st.integers(0, 63), st.integers(0, 255)), max_size=8),
        label="header edits",
    )
    out = bytearray(data.draw(mutated(raw, max_edits=4), label="data.mdb"))
    for pgno, at, value in edits:
        if pgno * page + at < len(out):
            out[pgno * page + at] = value
    (shard / "data.mdb").write_bytes(bytes(out))
    _read_everything(str(folder))  # through the manifest and index
    _read_everything(str(shard))  # the shard on its own (its values' headers give labels)


# --- NDArrayIter's CSR input -----------------------------------------------------------------------


def _csr_check():
    if not HAVE_MXNET:
        return None
    from fastload.mxnet.array_sources import check_csr

    return check_csr


@st.composite
def csr_parts(draw):
    rows, cols = draw(st.integers(0, 6)), draw(st.integers(0, 6))
    nnz = draw(st.integers(0, 12))
    indptr = sorted(draw(st.lists(st.integers(0, nnz), min_size=rows + 1, max_size=rows + 1))) if rows + 1 else []
    if indptr:
        indptr[0], indptr[-1] = 0, nnz
    if draw(st.booleans()):  # break the structure now and then
        indptr = draw(st.lists(st.integers(-3, nnz + 3), min_size=0, max_size=rows + 3))
    indices = draw(st.lists(st.integers(-2, cols + 2), min_size=nnz, max_size=nnz))
    if draw(st.integers(0, 3)) == 0:
        indices.append(draw(st.integers(-(10**6), 10**6)))
    return rows, cols, np.asarray(indptr, dtype=np.int64), np.asarray(indices, dtype=np.int64), nnz


def _csr_valid(rows, cols, indptr, indices, nnz) -> bool:
    if len(indptr) != rows + 1 or indptr[0] != 0 or indptr[-1] != nnz or np.any(np.diff(indptr) < 0):
        return False
    if len(indices) != nnz or np.any((indices < 0) | (indices >= cols)):
        return False
    return all(np.all(np.diff(indices[indptr[r] : indptr[r + 1]]) > 0) for r in range(rows))


@pytest.mark.skipif(
    _csr_check() is None,
    reason="MXNet is not installed",
)
@fuzz(200)
@given(csr_parts())
def test_fuzz_ndarrayiter_csr_input(parts):
    """The check refuses exactly the malformed matrices; what it accepts iterates to scipy's values."""
    import scipy.sparse as sp

    from fastload.mxnet import NDArrayIter

    rows, cols, indptr, indices, nnz = parts
    valid = _csr_valid(rows, cols, indptr, indices, nnz)
    try:
        _csr_check()("data", indptr, indices, nnz, (rows, cols))
    except ValueError:
        assert not valid
        return
    assert valid
    if rows == 0 or cols == 0:
        return
    values = np.arange(1, nnz + 1, dtype=np.float32)
    matrix = sp.csr_matrix((values, indices, indptr), shape=(rows, cols))
    it = NDArrayIter(data=matrix, batch_size=rows, last_batch_handle="discard")
    batch = next(iter(it))
    assert np.array_equal(batch.data[0].asnumpy(), matrix.toarray())
    it.close()
