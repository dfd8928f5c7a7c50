"""Device stage (MXNet): ``ImageRecordIter``'s ``mean_img``, loaded, or computed and saved when missing.

MXNet subtracts a per-pixel mean image instead of ``mean_r/g/b`` when ``mean_img`` names a file.
When the file does not exist, MXNet makes it while the iterator is built: one pass over the
iterator's part of the records through the same augmenter and mirror, the average of every output
image, saved with ``NDArray::Save`` under the key ``"mean_img"`` (what ``mx.nd.save(path,
{"mean_img": array})`` writes; ``mx.nd.load`` reads it). This module does the same, with one
difference: MXNet averages its *normalized* outputs (so a file it makes with ``scale`` or ``std_*``
set is in those units, yet it is subtracted from raw pixels), fastload averages the pixels, which is
what the subtraction expects; with the default ``mean_*``, ``std_*`` and ``scale`` both files are
the same. The file is written under a temporary name and renamed, so two workers computing it at
once never leave a torn file.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import mxnet as mx
import numpy as np
from numpy.typing import NDArray

from fastload.mxnet.arguments import MXNetArgumentError

if TYPE_CHECKING:
    from fastload.batch import Batch

__all__ = ["GRAY_WEIGHTS", "compute_mean_image", "load_mean_image", "mean_image", "save_mean_image"]

log = logging.getLogger("fastload.mxnet")

#: ITU-R BT.601 luma, the weights libjpeg uses for its Y channel (and OpenCV's RGB2GRAY).
GRAY_WEIGHTS = (0.299, 0.587, 0.114)


def load_mean_image(path: str, data_shape: tuple[int, int, int]) -> NDArray[np.float32]:
    """The float32 ``[C, H, W]`` mean image stored in ``path`` (one array, any key).

    Raises:
        MXNetArgumentError: Not an MXNet NDArray file, not exactly one array, or another shape.
    """
    try:
        loaded = mx.nd.load(path)
    except mx.base.MXNetError as exc:
        raise MXNetArgumentError(
            f"ImageRecordIter argument mean_img={path!r}: not an MXNet NDArray file ({str(exc).splitlines()[0]})"
        ) from exc
    arrays = list(loaded.values()) if isinstance(loaded, dict) else list(loaded)
    if len(arrays) != 1:
        raise MXNetArgumentError(
            f"ImageRecordIter argument mean_img={path!r}: holds {len(arrays)} arrays, a mean image file holds one"
        )
    mean: NDArray[np.float32] = arrays[0].asnumpy().astype(np.float32)
    if mean.shape != tuple(data_shape):
        raise MXNetArgumentError(
            f"ImageRecordIter argument mean_img={path!r}: shape {mean.shape} does not match "
            f"data_shape {tuple(data_shape)}"
        )
    return mean


def save_mean_image(path: str, mean: NDArray[np.float32]) -> None:
    """Write ``mean`` as MXNet does (``{"mean_img": NDArray}``), atomically."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".mean_img-", dir=folder)
    os.close(fd)
    try:
        mx.nd.save(tmp, {"mean_img": mx.nd.array(mean, dtype=np.float32)})
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def compute_mean_image(batches: Iterable[Batch], num_records: int, channels: int) -> NDArray[np.float32]:
    """Average the images of ``batches`` (each record once) into a float32 ``[C, H, W]`` array.

    Args:
        batches: Iterable of ``fastload.batch.Batch`` with uint8 NCHW RGB ``images``.
        num_records: Records of the dataset (``Batch.indices`` are below it).
        channels: 3, or 1 for a grayscale mean (BT.601 luma of the RGB output, rounded).
    """
    seen = np.zeros(num_records, dtype=bool)
    total = None
    count = 0
    weights = np.asarray(GRAY_WEIGHTS, dtype=np.float64).reshape(1, 3, 1, 1)
    for batch in batches:
        idx = np.asarray(batch.indices)
        # Padding rows repeat records (equal shares per part): count every record once.
        fresh = ~seen[idx]
        fresh &= ~_repeated_within(idx)
        if not fresh.any():
            continue
        seen[idx[fresh]] = True
        images = np.asarray(batch.images)[fresh].astype(np.float64)
        if channels == 1:
            images = np.rint((images * weights).sum(axis=1, keepdims=True))
        part = images.sum(axis=0)
        total = part if total is None else total + part
        count += int(fresh.sum())
    if total is None:
        raise MXNetArgumentError("ImageRecordIter argument mean_img: no image to average")
    mean: NDArray[np.float32] = (total / count).astype(np.float32)
    return mean


def _repeated_within(idx: NDArray[np.int64]) -> NDArray[np.bool_]:
    """True for every occurrence of a value after its first one in ``idx``."""
    _, first = np.unique(idx, return_index=True)
    out = np.ones(len(idx), dtype=bool)
    out[first] = False
    return out


def mean_image(
    path: str, data_shape: tuple[int, int, int], compute: Callable[[], NDArray[np.float32]], *, verbose: bool = False
) -> NDArray[np.float32]:
    """Load ``path``, or compute the mean image with ``compute()`` and save it there first (as MXNet).

    Raises:
        MXNetArgumentError: An unusable file, or a folder that does not exist for a new one.
    """
    if os.path.exists(path):
        if verbose:
            log.info("Load mean image from %s", path)
        return load_mean_image(path, data_shape)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise MXNetArgumentError(
            f"ImageRecordIter argument mean_img={path!r}: the file does not exist and its "
            f"folder {folder} does not either, so the computed mean image cannot be saved"
        )
    log.info("Cannot find %s: computing the mean image (one pass over the records)", path)
    mean = compute()
    save_mean_image(path, mean)
    if verbose:
        log.info("Save mean image to %s", path)
    return mean
