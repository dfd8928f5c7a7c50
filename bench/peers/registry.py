"""Benchmarks, peers: which peer contenders exist for a dataset, and why others are skipped.

Each peer family runs in one long-lived process (its interpreter is ``--peer-python NAME=PATH``, an
auto-detected ``.venv-NAME/bin/python`` beside the project, or this interpreter). Contenders of a
family share that process, started on first use and closed by :meth:`PeerProcesses.close`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

from ..harness import Contender, PeerContender, PeerProcess, Result, skipped

__all__ = [
    "PeerProcesses",
    "eval_peers",
    "mxnet_peers",
    "peer_python",
    "pipeline_peers",
    "set_overrides",
    "sparse_peers",
]

_HERE = os.path.dirname(os.path.realpath(__file__))
_PROJECT = os.path.dirname(os.path.dirname(_HERE))


def peer_python(name: str, overrides: dict[str, str]) -> str | None:
    """Interpreter for peer ``name``: ``--peer-python`` first, then ``.venv-NAME`` in the project or cwd."""
    if name in overrides:
        return overrides[name]
    for root in (_PROJECT, os.getcwd()):
        candidate = os.path.join(root, f".venv-{name}", "bin", "python")
        if os.path.exists(candidate):
            return candidate
    return None


class PeerProcesses:
    """Lazily started peer processes, one per family; close() ends them all."""

    def __init__(self) -> None:
        self._procs: dict[str, PeerProcess] = {}
        self._argv: dict[str, list[str]] = {}

    def factory(self, key: str, argv: list[str], env: dict[str, str] | None = None):
        self._argv[key] = (argv, env)

        def get() -> PeerProcess:
            if key not in self._procs:
                self._procs[key] = PeerProcess(argv, label=key, env=env)
            return self._procs[key]

        return get

    def spawn_all(self) -> None:
        """Start every registered peer now, so their imports overlap instead of queueing."""
        for key, (argv, env) in self._argv.items():
            if key not in self._procs:
                with contextlib.suppress(Exception):  # the contender's own start() reports it
                    self._procs[key] = PeerProcess(argv, label=key, env=env)

    def close(self) -> None:
        """End every peer process and forget the registrations (the next group registers its own)."""
        self._argv.clear()
        while self._procs:
            _, proc = self._procs.popitem()
            proc.close()


_OVERRIDES: dict[str, str] = {}


def _module_argv(module: str, family: str) -> list[str]:
    """This interpreter running the peer module, or ``--peer-python FAMILY=PATH`` running its file."""
    python = _OVERRIDES.get(family)
    if python:
        return [python, os.path.join(_HERE, f"{module}.py")]
    return [sys.executable, "-m", f"bench.peers.{module}"]


def set_overrides(overrides: dict[str, str]) -> None:
    """Remember ``--peer-python`` for the torch and mxnet peers (dali and ffcv always use theirs)."""
    _OVERRIDES.clear()
    _OVERRIDES.update(overrides)


# MXNet logs every storage fallback (one per CSR batch) unless told not to.
_MXNET_ENV = {"MXNET_STORAGE_FALLBACK_LOG_VERBOSE": "0"}


def _have(module: str) -> bool:
    # With --peer-python for that family, the other interpreter is the one that must have it; its
    # peer reports a skip itself when it does not.
    return module in _OVERRIDES or importlib.util.find_spec(module) is not None


def pipeline_peers(
    data, *, procs: PeerProcesses, threads: int, batch_size: int, quick: bool, overrides: dict[str, str]
) -> tuple[list[Contender], list[Result]]:
    """The train-pipeline peers (RandomResizedCrop 224 + flip, uint8), and the skipped ones."""
    group = "pipeline"
    out: list[Contender] = []
    skips: list[Result] = []
    # torch DataLoader + the torchvision-equivalent Pillow pipeline.
    name = f"torch DataLoader + PIL (num_workers={threads})"
    if not _have("torch"):
        skips.append(skipped(name, group=group, reason="torch is not installed"))
    elif data.images_root is None:
        skips.append(skipped(name, group=group, reason=data.missing.get("images", "no image folder")))
    else:
        out.append(
            PeerContender(
                name,
                process=procs.factory("torch", _module_argv("torch_pil", "torch")),
                kind="train",
                spec={"root": data.images_root, "batch_size": batch_size, "workers": threads},
                group=group,
                threads=threads,
                notes="torchvision-equivalent RandomResizedCrop(224)+flip in Pillow, ImageFolder",
            )
        )
    # MXNet ImageRecordIter, one iterator and num_parts=2 in parallel.
    variants = [(1, f"MXNet ImageRecordIter (preprocess_threads={threads})")]
    if not quick:
        variants.append((2, f"MXNet ImageRecordIter x2 partitions (preprocess_threads={threads})"))
    for parts, name in variants:
        if not _have("mxnet"):
            skips.append(skipped(name, group=group, reason="mxnet is not installed"))
        elif data.rec is None:
            skips.append(skipped(name, group=group, reason=data.missing.get("rec", "no .rec")))
        else:
            out.append(
                PeerContender(
                    name,
                    process=procs.factory("mxnet", _module_argv("mxnet_rec", "mxnet"), _MXNET_ENV),
                    kind="imagerecorditer",
                    group=group,
                    threads=threads,
                    spec={
                        "rec": data.rec,
                        "idx": data.idx,
                        "batch_size": batch_size,
                        "threads": threads,
                        "parts": parts,
                    },
                    notes="random_resized_crop=True, rand_mirror=True, uint8; OpenCV bilinear",
                )
            )
    # NVIDIA DALI's CPU pipeline in its own interpreter.
    python = peer_python("dali", overrides)
    variants = [(True, "DALI CPU pipeline (region decode)")]
    if not quick:
        variants.append((False, "DALI CPU pipeline (full decode)"))
    for region, name in variants:
        if python is None:
            skips.append(
                skipped(
                    name,
                    group=group,
                    reason="no DALI interpreter: run tools/setup_peer_envs.sh "
                    "or pass --peer-python dali=/path/to/python",
                )
            )
        elif data.rec is None:
            skips.append(skipped(name, group=group, reason=data.missing.get("rec", "no .rec")))
        else:
            out.append(
                PeerContender(
                    name,
                    process=procs.factory("dali", [python, os.path.join(_HERE, "dali_cpu.py")]),
                    kind="train",
                    group=group,
                    threads=threads,
                    spec={
                        "rec": data.rec,
                        "idx": data.idx,
                        "batch_size": batch_size,
                        "threads": threads,
                        "region": region,
                    },
                    notes="fn.readers.mxnet, device_id=None, linear antialiased resize",
                )
            )
    # FFCV builds against OpenCV and libturbojpeg dev packages and reads its own .beton file.
    python = peer_python("ffcv", overrides)
    name = f"FFCV loader (num_workers={threads}, RANDOM order)"
    if quick:
        skips.append(skipped(name, group=group, reason="not in --quick (converts the dataset to .beton first)"))
    elif python is None:
        skips.append(
            skipped(
                name,
                group=group,
                reason="no FFCV interpreter: tools/setup_peer_envs.sh ffcv (needs "
                "libopencv-dev, libturbojpeg0-dev) or --peer-python ffcv=PATH",
            )
        )
    elif data.images_root is None:
        skips.append(skipped(name, group=group, reason=data.missing.get("images", "no image folder")))
    else:
        out.append(
            PeerContender(
                name,
                process=procs.factory("ffcv", [python, os.path.join(_HERE, "ffcv_peer.py")]),
                kind="train",
                group=group,
                threads=threads,
                spec={"root": data.images_root, "batch_size": batch_size, "threads": threads},
                notes="RandomResizedCropRGBImageDecoder + flip; .beton re-encoded at quality 90",
            )
        )
    return out, skips


def eval_peers(data, *, procs: PeerProcesses, threads: int, batch_size: int) -> tuple[list[Contender], list[Result]]:
    """The eval-pipeline peer: torch DataLoader with Resize(256) + CenterCrop(224) in Pillow."""
    name = f"torch DataLoader + PIL eval (num_workers={threads})"
    if not _have("torch"):
        return [], [skipped(name, group="eval", reason="torch is not installed")]
    if data.images_root is None:
        return [], [skipped(name, group="eval", reason=data.missing.get("images", "no image folder"))]
    return [
        PeerContender(
            name,
            process=procs.factory("torch", _module_argv("torch_pil", "torch")),
            kind="eval",
            spec={"root": data.images_root, "batch_size": batch_size, "workers": threads},
            group="eval",
            threads=threads,
            notes="Resize(256) + CenterCrop(224) in Pillow",
        )
    ], []


def mxnet_peers(
    data,
    *,
    procs: PeerProcesses,
    threads: int,
    batch_size: int,
    with_mxnet_own: bool,
    group: str = "pipeline",
    reference: bool = False,
) -> tuple[list[Contender], list[Result]]:
    """fastload.mxnet.ImageRecordIter (and, if asked, MXNet's own iterators) in one MXNet process."""
    out: list[Contender] = []
    skips: list[Result] = []
    rows = [
        (f"fastload.mxnet ImageRecordIter (preprocess_threads={threads})", "fastload_imagerecorditer", 1, reference)
    ]
    if with_mxnet_own:
        rows += [
            (f"MXNet ImageRecordIter (preprocess_threads={threads})", "imagerecorditer", 1, False),
            (f"MXNet ImageRecordIter x2 partitions (preprocess_threads={threads})", "imagerecorditer", 2, False),
        ]
    for name, kind, parts, ref in rows:
        if not _have("mxnet"):
            skips.append(skipped(name, group=group, reason="mxnet is not installed"))
        elif data.rec is None:
            skips.append(skipped(name, group=group, reason=data.missing.get("rec", "no .rec")))
        else:
            out.append(
                PeerContender(
                    name,
                    process=procs.factory("mxnet", _module_argv("mxnet_rec", "mxnet"), _MXNET_ENV),
                    kind=kind,
                    group=group,
                    threads=threads,
                    reference=ref,
                    spec={
                        "rec": data.rec,
                        "idx": data.idx,
                        "packed": data.packed,
                        "batch_size": batch_size,
                        "threads": threads,
                        "parts": parts,
                    },
                )
            )
    return out, skips


def sparse_peers(*, procs: PeerProcesses, quick: bool, batch_size: int = 256) -> tuple[list[Contender], list[Result]]:
    """fastload.mxnet.NDArrayIter vs mx.io.NDArrayIter on the same CSR rows (batches/s)."""
    names = [("fastload.mxnet NDArrayIter (CSR)", "fastload", True), ("MXNet NDArrayIter (CSR)", "mxnet", False)]
    if not _have("mxnet"):
        return [], [skipped(n, group="sparse", reason="mxnet is not installed") for n, _, _ in names]
    # The sparse target's case: 250,000 features at ~0.1% density; --quick shrinks it to a smoke size.
    # mx.io.NDArrayIter slices CSR with slice_axis, which has no sparse kernel: every batch
    # densifies the *whole* matrix (rows x features floats; MXNet's default build also refuses
    # 2^31 elements). Its cost per batch grows with the rows, so the epoch is kept to 4 batches
    # (1,024 x 250,000 = 1 GB of temporary dense memory per batch); the note says so.
    spec = {
        "rows": 256 * (2 if quick else 4),
        "features": 20_000 if quick else 250_000,
        "density": 0.001,
        "batch_size": batch_size,
        "seed": 0,
    }
    note = (
        f"{spec['rows']} x {spec['features']} CSR, 0.1% dense, batch {batch_size}, consumer waits for data+label; "
        "MXNet's per-batch cost grows with the rows (dense fallback of slice_axis)"
    )
    return [
        PeerContender(
            n,
            process=procs.factory("mxnet", _module_argv("mxnet_rec", "mxnet"), _MXNET_ENV),
            kind="ndarrayiter_csr",
            spec=dict(spec, impl=impl),
            group="sparse",
            reference=ref,
            unit="batches",
            notes=note,
        )
        for n, impl, ref in names
    ], []
