"""A training script in the style of torchvision's ``references/classification/train.py``.

Presets as the reference's ``ClassificationPresetTrain`` / ``ClassificationPresetEval`` (PIL backend,
v1 or v2 transforms), ``RandomSampler`` / ``SequentialSampler``, and the reference's MixUp / CutMix
collate: ``v2.RandomChoice([v2.MixUp(...), v2.CutMix(...)])`` applied to ``default_collate(batch)``.
The drop-in tests run it as written and with its ``DataLoader`` import line changed to
``from fastload.torch import DataLoader``. It records the samples the collate function received
(types, shapes, targets), the mixed batches' shapes and soft labels, and the evaluation images.
``--auto-augment ta_wide|ra|augmix|imagenet`` adds the reference's policy after the flip,
``--no-mixup`` uses the default collate; with ``--bench OUT.json`` it times instead: two passes of
its train loader alone (the second timed) and one training epoch (``bench/clients.py``).

Usage: ``python reference_train.py DATA OUT [--use-v2] [-b 8] [-j 2] [--random-erase 0.0]
[--auto-augment ta_wide] [--no-mixup] [--bench OUT.json]``
"""

import argparse
import json
import os
import time
import warnings

import torch
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import default_collate
from torchvision.transforms import InterpolationMode


def get_module(use_v2):
    if use_v2:
        import torchvision.transforms.v2

        return torchvision.transforms.v2
    else:
        import torchvision.transforms

        return torchvision.transforms


class ClassificationPresetTrain:
    def __init__(self, *, crop_size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                 interpolation=InterpolationMode.BILINEAR, hflip_prob=0.5, auto_augment_policy=None, ra_magnitude=9,
                 augmix_severity=3, random_erase_prob=0.0, use_v2=False):
        T = get_module(use_v2)
        transforms = [T.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True)]
        if hflip_prob > 0:
            transforms.append(T.RandomHorizontalFlip(hflip_prob))
        if auto_augment_policy is not None:
            if auto_augment_policy == "ra":
                transforms.append(T.RandAugment(interpolation=interpolation, magnitude=ra_magnitude))
            elif auto_augment_policy == "ta_wide":
                transforms.append(T.TrivialAugmentWide(interpolation=interpolation))
            elif auto_augment_policy == "augmix":
                transforms.append(T.AugMix(interpolation=interpolation, severity=augmix_severity))
            else:
                aa_policy = T.AutoAugmentPolicy(auto_augment_policy)
                transforms.append(T.AutoAugment(policy=aa_policy, interpolation=interpolation))
        transforms.append(T.PILToTensor())
        transforms.extend([T.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float),
                           T.Normalize(mean=mean, std=std)])
        if random_erase_prob > 0:
            transforms.append(T.RandomErasing(p=random_erase_prob))
        if use_v2:
            transforms.append(T.ToPureTensor())
        self.transforms = T.Compose(transforms)

    def __call__(self, img):
        return self.transforms(img)


class ClassificationPresetEval:
    def __init__(self, *, crop_size, resize_size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                 interpolation=InterpolationMode.BILINEAR, use_v2=False):
        T = get_module(use_v2)
        transforms = [T.Resize(resize_size, interpolation=interpolation, antialias=True), T.CenterCrop(crop_size),
                      T.PILToTensor(),
                      T.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float),
                      T.Normalize(mean=mean, std=std)]
        if use_v2:
            transforms.append(T.ToPureTensor())
        self.transforms = T.Compose(transforms)

    def __call__(self, img):
        return self.transforms(img)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--use-v2", action="store_true")
    parser.add_argument("-b", "--batch-size", type=int, default=8)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--random-erase", type=float, default=0.0)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--auto-augment", default=None)
    parser.add_argument("--no-mixup", action="store_true")
    parser.add_argument("--bench", default=None, help="time the loader and one epoch, write them here")
    args = parser.parse_args()
    warnings.simplefilter("always")
    caught = []
    warnings.showwarning = lambda message, *a, **k: caught.append(str(message))
    torch.manual_seed(0)

    traindir, valdir = os.path.join(args.data, "train"), os.path.join(args.data, "val")
    dataset = torchvision.datasets.ImageFolder(traindir, ClassificationPresetTrain(
        crop_size=args.size, auto_augment_policy=args.auto_augment, random_erase_prob=args.random_erase,
        use_v2=args.use_v2))
    dataset_test = torchvision.datasets.ImageFolder(valdir, ClassificationPresetEval(
        crop_size=args.size, resize_size=args.size * 232 // 224, use_v2=args.use_v2))
    num_classes = len(dataset.classes)
    train_sampler = torch.utils.data.RandomSampler(dataset)
    test_sampler = torch.utils.data.SequentialSampler(dataset_test)

    from torchvision.transforms import v2

    mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=num_classes),
                                    v2.CutMix(alpha=1.0, num_classes=num_classes)])
    received = []

    def collate_fn(batch):
        received.append([(type(img).__name__, list(img.shape), str(img.dtype), type(t).__name__, t) for img, t in batch])
        return mixup_cutmix(*default_collate(batch))

    data_loader = DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers,
                             pin_memory=True, collate_fn=default_collate if args.no_mixup else collate_fn)
    data_loader_test = DataLoader(dataset_test, batch_size=args.batch_size, sampler=test_sampler,
                                  num_workers=args.workers, pin_memory=True)

    model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(3 * 16, num_classes))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mixed = []

    def train_one_epoch():
        model.train()
        n = 0
        for image, target in data_loader:
            output = model(image)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n += image.shape[0]
            if target.ndim == 2:
                mixed.append({"image": list(image.shape), "dtype": str(image.dtype), "target": list(target.shape),
                              "target_dtype": str(target.dtype), "target_sums": target.sum(1).tolist()})
        return n

    if args.bench:
        for _ in range(2):  # the first pass warms the page cache and the workers' or engine's state
            t0, loader_n = time.perf_counter(), 0
            for image, target in data_loader:
                loader_n += image.shape[0]
            loader_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        epoch_n = train_one_epoch()
        epoch_s = time.perf_counter() - t0
        with open(args.bench, "w") as fh:
            json.dump({"loader_images": loader_n, "loader_seconds": loader_s, "epoch_images": epoch_n,
                       "epoch_seconds": epoch_s,
                       "loader": f"{type(data_loader).__module__}.{type(data_loader).__name__}",
                       "warnings": caught}, fh)
        return
    train_one_epoch()
    model.eval()
    images, targets = [], []
    with torch.inference_mode():
        for image, target in data_loader_test:
            images.append(image.clone())
            targets.append(target.clone())
    torch.save({"loader": f"{type(data_loader).__module__}.{type(data_loader).__name__}",
                "received": received if args.workers == 0 else None, "mixed": mixed,
                "eval_images": torch.cat(images), "eval_targets": torch.cat(targets), "warnings": caught}, args.out)


if __name__ == "__main__":
    main()
