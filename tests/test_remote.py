"""Remote datasets against a real S3 server on loopback: reading through the per-node cache, the loader
in shard-aware order, exact resume, a server restarted mid-epoch, corrupted objects, a bounded
cache, and where credentials and endpoints come from."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from forked import run_in_fork
from remote_fixtures import (  # noqa: F401
    BUCKET,
    clean_env,
    images_folder,
    packed_folder,
    requires_s3,
    s3_dataset,
    s3_server,
    upload_folder,
)

from fastload.errors import UserError
from fastload.loader import Loader, LoaderConfig
from fastload.records.dataset import open_dataset
from fastload.records.remote.cache import CacheError, ShardCache
from fastload.records.remote.dataset import open_remote_dataset
from fastload.records.remote.fetch import ChecksumMismatch, FetchError, RetryPolicy, fetch_to_file
from fastload.records.remote.storage import RemoteError, RemoteNotFound, RemoteStore
from fastload.transforms import eval_transform

from conftest import wait_for_exit

pytestmark = requires_s3

FAST_RETRY = RetryPolicy(attempts=2, initial_backoff=0.05, max_backoff=0.1)


def _config(**kw):
    base = dict(
        batch_size=5,
        transform=eval_transform(32, resize=36),
        shuffle="shard",
        seed=11,
        num_threads=1,
        prefetch=1,
        window=2,
    )
    base.update(kw)
    return LoaderConfig(**base)


def _epoch(loader):
    return [(b.images.copy(), b.labels.copy(), b.indices.copy()) for b in loader]


def _assert_same(a, b):
    assert len(a) == len(b)
    for (ia, la, xa), (ib, lb, xb) in zip(a, b, strict=False):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(ia, ib)


def test_records_through_the_cache_equal_the_local_ones(s3_dataset, packed_folder, tmp_path):
    url, options = s3_dataset
    cache = tmp_path / "cache"
    local = open_dataset(packed_folder)
    with open_remote_dataset(url, storage_options=options, cache_dir=str(cache)) as ds:
        assert len(ds) == len(local) and ds.label_width == local.label_width
        np.testing.assert_array_equal(ds.labels, local.labels)
        np.testing.assert_array_equal(ds.ids, local.ids)
        for i in range(len(ds)):
            assert bytes(ds.image(i)) == bytes(local.image(i))
            assert bytes(ds.payload(i)) == bytes(local.payload(i))
        assert ds.locate(3) == f"shard {url}/imgs-00000.rec record 3"
        stats = ds.remote_stats()
        assert stats["fetched"] == 8 + 1  # every shard once, plus the index
    # A second open on the same node fetches nothing: manifest, index and shards are cached...
    with open_remote_dataset(url, storage_options=options, cache_dir=str(cache)) as ds:
        assert [bytes(ds.image(i)) for i in range(len(ds))] == [bytes(local.image(i)) for i in range(len(local))]
        assert ds.remote_stats()["fetched"] == 0
    # ...and the complete cache is itself a valid local dataset folder.
    with open_dataset(cache) as copy:
        assert [bytes(copy.image(i)) for i in range(len(copy))] == [bytes(local.image(i)) for i in range(len(local))]
    local.close()


@pytest.mark.parametrize("shuffle", ["shard", "global"])
def test_loader_from_s3_equals_the_local_loader(s3_dataset, packed_folder, tmp_path, shuffle):
    url, options = s3_dataset
    with Loader(str(packed_folder), _config(shuffle=shuffle)) as local_loader:
        reference = [_epoch(local_loader) for _ in range(2)]
    with (
        open_remote_dataset(url, storage_options=options, cache_dir=str(tmp_path / "c"), prefetch_shards=2) as ds,
        Loader(ds, _config(shuffle=shuffle)) as loader,
    ):
        _assert_same(_epoch(loader), reference[0])
        _assert_same(_epoch(loader), reference[1])
        fetched = ds.remote_stats()["fetched"]
        loader.set_epoch(0)
        _assert_same(_epoch(loader), reference[0])
        assert ds.remote_stats()["fetched"] == fetched  # later epochs come from the cache


def test_shard_order_exact_resume_and_open_shards(s3_dataset, tmp_path):
    url, options = s3_dataset
    cache = str(tmp_path / "c")
    with (
        open_remote_dataset(url, storage_options=options, cache_dir=cache, prefetch_shards=1) as ds,
        Loader(ds, _config()) as loader,
    ):
        full = [_epoch(loader) for _ in range(2)]
        # the shard-aware order keeps few shards mapped at once (window 2 + the shard being entered)
        assert len(ds._open) <= 3
    seen = np.sort(np.concatenate([x for _, _, x in full[0]]))
    np.testing.assert_array_equal(np.unique(seen), np.arange(48))
    with open_remote_dataset(url, storage_options=options, cache_dir=cache) as ds, Loader(ds, _config()) as loader:
        it = iter(loader)
        taken = [next(it) for _ in range(3)]
        state = loader.state_dict()
        del taken, it
    with open_remote_dataset(url, storage_options=options, cache_dir=cache) as ds, Loader(ds, _config()) as loader:
        loader.load_state_dict(state)
        rest = _epoch(loader)
        _assert_same(rest, full[0][3:])
        _assert_same(_epoch(loader), full[1])


class _Logged(logging.Handler):
    """Sets ``seen`` when a record containing ``text`` is logged (on whatever thread logs it)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text, self.seen = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def test_server_stopped_and_restarted_mid_epoch(s3_server, packed_folder, tmp_path, caplog):
    url = f"s3://{BUCKET}/restart/packed"
    options = s3_server.storage_options()
    upload_folder(RemoteStore(url, options), packed_folder)
    with (
        open_remote_dataset(url, storage_options=options, cache_dir=str(tmp_path / "ref")) as ds,
        Loader(ds, _config(window=1)) as loader,
    ):
        reference = _epoch(loader)
    # The retries must outlast the restart however slow the machine is: a busy machine has taken
    # longer than 8 jittered waits (about 10 s) to bring the server back. 600 waits of up to 1 s
    # give it minutes, and the epoch goes on within a second of the server answering again.
    policy = RetryPolicy(attempts=600, initial_backoff=0.25, max_backoff=1.0)
    caplog.set_level(logging.WARNING, logger="fastload.remote")
    retrying = _Logged("retrying")
    remote_log = logging.getLogger("fastload.remote")
    remote_log.addHandler(retrying)
    try:
        with (
            open_remote_dataset(
                url, storage_options=options, cache_dir=str(tmp_path / "c"), prefetch_shards=0, retry=policy
            ) as ds,
            Loader(ds, _config(window=1)) as loader,
        ):
            got = []
            restarter = None
            for k, batch in enumerate(loader):
                got.append((batch.images.copy(), batch.labels.copy(), batch.indices.copy()))
                if k == 1:
                    s3_server.stop()  # mid-epoch: most shards are not fetched yet

                    def restart():
                        # Back once a fetch has failed and waits to retry: the outage was seen mid-epoch.
                        retrying.seen.wait(60)
                        s3_server.start()

                    restarter = threading.Thread(target=restart)
                    restarter.start()
            restarter.join()
    finally:
        remote_log.removeHandler(retrying)
    _assert_same(got, reference)
    assert any("retrying" in r.getMessage() and url in r.getMessage() for r in caplog.records)


