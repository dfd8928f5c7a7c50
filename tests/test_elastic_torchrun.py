"""An elastic job on loopback: processes die, the job resumes from its checkpoint with fewer, then more ranks.

Three ``torchrun`` jobs (gloo on 127.0.0.1) train a tiny model over a packed dataset whose label
is the record's index, with ``fastload.torch.DataLoader`` and ``OrderSampler`` (shard order),
checkpointing model, optimizer and loader state (rank 0's) every few steps:

1. 4 processes from scratch; one kills itself with SIGKILL in the middle of epoch 0, the agent
   stops the others;
2. 3 processes resume from the last checkpoint, finish epoch 0, run epoch 1, and one of them is
   killed in the middle of epoch 2;
3. 5 processes resume from the last checkpoint, finish epoch 2 and run epoch 3.

Counting from each checkpoint (what a killed job consumed after its last checkpoint is replayed, as
its model updates are), every record is seen exactly once per epoch, up to the padding that keeps
ranks equal; every rank of a job gets the same number of batches; the whole epochs after a resume
are exactly what a fresh job of that size gives; nothing hangs (every wait has a deadline) and no
process is left at the end.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed

if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from fastload.order import EpochOrder, OrderSpec
from fastload.records.dataset import open_dataset

RECORDS, BATCH, EVERY, EPOCHS, SEED = 150, 4, 3, 4, 5

TRAIN = r"""
import datetime, json, os, signal
import torch
import torch.distributed as dist
from fastload.records.dataset import open_dataset
from fastload.torch import DataLoader, OrderSampler
from fastload.transforms import eval_transform

out, ckpt_path, job = os.environ["OUT"], os.environ["CKPT"], os.environ["JOB"]
kill = os.environ.get("KILL", "")
epochs, every = int(os.environ["EPOCHS"]), int(os.environ["EVERY"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
ds = open_dataset(os.environ["DATA"])
sampler = OrderSampler(ds, shuffle="shard", seed=int(os.environ["SEED"]), window=2)  # ranks from the group
loader = DataLoader(ds, batch_size=int(os.environ["BATCH"]), sampler=sampler, transform=eval_transform(8, resize=10),
                    num_threads=1, prefetch=2)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3 * 8 * 8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
if os.path.exists(ckpt_path):
    ckpt = torch.load(ckpt_path, weights_only=True)  # the loader state is plain data
    model.module.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    loader.load_state_dict(ckpt["loader"])
    step = ckpt["step"]
start = sampler.epoch  # after load_state_dict: the epoch the saved position is in
log = open(os.path.join(out, f"{job}-rank{rank}.jsonl"), "a")
def note(**kw):
    log.write(json.dumps(kw) + "\n")
    log.flush()
note(start=start, world=world, step=step)
for epoch in range(start, epochs):
    loader.set_epoch(epoch)  # the loaded epoch keeps the saved position
    for images, ids in loader:
        x = images.float().flatten(1) / 255
        loss = ((model(x).squeeze(1) - ids.float() / 100) ** 2).mean()
        opt.zero_grad()
        loss.backward()  # DDP all-reduce: a rank with fewer batches would hang here
        opt.step()
        step += 1
        note(epoch=epoch, step=step, ids=ids.tolist())
        if kill == f"{rank}:{step}":
            os.kill(os.getpid(), signal.SIGKILL)
        if step % every == 0:
            state = loader.state_dict()
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "loader": state,
                            "step": step}, ckpt_path + ".tmp")
                os.replace(ckpt_path + ".tmp", ckpt_path)
            dist.barrier()  # every rank knows the checkpoint is written
            note(ckpt=step)
