"""Two "nodes" x two processes with torchrun on loopback train a tiny model over an S3 dataset: each
node has its own cache folder, every rank gets the same number of batches, every record is seen once
per epoch across the ranks (up to padding), and nothing hangs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from remote_fixtures import images_folder, packed_folder, requires_s3, s3_dataset, s3_server  # noqa: F401

pytestmark = requires_s3
torch = pytest.importorskip("torch")

TRAIN = r"""
import json, os, sys
import numpy as np
import torch
import torch.distributed as dist
from fastload.order import EpochOrder
from fastload.records.dataset import open_dataset
from fastload.order import OrderSpec
from fastload.torch import DataLoader, OrderSampler
from fastload.transforms import eval_transform

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ds = open_dataset(os.environ["S3_URL"], storage_options=json.loads(os.environ["S3_OPTIONS"]),
                  cache_dir=os.environ["NODE_CACHE"], prefetch_shards=1)
loader = DataLoader(ds, batch_size=4, sampler=OrderSampler(ds, shuffle="shard", seed=5, window=1),
                    transform=eval_transform(16, resize=18), num_threads=1, prefetch=1)
spec = OrderSpec(num_records=len(ds), batch_size=4, shuffle="shard", seed=5, rank=rank, world_size=world, window=1,
                 shard_starts=tuple(int(s) for s in ds.shard_starts))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3 * 16 * 16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
report = {"rank": rank, "world": world, "batches": [], "indices": [], "losses": []}
for epoch in range(2):
    loader.set_epoch(epoch)
    order = EpochOrder(spec, epoch)
    n = 0
    for k, (images, labels) in enumerate(loader):
        # What the loader yielded is the order's batch k (labels checked against the dataset's).
        assert np.array_equal(labels.numpy(), ds.labels[order[k], 0].astype(np.int64)), (epoch, k)
        x = images.float().flatten(1) / 255
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()  # DDP all-reduce: a rank with fewer batches would hang here
        opt.step()
        report["losses"].append(float(loss))
        report["indices"].append([epoch, [int(i) for i in order[k]]])
        n += 1
    report["batches"].append(n)
report["stats"] = ds.remote_stats()
json.dump(report, open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w"))
loader.close(); ds.close(); dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_two_processes_train_over_s3(s3_dataset, tmp_path):
    url, options = s3_dataset
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    port = _free_port()
    procs = []
    for node in range(2):
        env = dict(
            os.environ,
            S3_URL=url,
            S3_OPTIONS=json.dumps(options),
            OUT=str(tmp_path),
            NODE_CACHE=str(tmp_path / f"node{node}-cache"),
            OMP_NUM_THREADS="1",
        )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            str(script),
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert {r["world"] for r in reports} == {4}
    assert len({tuple(r["batches"]) for r in reports}) == 1, "every rank the same number of batches"
    for epoch in range(2):
        seen = [i for r in reports for e, batch in r["indices"] if e == epoch for i in batch]
        assert set(seen) == set(range(48)) and len(seen) == 48  # 48 records, 4 ranks x 12: no padding needed
    assert all(np.isfinite(r["losses"]).all() for r in reports)
    # Each node's cache holds only what its ranks read; the two nodes fetched separately.
    for node in range(2):
        assert any((tmp_path / f"node{node}-cache").glob("*.rec"))
    fetched = [r["stats"]["fetched"] for r in reports]
    assert sum(fetched[:2]) <= 8 + 1 and sum(fetched[2:]) <= 8 + 1  # never a shard twice on one node
