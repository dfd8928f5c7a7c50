"""HF Accelerate's prepare() on fastload.torch loaders: sharded as torch's, batched engine decode kept.

``accelerate.data_loader.prepare_data_loader`` rebuilds a loader as its own ``DataLoaderShard`` (a
torch DataLoader subclass) from the loader's attributes, with a ``BatchSamplerShard`` over its batch
sampler. The shards must equal those of the same preparation of torch's own DataLoader, and an
``ImageDataset`` view keeps the engine's batched decode (torch's DataLoader calls its
``__getitems__``).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
accelerate_data = pytest.importorskip("accelerate.data_loader")

import torch.utils.data as tud
from torchvision import datasets
from torchvision import transforms as T

import fastload.torch as ft

TF = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])


def shards(loader):
    out = []
    for rank in range(2):
        prepared = accelerate_data.prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
        out.append([(x.clone(), y.clone()) for x, y in prepared])
    return out


@pytest.mark.parametrize("view", [False, True], ids=["imagefolder", "imagedataset-view"])
def test_prepare_shards_like_torch_and_keeps_batched_decode(tiny_folder, view, monkeypatch):
    folder = datasets.ImageFolder(str(tiny_folder), TF)
    dataset = ft.ImageDataset(folder) if view else folder
    calls = []
    original = ft.ImageDataset.__getitems__
    monkeypatch.setattr(
        ft.ImageDataset, "__getitems__", lambda self, idx: calls.append(len(idx)) or original(self, idx)
    )
    ours = shards(ft.DataLoader(dataset, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(2)))
    theirs = shards(tud.DataLoader(folder, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(2)))
    for o, t in zip(ours, theirs, strict=False):
        assert len(o) == len(t) == 4
        for (x, y), (rx, ry) in zip(o, t, strict=False):
            assert torch.equal(y, ry) and x.shape == rx.shape and (x - rx).abs().mean() < 0.02
    seen = [int(v) for rank in ours for _, y in rank for v in y]
    assert len(seen) == 48  # 40 images, padded to whole batches on both processes
    assert calls == ([6] * 8 if view else [])  # one engine call per batch through the view


def test_image_dataset_view_of_an_imagefolder(tiny_folder):
    folder = datasets.ImageFolder(str(tiny_folder), TF)
    view = ft.ImageDataset(folder)
    assert view.classes == folder.classes and view.targets == folder.targets and view.transform is TF
    x, y = view[3]
    rx, ry = folder[3]
    assert y == ry and torch.equal(x, rx)  # per sample: exactly ImageFolder's pipeline
    with pytest.raises(ValueError, match="ImageFolder"):
        ft.ImageDataset(tud.TensorDataset(torch.zeros(2)))
