"""Reading damaged, changing or hostile datasets: errors that name the file, never a dead process.

One group per finding: a shard changed under a reader (no SIGBUS), paths that leave the dataset
(containment), damaged metadata (one CorruptDatasetError naming file and field), integrity at load
(per-record checksums, labels), and `fastload verify` reporting all of it without dying. Scenarios
that killed the process are run in a subprocess, so a regression shows as a failed test, not a
crashed suite.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fastload.errors import CorruptDatasetError, CorruptRecordError, DecodeError
from fastload.loader import Loader, LoaderConfig
from fastload.pack.packer import pack_folder
from fastload.records import recordio
from fastload.records.dataset import open_dataset
from fastload.records.durable import write_json_atomic
from fastload.records.manifest import INDEX_NAME, MANIFEST_NAME, index_dtype, load_index, write_index
from fastload.records.verify import verify_dataset
from fastload.transforms import Resize

SECRET = b"SECRET-0123456789-do-not-print"


@pytest.fixture
def packed(tiny_folder, tmp_path):
    """A fresh RecordIO dataset of the 40 tiny images in one shard (tests damage it)."""
    out = tmp_path / "ds"
    pack_folder(str(tiny_folder), str(out), shards=1, name="tiny", progress=False, workers=1)
    return out


@pytest.fixture
def packed_lmdb(tiny_folder, tmp_path):
    out = tmp_path / "lmdb"
    pack_folder(str(tiny_folder), str(out), format="lmdb", shards=1, name="tiny", progress=False, workers=1)
    return out


def _manifest(folder):
    return json.loads((folder / MANIFEST_NAME).read_text())


def _run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=timeout
    )


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastload", *args], capture_output=True, text=True, timeout=120)


def _died(res: subprocess.CompletedProcess) -> str:
    return f"exit {res.returncode} (signal {-res.returncode})" if res.returncode < 0 else ""


# --- a shard changed under a reader: never SIGBUS --------------------------------------------------

_LOADER_SCRIPT = """
    import os, sys
    from fastload.errors import DecodeError
    from fastload.loader import Loader, LoaderConfig
    from fastload.transforms import Resize

    from fastload.records.readahead import ReadOptions

    folder, how, policy, reads = sys.argv[1:5]
    shard = os.path.join(folder, "tiny-00000.rec")
    size = os.path.getsize(shard)
    # Read ahead with a budget of one record (reads go on after the change), or one by one.
    read_options = ReadOptions(budget=1, queue_depth=2) if reads == "ahead" else None
    config = LoaderConfig(batch_size=4, shuffle="none", prefetch=1, num_threads=1, on_error=policy,
                          transform=Resize(size=(24, 24)), read_options=read_options)
    with Loader(folder, config) as loader:
        it = iter(loader)
        next(it)
        if how == "truncate":
            os.truncate(shard, size // 3)
        elif how == "rewrite":  # rewritten in place with other bytes (same size)
            with open(shard, "r+b") as f:
                f.seek(size // 3)
                f.write(b"\\0" * (size - size // 3))
        elif how == "replace":  # a new file renamed over it
            with open(shard + ".new", "wb") as f:
                f.write(b"x" * 100)
            os.replace(shard + ".new", shard)
        elif how == "remove":
            os.unlink(shard)
        taken = 1
        try:
            for _ in it:
                taken += 1
        except DecodeError as exc:
            print("ERROR", exc)
            sys.exit(0)
        print("DONE", taken, loader.stats().skipped)
"""


@pytest.mark.parametrize(
    ("how", "policy", "expect"),
    [
        ("truncate", "raise", "ERROR"),
        ("truncate", "skip", "DONE"),
        ("rewrite", "raise", "ERROR"),
        ("replace", "raise", "DONE"),  # the reader keeps the file it opened: the old bytes, intact
        ("remove", "raise", "DONE"),
    ],
)
@pytest.mark.parametrize("reads", ["ahead", "one-by-one"])
def test_shard_changed_under_a_loader_is_an_error_not_sigbus(packed, how, policy, expect, reads):
    res = _run(_LOADER_SCRIPT, str(packed), how, policy, reads)
    assert res.returncode == 0, _died(res) + res.stderr[-2000:]
    word, *rest = res.stdout.split()
    assert word == expect, res.stdout
    if expect == "ERROR":
        assert "tiny-00000.rec" in res.stdout and "record" in res.stdout
    elif how == "truncate":
        assert int(rest[0]) == 10 and int(rest[1]) > 0  # every batch, the records past the cut skipped and counted
    else:
        assert rest == ["10", "0"]


_LMDB_SCRIPT = """
    import os, sys
    from fastload.errors import CorruptRecordError
    from fastload.records.dataset import open_dataset

    folder = sys.argv[1]
    data = os.path.join(folder, "tiny-00000.lmdb", "data.mdb")
    ds = open_dataset(folder)
    os.truncate(data, os.path.getsize(data) // 2)  # after open: reads find a shorter file
    errors = 0
    for i in range(len(ds)):
        try:
            bytes(ds.image(i))
        except CorruptRecordError as exc:
            errors += 1
            assert "tiny-00000.lmdb" in str(exc), exc
    ds.close()
    try:
        open_dataset(folder)  # at open: the meta page says more pages than the file holds
    except CorruptRecordError as exc:
        print("OPEN", exc)
    print("ERRORS", errors)
"""


def test_truncated_lmdb_is_an_error_not_sigbus(packed_lmdb):
    res = _run(_LMDB_SCRIPT, str(packed_lmdb))
    assert res.returncode == 0, _died(res) + res.stderr[-2000:]
    assert "OPEN" in res.stdout and "truncated" in res.stdout
    errors = int(res.stdout.split("ERRORS")[1].split()[0])
    assert errors > 0


@pytest.mark.parametrize("fmt", ["recordio", "lmdb"])
def test_verify_reports_truncated_shards_without_dying(packed, packed_lmdb, fmt):
    folder = packed if fmt == "recordio" else packed_lmdb
    data = folder / "tiny-00000.rec" if fmt == "recordio" else folder / "tiny-00000.lmdb" / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    res = _cli("verify", str(folder))
    assert res.returncode == 1, _died(res) + res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "BAD" in res.stdout and "truncated" in res.stdout
    assert res.stdout.strip().splitlines()[-1].startswith("FAILED")


# --- containment: nothing a manifest names leaves the dataset folder -------------------------------


def _point_shard_at(folder, name, field="file"):
    manifest = _manifest(folder)
    manifest["shards"][0][field] = name
    write_json_atomic(str(folder / MANIFEST_NAME), manifest)


@pytest.mark.parametrize("where", ["dotdot", "absolute", "proc", "symlink_out"])
def test_manifest_paths_outside_the_dataset_are_refused(packed, tmp_path, where):
    outside = tmp_path / "outside.rec"
    shutil.copy(packed / "tiny-00000.rec", outside)  # a valid shard, so only containment can refuse it
    with open(outside, "r+b") as f:
        f.seek(40)
        f.write(SECRET)
    if where == "dotdot":
        _point_shard_at(packed, "../outside.rec")
    elif where == "absolute":
        _point_shard_at(packed, str(outside))
    elif where == "proc":
        _point_shard_at(packed, "/proc/self/mem")
    else:
        os.unlink(packed / "tiny-00000.rec")
        os.symlink(outside, packed / "tiny-00000.rec")
    with pytest.raises(CorruptDatasetError, match=r"fastload\.json: shards\[0\]\.file: .*(refused|outside)") as info:
        open_dataset(str(packed))
    assert SECRET.decode() not in str(info.value)
    report = verify_dataset(str(packed))
    assert not report.ok and any("shards[0].file" in p for p in report.problems)
    assert not any(SECRET.decode() in p for p in report.problems)
    res = _cli("verify", str(packed))
    assert res.returncode == 1 and "OK" not in res.stdout and SECRET.decode() not in res.stdout + res.stderr


def test_index_path_outside_is_refused_and_symlinks_inside_are_allowed(packed, tmp_path):
    manifest = _manifest(packed)
    manifest["index"]["file"] = "../../etc/passwd"
    write_json_atomic(str(packed / MANIFEST_NAME), manifest)
    with pytest.raises(CorruptDatasetError, match=r"index\.file: .*'\.\.'"):
        open_dataset(str(packed))
    manifest["index"]["file"] = INDEX_NAME
    write_json_atomic(str(packed / MANIFEST_NAME), manifest)
    # A shard that is a symlink to a file inside the folder, and a dataset folder that is a symlink.
    os.rename(packed / "tiny-00000.rec", packed / "real.rec")
    os.symlink("real.rec", packed / "tiny-00000.rec")
    os.symlink(packed, tmp_path / "link")
    with open_dataset(str(tmp_path / "link")) as ds:
        assert len(ds) == 40 and len(bytes(ds.image(39))) > 0
    assert verify_dataset(str(tmp_path / "link")).ok


def test_error_messages_never_quote_file_bytes(tmp_path):
    rec = tmp_path / "x.rec"
    with open(rec, "wb") as f:
        w = recordio.RecordIOWriter(f)
        w.write(recordio.pack_header(1.0, 0) + b"y" * 40, 0)
    (tmp_path / "x.idx").write_bytes(b"0\t0\n" + SECRET + b"\t7\n")
    with pytest.raises(CorruptDatasetError, match=r"x\.idx: line 2: key is not a decimal integer") as info:
        open_dataset(str(rec))
    assert SECRET.decode() not in str(info.value)


# --- damaged metadata: one CorruptDatasetError naming the file and the field -----------------------


def _damage_manifest(folder, edit):
    manifest = _manifest(folder)
    edit(manifest)
    write_json_atomic(str(folder / MANIFEST_NAME), manifest)


_MANIFEST_DAMAGE = {
    "records_string": (lambda m: m.update(records="40"), "records"),
    "records_huge": (lambda m: m.update(records=10**30), "records"),
    "label_width_huge": (lambda m: m.update(label_width=10**9), "label_width"),
    "shards_not_list": (lambda m: m.update(shards="tiny-00000.rec"), "shards"),
    "shard_file_int": (lambda m: m["shards"][0].update(file=3), r"shards\[0\]\.file"),
    "shard_bytes_negative": (lambda m: m["shards"][0].update(bytes=-1), r"shards\[0\]\.bytes"),
    "shard_records_float": (lambda m: m["shards"][0].update(records=40.0), r"shards\[0\]\.records"),
    "records_disagree": (lambda m: m["shards"][0].update(records=41), "records"),
    "version_string": (lambda m: m.update(format_version="3"), "format_version"),
    "version_future": (lambda m: m.update(format_version=99), "format_version"),
    "format_unknown": (lambda m: m.update(format="zip"), "format"),
    "classes_bad": (lambda m: m.update(classes={"a": "x"}), "classes"),
    "index_not_object": (lambda m: m.update(index=[1]), "index"),
    "record_checksum_unknown": (lambda m: m["index"].update(record_checksum="md5"), r"index\.record_checksum"),
}


@pytest.mark.parametrize("case", sorted(_MANIFEST_DAMAGE))
def test_damaged_manifest_fields_are_one_clear_error(packed, case):
    edit, field = _MANIFEST_DAMAGE[case]
    _damage_manifest(packed, edit)
    with pytest.raises(CorruptDatasetError, match=rf"fastload\.json: {field}"):
        open_dataset(str(packed))
    report = verify_dataset(str(packed))
    assert len(report.problems) == 1 and "fastload.json" in report.problems[0]


@pytest.mark.parametrize(
    "text",
    [
        '{"format_version": 3, "records": 1' + "0" * 5000 + "}",  # past Python's int digit limit
        "[" * 100_000 + "]" * 100_000,  # nested past the recursion limit
        "{not json",
        "[1, 2]",
    ],
)
def test_unparseable_manifest_is_one_clear_error(packed, text):
    (packed / MANIFEST_NAME).write_text(text)
    with pytest.raises(CorruptDatasetError, match=r"fastload\.json: "):
        open_dataset(str(packed))
    res = _cli("info", str(packed))
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
    res = _cli("verify", str(packed))
    assert res.returncode == 1 and "Traceback" not in res.stderr


def _npy(header: str, data: bytes = b"") -> bytes:
    text = header.encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


_INDEX_DAMAGE = {
    "unterminated_string": _npy("{'descr': '''<u8, 'fortran_order': False, 'shape': (40,), }"),
    "descr_not_a_dtype": _npy("{'descr': 5, 'fortran_order': False, 'shape': (40,), }"),
    "shape_overflow": _npy("{'descr': '<u8', 'fortran_order': False, 'shape': (10000000000000000000000,), }"),
    "not_a_dict": _npy("[1, 2, 3]"),
    "bad_magic": b"PK\x03\x04" + b"\0" * 100,
    "empty": b"",
}


@pytest.mark.parametrize("case", sorted(_INDEX_DAMAGE))
def test_damaged_index_header_is_one_clear_error(packed, case):
    (packed / INDEX_NAME).write_bytes(_INDEX_DAMAGE[case])
    with pytest.raises(CorruptDatasetError, match=r"fastload-index\.npy: (header|dtype|shape|data)"):
        open_dataset(str(packed))
    res = _cli("verify", str(packed))
    assert res.returncode == 1 and "Traceback" not in res.stderr and "fastload-index.npy" in res.stdout


def test_index_that_disagrees_with_the_manifest_is_one_clear_error(packed):
    index = load_index(str(packed / INDEX_NAME), 1, 40)
    cases = {
        "shard": ("shard", 7),
        "offset": ("offset", 2**64 - 1),
        "data_offset": ("data_offset", 2**31),
        "parts": ("parts", 1),
    }
    for column, (field, value) in cases.items():
        damaged = index.copy()
        damaged[column][5] = value
        write_index(str(packed / INDEX_NAME), damaged)
        with pytest.raises(CorruptDatasetError, match=rf"fastload-index\.npy: {field}"):
            open_dataset(str(packed))
    write_index(str(packed / INDEX_NAME), index[:39])  # a row short of the manifest
    with pytest.raises(CorruptDatasetError, match=r"fastload-index\.npy: shape"):
        open_dataset(str(packed))


def _bare(packed, tmp_path):
    rec, idx = tmp_path / "bare.rec", tmp_path / "bare.idx"
    shutil.copy(packed / "tiny-00000.rec", rec)
    shutil.copy(packed / "tiny-00000.idx", idx)
    return rec, idx, idx.read_text().splitlines()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("forty_digit_offset", r"line 3: offset is not a decimal integer"),
        ("negative_offset", r"line 3: offset is not a decimal integer"),
        ("out_of_order", r"entry 3: offset \d+ is before the offset before it"),
        ("duplicate", r"entry 4: offset \d+ repeats the offset before it"),
        ("short", r"lists records up to byte \d+ of the \d+-byte \.rec: it does not cover the whole file"),
        ("skips_records", r"entry 3: offset \d+ is not where the record before it ends"),
        ("past_the_end", r"entry 40: offset \d+ is past the end"),
        ("not_two_fields", r"line 2: expected key<TAB>offset"),
    ],
)
def test_damaged_idx_is_one_clear_error(packed, tmp_path, case, message):
    rec, idx, lines = _bare(packed, tmp_path)
    key = lambda k: lines[k].split("\t")[0]  # noqa: E731
    if case == "forty_digit_offset":
        lines[2] = key(2) + "\t" + "9" * 40
    elif case == "negative_offset":
        lines[2] = key(2) + "\t-8"
    elif case == "out_of_order":
        lines[1], lines[2] = lines[2], lines[1]
    elif case == "duplicate":
        lines[3] = key(3) + "\t" + lines[2].split("\t")[1]
    elif case == "short":
        lines = lines[:20]
    elif case == "skips_records":
        del lines[2]
    elif case == "past_the_end":
        lines[39] = key(39) + "\t" + str(rec.stat().st_size + 8)
    elif case == "not_two_fields":
        lines[1] = "1\t2\t3"
    idx.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptDatasetError, match=r"bare\.idx: " + message):
        open_dataset(str(rec))
    report = verify_dataset(str(rec))
    assert len(report.problems) == 1 and "bare.idx" in report.problems[0]
    os.unlink(idx)  # without it the .rec is scanned: every record, once
    with open_dataset(str(rec)) as ds:
        assert len(ds) == 40


# --- integrity at load: checksums and labels ----------------------------------------------------------


def _flip_image_byte(folder, record: int, fmt: str = "recordio") -> None:
    with open_dataset(str(folder)) as ds:
        image_len = len(ds.image(record))
        offset, data_offset = int(ds._offset[record]), int(ds._data_offset[record])
        if fmt == "lmdb":
            value_at = int(ds.shards[0]._file.locations()[0][record])
    at = (offset + 8 if fmt == "recordio" else value_at) + data_offset + image_len // 2
    path = folder / "tiny-00000.rec" if fmt == "recordio" else folder / "tiny-00000.lmdb" / "data.mdb"
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x01]))


@pytest.mark.parametrize("fmt", ["recordio", "lmdb"])
def test_flipped_byte_is_a_bad_record_at_load(packed, packed_lmdb, fmt):
    folder = packed if fmt == "recordio" else packed_lmdb
    _flip_image_byte(folder, 17, fmt)
    with open_dataset(str(folder)) as ds:
        assert ds.checksummed
        with pytest.raises(CorruptRecordError, match=r"checksum mismatch.*record 17"):
            ds.image(17)
    config = LoaderConfig(batch_size=8, shuffle="none", num_threads=1, transform=Resize(size=(16, 16)))
    with Loader(str(folder), config) as loader:
        seen = np.concatenate([b.indices.copy() for b in loader])
        assert 17 not in seen.tolist() and loader.stats().skipped == 1
    with (
        Loader(
            str(folder),
            LoaderConfig(
                batch_size=8, shuffle="none", num_threads=1, on_error="raise", transform=Resize(size=(16, 16))
            ),
        ) as loader,
        pytest.raises(DecodeError, match=r"checksum mismatch.*record 17"),
    ):
        list(loader)
    report = verify_dataset(str(folder))
    assert any("record 17" in p and "checksum mismatch" in p for p in report.problems)


def test_labels_outside_the_declared_classes_are_bad_records(packed):
    classes = len(_manifest(packed)["classes"])
    index = load_index(str(packed / INDEX_NAME), 1, 40)
    bad = {3: np.nan, 5: -1.0, 7: 1e30, 9: 2.5, 11: float(classes), 13: np.inf}
    for i, value in bad.items():
        index["labels"][i, 0] = value
    write_index(str(packed / INDEX_NAME), index)
    with open_dataset(str(packed)) as ds:
        for i in bad:
            with pytest.raises(CorruptRecordError, match=rf"label .* (not finite|not a class number).*record {i}\)"):
                ds.image(i)
        bytes(ds.image(4))
    config = LoaderConfig(batch_size=8, shuffle="none", num_threads=1, transform=Resize(size=(16, 16)))
    with Loader(str(packed), config) as loader:
        batches = list(loader)
        seen = set(np.concatenate([b.indices for b in batches]).tolist())
        labels = np.concatenate([b.labels for b in batches])
        assert not seen & set(bad) and loader.stats().skipped == len(bad)
        assert np.isfinite(labels).all() and labels.min() >= 0 and labels.max() < classes
    report = verify_dataset(str(packed))
    assert sum("label" in p for p in report.problems) == len(bad)


def test_indexes_without_checksums_still_open(packed):
    manifest = _manifest(packed)
    index = load_index(str(packed / INDEX_NAME), 1, 40)
    old = np.zeros(40, dtype=index_dtype(1))
    for name in old.dtype.names:
        old[name] = index[name]
    write_index(str(packed / INDEX_NAME), old)
    del manifest["index"]["record_checksum"], manifest["index"]["checksum"]
    manifest["format_version"] = 2
    write_json_atomic(str(packed / MANIFEST_NAME), manifest)
    _flip_image_byte(packed, 17)
    with open_dataset(str(packed)) as ds:
        assert not ds.checksummed
        bytes(ds.image(17))  # not caught at load: nothing to check it against
    report = verify_dataset(str(packed))
    assert any("checksum differs" in p for p in report.problems)  # the whole-shard checksum still is
    assert any("no per-record checksums" in n for n in report.notes)
    manifest["index"]["record_checksum"] = "xxh3_64"  # declared, but the index has none
    write_json_atomic(str(packed / MANIFEST_NAME), manifest)
    with pytest.raises(CorruptDatasetError, match=r"fastload-index\.npy: checksum"):
        open_dataset(str(packed))


def test_verify_never_dies_on_what_it_exists_to_find(packed, tmp_path):
    """Every kind of damage at once, through the command line: a report, exit status 1."""
    _flip_image_byte(packed, 3)
    index = load_index(str(packed / INDEX_NAME), 1, 40)
    index["labels"][8, 0] = np.nan
    write_index(str(packed / INDEX_NAME), index)
    res = _cli("verify", str(packed), "--decode")
    assert res.returncode == 1, _died(res) + res.stderr[-2000:]
    out = res.stdout
    assert "record 3: checksum mismatch" in out and "record 8: label" in out
    assert "record index fastload-index.npy: checksum differs" in out
    assert "Traceback" not in res.stderr
    with open(packed / "tiny-00000.rec", "r+b") as f:  # a shard cut short as well
        f.truncate(1000)
    res = _cli("verify", str(packed))
    assert res.returncode == 1 and "truncated" in res.stdout and "Traceback" not in res.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
@pytest.mark.parametrize("name", ["tiny-00000.rec", INDEX_NAME, "bare.idx"])
def test_verify_and_open_never_block_on_a_fifo(packed, tmp_path, name):
    """A FIFO where a shard, index or .idx should be: refused (opening it must not wait for a writer)."""
    if name == "bare.idx":
        shutil.copy(packed / "tiny-00000.rec", tmp_path / "bare.rec")
        os.mkfifo(tmp_path / name)
        target = str(tmp_path / "bare.rec")
    else:
        os.unlink(packed / name)
        os.mkfifo(packed / name)
        target = str(packed)
    res = _cli("verify", target)  # the timeout of _cli fails the test if anything blocks
    assert res.returncode == 1 and "not a regular file" in res.stdout, res.stdout + res.stderr
    with pytest.raises((CorruptRecordError, CorruptDatasetError), match="not a regular file"):
        open_dataset(target)


def test_signal_module_untouched_by_readers(packed):
    """Library code installs no signal handler (the SIGBUS fix is pread, not a handler)."""
    before = signal.getsignal(signal.SIGBUS)
    with open_dataset(str(packed)) as ds:
        bytes(ds.image(0))
    assert signal.getsignal(signal.SIGBUS) is before


def test_read_checks_benchmark_smoke(packed):
    res = subprocess.run(
        [sys.executable, "-m", "bench.read_checks", "checksums", str(packed), "--pairs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "checksums on/off, cpu: median" in res.stdout and "xxh3_64 alone" in res.stdout


def test_pillow_decode_threads_leave_the_warning_filters_alone(monkeypatch, tiny_folder):
    """warnings.catch_warnings() is process-wide (not thread-safe before Python 3.14): decode threads must not use it."""
    import sys
    import warnings

    from fastload import decode as decode_mod
    from fastload.transforms import CenterCrop

    callers = []
    real_catch, real_simple = warnings.catch_warnings, warnings.simplefilter

    def catch(*args, **kwargs):
        callers.append(sys._getframe(1).f_globals.get("__name__"))
        return real_catch(*args, **kwargs)

    def simple(*args, **kwargs):
        callers.append(sys._getframe(1).f_globals.get("__name__"))
        return real_simple(*args, **kwargs)

    monkeypatch.setattr(warnings, "catch_warnings", catch)
    monkeypatch.setattr(warnings, "simplefilter", simple)
    files = sorted(p for p in tiny_folder.rglob("*") if p.is_file())[:6]
    images = [p.read_bytes() for p in files]
    out = np.empty((len(images), 32, 32, 3), np.uint8)
    before = list(warnings.filters)
    monkeypatch.setattr(decode_mod, "active_backend", lambda: "pillow")
    monkeypatch.setenv("FASTLOAD_DECODER", "pillow")
    res = decode_mod.decode_batch(
        images, out, CenterCrop(size=32, resize=36), seed=0, epoch=0, indices=np.arange(len(images)), threads=2
    )
    assert list(warnings.filters) == before
    assert not [c for c in callers if c and c.startswith("fastload")], callers
    assert res is not None and out.any()
