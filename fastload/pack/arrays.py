"""Write stage: ``fastload pack-arrays`` stores dense ``.npy`` and sparse CSR ``.npz`` arrays as row shards.

The output is read by :mod:`fastload.records.arrays` and streamed by ``fastload.mxnet.NDArrayIter``
(pass the folder as ``data``). Inputs are read through memory maps (``.npy``) so dense arrays larger
than RAM pack in bounded memory; a scipy ``save_npz`` CSR file is a zip archive, whose ``indices``
and ``data`` members numpy loads whole, so a sparse input must fit in RAM once (its output shards
then stream). Shards are written into a temporary folder beside OUT and the manifest goes last, so an
interrupted pack leaves no half-valid dataset.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fastload.errors import CorruptRecordError, UserError
from fastload.records.arrays import ARRAYS_FORMAT, ARRAYS_MANIFEST, NpyShard
from fastload.records.durable import fsync_dir, make_temp_dir, write_json_atomic

__all__ = ["ArraysPackConfig", "pack_arrays"]

_DEFAULT_SHARD_BYTES = 256 << 20


@dataclass(frozen=True, kw_only=True)
class ArraysPackConfig:
    """What ``pack_arrays`` writes.

    Args:
        data: Array name -> input path (``.npy`` dense or ``.npz`` scipy CSR) stored as data.
        labels: Array name -> input path stored as labels.
        out: Output folder.
        shard_bytes: Target bytes per shard (all arrays together).
        overwrite: Replace an existing pack-arrays folder at ``out``.
    """

    data: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    out: str
    shard_bytes: int = _DEFAULT_SHARD_BYTES
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not self.data:
            raise ValueError("data must name at least one input array")
        names = list(self.data) + list(self.labels)
        if len(set(names)) != len(names):
            raise ValueError(f"array names must be unique, got {names}")
        for name in names:
            if not name or "/" in name or name.startswith("."):
                raise ValueError(f"array name {name!r} must be a plain file-name-safe word")
        if isinstance(self.shard_bytes, bool) or not isinstance(self.shard_bytes, int) or self.shard_bytes <= 0:
            raise ValueError(f"shard_bytes={self.shard_bytes!r} must be a positive int")


class _Input:
    """One input array, dense (read by rows with ``pread``) or CSR (loaded).

    A dense input is never memory-mapped: a file truncated while it is packed then fails the pack
    with a clear error instead of killing the process with SIGBUS.
    """

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path
        if not os.path.isfile(path):
            raise UserError(f"{path}: no such file (input array {name!r})")
        if path.endswith(".npy"):
            self.array: NpyShard | NDArray[Any]
            try:
                self.array = NpyShard(path, path)
            except CorruptRecordError as exc:
                # A Fortran-order array (np.save of a transposed array) cannot be read by rows: load it.
                try:
                    loaded = np.load(path, allow_pickle=False)
                except Exception:  # numpy's messages quote header bytes: report NpyShard's reason
                    raise UserError(f"{path}: not a readable .npy array ({exc.message})") from None
                if loaded.ndim < 1:
                    raise UserError(f"{path}: a 0-d array has no rows") from None
                self.array = loaded
            self.stype, self.shape, self.dtype = "default", tuple(self.array.shape), self.array.dtype
            self.row_bytes = float(np.prod(self.shape[1:], dtype=np.int64) * self.dtype.itemsize)
        elif path.endswith(".npz"):
            self._load_csr(path)
        else:
            raise UserError(f"{path}: input arrays must be .npy (dense) or .npz (scipy.sparse.save_npz CSR)")

    def _load_csr(self, path: str) -> None:
        try:
            z = np.load(path, allow_pickle=False)
        except (ValueError, zipfile.BadZipFile, OSError) as exc:
            raise UserError(f"{path}: not a readable .npz file ({exc})") from None
        with z:
            keys = set(z.files)
            if not {"indptr", "indices", "data", "shape"} <= keys:
                raise UserError(f"{path}: expected a scipy.sparse.save_npz CSR file, found members {sorted(keys)}")
            fmt = z["format"].item() if "format" in keys else b"csr"
            fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
            if fmt != "csr":
                raise UserError(f"{path}: sparse format {fmt!r} is not supported; save a CSR matrix (.tocsr())")
            self.indptr = np.asarray(z["indptr"], dtype=np.int64)
            self.indices = np.asarray(z["indices"], dtype=np.int64)
            self.data = z["data"]
            shape = tuple(int(s) for s in z["shape"])
        if (
            len(shape) != 2
            or len(self.indptr) != shape[0] + 1
            or self.indptr[-1] != len(self.indices)
            or len(self.indices) != len(self.data)
        ):
            raise UserError(
                f"{path}: inconsistent CSR arrays (shape {shape}, indptr {len(self.indptr)}, "
                f"{len(self.indices)} indices, {len(self.data)} values)"
            )
        self.stype, self.shape, self.dtype = "csr", shape, self.data.dtype
        self.row_bytes = (len(self.data) * (self.dtype.itemsize + 8)) / max(shape[0], 1) + 8

    def write_shard(self, folder: str, base: str, lo: int, hi: int) -> None:
        if self.stype == "default":
            if isinstance(self.array, NpyShard):
                rows = np.empty((hi - lo, *self.shape[1:]), dtype=self.dtype)
                self.array.read_rows(lo, rows)
            else:
                rows = np.ascontiguousarray(self.array[lo:hi])
            np.save(os.path.join(folder, base + ".npy"), rows)
            return
        a, b = int(self.indptr[lo]), int(self.indptr[hi])
        ind = self.indices[a:b].copy()
        dat = self.data[a:b].copy()
        local = self.indptr[lo : hi + 1] - a
        # Columns sorted within each row, as MXNet's CSRNDArray expects.
        row_of = np.repeat(np.arange(hi - lo), np.diff(local))
        perm = np.lexsort((ind, row_of))
        np.save(os.path.join(folder, base + ".indptr.npy"), local)
        np.save(os.path.join(folder, base + ".indices.npy"), ind[perm])
        np.save(os.path.join(folder, base + ".data.npy"), dat[perm])


def pack_arrays(config: ArraysPackConfig, *, progress: bool = False) -> dict[str, Any]:
    """Write ``config``'s arrays as row shards plus a manifest; returns the manifest.

    Raises:
        UserError: Missing or unreadable inputs, mismatched row counts, or an existing output
            without ``overwrite``.
    """
    inputs = [(_Input(n, p), "data") for n, p in config.data.items()] + [
        (_Input(n, p), "label") for n, p in config.labels.items()
    ]
    rows = {inp.name: inp.shape[0] for inp, _ in inputs}
    if len(set(rows.values())) != 1:
        raise UserError(f"input arrays have different row counts: {rows}")
    num_rows = next(iter(rows.values()))
    if num_rows == 0:
        raise UserError("input arrays have no rows")
    out = os.path.abspath(config.out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        if not config.overwrite:
            raise UserError(f"{out} exists and is not empty (use --overwrite to replace a pack-arrays folder)")
        if os.path.isdir(out) and not os.path.exists(os.path.join(out, ARRAYS_MANIFEST)) and os.listdir(out):
            raise UserError(f"{out} is not a pack-arrays folder; refusing to replace it")
    row_bytes = sum(inp.row_bytes for inp, _ in inputs)
    shard_rows = max(1, int(config.shard_bytes // max(row_bytes, 1.0)))
    starts = [*list(range(0, num_rows, shard_rows)), num_rows]
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = make_temp_dir(parent, os.path.basename(out))
    try:
        entries = []
        iterator = range(len(starts) - 1)
        if progress:
            from tqdm import tqdm

            iterator = tqdm(iterator, desc="pack-arrays", unit="shard")
        files: dict[str, list[str]] = {inp.name: [] for inp, _ in inputs}
        for k in iterator:
            for inp, _ in inputs:
                base = f"{inp.name}-{k:05d}"
                inp.write_shard(tmp, base, starts[k], starts[k + 1])
                files[inp.name].append(base + ".npy" if inp.stype == "default" else base)
        for inp, role in inputs:
            entries.append(
                {
                    "name": inp.name,
                    "role": role,
                    "stype": inp.stype,
                    "shape": list(inp.shape),
                    "dtype": inp.dtype.str,
                    "source": os.path.abspath(inp.path),
                    "files": files[inp.name],
                }
            )
        manifest = {
            "format": ARRAYS_FORMAT,
            "format_version": 1,
            "num_rows": num_rows,
            "row_starts": starts,
            "arrays": entries,
        }
        write_json_atomic(os.path.join(tmp, ARRAYS_MANIFEST), manifest)
        if os.path.exists(out):
            shutil.rmtree(out) if os.path.isdir(out) else os.unlink(out)
        os.replace(tmp, out)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest
