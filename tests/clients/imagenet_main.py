"""A training script in the style of pytorch/examples ``imagenet/main.py``, on the CPU with gloo DDP.

The drop-in tests run it twice, once as written and once with its ``DataLoader`` import line
changed to ``from fastload.torch import DataLoader``, and compare what each rank saw. It records,
per rank: the train batches' targets, shapes and dtypes per epoch, the validation images and targets
(the main loader over ``DistributedSampler(val, shuffle=False, drop_last=True)`` and the extra
``Subset`` loader for the remainder), and the loaders' classes. With ``--bench OUT.json`` it times
instead: two passes of its train loader alone (the second timed) and one training epoch
(``bench/clients.py``).

Usage: ``python imagenet_main.py DATA OUT --rank R --world-size W --port P [--epochs 2] [-b 4] [-j 2]
[--bench OUT.json]``
"""

import argparse
import datetime
import json
import os
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from torch.utils.data import DataLoader
from torch.utils.data import Subset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--port", type=int, default=29500)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("-b", "--batch-size", type=int, default=4)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--bench", default=None, help="time the loader and one epoch, write them here")
    args = parser.parse_args()
    warnings.simplefilter("always")  # so that every warning is recorded below
    caught = []
    warnings.showwarning = lambda message, *a, **k: caught.append(str(message))

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world_size, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    device = torch.device("cpu")
    traindir, valdir = os.path.join(args.data, "train"), os.path.join(args.data, "val")
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(traindir, transforms.Compose([
        transforms.RandomResizedCrop(args.size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize,
    ]))
    val_dataset = datasets.ImageFolder(valdir, transforms.Compose([
        transforms.Resize(args.size * 256 // 224),
        transforms.CenterCrop(args.size),
        transforms.ToTensor(),
        normalize,
    ]))
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
                              num_workers=args.workers, pin_memory=True, sampler=train_sampler)
    val_loader = DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.workers,
                            pin_memory=True, sampler=val_sampler)

    classes = len(train_dataset.classes)
    model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(3 * 16, classes))
    model = nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)

    record = {"loader": f"{type(train_loader).__module__}.{type(train_loader).__name__}", "train": [], "val": [],
              "val_sampler_len": len(val_loader.sampler)}

    def train(epoch):
        train_sampler.set_epoch(epoch)
        model.train()
        seen = []
        for i, (images, target) in enumerate(train_loader):
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(images)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append({"target": target.tolist(), "shape": list(images.shape), "dtype": str(images.dtype),
                         "min": float(images.min()), "max": float(images.max())})
        return seen

    if args.bench:
        for epoch in range(2):  # the first pass warms the page cache and the workers' or engine's state
            train_sampler.set_epoch(epoch)
            t0, loader_n = time.perf_counter(), 0
            for images, target in train_loader:
                loader_n += images.shape[0]
            loader_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        epoch_n = sum(s["shape"][0] for s in train(2))
        epoch_s = time.perf_counter() - t0
        with open(args.bench, "w") as fh:
            json.dump({"loader_images": loader_n, "loader_seconds": loader_s, "epoch_images": epoch_n,
                       "epoch_seconds": epoch_s, "loader": record["loader"], "warnings": caught}, fh)
        dist.destroy_process_group()
        return
    for epoch in range(args.epochs):
        record["train"].append(train(epoch))

    model.eval()
    with torch.no_grad():
        images_all, targets_all = [], []
        for images, target in val_loader:
            images_all.append(images.clone())
            targets_all.append(target.clone())
        if len(val_loader.sampler) * args.world_size < len(val_loader.dataset):
            aux_val_dataset = Subset(val_dataset, range(len(val_loader.sampler) * args.world_size, len(val_dataset)))
            aux_val_loader = DataLoader(aux_val_dataset, batch_size=args.batch_size, shuffle=False,
                                        num_workers=args.workers, pin_memory=True)
            for images, target in aux_val_loader:
                images_all.append(images.clone())
                targets_all.append(target.clone())
        record["val"] = {"images": torch.cat(images_all), "targets": torch.cat(targets_all),
                         "logits": model(torch.cat(images_all))}
    record["warnings"] = caught
    dist.barrier()
    dist.destroy_process_group()
    torch.save(record, args.out)


if __name__ == "__main__":
    main()
