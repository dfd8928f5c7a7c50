"""Device stage for PyTorch: ``fastload.torch.DataLoader``, a drop-in ``torch.utils.data.DataLoader``.

Change one import and the input pipeline of a torchvision-style training script runs in fastload's
engine::

    from fastload.torch import DataLoader          # was: from torch.utils.data import DataLoader

    train_dataset = datasets.ImageFolder(traindir, transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(mean, std)]))
    loader = DataLoader(train_dataset, batch_size=256, shuffle=True, num_workers=8, pin_memory=True)

Modules, one job each:

- :mod:`fastload.torch.dataloader`: :class:`DataLoader` (a subclass of torch's), its argument checks
  and its ``state_dict`` / ``load_state_dict``;
- :mod:`fastload.torch.planning`: what a pass runs in the engine (the compiled plan, the output
  extras, the :class:`~fastload.loader.Loader` behind it);
- :mod:`fastload.torch.iteration`: one pass on the engine, batches collated as torch's;
- :mod:`fastload.torch.state`: the sampler and generator states, the worker-like RNG scope;
- :mod:`fastload.torch.compile`: torchvision / timm transforms -> fastload engine ops (table-driven;
  :mod:`~fastload.torch.compile_plan`, :mod:`~fastload.torch.compile_torchvision`,
  :mod:`~fastload.torch.compile_timm`);
- :mod:`fastload.torch.datasets`: which datasets the engine reads, and :class:`ImageDataset`, a torch
  ``Dataset`` view of fastload's packed datasets;
- :mod:`fastload.torch.sampler`: :class:`OrderSampler` (fastload's own sharded order) and the index
  feed from the sampler to the decode thread;
- :mod:`fastload.torch.placement`: pinned ring buffers, the float conversion, per-device copies.
"""

from fastload.torch.compile import Plan, compile_transform
from fastload.torch.dataloader import DataLoader
from fastload.torch.datasets import ImageDataset
from fastload.torch.placement import cuda_release_fences, pinned_allocator, split_sizes
from fastload.torch.sampler import OrderSampler

__all__ = [
    "DataLoader",
    "ImageDataset",
    "OrderSampler",
    "Plan",
    "compile_transform",
    "cuda_release_fences",
    "pinned_allocator",
    "split_sizes",
]
