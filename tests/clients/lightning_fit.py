"""A PyTorch Lightning script: ``Trainer.fit`` on 2 CPU processes (DDP), resumed from a mid-epoch checkpoint.

A run can be cut short by a crash (``--crash-at STEP``) after ``ModelCheckpoint`` saved a
checkpoint every ``--every`` steps, and a new run resumes from that checkpoint (``--resume-from``).

``train_dataloader`` returns ``DataLoader(ImageFolder(...), shuffle=True, num_workers=2)``; Lightning
re-instantiates it with a ``DistributedSampler`` (``use_distributed_sampler=True``, its default),
calls ``set_epoch``, and saves / restores ``state_dict()`` of loaders that have one. The drop-in tests
run it as written and with the ``DataLoader`` import line changed to
``from fastload.torch import DataLoader``. Each rank records the targets of every training step and
the loader Lightning ended up with. With ``--bench OUT.json`` (one process) it times instead: two
passes of ``train_dataloader()`` alone (the second timed) and one epoch of ``Trainer.fit``
(``bench/clients.py``).

Usage: ``python lightning_fit.py DATA OUT --max-steps N [--every K --crash-at S] [--resume-from CKPT]
[-b 2] [--size 48] [-j 2] [--bench OUT.json]``
"""

import argparse
import json
import os
import time
import warnings

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from torch.utils.data import DataLoader


class Crash(Exception):
    """The simulated failure that stops a run after its checkpoint."""


class Model(L.LightningModule):
    def __init__(self, data: str, out: str, size: int = 48, crash_at: int = -1, batch_size: int = 2,
                 workers: int = 2) -> None:
        super().__init__()
        self.data, self.out, self.size, self.crash_at = data, out, size, crash_at
        self.batch_size, self.workers = batch_size, workers
        classes = sum(1 for entry in os.scandir(data) if entry.is_dir())
        self.net = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(3 * 16, classes))
        self.seen = []

    def train_dataloader(self):
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        dataset = datasets.ImageFolder(self.data, transforms.Compose([
            transforms.RandomResizedCrop(self.size), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
            normalize]))
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, num_workers=self.workers)

    def training_step(self, batch, batch_idx):
        if self.global_step == self.crash_at:
            raise Crash(f"simulated failure at step {self.global_step}")
        images, target = batch
        if self.crash_at != -2:  # -2: a timed run (--bench) records nothing
            self.seen.append({"epoch": self.current_epoch, "idx": batch_idx, "target": target.tolist(),
                              "shape": list(images.shape), "dtype": str(images.dtype)})
        return nn.functional.cross_entropy(self.net(images), target)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def write(self) -> None:
        loader = self.trainer.train_dataloader
        record = {"seen": self.seen, "loader": f"{type(loader).__module__}.{type(loader).__name__}",
                  "sampler": type(loader.sampler).__name__, "rank": self.global_rank,
                  "world": self.trainer.world_size}
        with open(f"{self.out}.rank{self.global_rank}.json", "w") as f:
            json.dump(record, f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--every", type=int, default=0, help="save a checkpoint every N training steps")
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("-b", "--batch-size", type=int, default=2)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=48)
    parser.add_argument("--bench", default=None, help="time the loader and one epoch, write them here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    L.seed_everything(0, workers=True)
    if args.bench:
        bench(args)
        return
    model = Model(args.data, args.out, crash_at=args.crash_at, size=args.size, batch_size=args.batch_size,
                  workers=args.workers)
    callbacks = [ModelCheckpoint(dirpath=os.path.dirname(args.out), filename="mid", every_n_train_steps=args.every,
                                 save_top_k=-1)] if args.every else []
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=args.max_steps, logger=False,
                        enable_checkpointing=bool(callbacks), callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    try:
        trainer.fit(model, ckpt_path=args.resume_from)
    except Crash:
        pass
    model.write()


def bench(args):
    model = Model(args.data, args.out, crash_at=-2, size=args.size, batch_size=args.batch_size, workers=args.workers)
    loader = model.train_dataloader()
    for _ in range(2):  # the first pass warms the page cache and the workers' or engine's state
        t0, loader_n = time.perf_counter(), 0
        for images, target in loader:
            loader_n += images.shape[0]
        loader_s = time.perf_counter() - t0
    del loader
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    t0 = time.perf_counter()
    trainer.fit(model)
    epoch_s = time.perf_counter() - t0
    fitted = trainer.train_dataloader
    with open(args.bench, "w") as fh:
        json.dump({"loader_images": loader_n, "loader_seconds": loader_s, "epoch_images": loader_n,
                   "epoch_seconds": epoch_s, "loader": f"{type(fitted).__module__}.{type(fitted).__name__}",
                   "warnings": []}, fh)


if __name__ == "__main__":
    main()