def test_corrupted_object_is_reported_and_refetched(s3_server, packed_folder, tmp_path, caplog):
    url = f"s3://{BUCKET}/corrupt/packed"
    options = s3_server.storage_options()
    store = RemoteStore(url, options)
    upload_folder(store, packed_folder)
    name = "imgs-00002.rec"
    good = (packed_folder / name).read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    store.put_bytes(name, bytes(bad))

    class Repair(logging.Handler):  # the operator re-uploads the object once the mismatch is reported
        def emit(self, record):
            if "checksum mismatch" in record.getMessage():
                store.put_bytes(name, good)

    handler = Repair()
    logging.getLogger("fastload.remote").addHandler(handler)
    caplog.set_level(logging.WARNING, logger="fastload.remote")
    try:
        local = open_dataset(packed_folder)
        with open_remote_dataset(
            url,
            storage_options=options,
            cache_dir=str(tmp_path / "c"),
            retry=RetryPolicy(attempts=3, initial_backoff=0.05, max_backoff=0.1),
        ) as ds:
            assert [bytes(ds.image(i)) for i in range(len(ds))] == [bytes(local.image(i)) for i in range(len(local))]
        local.close()
    finally:
        logging.getLogger("fastload.remote").removeHandler(handler)
    messages = [r.getMessage() for r in caplog.records]
    assert any("checksum mismatch" in m and store.url_of(name) in m for m in messages)
    assert (tmp_path / "c" / name).read_bytes() == good


def test_corruption_that_persists_fails_naming_the_url_and_is_never_used(s3_server, packed_folder, tmp_path):
    url = f"s3://{BUCKET}/corrupt2/packed"
    options = s3_server.storage_options()
    store = RemoteStore(url, options)
    upload_folder(store, packed_folder)
    name = "imgs-00001.rec"
    data = bytearray((packed_folder / name).read_bytes())
    data[100] ^= 0x01
    store.put_bytes(name, bytes(data))
    cache = tmp_path / "c"
    with open_remote_dataset(url, storage_options=options, cache_dir=str(cache), retry=FAST_RETRY) as ds:
        first_of_shard_1 = int(ds.shard_starts[1])
        with pytest.raises(ChecksumMismatch, match="checksum mismatch") as info:
            ds.image(first_of_shard_1)
        assert store.url_of(name) in str(info.value)
        with Loader(ds, _config(shuffle="none")) as loader, pytest.raises(FetchError, match=name):
            _epoch(loader)  # not skipped as bad records: the run stops with the reason
    assert not (cache / name).exists()
    assert not [p for p in cache.iterdir() if p.name.endswith(".part")]
    # a truncated object too
    store.put_bytes(name, bytes(data[:-10]))
    with open_remote_dataset(url, storage_options=options, cache_dir=str(tmp_path / "c2"), retry=FAST_RETRY) as ds:
        with pytest.raises(ChecksumMismatch, match="partial download"):
            ds.image(int(ds.shard_starts[1]))


def test_cache_limit_smaller_than_the_dataset_evicts_and_stays_bounded(s3_dataset, packed_folder, tmp_path):
    url, options = s3_dataset
    sizes = [e["bytes"] for e in json.loads((packed_folder / "fastload.json").read_text())["shards"]]
    limit = 3 * max(sizes)
    assert limit < sum(sizes)
    cache = tmp_path / "c"
    with (
        open_remote_dataset(
            url, storage_options=options, cache_dir=str(cache), cache_limit=limit, prefetch_shards=1
        ) as ds,
        Loader(ds, _config(window=1)) as loader,
    ):
        peak = 0
        epochs = []
        for _ in range(2):
            batches = []
            for batch in loader:
                batches.append(batch.indices.copy())
                peak = max(peak, ds.cache.cached_bytes())
            epochs.append(np.concatenate(batches))
        fetched = ds.remote_stats()["fetched"]
    assert peak <= limit
    assert fetched > len(sizes) + 1, "a bounded cache must have evicted and refetched shards"
    for seen in epochs:
        np.testing.assert_array_equal(np.unique(seen), np.arange(48))
    with pytest.raises(UserError, match="cache_limit"):
        open_remote_dataset(url, storage_options=options, cache_dir=str(cache), cache_limit=-5)


def test_cache_limit_below_one_shard_is_a_clear_error(s3_dataset, tmp_path):
    url, options = s3_dataset
    from fastload.records.remote.cache import CacheFullError

    with open_remote_dataset(url, storage_options=options, cache_dir=str(tmp_path / "c"), cache_limit=1000) as ds:
        with pytest.raises(CacheFullError, match="cannot hold shard"):
            ds.image(0)


_TWO_RANKS = r"""
import json, os, sys
import torch.distributed as dist
from fastload.records.remote.dataset import open_remote_dataset
from fastload.torch import DataLoader, OrderSampler
from fastload.transforms import eval_transform
rank = int(sys.argv[1]); out = sys.argv[2]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[3], rank=rank, world_size=2)
opts = json.loads(os.environ["S3_OPTIONS"])
ds = open_remote_dataset(os.environ["S3_URL"], storage_options=opts, cache_dir=os.environ["CACHE"],
                         prefetch_shards=1)
sampler = OrderSampler(ds, shuffle="shard", seed=2, window=1)
loader = DataLoader(ds, batch_size=4, sampler=sampler, transform=eval_transform(32, resize=36), num_threads=1,
                    prefetch=1)
epochs = []
for epoch in range(2):
    loader.set_epoch(epoch)
    epochs.append([labels.tolist() for _, labels in loader])
    dist.barrier()
indices = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    indices.append([int(i) for i in sampler])
json.dump({"batches": [len(e) for e in epochs], "indices": indices, "stats": ds.remote_stats()}, open(out, "w"))
loader.close(); ds.close(); dist.destroy_process_group()
"""


