"""MXNet client scripts run with only the iterator class changed: MXNet's image-classification example
(``train_imagenet.py`` + ``common/data.py`` + ``common/fit.py``, Module on two contexts, dist_sync with
ResizeIter) and a GluonCV-style loop with ``split_and_load`` (scripts in ``tests/mxnet_clients``).

Augmentations whose engine ops this build lacks (``MXNetDefaultAugment``'s rotation / shear / aspect
warp / random crop window, ``MXNetColorAugment``'s colour, HSL and PCA jitter) must make fastload refuse
with MXNet's error type, naming them; once the build has the ops, the same runs must train.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
from PIL import Image

CLIENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_clients")
PY = sys.executable


def _image(i: int) -> bytes:
    """Class i % 3 is red, green or blue dominated."""
    rng = np.random.default_rng(i)
    h, w = 40 + (i % 5) * 4, 48 - (i % 3) * 4
    pixels = rng.integers(0, 90, (h, w, 3))
    pixels[..., i % 3] += 150
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _write(prefix: str, first: int, n: int) -> None:
    writer = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for k in range(n):
        i = first + k
        writer.write_idx(k, mx.recordio.pack(mx.recordio.IRHeader(0, float(i % 3), i, 0), _image(i)))
    writer.close()


@pytest.fixture(scope="module")
def recs(tmp_path_factory):
    root = tmp_path_factory.mktemp("clients")
    _write(str(root / "train"), 0, 72)
    _write(str(root / "val"), 1000, 24)
    return root


def _run(args, timeout=300):
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return subprocess.run([PY, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _imagenet_args(recs, iterator, out, *extra):
    return [
        os.path.join(CLIENTS, "train_imagenet.py"),
        "--iterator",
        iterator,
        "--data-train",
        str(recs / "train.rec"),
        "--data-train-idx",
        str(recs / "train.idx"),
        "--data-val",
        str(recs / "val.rec"),
        "--data-val-idx",
        str(recs / "val.idx"),
        "--image-shape",
        "3,32,32",
        "--num-classes",
        "3",
        "--num-examples",
        "72",
        "--batch-size",
        "12",
        "--data-nthreads",
        "2",
        "--cpus",
        "0,1",
        "--num-epochs",
        "4",
        "--lr",
        "0.01",
        "--disp-batches",
        "2",
        "--rgb-std",
        "58.393,57.12,57.375",
        "--result-json",
        str(out),
        *extra,
    ]


@pytest.mark.parametrize(
    "preset",
    [
        [],
        [
            "--random-resized-crop",
            "1",
            "--min-random-area",
            "0.3",
            "--max-random-aspect-ratio",
            "1.3333",
            "--min-random-aspect-ratio",
            "0.75",
            "--random-mirror",
            "1",
        ],
    ],
    ids=["defaults", "random-resized-crop"],
)
def test_image_classification_example_trains_with_either_iterator(recs, tmp_path, preset):
    scores = {}
    for iterator in ("mxnet", "fastload"):
        out = tmp_path / f"{iterator}.json"
        proc = _run(_imagenet_args(recs, iterator, out, *preset))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Epoch[3] Validation-accuracy" in proc.stderr
        scores[iterator] = json.loads(out.read_text())["val_accuracy"]
    assert scores["fastload"] >= 0.9, scores
    assert scores["mxnet"] >= 0.9, scores  # the data and the script are sound


@pytest.mark.parametrize("level", [1, 2, 3])
def test_aug_levels(recs, tmp_path, level):
    """--aug-level 1 (random crop + mirror), 2 (+ HSL jitter), 3 (+ rotation, shear, aspect)."""
    out = tmp_path / "fastload.json"
    proc = _run(_imagenet_args(recs, "fastload", out, "--aug-level", str(level), "--num-epochs", "1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["val_accuracy"] is not None
    if level == 3:  # the script itself runs every level with MXNet's iterator
        theirs = _run(
            _imagenet_args(recs, "mxnet", tmp_path / "mxnet.json", "--aug-level", str(level), "--num-epochs", "1")
        )
        assert theirs.returncode == 0, theirs.stderr[-3000:]


@pytest.mark.parametrize("color", [False, True], ids=["no-colour", "gluoncv-colour"])
def test_gluoncv_style_loop_with_split_and_load(recs, tmp_path, color):
    common = [
        "--rec-train",
        str(recs / "train.rec"),
        "--rec-train-idx",
        str(recs / "train.idx"),
        "--rec-val",
        str(recs / "val.rec"),
        "--rec-val-idx",
        str(recs / "val.idx"),
        "--num-epochs",
        "4",
    ]
    if not color:
        common.append("--no-color")
    out = tmp_path / "fastload.json"
    proc = _run([os.path.join(CLIENTS, "train_gluon.py"), "--iterator", "fastload", "--result-json", str(out), *common])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["val_accuracy"] >= 0.9
    theirs = _run([os.path.join(CLIENTS, "train_gluon.py"), "--iterator", "mxnet", *common])
    assert theirs.returncode == 0, theirs.stderr[-3000:]


def test_dist_sync_run_wraps_the_iterator_in_resize_iter(recs, tmp_path):
    """fit.py under dist_sync: two workers, each reading its part, ResizeIter(train, epoch_size)."""
    sys.path.insert(0, CLIENTS)
    try:
        from dist import launch_local
    finally:
        sys.path.remove(CLIENTS)
    out = tmp_path / "dist.json"
    args = _imagenet_args(recs, "fastload", out, "--kv-store", "dist_sync", "--num-epochs", "2", "--cpus", "0")
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    codes, stderr = launch_local([PY, *args], workers=2, servers=1, timeout=240, env=env)
    assert codes == [0, 0], stderr[-3000:]
    results = [json.loads((tmp_path / f"dist.json.{r}").read_text()) for r in range(2)]
    assert sorted(r["rank"] for r in results) == [0, 1] and all(r["workers"] == 2 for r in results)
    # 72 records over 2 workers, batches of 12: 3 batches per epoch on each worker.
    assert stderr.count("Resizing training data to 3 batches per machine") == 2
    assert stderr.count("Epoch[1] Time cost") == 2


def test_bench_training_pairs_smoke(recs):
    """bench/mxnet_iters.py's two training-iterator ratios run end to end."""
    from bench.mxnet_iters import TARGETS, data_py_train_kwargs, training_pairs

    kwargs = data_py_train_kwargs(str(recs / "train.rec"), aug_level=3)
    assert (kwargs["fill_value"], kwargs["pad"], kwargs["random_h"], kwargs["max_rotate_angle"]) == (127, 0, 36, 10)
    rows = training_pairs(str(recs / "train.rec"), rounds=1, batch_size=12, size=32, batches=2)
    assert [r.check for r in rows] == list(TARGETS)
    for row in rows:
        assert row.skipped is None and row.median > 0 and row.pairs == 1


def test_bench_iterator_pairs_smoke(recs):
    from bench.mxnet_iters import iterator_pairs

    rows = iterator_pairs(str(recs / "train.rec"), rounds=1, batch_size=12, size=32, rows=512, features=8)
    assert [r.pairs for r in rows] == [1, 1, 1] and all(r.median > 0 for r in rows)
    assert rows[-1].check.startswith("NDArrayIter dense 512x8")
