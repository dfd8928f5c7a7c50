"""Benchmarks, write side: ``fastload pack`` against MXNet's ``tools/im2rec.py`` on one folder.

Both tools are timed as a user runs them (the whole command, interpreter start-up included), with
the same number of workers, pass-through and ``--resize 256``. A plain copy of the same files into
one file is the page-cache bandwidth reference pass-through packing is measured against (its target);
as that copy runs inside the benchmark process, ``pack_folder()`` is also timed in-process (no
interpreter start-up or imports), and a copy that ends with an fsync shows what durability costs
(the pack fsyncs every shard before it counts as written).
Outputs go to a scratch folder that is emptied, untimed, before every repeat.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from .harness import Contender, Result, Sample, Skip, skipped, warm_inputs
from .paired import PairedRatio, run_pair
from .prepare import image_files, pack_command

__all__ = [
    "PACK_PAIR_CHECK",
    "CommandContender",
    "CopyContender",
    "InProcessPackContender",
    "im2rec_path",
    "pack_contenders",
    "pack_pair",
]


def im2rec_path() -> str | None:
    """MXNet's im2rec.py as shipped inside the mxnet wheel, found without importing mxnet."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "tools", "im2rec.py")
    return path if os.path.exists(path) else None


class CommandContender(Contender):
    """Runs one command per repeat into an emptied scratch folder and times it."""

    def __init__(
        self,
        name: str,
        *,
        argv: list[str],
        scratch: str,
        images: int,
        nbytes: int,
        prepare: list[str] | None = None,
        cwd: str | None = None,
        pycache: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(name, group="pack", **kwargs)
        self.argv, self.scratch, self.images, self.nbytes = argv, scratch, images, nbytes
        self.prepare, self.cwd = prepare, cwd
        self.env = None
        if pycache is not None:
            # Both tools run with byte-compiled modules, as after a pip install, even where
            # PYTHONDONTWRITEBYTECODE is set (an editable fastload would otherwise be compiled from
            # source on every run while mxnet's wheel ships its .pyc files); the warm-up run fills it.
            self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            self.env["PYTHONPYCACHEPREFIX"] = pycache

    def _empty(self) -> None:
        keep = {".lst"}
        if os.path.isdir(self.scratch):
            for name in os.listdir(self.scratch):
                path = os.path.join(self.scratch, name)
                if os.path.isdir(path):
                    shutil.rmtree(path)
                elif os.path.splitext(name)[1] not in keep:
                    os.remove(path)
        os.makedirs(self.scratch, exist_ok=True)

    def start(self) -> None:
        self._empty()
        if self.prepare:
            proc = subprocess.run(self.prepare, capture_output=True, text=True, cwd=self.cwd)
            if proc.returncode != 0:
                raise Skip(
                    f"{os.path.basename(self.prepare[1])} list step failed: "
                    + " | ".join(proc.stderr.strip().splitlines()[-2:])
                )

    def run(self) -> Sample:
        self._empty()
        t0 = time.perf_counter()
        proc = subprocess.run(self.argv, capture_output=True, text=True, cwd=self.cwd, env=self.env)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(
                f"{self.argv[:4]} exited {proc.returncode}: "
                + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            )
        written = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(self.scratch) for f in fs)
        return Sample(images=self.images, bytes=self.nbytes, seconds=seconds, extra={"output_bytes": written})

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


class CopyContender(Contender):
    """Read every source file and append it to one output file: the copy bandwidth reference."""

    def __init__(self, files: list[str], scratch: str, nbytes: int, *, fsync: bool = False) -> None:
        name = "copy files into one file, then fsync" if fsync else "copy files into one file (reference)"
        super().__init__(
            name,
            group="pack",
            family="copy+fsync" if fsync else "copy",
            threads=1,
            notes="read + write of the same bytes" + (", fsync at the end" if fsync else ", page cache"),
            inputs=files,
        )
        self.files, self.scratch, self.nbytes, self.fsync = files, scratch, nbytes, fsync

    def start(self) -> None:
        os.makedirs(self.scratch, exist_ok=True)

    def run(self) -> Sample:
        target = os.path.join(self.scratch, "all.bin")
        t0 = time.perf_counter()
        with open(target, "wb") as out:
            for path in self.files:
                with open(path, "rb") as fh:
                    out.write(fh.read())
            if self.fsync:
                out.flush()
                os.fsync(out.fileno())
        seconds = time.perf_counter() - t0
        os.remove(target)
        return Sample(images=len(self.files), bytes=self.nbytes, seconds=seconds)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


