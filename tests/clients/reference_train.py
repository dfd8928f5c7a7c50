"""A training script in the style of torchvision's ``references/classification/train.py``.

Presets as the reference's ``ClassificationPresetTrain`` / ``ClassificationPresetEval`` (PIL backend,
v1 or v2 transforms), ``RandomSampler`` / ``SequentialSampler``, and the reference's MixUp / CutMix
collate: ``v2.RandomChoice([v2.MixUp(...), v2.CutMix(...)])`` applied to ``default_collate(batch)``.
The drop-in tests run it as written and with its ``DataLoader`` import line changed to
``from fastload.torch import DataLoader``. It records the samples the collate function received
(types, shapes, targets), the mixed batches' shapes and soft labels, and the evaluation images.

Usage: ``python reference_train.py DATA OUT [--use-v2] [-b 8] [-j 2] [--random-erase 0.0]``
"""

import argparse
import os
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
                 interpolation=InterpolationMode.BILINEAR, hflip_prob=0.5, random_erase_prob=0.0, use_v2=False):
        T = get_module(use_v2)
        transforms = [T.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True)]
        if hflip_prob > 0:
            transforms.append(T.RandomHorizontalFlip(hflip_prob))
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
    args = parser.parse_args()
    warnings.simplefilter("always")
    caught = []
    warnings.showwarning = lambda message, *a, **k: caught.append(str(message))
    torch.manual_seed(0)

    traindir, valdir = os.path.join(args.data, "train"), os.path.join(args.data, "val")
    dataset = torchvision.datasets.ImageFolder(traindir, ClassificationPresetTrain(
        crop_size=args.size, random_erase_prob=args.random_erase, use_v2=args.use_v2))
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
                             pin_memory=True, collate_fn=collate_fn)
    data_loader_test = DataLoader(dataset_test, batch_size=args.batch_size, sampler=test_sampler,
                                  num_workers=args.workers, pin_memory=True)

    model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(3 * 16, num_classes))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mixed = []
    model.train()
    for image, target in data_loader:
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mixed.append({"image": list(image.shape), "dtype": str(image.dtype), "target": list(target.shape),
                      "target_dtype": str(target.dtype), "target_sums": target.sum(1).tolist()})
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