note(done=True)
loader.close()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def packed(tiny_folder, tmp_path_factory):
    """``RECORDS`` records in 6 shards; the label of record ``i`` is ``i``."""
    from fastload.pack.packer import pack_folder

    root = tmp_path_factory.mktemp("elastic")
    files = sorted(p for p in Path(tiny_folder).rglob("*.JPEG"))
    lst = root / "records.lst"
    lst.write_text("".join(f"{i}\t{i}\t{files[i % len(files)]}\n" for i in range(RECORDS)))
    pack_folder(str(lst), str(root / "packed"), shards=6, progress=False)
    with open_dataset(str(root / "packed")) as ds:
        assert ds.labels[:, 0].tolist() == list(range(RECORDS)) and len(ds.shard_starts) == 7
        starts = tuple(int(s) for s in ds.shard_starts)
    return root / "packed", starts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(job: str, procs: int, tmp_path: Path, data: Path, kill: str = "") -> tuple[int, str]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = dict(
        os.environ,
        OUT=str(tmp_path),
        CKPT=str(tmp_path / "checkpoint.pt"),
        JOB=job,
        KILL=kill,
        DATA=str(data),
        EPOCHS=str(EPOCHS),
        EVERY=str(EVERY),
        BATCH=str(BATCH),
        SEED=str(SEED),
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={procs}",
        "--max-restarts=0",
        "--master-addr=127.0.0.1",
        f"--master-port={_free_port()}",
        "--monitor-interval=0.2",
        str(script),
    ]
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Every process the job started (the agent and its workers share its process group) is gone.
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        pass
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"job {job}: processes were left running after torchrun returned")
    return proc.returncode, out


def _read(tmp_path: Path, job: str, procs: int) -> list[list[dict]]:
    return [
        [json.loads(line) for line in (tmp_path / f"{job}-rank{r}.jsonl").read_text().splitlines()]
        for r in range(procs)
    ]


def _fresh(starts, world: int, epoch: int) -> list[list[list[int]]]:
    out = []
    for rank in range(world):
        spec = OrderSpec(
            num_records=RECORDS,
            batch_size=BATCH,
            shuffle="shard",
            seed=SEED,
            rank=rank,
            world_size=world,
            window=2,
            shard_starts=starts,
        )
        order = EpochOrder(spec, epoch)
        out.append([order[k].tolist() for k in range(len(order))])
    return out


def test_killed_job_resumes_with_three_then_five_processes(packed, tmp_path):
    data, starts = packed
    plan = [("a", 4, "2:7"), ("b", 3, "1:31"), ("c", 5, "")]  # (job, processes, rank:step to SIGKILL)
    counted: dict[str, list[list[dict]]] = {}
    for job, procs, kill in plan:
        rc, out = _torchrun(job, procs, tmp_path, data, kill)
        if kill:
            assert rc != 0, f"job {job}: the killed job did not fail:\n{out[-3000:]}"
        else:
            assert rc == 0, f"job {job} failed:\n{out[-4000:]}"
        logs = _read(tmp_path, job, procs)
        assert all(rows[0]["world"] == procs for rows in logs)
        if kill:
            # What counts of a killed job: up to its last checkpoint (the rest is replayed).
            last = max(row["ckpt"] for row in logs[0] if "ckpt" in row)
            logs = [[row for row in rows if "ids" not in row or row["step"] <= last] for rows in logs]
        else:
            assert all(rows[-1] == {"done": True} for rows in logs)
        counted[job] = [[row for row in rows if "ids" in row] for rows in logs]
    # The resumed jobs started where the checkpoints said: job b in epoch 0, job c in epoch 2.
    assert [_read(tmp_path, j, p)[0][0]["start"] for j, p, _ in plan] == [0, 0, 2]
    for epoch in range(EPOCHS):
        seen: collections.Counter = collections.Counter()
        worlds = 0
        for job, procs, _ in plan:
            per_rank = [[row["ids"] for row in rows if row["epoch"] == epoch] for rows in counted[job]]
            if not any(per_rank):
                continue
            worlds += procs
            assert len({len(b) for b in per_rank}) == 1, f"epoch {epoch}, job {job}: unequal batch counts"
            seen.update(i for batches in per_rank for b in batches for i in b)
        assert set(seen) == set(range(RECORDS)), f"epoch {epoch}: records never seen"
        assert sum(seen.values()) - RECORDS <= worlds, f"epoch {epoch}: more repeats than padding"
    # Whole epochs after a resume are a fresh job's of that size.
    for job, procs, epoch in (("b", 3, 1), ("c", 5, 3)):
        got = [[row["ids"] for row in rows if row["epoch"] == epoch] for rows in counted[job]]
        assert got == _fresh(starts, procs, epoch), f"job {job}, epoch {epoch}"
