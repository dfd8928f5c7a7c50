"""fastload: high-throughput data loading for deep-learning training.

The data path, one module per stage: folder -> shards (:mod:`fastload.pack`) -> record bytes
(:mod:`fastload.records`) -> which records (:mod:`fastload.order`) -> pixels (:mod:`fastload.decode`,
:mod:`fastload.transforms`) -> pinned batch slots (:mod:`fastload.batch`) -> prefetch queue
(:mod:`fastload.prefetch`, :mod:`fastload.loader`) -> device (:mod:`fastload.torch`,
:mod:`fastload.mxnet`). torch and mxnet are imported only by their adapters.
"""

from typing import Any

from fastload.version import __version__

_TRANSFORMS = ("CenterCrop", "RandomResizedCrop", "Resize", "eval_transform", "train")

__all__ = [
    "CenterCrop",
    "Loader",
    "LoaderConfig",
    "RandomResizedCrop",
    "ReadOptions",
    "Resize",
    "__version__",
    "eval_transform",
    "info",
    "open_dataset",
    "pack_folder",
    "train",
]


def __getattr__(name: str) -> Any:
    # Lazy: `import fastload` stays cheap (no numpy) and never imports a stage the caller does not
    # use; the CLI relies on it to configure numpy's BLAS before numpy loads (see fastload.cli).
    if name in _TRANSFORMS:
        from fastload import transforms

        return getattr(transforms, name)
    if name == "open_dataset":
        from fastload.records.dataset import open_dataset

        return open_dataset
    if name == "pack_folder":
        from fastload.pack.packer import pack_folder

        return pack_folder
    if name in ("Loader", "LoaderConfig"):
        from fastload import loader

        return getattr(loader, name)
    if name == "ReadOptions":
        from fastload.records.read_options import ReadOptions

        return ReadOptions
    if name == "info":
        from fastload.decode import engine_info

        return engine_info
    if name == "transforms":  # was imported eagerly before; `fastload.transforms.X` keeps working
        import importlib

        return importlib.import_module("fastload.transforms")
    raise AttributeError(f"module 'fastload' has no attribute {name!r}")
