"""Direct I/O reads of the read-ahead's long runs (fastload.records.direct_reads, ReadOptions(direct=True)).

The reads must give exactly the bytes buffered reads give, whatever the alignment of the range,
including a file's last bytes; keep the views they hand out valid; and fall back, with one warning
naming the shard, on a file system that refuses ``O_DIRECT`` (tmpfs). The loop-device case checks
that direct reads reach the device even with the data in the page cache; it needs root, loop
devices and the cgroup v1 blkio controller, and skips elsewhere with the reason.
"""

from __future__ import annotations

import ctypes
import errno
import os
import tempfile
import warnings

import numpy as np
import pytest
from test_records_data import tiny_folder  # noqa: F401  (fixture)

from bench.cold_contenders import read_only_decode
from bench.slow_device import SlowDevice, unsupported_reason
from fastload.errors import CorruptRecordError
from fastload.loader import Loader, LoaderConfig
from fastload.pack.packer import pack_folder
from fastload.records.dataset import open_dataset
from fastload.records.direct_reads import ALIGN, DIRECT_MIN, DirectIOWarning, DirectReads
from fastload.records.read_buffers import HUGE, ReadBuffers
from fastload.records.readahead import ReadAhead, ReadOptions


def _o_direct_reason(folder: str) -> str | None:
    """Why ``folder``'s file system cannot be read with O_DIRECT here, or None."""
    if not hasattr(os, "O_DIRECT"):
        return "this platform has no O_DIRECT"
    probe = os.path.join(folder, ".o-direct-probe")
    with open(probe, "wb") as fh:
        fh.write(b"x" * ALIGN)
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        return f"{folder} refuses O_DIRECT ({exc.strerror})"
    finally:
        os.unlink(probe)
    os.close(fd)
    return None


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    """24 full-size JPEGs (about 90 KB each): runs long enough to be read directly."""
    from tools.make_dataset import make_dataset

    out = str(tmp_path_factory.mktemp("photos") / "photos")
    make_dataset(out, count=24, seed=5, classes=3, workers=1)
    return out


@pytest.fixture(scope="module", params=["recordio", "lmdb"])
def packed(request, photos, tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp(f"direct-{request.param}"))
    reason = _o_direct_reason(folder)
    if reason is not None:
        pytest.skip(reason)
    out = os.path.join(folder, "ds")
    pack_folder(photos, out, format=request.param, shards=2, progress=False, workers=1)
    return out


def test_direct_reads_equal_buffered_reads_at_any_alignment(packed):
    buffers = ReadBuffers(cap=64 << 20, huge=True)
    with open_dataset(packed) as ds:
        direct = DirectReads(ds)
        try:
            for s, shard in enumerate(ds.shards):
                size = shard.size
                ranges = [(0, 1), (1, ALIGN + 1), (ALIGN - 1, 2 * ALIGN + 1), (ALIGN, 3 * ALIGN), (123, size)]
                ranges += [(size - 1, size), (size - 5000, size), (size - ALIGN - 7, size - 3), (0, size)]
                for a, b in ranges:
                    got = direct.read(s, a, b, buffers.take)
                    assert got is not None, "the file system refused O_DIRECT after accepting it"
                    view, nbytes = got
                    assert bytes(view) == ds.read_extent(s, a, b), (s, a, b)
                    assert nbytes >= b - a and nbytes % ALIGN in (0, size % ALIGN)
            assert not direct.buffered
        finally:
            direct.close()
        with pytest.raises(ValueError, match="closed"):
            direct.read(0, 0, 1, buffers.take)


def test_a_read_past_the_end_of_the_file_names_the_shard(packed):
    buffers = ReadBuffers(cap=64 << 20, huge=True)
    with open_dataset(packed) as ds:
        direct = DirectReads(ds)
        size = ds.shards[0].size
        with pytest.raises(CorruptRecordError, match="truncated") as err:
            direct.read(0, size - 10, size + 10, buffers.take)
        assert os.path.basename(os.path.normpath(ds.shards[0].path)) in str(err.value)
        direct.close()


def test_a_shard_truncated_after_opening_keeps_the_records_before_the_cut(photos, tmp_path):
    reason = _o_direct_reason(str(tmp_path))
    if reason is not None:
        pytest.skip(reason)
    out = str(tmp_path / "ds")
    pack_folder(photos, out, shards=1, name="ds", progress=False, workers=1)
    with open_dataset(out) as ds, ReadAhead(ds, ReadOptions(gap=1 << 20, direct=True)) as ra:
        expected = [bytes(ds.image(i)) for i in range(len(ds))]
        _shard, starts, _ends = ds.extents(np.arange(len(ds), dtype=np.int64))
        os.truncate(ds.shards[0].path, int(starts[10]) + 10)  # records 0-9 stay whole
        ra.begin(np.arange(len(ds), dtype=np.int64))
        views, errors = ra.records(0, len(ds))
        assert sorted(errors) == list(range(10, len(ds)))
        assert all("ds-00000.rec" in errors[i] and "truncated" in errors[i] for i in errors)
        assert [bytes(v) for v in views[:10]] == expected[:10]
        assert ra.counters().direct >= len(ds) - 10  # the failed run was redone record by record