def test_two_ranks_share_one_cache_without_fetching_a_shard_twice(s3_dataset, tmp_path):
    pytest.importorskip("torch")
    import socket

    url, options = s3_dataset
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "rank.py"
    script.write_text(_TWO_RANKS)
    env = dict(os.environ, S3_URL=url, S3_OPTIONS=json.dumps(options), CACHE=str(tmp_path / "node-cache"))
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / f"r{r}.json"), port], env=env)
        for r in range(2)
    ]
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0]
    results = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert results[0]["batches"] == results[1]["batches"], "equal batch counts on every rank"
    for epoch in range(2):
        seen = results[0]["indices"][epoch] + results[1]["indices"][epoch]
        assert sorted(set(seen)) == list(range(48)) and len(seen) == 48
    fetched = sum(r["stats"]["fetched"] for r in results)
    # 8 shards + the index, each fetched once on this node, however the two ranks raced.
    assert fetched == 9


class _RecordBytes:
    """A map-style torch dataset over a fastload dataset: (record bytes, index, worker pid)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return bytes(self.ds.image(i)), i, os.getpid()


def _helper_orphans() -> list[int]:
    """Storage helper processes that are not this process's own (theirs should exit with them)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"fastload.records.remote.spawned" in cmd and ppid != os.getpid():
            found.append(int(pid))
    return found


def test_forked_dataloader_workers_read_through_the_cache(s3_dataset, packed_folder, tmp_path):
    """torch's DataLoader forks its workers (Linux's default) after the parent has used the storage
    client, which cannot run in a forked process: the workers download through helper processes,
    read the same bytes as the local dataset, and leave no process behind."""
    torch = pytest.importorskip("torch")
    url, options = s3_dataset
    with open_remote_dataset(url, storage_options=options, cache_dir=str(tmp_path / "cache")) as ds:
        ds.will_read(range(len(ds)))  # the parent prefetches while the workers start (fork mid-download)
        loader = torch.utils.data.DataLoader(
            _RecordBytes(ds), batch_size=4, num_workers=2, multiprocessing_context="fork", collate_fn=list
        )
        got, workers = {}, set()
        for epoch in range(2):
            for batch in loader:
                for data, i, pid in batch:
                    got.setdefault(i, set()).add(data)
                    workers.add(pid)
    assert len(workers) == 4 and os.getpid() not in workers  # two new workers each epoch
    with open_dataset(str(packed_folder)) as local:
        assert sorted(got) == list(range(len(local)))
        for i, seen in got.items():
            assert seen == {bytes(local.image(i))}
    deadline = time.monotonic() + 15
    for pid in _helper_orphans():  # each waited for through its pidfd
        wait_for_exit(pid, deadline - time.monotonic())
    assert _helper_orphans() == []


def test_spawned_dataloader_workers_reopen_the_remote_dataset(s3_dataset, packed_folder, tmp_path):
    """A spawned worker unpickles the dataset as its URL, options and cache folder, and reopens it."""
    torch = pytest.importorskip("torch")
    from fastload.torch import ImageDataset

    url, options = s3_dataset
    cache = tmp_path / "cache"
    with open_remote_dataset(url, storage_options=options, cache_dir=str(cache)) as ds:
        loader = torch.utils.data.DataLoader(
            ImageDataset(ds), batch_size=8, num_workers=2, multiprocessing_context="spawn", collate_fn=list
        )
        got = [(np.asarray(img), target) for batch in loader for img, target in batch]
        assert ds.remote_stats()["fetched"] == 1  # the index, at open: the workers fetched the shards
    local = ImageDataset(str(packed_folder))
    assert len(got) == len(local)
    for (img, target), i in zip(got, range(len(local)), strict=True):
        ref_img, ref_target = local[i]
        assert target == ref_target
        np.testing.assert_array_equal(img, np.asarray(ref_img))
    local.close()
    assert sorted(p.name for p in cache.iterdir() if p.name.endswith(".rec")) == sorted(
        p.name for p in packed_folder.iterdir() if p.name.endswith(".rec")
    )


def test_a_forked_process_gets_storage_errors_not_a_hang(s3_dataset, tmp_path):
    url, options = s3_dataset
    store = RemoteStore(url, options)
    assert store.exists("fastload.json")  # the client has started in this process

    def in_child():
        out = []
        try:
            store.get_bytes("no-such-object")
        except RemoteNotFound as exc:
            out.append(exc.url)
        out.append(len(store.get_bytes("fastload.json")))
        out.append(store.head("fastload.json").size)
        fetch_to_file(store, "fastload.json", str(tmp_path / "m.json"))
        out.append(os.path.getsize(tmp_path / "m.json"))
        try:
            store.store  # the raw client would hang here: refused instead
        except RemoteError as exc:
            out.append("refused" if "fork" in str(exc) else str(exc))
        return out

    result = run_in_fork(in_child)
    size = store.head("fastload.json").size
    assert result == [store.url_of("no-such-object"), size, size, size, "refused"]


