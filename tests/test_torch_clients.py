"""Real training scripts run with only their DataLoader import changed (tests/clients/).

Each script is run as written (torch's DataLoader) and with ``from torch.utils.data import
DataLoader`` replaced by ``from fastload.torch import DataLoader``; the test compares what the two
runs saw: the order of the samples (targets), structure, dtypes and shapes of the batches, and the
deterministic (evaluation) images within the pixel tolerance of the other tests.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

CLIENTS = Path(__file__).resolve().parent / "clients"
TORCH_IMPORT = "from torch.utils.data import DataLoader\n"
FASTLOAD_IMPORT = "from fastload.torch import DataLoader\n"
TOL_EVAL = 0.02  # mean absolute difference, normalized units


def variant(script: str, tmp: Path, loader: str) -> Path:
    """The client script as written (``loader="torch"``) or with only the import line changed."""
    text = (CLIENTS / script).read_text()
    assert text.count(TORCH_IMPORT) == 1
    if loader == "fastload":
        text = text.replace(TORCH_IMPORT, FASTLOAD_IMPORT)
    path = tmp / f"{loader}_{script}"
    path.write_text(text)
    return path


def env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore::DeprecationWarning", **extra)


def run(args, timeout=300, **extra_env):
    proc = subprocess.run(
        [sys.executable, *map(str, args)], env=env(**extra_env), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def data(realistic_folder, tmp_path_factory):
    """``train/`` (24 ImageNet-sized JPEGs, 4 classes) and ``val/`` (25 small ones, same classes)."""
    from tools.make_dataset import make_dataset

    root = tmp_path_factory.mktemp("clients")
    (root / "train").symlink_to(realistic_folder)
    make_dataset(root / "val", count=25, seed=5, classes=4, tiny=True, workers=1)
    return root


def fastload_warnings(record):
    return [w for w in record["warnings"] if "fastload" in w]


def test_imagenet_example_ddp_two_gloo_processes(data, tmp_path):
    outputs = {}
    for loader in ("torch", "fastload"):
        script = variant("imagenet_main.py", tmp_path, loader)
        port = free_port()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(script),
                    str(data),
                    str(tmp_path / f"{loader}{r}.pt"),
                    "--rank",
                    str(r),
                    "--world-size",
                    "2",
                    "--port",
                    str(port),
                ],
                env=env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(2)
        ]
        try:
            logs = [p.communicate(timeout=300)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for p, log in zip(procs, logs, strict=False):
            assert p.returncode == 0, log[-5000:]
        outputs[loader] = [torch.load(tmp_path / f"{loader}{r}.pt", weights_only=False) for r in range(2)]
    for theirs, ours in zip(outputs["torch"], outputs["fastload"], strict=False):
        assert ours["loader"] == "fastload.torch.dataloader.DataLoader"
        assert theirs["loader"] == "torch.utils.data.dataloader.DataLoader"
        assert not fastload_warnings(ours), ours["warnings"]
        assert ours["val_sampler_len"] == theirs["val_sampler_len"] == 12
        assert len(ours["train"]) == len(theirs["train"]) == 2
        for e_ours, e_theirs in zip(ours["train"], theirs["train"], strict=False):
            assert [b["target"] for b in e_ours] == [b["target"] for b in e_theirs]  # DistributedSampler's order
            assert [(b["shape"], b["dtype"]) for b in e_ours] == [(b["shape"], b["dtype"]) for b in e_theirs]
            assert all(b["min"] > -2.2 and b["max"] < 2.7 for b in e_ours)
        assert ours["train"][0] != ours["train"][1]  # set_epoch reshuffled
        v_ours, v_theirs = ours["val"], theirs["val"]
        assert torch.equal(v_ours["targets"], v_theirs["targets"])  # main loader + the Subset remainder
        assert v_ours["images"].shape == v_theirs["images"].shape and v_ours["images"].dtype == torch.float32
        assert (v_ours["images"] - v_theirs["images"]).abs().mean() < TOL_EVAL
    # Ranks read disjoint shares (12 + 12 training samples per epoch).
    t0 = [t for b in outputs["fastload"][0]["train"][0] for t in b["target"]]
    assert len(t0) == 12


@pytest.mark.parametrize("use_v2", [False, True], ids=["v1", "v2"])
def test_reference_script_with_mixup_cutmix_collate(data, tmp_path, use_v2):
    flags = ["--use-v2"] if use_v2 else []
    out = {}
    for loader in ("torch", "fastload"):
        script = variant("reference_train.py", tmp_path, loader)
        for workers in ("2", "0"):
            path = tmp_path / f"{loader}{workers}.pt"
            run([script, data, path, "-j", workers, *flags])
            out[loader, workers] = torch.load(path, weights_only=False)
    for workers in ("2", "0"):
        ours, theirs = out["fastload", workers], out["torch", workers]
        assert ours["loader"] == "fastload.torch.dataloader.DataLoader"
        assert not fastload_warnings(ours), ours["warnings"]
        assert len(ours["mixed"]) == len(theirs["mixed"]) == 3
        for a, b in zip(ours["mixed"], theirs["mixed"], strict=False):
            assert (
                (a["image"], a["dtype"], a["target"], a["target_dtype"])
                == (b["image"], b["dtype"], b["target"], b["target_dtype"])
                == ([8, 3, 64, 64], "torch.float32", [8, 4], "torch.float32")
            )
            assert all(abs(s - 1.0) < 1e-5 for s in a["target_sums"])  # MixUp / CutMix soft labels
        assert torch.equal(ours["eval_targets"], theirs["eval_targets"])
        assert (ours["eval_images"] - theirs["eval_images"]).abs().mean() < TOL_EVAL
    # What the collate function received (in this process with num_workers=0): the same samples.
    received_ours, received_theirs = out["fastload", "0"]["received"], out["torch", "0"]["received"]
    assert received_ours == received_theirs


def test_lightning_fit_two_processes_and_mid_epoch_resume(data, tmp_path):
    pytest.importorskip("lightning")
    train = data / "train"
    runs = {}

    def fit(name, loader, steps, *extra):
        script = variant("lightning_fit.py", tmp_path, loader)
        # Lightning's launcher starts rank 1 itself; an explicit free port keeps parallel test runs apart.
        run([script, train, tmp_path / name, "--max-steps", steps, *extra], timeout=400, MASTER_PORT=str(free_port()))
        runs[name] = [json.loads((tmp_path / f"{name}.rank{r}.json").read_text()) for r in range(2)]

    fit("torch", "torch", 9)
    fit("fastload", "fastload", 9)
    # ModelCheckpoint saves after step 4 (mid-epoch); the run then fails at step 6.
    fit("part", "fastload", 9, "--every", 4, "--crash-at", 6)
    fit("resumed", "fastload", 9, "--resume-from", tmp_path / "mid.ckpt")
    for r in range(2):
        theirs, ours = runs["torch"][r], runs["fastload"][r]
        assert ours["loader"] == "fastload.torch.dataloader.DataLoader"  # re-instantiated, still fastload's
        assert ours["sampler"] == theirs["sampler"] == "DistributedSampler"
        assert ours["world"] == 2
        assert [s["target"] for s in ours["seen"]] == [s["target"] for s in theirs["seen"]]
        assert {(tuple(s["shape"]), s["dtype"]) for s in ours["seen"]} == {((2, 3, 48, 48), "torch.float32")}
        assert len(ours["seen"]) == 9 and {s["epoch"] for s in ours["seen"]} == {0, 1}
        # Checkpointed after 4 steps, failed at 6, resumed from the checkpoint: the resumed run trains on
        # the batches the uninterrupted run had from step 4 on, across the epoch boundary.
        part, resumed = runs["part"][r]["seen"], runs["resumed"][r]["seen"]
        assert len(part) == 6 and len(resumed) == 5
        assert [s["target"] for s in part[:4] + resumed] == [s["target"] for s in ours["seen"]]
        assert [(s["epoch"], s["idx"]) for s in part[:4] + resumed] == [(s["epoch"], s["idx"]) for s in ours["seen"]]


@pytest.mark.parametrize(
    "flags",
    [
        ["--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--remode", "pixel"],
        ["--aa", "augmix-m3-w2", "--no-prefetcher", "--reprob", "0.25", "--remode", "rand"],
        ["--mixup", "0.8", "--cutmix", "1.0"],
    ],
    ids=["randaugment-prefetcher", "augmix-no-prefetcher", "fast-collate-mixup"],
)
def test_timm_train_script_with_create_loader(data, tmp_path, flags):
    pytest.importorskip("timm")
    out = {}
    for loader in ("torch", "fastload"):
        script = variant("timm_train.py", tmp_path, loader)
        path = tmp_path / f"{loader}.pt"
        run([script, data, path, *flags])
        out[loader] = torch.load(path, weights_only=False)
    ours, theirs = out["fastload"], out["torch"]
    assert ours["loader"] == "fastload.torch.dataloader.DataLoader"
    assert theirs["loader"] == "torch.utils.data.dataloader.DataLoader"
    named = fastload_warnings(ours)
    if "--mixup" in flags:  # timm's FastCollateMixup runs as its collate_fn, named once
        assert len(named) == 1 and "FastCollateMixup" in named[0], named
    else:
        assert not named, named
    assert len(ours["seen"]) == len(theirs["seen"]) == 3  # 24 images, batch 8, drop_last
    for a, b in zip(ours["seen"], theirs["seen"], strict=True):
        assert (a["shape"], a["dtype"], a["target"], a["target_dtype"]) == (
            b["shape"],
            b["dtype"],
            b["target"],
            b["target_dtype"],
        )
        if a["target_sums"] is not None:
            assert all(abs(s - 1.0) < 1e-5 for s in a["target_sums"])  # soft targets
    assert torch.equal(ours["eval_targets"], theirs["eval_targets"])
    assert ours["eval_images"].dtype == theirs["eval_images"].dtype == torch.float32
    assert (ours["eval_images"] - theirs["eval_images"]).abs().mean() < TOL_EVAL