def test_views_stay_valid_while_later_reads_reuse_free_mappings(packed):
    buffers = ReadBuffers(cap=64 << 20, huge=True)
    with open_dataset(packed) as ds:
        direct = DirectReads(ds)
        size = ds.shards[0].size
        kept = direct.read(0, 100, size - 100, buffers.take)
        assert kept is not None
        expected = ds.read_extent(0, 100, size - 100)
        for _ in range(6):  # each view dies at once: its mapping is used again for the next read
            got = direct.read(0, 0, size, buffers.take)
            assert got is not None and bytes(got[0]) == ds.read_extent(0, 0, size)
            del got
        assert buffers.reused >= 4
        direct.close()
        assert bytes(kept[0]) == expected  # the view outlives the reader and later reads


def test_huge_buffers_start_on_a_2_mib_boundary():
    buffers = ReadBuffers(cap=64 << 20, huge=True)
    for n in (ALIGN, 3 << 20, 5 * HUGE + 1):
        view = buffers.take(n)
        assert len(view) == n
        assert ctypes.addressof(ctypes.c_char.from_buffer(view)) % HUGE == 0
    buffers.clear()


@pytest.mark.parametrize("shuffle", ["block", "shard"])
def test_an_epoch_read_directly_equals_dataset_image(packed, shuffle):
    with open_dataset(packed) as ds:
        expected = [bytes(ds.image(i)) for i in range(len(ds))]
        config = LoaderConfig(
            batch_size=8, shuffle=shuffle, block_size=4, window=2, read_options=ReadOptions(gap=1 << 20, direct=True)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", DirectIOWarning)
            loader = Loader(ds, config, decode=read_only_decode)
            seen = {}
            try:
                for batch in loader:
                    for i in batch.indices.tolist():
                        seen[i] = True
                stats = loader.stats()
            finally:
                loader.close()
        assert len(seen) == len(ds)
        assert stats.bytes_read >= sum(len(e) for e in expected)
    with open_dataset(packed) as ds, ReadAhead(ds, ReadOptions(gap=1 << 20, direct=True)) as ra:
        ra.begin(np.arange(len(ds), dtype=np.int64))
        views, errors = ra.records(0, len(ds))
        assert not errors and [bytes(v) for v in views] == expected
        assert ra._odirect is not None and not ra._odirect.buffered


@pytest.mark.parametrize("where", ["tmpfs", "refused"])
def test_a_file_system_without_o_direct_warns_once_and_reads_buffered(photos, tmp_path, monkeypatch, where):
    if where == "tmpfs":
        # tmpfs refuses O_DIRECT before Linux 6.6; later ones accept it (then "refused" covers the case).
        if not os.path.isdir("/dev/shm") or _o_direct_reason("/dev/shm") is None:
            pytest.skip("no tmpfs at /dev/shm that refuses O_DIRECT (Linux 6.6 and later accept it)")
        parent = "/dev/shm"
    else:
        parent = str(tmp_path)
    with tempfile.TemporaryDirectory(dir=parent) as folder:
        out = os.path.join(folder, "ds")
        pack_folder(photos, out, shards=2, name="ds", progress=False, workers=1)
        with open_dataset(out) as ds:
            if where == "refused":
                paths = [sh.path for sh in ds.shards]

                def refuse(shard, flags):
                    raise OSError(errno.EINVAL, "Invalid argument", paths[shard])

                monkeypatch.setattr(ds, "open_direct", refuse)
            expected = [bytes(ds.image(i)) for i in range(len(ds))]
            with pytest.warns(DirectIOWarning, match=r"ds-0000\d\.rec: Invalid argument.*page cache") as caught:
                with ReadAhead(ds, ReadOptions(gap=1 << 20, direct=True)) as ra:
                    ra.begin(np.arange(len(ds), dtype=np.int64))
                    views, errors = ra.records(0, len(ds))
                    assert not errors and [bytes(v) for v in views] == expected
                    assert ra._odirect is not None and ra._odirect.buffered == {0, 1}
            assert len([w for w in caught if w.category is DirectIOWarning]) == 1


def test_datasets_without_shard_files_warn_and_read_buffered(tiny_folder):
    from fastload.records.imagefolder import ImageFolderDataset

    ds = ImageFolderDataset(tiny_folder)
    with pytest.warns(DirectIOWarning, match="no local shard files"):
        ra = ReadAhead(ds, ReadOptions(direct=True))
    ra.close()


def test_huge_pages_off_warns_that_requests_will_be_small(packed, tmp_path, monkeypatch):
    from fastload.records import direct_reads

    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(direct_reads, "_THP_SETTING", str(setting))
    with open_dataset(packed) as ds:
        with pytest.warns(DirectIOWarning, match="huge pages off"):
            reads = DirectReads.for_dataset(ds, True)
        assert reads is not None  # still direct: the reads stay correct, only smaller requests
        reads.close()
    setting.write_text("always [madvise] never\n")
    with open_dataset(packed) as ds, warnings.catch_warnings():
        warnings.simplefilter("error", DirectIOWarning)
        reads = DirectReads.for_dataset(ds, True)
        assert reads is not None
        reads.close()


def test_the_option_is_validated():
    assert ReadOptions().direct is False
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="direct="):
            ReadOptions(direct=bad)  # type: ignore[arg-type]


