"""Benchmarks, GPU machine: one command that runs every GPU path and measures 1 to N cores.

``make device-check`` (``python -m bench.device_check``) prepares what a bare GPU machine lacks
(the carried wheels, the engine built against the carried libjpeg-turbo), generates an ImageNet-like
dataset (plain and restart-indexed shards), then runs, in order, each part in its own process and
under its own time budget:

1. ``cuda_tests``: ``pytest -m cuda`` over ``tests/test_cuda*.py``;
2. ``h2d``: pinned vs pageable host-to-device GB/s (uint8 batch and its float16 form), and how much
   of a copy hides behind compute;
3. ``scaling``: the engine alone and the ``Loader`` at 1..N threads, torch's ``DataLoader`` + PIL
   (``ImageFolder``) at 1..N workers, images/s and per core;
4. ``train_step``: ResNet-50 (bf16 autocast, channels-last) fed by ``fastload.torch.DataLoader``,
   by torch's ``DataLoader`` and by a synthetic batch already on the device: images/s, the GPU's idle
   fraction, and the cores fastload needs to match the synthetic rate;
5. ``gpu_decode``: ``torchvision.io.decode_jpeg(..., device="cuda")`` with the crop / resize on the
   GPU: images/s.

It writes ``device-check.json`` (one key per part, plus ``device`` and ``dry_run``) and
``device-check.md`` into ``--out``. A part that fails or runs out of time records its error (and
what it measured so far); the others still run. Without CUDA (or with ``--dry-run``) the same code
runs on CPU devices with tiny sizes, so the command cannot rot between runs on a GPU machine.
"""

PARTS = ("cuda_tests", "h2d", "scaling", "train_step", "gpu_decode")

__all__ = ["PARTS"]