class InProcessPackContender(Contender):
    """``fastload.pack.pack_folder()`` called in this process: the pack without interpreter start-up."""

    def __init__(self, images_root: str, scratch: str, *, images: int, nbytes: int, workers: int) -> None:
        super().__init__(
            f"fastload pack_folder() in-process (pass-through, {workers} workers)",
            group="pack",
            family="fastload pack in-process",
            threads=workers,
            notes="same options as the command, timed without start-up and imports",
            inputs=(images_root,),
        )
        self.images_root, self.scratch, self.images, self.nbytes, self.workers = (
            images_root,
            scratch,
            images,
            nbytes,
            workers,
        )

    def start(self) -> None:
        from fastload.pack.packer import pack_folder

        self._pack = pack_folder
        os.makedirs(self.scratch, exist_ok=True)

    def run(self) -> Sample:
        out = os.path.join(self.scratch, "out")
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        self._pack(self.images_root, out, overwrite=True, progress=False, shards=1, workers=self.workers)
        return Sample(images=self.images, bytes=self.nbytes, seconds=time.perf_counter() - t0)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def pack_contenders(
    images_root: str | None, *, workers: int, quick: bool, workdir: str | None = None
) -> tuple[list[Contender], list[Result], str]:
    """fastload pack vs im2rec, pass-through and (not in quick mode) --resize 256.

    Returns:
        ``(contenders, skipped_rows, scratch_root)``; the caller removes ``scratch_root``.
    """
    scratch = tempfile.mkdtemp(prefix="fastload-bench-pack-", dir=workdir)
    if images_root is None:
        return [], [skipped("fastload pack", group="pack", reason="no image folder to pack")], scratch
    files = image_files(images_root)
    nbytes = sum(os.path.getsize(f) for f in files)
    im2rec = im2rec_path()
    have_cv2 = importlib.util.find_spec("cv2") is not None
    out: list[Contender] = [
        CopyContender(files, os.path.join(scratch, "copy"), nbytes),
        CopyContender(files, os.path.join(scratch, "copy-fsync"), nbytes, fsync=True),
        InProcessPackContender(
            images_root, os.path.join(scratch, "fl-inproc"), images=len(files), nbytes=nbytes, workers=workers
        ),
    ]
    pycache = os.path.join(scratch, "pycache")
    skips: list[Result] = []
    modes = [(None, "pass-through")] + ([] if quick else [(256, "--resize 256")])
    for resize, label in modes:
        out.append(
            CommandContender(
                f"fastload pack ({label}, {workers} workers)",
                reference=resize is None,
                argv=pack_command(
                    images_root, os.path.join(scratch, f"fl-{label[:6]}", "out"), workers=workers, resize=resize
                ),
                scratch=os.path.join(scratch, f"fl-{label[:6]}"),
                images=len(files),
                nbytes=nbytes,
                family=f"fastload pack {label}",
                threads=workers,
                notes="RecordIO, one shard",
                pycache=pycache,
                inputs=(images_root,),
            )
        )
        name = f"MXNet im2rec.py ({label}, {workers} workers)"
        if im2rec is None:
            skips.append(skipped(name, group="pack", reason="mxnet (and its tools/im2rec.py) is not installed"))
            continue
        if not have_cv2:
            skips.append(
                skipped(name, group="pack", reason="im2rec.py imports cv2: pip install opencv-python-headless")
            )
            continue
        folder = os.path.join(scratch, f"im2rec-{label[:6]}")
        prefix = os.path.join(folder, "data")
        argv = [sys.executable, im2rec, "--num-thread", str(workers), "--quality", "95"]
        argv += ["--pass-through"] if resize is None else ["--resize", str(resize)]
        out.append(
            CommandContender(
                name,
                argv=[*argv, prefix, images_root],
                scratch=folder,
                images=len(files),
                nbytes=nbytes,
                prepare=[sys.executable, im2rec, "--list", "--recursive", prefix, images_root],
                family=f"im2rec {label}",
                threads=workers,
                notes="list made beforehand, untimed",
                pycache=pycache,
                inputs=(images_root,),
            )
        )
        if resize is None:
            # The same job as `fastload pack FOLDER`: im2rec needs its --list step to pack a folder,
            # and fastload's own folder scan is inside its timing, so this row times both steps.
            folder_all = os.path.join(scratch, "im2rec-list-pack")
            prefix_all = os.path.join(folder_all, "data")
            listing = [sys.executable, im2rec, "--list", "--recursive", prefix_all, images_root]
            script = " && ".join(shlex.join(cmd) for cmd in (listing, [*argv, prefix_all, images_root]))
            out.append(
                CommandContender(
                    f"MXNet im2rec.py --list, then pack ({label}, {workers} workers)",
                    argv=["sh", "-c", script],
                    scratch=folder_all,
                    images=len(files),
                    nbytes=nbytes,
                    family=f"im2rec list+pack {label}",
                    threads=workers,
                    notes="folder to .rec: the list step is timed too",
                    pycache=pycache,
                    inputs=(images_root,),
                )
            )
    # Fix the reference per mode: the ratio column compares like with like.
    if not quick:
        for c in out:
            if "--resize" in c.name:
                c.group = "pack-resize"
                c.reference = c.name.startswith("fastload")
    return out, skips, scratch


PACK_PAIR_CHECK = "fastload pack_folder() in-process / page-cache copy of the same files, MB/s"


def pack_pair(images_root: str, *, workers: int, rounds: int, workdir: str | None = None) -> PairedRatio:
    """The packing target, "close to the page-cache copy bandwidth", from alternated runs.

    ``pack_folder()`` in-process and the copy of the same files take turns (their order swapped
    every pair), each after its input files are read through the page cache; the ratio is of MB/s
    (the same bytes on both sides). Interleaved medians of the two rows are a whole round of other
    contenders apart, and the copy of 2,000 files lasts ~0.1 s: drift on this VM moved their ratio
    by 0.1 between runs.
    """
    scratch = tempfile.mkdtemp(prefix="fastload-bench-packpair-", dir=workdir)
    files = image_files(images_root)
    nbytes = sum(os.path.getsize(f) for f in files)
    num = InProcessPackContender(
        images_root, os.path.join(scratch, "fl-inproc"), images=len(files), nbytes=nbytes, workers=workers
    )
    den = CopyContender(files, os.path.join(scratch, "copy"), nbytes)
    try:
        num.start()
        den.start()
        return run_pair(PACK_PAIR_CHECK, num, den, rounds=rounds, before=lambda c: warm_inputs(c.inputs))
    except Exception as exc:
        nan = float("nan")
        return PairedRatio(
            check=PACK_PAIR_CHECK,
            numerator=num.name,
            denominator=den.name,
            median=nan,
            q1=nan,
            q3=nan,
            total=nan,
            pairs=0,
            chunk=0,
            skipped=f"{type(exc).__name__}: {exc}",
        )
    finally:
        num.close()
        den.close()
        shutil.rmtree(scratch, ignore_errors=True)
