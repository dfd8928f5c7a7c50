"""Benchmarks, peers: the loaders fastload is compared with, each in its own process.

``torch_pil`` (torch DataLoader + the torchvision-equivalent Pillow pipeline), ``mxnet_rec``
(MXNet's C++ ImageRecordIter), ``dali_cpu`` (NVIDIA DALI's CPU pipeline, run by the interpreter of
``.venv-dali``). Each module is a peer process speaking :mod:`.protocol`; :mod:`.registry` builds
the harness contenders for them and says why a peer is skipped.
"""

__all__ = ["protocol", "registry"]