def test_settings_from_env_and_aws_files(s3_server, s3_dataset, packed_folder, tmp_path, monkeypatch):
    url, _ = s3_dataset
    clean_env(monkeypatch)
    # 1. The standard environment variables (AWS_ENDPOINT_URL included).
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    with open_remote_dataset(url, cache_dir=str(tmp_path / "a")) as ds:
        assert len(ds) == 48
    clean_env(monkeypatch)
    # 2. ~/.aws files only: profile with credentials, region and endpoint_url.
    config, creds = tmp_path / "aws-config", tmp_path / "aws-credentials"
    config.write_text(f"[profile lab]\nregion = us-east-1\nendpoint_url = {s3_server.endpoint}\n")
    creds.write_text("[lab]\naws_access_key_id = from-file\naws_secret_access_key = secret-from-file\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "lab")
    store = RemoteStore(url)
    assert store.store.config["access_key_id"] == "from-file"
    assert store.store.config["endpoint"] == s3_server.endpoint
    with open_remote_dataset(url, cache_dir=str(tmp_path / "b")) as ds:
        assert bytes(ds.image(5)) == bytes(open_dataset(packed_folder).image(5))
    # 3. Without any of them no endpoint is known: the default (AWS) is unreachable here; the
    #    options alone are enough again.
    clean_env(monkeypatch)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with open_remote_dataset(url, storage_options=s3_server.storage_options(), cache_dir=str(tmp_path / "c")) as ds:
        assert len(ds) == 48
    # s3fs-style client_kwargs work too
    opts = {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": s3_server.endpoint, "region_name": "us-east-1"},
    }
    with open_remote_dataset(url, storage_options=opts, cache_dir=str(tmp_path / "d")) as ds:
        assert len(ds) == 48


def test_plain_http_url(s3_dataset, s3_server, packed_folder, tmp_path):
    # SeaweedFS also serves objects to anonymous HTTP GETs: the same dataset as an https?:// URL.
    http_url = f"{s3_server.endpoint}/{BUCKET}/datasets/packed"
    local = open_dataset(packed_folder)
    with open_remote_dataset(http_url, cache_dir=str(tmp_path / "h")) as ds:
        assert [bytes(ds.image(i)) for i in range(len(ds))] == [bytes(local.image(i)) for i in range(len(local))]
    local.close()


def test_errors_name_the_url_and_never_hang(s3_server, s3_dataset, tmp_path):
    url, options = s3_dataset
    with pytest.raises(UserError, match=f"s3://{BUCKET}/nothing-here/fastload.json"):
        open_remote_dataset(f"s3://{BUCKET}/nothing-here", storage_options=options, cache_dir=str(tmp_path / "x"))
    # A server nobody answers at: the error names the URL, within the retry budget.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    dead_opts = dict(options, endpoint_url=f"http://127.0.0.1:{dead}", connect_timeout=1)
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=f"s3://{BUCKET}/datasets/packed/fastload.json"):
        open_remote_dataset(url, storage_options=dead_opts, cache_dir=str(tmp_path / "y"))
    assert time.monotonic() - t0 < 60
    store = RemoteStore(url, options)
    with pytest.raises(RemoteNotFound, match="missing.rec"):
        fetch_to_file(store, "missing.rec", str(tmp_path / "m"), policy=FAST_RETRY)
    with pytest.raises(UserError, match="not a remote URL"):
        RemoteStore("/local/path")
    with pytest.raises(UserError, match="cannot set up"):
        RemoteStore(url, {"no_such_setting": 1}).store


def test_a_cache_folder_belongs_to_one_dataset_and_dead_readers_are_cleared(s3_dataset, tmp_path):
    url, options = s3_dataset
    cache = tmp_path / "c"
    with open_remote_dataset(url, storage_options=options, cache_dir=str(cache)) as ds:
        readers = ds.cache.readers()
        assert len(readers) == 1
    with pytest.raises(CacheError, match="holds a cache of"):
        ShardCache(str(cache), RemoteStore(f"s3://{BUCKET}/other", options))
    # A reader that died without closing (kill -9) leaves files whose lock nobody holds.
    folder = cache / ".fastload-cache" / "readers"
    (folder / "ghost.lock").write_text("")
    (folder / "ghost.json").write_text(json.dumps({"id": "ghost", "pinned": ["imgs-00000.rec"], "upcoming": []}))
    assert ShardCache(str(cache), RemoteStore(url, options)).readers() == []
    assert not (folder / "ghost.json").exists()
