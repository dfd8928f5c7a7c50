"""Device stage (MXNet): the records ``ImageRecordIter`` reads, named the way MXNet names them.

- ``path_imgrec``: a ``.rec`` (MXNet's ``im2rec`` / ``MXIndexedRecordIO``) or a fastload dataset
  folder (``fastload pack``; any path :func:`fastload.records.dataset.open_dataset` opens);
- ``path_imgidx``: the ``.rec``'s index, wherever it is (default: the ``.idx`` beside the ``.rec``;
  without one the ``.rec`` is scanned once);
- ``path_imglist``: an ``im2rec`` list (``index<TAB>label...<TAB>path`` per line) whose labels
  replace the records' own, matched by the record's id (its IRHeader ``id``), as MXNet's
  ``ImageLabelMap`` does;
- ``label_width``: labels per record; without a list it must equal what the records store (MXNet
  checks the same and aborts the iterator otherwise).

Every failure raises :class:`~fastload.mxnet.arguments.MXNetArgumentError` naming the argument and the
file (MXNet raises ``MXNetError`` for a missing file).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fastload.errors import FastloadError
from fastload.mxnet.arguments import MXNetArgumentError

if TYPE_CHECKING:
    from fastload.records.base import Dataset

__all__ = ["RelabelledDataset", "open_records", "read_image_list"]


def _require_file(name: str, path: str) -> None:
    if not os.path.exists(path):
        raise MXNetArgumentError(f"ImageRecordIter argument {name}={path!r}: no such file or directory")


def read_image_list(path: str, label_width: int) -> dict[int, NDArray[np.float32]]:
    """Labels of an ``im2rec`` ``.lst`` file by record id.

    Each non-blank line is ``index``, then ``label_width`` labels, then (usually) the image path,
    separated by whitespace.

    Raises:
        MXNetArgumentError: A line with fewer than ``label_width`` labels, or an unparsable field.
    """
    out: dict[int, NDArray[np.float32]] = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line_no, line in enumerate(fh, 1):
            fields = line.split()
            if not fields:
                continue
            where = f"path_imglist={path!r} line {line_no}"
            if len(fields) < 1 + label_width:
                raise MXNetArgumentError(f"{where}: expected an index and {label_width} label(s), got {line.strip()!r}")
            try:
                index = int(fields[0])
                labels = np.array([float(f) for f in fields[1 : 1 + label_width]], dtype=np.float32)
            except ValueError:
                raise MXNetArgumentError(
                    f"{where}: not an index followed by {label_width} number(s): {line.strip()!r}"
                ) from None
            out[index] = labels
    return out


class RelabelledDataset:
    """A dataset whose labels come from elsewhere (an image list); everything else is the wrapped one's.

    Args:
        dataset: A dataset of the Records contract.
        labels: float32 ``[len(dataset), label_width]``.
    """

    def __init__(self, dataset: Dataset, labels: NDArray[np.float32]) -> None:
        self._dataset = dataset
        self.labels = np.ascontiguousarray(labels, dtype=np.float32)
        self.label_width = int(self.labels.shape[1])

    def __len__(self) -> int:
        return len(self._dataset)

    def __getattr__(self, name: str) -> Any:
        if name == "_dataset":
            raise AttributeError(name)
        return getattr(self._dataset, name)

    def __enter__(self) -> RelabelledDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_records(
    *, path_imgrec: str, path_imgidx: str = "", path_imglist: str = "", label_width: int = 1
) -> Dataset | RelabelledDataset:
    """Open what ``ImageRecordIter`` reads, with MXNet's checks.

    Args:
        path_imgrec: A ``.rec`` or a fastload dataset path.
        path_imgidx: The ``.rec``'s index when it is not beside it ("" for the default).
        path_imglist: An ``im2rec`` list whose labels replace the records' ("" for none).
        label_width: Labels per record.

    Returns:
        A dataset of the Records contract (the caller closes it).

    Raises:
        MXNetArgumentError: Missing or unreadable files, a label count that does not match.
    """
    _require_file("path_imgrec", path_imgrec)
    if path_imgidx:
        _require_file("path_imgidx", path_imgidx)
    if path_imglist:
        _require_file("path_imglist", path_imglist)
    from fastload.records.dataset import open_dataset

    try:
        dataset = open_dataset(path_imgrec, idx_path=path_imgidx or None)
    except (FastloadError, OSError) as exc:
        name = "path_imgidx" if path_imgidx and path_imgidx in str(exc) else "path_imgrec"
        raise MXNetArgumentError(f"ImageRecordIter argument {name}: {exc}") from exc
    try:
        if path_imglist:
            listed = read_image_list(path_imglist, label_width)
            ids = getattr(dataset, "ids", None)
            if ids is None:
                ids = np.arange(len(dataset), dtype=np.uint64)
            labels = np.empty((len(dataset), label_width), dtype=np.float32)
            missing: list[int] = []
            for i, rid in enumerate(np.asarray(ids).tolist()):
                row = listed.get(int(rid))
                if row is None:
                    missing.append(int(rid))
                else:
                    labels[i] = row
            if missing:
                raise MXNetArgumentError(
                    f"path_imglist={path_imglist!r} has no labels for {len(missing)} record "
                    f"id(s) of {path_imgrec}, e.g. {missing[:5]}"
                )
            return RelabelledDataset(dataset, labels)
        stored = int(getattr(dataset, "label_width", 1))
        if stored != label_width:
            raise MXNetArgumentError(
                f"ImageRecordIter argument label_width={label_width}: {path_imgrec} stores "
                f"{stored} label(s) per record (pass label_width={stored}, or path_imglist)"
            )
        return dataset
    except BaseException:
        dataset.close()
        raise
