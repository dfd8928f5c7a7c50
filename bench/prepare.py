"""Benchmarks, inputs: the dataset a benchmark runs on, in every form the contenders need.

fastload reads packed shards, the torch peer reads the JPEG files through an ImageFolder, MXNet and
DALI read one ``.rec`` with its ``.idx``. :func:`prepare` turns whatever the user gave (nothing, an
image folder, a packed fastload folder, a bare ``.rec``) into all of these, in a temporary folder
that :meth:`BenchData.close` removes, and records why a form is missing so the contenders that need
it are reported as skipped instead of vanishing.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from fastload.errors import UserError

__all__ = ["SHARED_DATASET", "BenchData", "image_files", "manifest", "pack_command", "prepare"]

# Another helper of this project leaves a ready-made realistic dataset here on shared machines.
SHARED_DATASET = "/tmp/fl-data"
_IMAGE_EXT = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")


@dataclass(kw_only=True)
class BenchData:
    """The benchmark's dataset in each form; ``None`` fields come with a reason in ``missing``."""

    source: str
    images_root: str | None = None
    packed: str | None = None
    rec: str | None = None
    idx: str | None = None
    restart_packed: str | None = None
    tmpfs_packed: str | None = None
    count: int = 0
    image_bytes: int = 0
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _cleanup: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Delete the temporary folders (idempotent)."""
        while self._cleanup:
            shutil.rmtree(self._cleanup.pop(), ignore_errors=True)

    def __enter__(self) -> BenchData:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict:
        return {
            "source": self.source,
            "images": self.count,
            "image_bytes": self.image_bytes,
            "mean_kb": round(self.image_bytes / max(1, self.count) / 1e3, 1),
            "packed": self.packed,
            "rec": self.rec,
            "restart_packed": self.restart_packed,
            "tmpfs_packed": self.tmpfs_packed,
            "missing": dict(self.missing),
            "notes": list(self.notes),
        }


def image_files(root: str) -> list[str]:
    """Image files under ``root`` (recursively, sorted), as an ImageFolder would find them."""
    found = []
    for dirpath, dirs, files in os.walk(root, followlinks=True):
        dirs.sort()
        found.extend(os.path.join(dirpath, f) for f in sorted(files) if f.lower().endswith(_IMAGE_EXT))
    return found


def pack_command(
    src: str,
    out: str,
    *,
    workers: int | None = None,
    resize: int | None = None,
    restart_index: bool = False,
    shards: int | None = 1,
) -> list[str]:
    """The ``fastload pack`` command line the benchmark uses (the same one a user would type)."""
    cmd = [sys.executable, "-m", "fastload", "pack", src, out, "--overwrite", "--quiet"]
    if shards:
        cmd += ["--shards", str(shards)]
    if workers:
        cmd += ["--workers", str(workers)]
    if resize:
        cmd += ["--resize", str(resize)]
    if restart_index:
        cmd += ["--restart-index"]
    return cmd


def _run_pack(src: str, out: str, **kwargs) -> str | None:
    """Pack; returns None on success or the reason it failed (last lines of its stderr)."""
    proc = subprocess.run(pack_command(src, out, **kwargs), capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return f"fastload pack exited {proc.returncode}: {tail}"
    return None


def _find_rec(packed: str, data: BenchData) -> None:
    recs = sorted(glob.glob(os.path.join(packed, "*.rec")))
    if not recs:
        data.missing["rec"] = f"{packed} holds no RecordIO shard (LMDB?); MXNet and DALI read RecordIO"
        return
    data.rec = recs[0]
    data.idx = os.path.splitext(recs[0])[0] + ".idx"
    if len(recs) > 1:
        data.notes.append(
            f"{len(recs)} RecordIO shards: MXNet's ImageRecordIter takes one file, so MXNet "
            f"and DALI read the first shard only ({os.path.basename(recs[0])})"
        )


def _subset(src_root: str, dst: str, count: int) -> None:
    # Symlinks keep the subset cheap; class folders keep labels.
    files = image_files(src_root)
    step = max(1, len(files) // count)
    for path in files[::step][:count]:
        rel = os.path.relpath(path, src_root)
        os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
        os.symlink(os.path.abspath(path), os.path.join(dst, rel))


def _generate(dst: str, count: int, seed: int) -> None:
    try:
        from tools.make_dataset import make_dataset
    except ImportError as exc:
        raise UserError(f"no DATASET given and the dataset generator is unavailable ({exc})") from exc
    make_dataset(dst, count=count, seed=seed, quiet=True)


def _export_images(packed: str, dst: str) -> int:
    """Write every record of a packed dataset as a JPEG file in class folders (for the torch peer)."""
    from fastload.records.dataset import open_dataset

    n = 0
    with open_dataset(packed) as ds:
        labels = ds.labels
        for i in range(len(ds)):
            label = int(labels[i, 0]) if labels.ndim == 2 and labels.shape[1] else 0
            folder = os.path.join(dst, f"class_{label:04d}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{i:08d}.jpg"), "wb") as fh:
                fh.write(bytes(ds.image(i)))
            n += 1
    return n


def _copy_to_tmpfs(packed: str, data: BenchData) -> None:
    if not os.path.isdir("/dev/shm"):
        data.missing["tmpfs"] = "no /dev/shm on this machine"
        return
    need = sum(os.path.getsize(p) for p in glob.glob(os.path.join(packed, "*")) if os.path.isfile(p))
    free = shutil.disk_usage("/dev/shm").free
    if need * 2 > free:
        data.missing["tmpfs"] = f"/dev/shm has {free / 1e9:.1f} GB free, the shards need {need / 1e9:.1f} GB"
        return
    dst = tempfile.mkdtemp(prefix="fastload-bench-", dir="/dev/shm")
    data._cleanup.append(dst)
    target = os.path.join(dst, "packed")
    shutil.copytree(packed, target)
    data.tmpfs_packed = target


def prepare(
    dataset: str | None,
    *,
    quick: bool,
    count: int | None = None,
    seed: int = 0,
    restart_index: bool = True,
    tmpfs: bool = True,
    workdir: str | None = None,
) -> BenchData:
    """Build every form of the benchmark dataset.

    Args:
        dataset: None (generate), an image folder, a packed fastload folder, or a ``.rec`` file.
        quick: Tiny dataset for smoke runs.
        count: Images to generate (default 96 quick, 2000 otherwise; the shared dataset is used
            when present and ``count`` is not given).
        seed: Generator seed.
        restart_index: Also pack a restart-indexed copy (``fastload pack --restart-index``).
        tmpfs: Also copy the shards to /dev/shm for the tmpfs read stage.
        workdir: Parent of the temporary folder (default: the system's).

    Returns:
        The dataset; close it to delete the temporary copies.
    """
    tmp = tempfile.mkdtemp(prefix="fastload-bench-", dir=workdir)
    data = BenchData(source="")
    data._cleanup.append(tmp)
    try:
        packed_given = False
        if dataset is None:
            shared_images = os.path.join(SHARED_DATASET, "images")
            shared = (
                len(image_files(shared_images))
                if os.path.exists(os.path.join(SHARED_DATASET, "READY")) and os.path.isdir(shared_images)
                else 0
            )
            n = count or (96 if quick else 2000)
            data.images_root = os.path.join(tmp, "images")
            if shared and n < shared:
                _subset(shared_images, data.images_root, n)
                data.source = f"{n} images sampled from {shared_images}"
            elif shared and n == shared:
                data.images_root = shared_images
                data.source = shared_images
            else:
                _generate(data.images_root, n, seed)
                data.source = f"generated: tools/make_dataset.py --count {n} --seed {seed}"
        elif not os.path.exists(dataset):
            raise UserError(f"dataset {dataset} does not exist")
        elif (
            os.path.isdir(dataset)
            and not os.path.exists(os.path.join(dataset, "fastload.json"))
            and not glob.glob(os.path.join(dataset, "*.rec"))
            and not os.path.exists(os.path.join(dataset, "data.mdb"))
        ):
            data.images_root = os.path.abspath(dataset)
            data.source = data.images_root
        else:
            packed_given = True
            data.packed = os.path.abspath(dataset)
            data.source = data.packed

        if data.images_root is not None:
            files = image_files(data.images_root)
            if not files:
                raise UserError(f"{data.images_root} holds no image files")
            data.count = len(files)
            data.image_bytes = sum(os.path.getsize(f) for f in files)
            data.packed = os.path.join(tmp, "packed")
            failure = _run_pack(data.images_root, data.packed)
            if failure:
                data.missing["packed"] = failure
                data.packed = None
        if packed_given:
            if data.packed.endswith(".rec"):
                data.rec, data.idx = data.packed, os.path.splitext(data.packed)[0] + ".idx"
            else:
                _find_rec(data.packed, data)
            data.images_root = os.path.join(tmp, "images")
            try:
                data.count = _export_images(data.packed, data.images_root)
                data.image_bytes = sum(os.path.getsize(f) for f in image_files(data.images_root))
            except Exception as exc:
                data.images_root = None
                data.missing["images"] = f"cannot export {data.packed} to JPEG files: {type(exc).__name__}: {exc}"
        elif data.packed is not None:
            _find_rec(data.packed, data)
        else:
            data.missing.setdefault("rec", data.missing.get("packed", "no packed dataset"))

        if data.packed is not None and tmpfs:
            _copy_to_tmpfs(data.packed, data)
        if restart_index:
            if data.images_root is None:
                data.missing["restart"] = "no image folder to pack with --restart-index"
            else:
                target = os.path.join(tmp, "packed-restart")
                failure = _run_pack(data.images_root, target, restart_index=True)
                if failure:
                    data.missing["restart"] = failure
                else:
                    data.restart_packed = target
        return data
    except BaseException:
        data.close()
        raise


def manifest(packed: str) -> dict | None:
    """The fastload.json of a packed folder, or None."""
    path = os.path.join(packed, "fastload.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)