REASON = unsupported_reason()


@pytest.mark.skipif(REASON is not None, reason=f"no throttled loop device here: {REASON}")
def test_direct_reads_reach_the_loop_device_with_the_data_cached(photos):
    with SlowDevice(size=128 << 20) as dev:
        out = os.path.join(dev.mount_point, "ds")
        pack_folder(photos, out, format="lmdb", shards=2, name="ds", progress=False, workers=1)
        dev.join()
        try:
            with open_dataset(out) as ds:
                expected = [bytes(ds.image(i)) for i in range(len(ds))]  # every value now in the page cache
                total = sum(sh.size for sh in ds.shards)
                for direct, least in ((False, 0), (True, total // 2)):
                    before = dev.counters()
                    with ReadAhead(ds, ReadOptions(gap=1 << 20, direct=direct)) as ra:
                        ra.begin(np.arange(len(ds), dtype=np.int64))
                        views, errors = ra.records(0, len(ds))
                        assert not errors and [bytes(v) for v in views] == expected
                        if direct:
                            assert ra._odirect is not None and not ra._odirect.buffered
                        del views
                    served = dev.counters() - before
                    if direct:
                        assert served.bytes >= least, "direct reads were served from the page cache"
                    else:
                        assert served.bytes < total // 4, "buffered reads of cached data reached the device"
        finally:
            dev.leave()


def test_the_torch_dataloader_reads_directly_and_hands_out_the_same_batches(packed):
    torch = pytest.importorskip("torch")
    from fastload.torch import DataLoader
    from fastload.transforms import CenterCrop

    transform = CenterCrop(size=32, resize=40)

    def batches(**kwargs):
        loader = DataLoader(packed, batch_size=8, shuffle=True, seed=4, num_workers=2, transform=transform, **kwargs)
        try:
            out = [(x.clone(), y.clone()) for x, y in loader]
            # The engine's loader got the options: a fresh one is made per layout, keep what it had.
            used = loader._core.config.read_options if loader._core is not None else None
            return out, used
        finally:
            loader.close()

    plain, _ = batches()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DirectIOWarning)
        direct, used = batches(read_options=ReadOptions(gap=1 << 20, direct=True))
    assert used is not None and used.direct is True
    assert len(plain) == len(direct) == 3
    for (xa, ya), (xb, yb) in zip(plain, direct, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    with pytest.raises(ValueError, match="read_options="):
        DataLoader(packed, batch_size=8, read_options={"direct": True})


def test_only_runs_of_a_mib_and_more_are_read_directly(packed, monkeypatch):
    """Short direct reads cost more than they give (a huge page each, no kernel read-ahead): buffered."""
    with open_dataset(packed) as ds:
        expected = [bytes(ds.image(i)) for i in range(len(ds))]
        for max_read, long_runs in ((1, False), (16 << 20, True)):
            sizes: list[int] = []
            with ReadAhead(ds, ReadOptions(gap=1 << 20, max_read=max_read, direct=True)) as ra:
                assert ra._odirect is not None
                real = ra._odirect.read

                def counted(shard, start, end, take, real=real, sizes=sizes):
                    sizes.append(end - start)
                    return real(shard, start, end, take)

                monkeypatch.setattr(ra._odirect, "read", counted)
                seq = np.random.default_rng(0).permutation(len(ds)).astype(np.int64)
                ra.begin(seq)
                views, errors = ra.records(0, len(ds))
                assert not errors and [bytes(v) for v in views] == [expected[i] for i in seq.tolist()]
                del views
            assert all(n >= DIRECT_MIN for n in sizes)
            assert bool(sizes) is long_runs  # max_read=1: a run per record (about 90 KB), none read directly
