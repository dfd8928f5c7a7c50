"""Device stage under DDP: 2 real CPU processes with the gloo backend.

Each rank iterates ``fastload.torch.DataLoader`` with ``fastload.torch.OrderSampler``, which takes the
rank and world size from ``torch.distributed`` when each epoch starts, and runs one ``all_reduce`` per batch: if the ranks' batch counts differed the
collective would hang, so every wait is bounded (gloo timeout, subprocess timeout) and the test fails
instead of hanging.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
import torch.distributed

if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))

WORKER = textwrap.dedent("""
    import datetime, json, sys
    import torch, torch.distributed as dist
    from fastload.torch import DataLoader, OrderSampler
    from fastload.transforms import train
    from fake_dataset import FakeDataset

    rank, world, port, n, even, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
    ds = FakeDataset(n, label_width=2)  # labels[:, 0] is the record index: shows what each rank read
    result = {"epochs": []}
    # Built before the process group exists (as Lightning does): rank and world size are read when
    # each epoch starts.
    sampler = OrderSampler(ds, shuffle=True, seed=3, even=even)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, transform=train(16), num_threads=1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    with loader:
        result["len"] = len(loader)
        for epoch in range(2):
            loader.set_epoch(epoch)
            seen, batches = [], 0
            for images, labels in loader:
                # A collective per batch: unequal batch counts would hang here.
                total = torch.tensor([images.shape[0]], dtype=torch.int64)
                dist.all_reduce(total)
                batches += 1
                seen += labels[:, 0].to(torch.int64).tolist()
            result["epochs"].append({"batches": batches, "indices": seen})
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as fh:
        json.dump(result, fh)
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, n, even):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1"
    )
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), "2", str(port), str(n), even, str(tmp_path / f"rank{r}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=90)
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs, strict=False):
        assert p.returncode == 0, f"rank failed or hung:\n{out}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize(("n", "even"), [(101, "pad"), (101, "drop")])
def test_ddp_equal_batches_disjoint_shares(tmp_path, n, even):
    r0, r1 = _run(tmp_path, n, even)
    assert r0["len"] == r1["len"]
    for e0, e1 in zip(r0["epochs"], r1["epochs"], strict=False):
        assert e0["batches"] == e1["batches"] == r0["len"]
        a, b = e0["indices"], e1["indices"]
        assert len(a) == len(b)
        if even == "drop":
            assert not set(a) & set(b) and len(set(a) | set(b)) == n - 1
        else:
            assert set(a) | set(b) == set(range(n))
            assert len(set(a) & set(b)) <= 1  # only the padding repeats a record
    assert r0["epochs"][0]["indices"] != r0["epochs"][1]["indices"]  # set_epoch reshuffles
