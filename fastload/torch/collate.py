"""Device stage (torch): which collate functions the engine's batch already is, and which run as given.

The engine writes a whole batch into one ring slot: images ``[B, C, H, W]`` and labels. A loader's
``collate_fn`` either builds exactly that from the samples, and then the slot is handed out as it is
(zero copy), or it runs on the samples as torch would call it:

- torch's ``default_collate`` of ``(image tensor, int)`` samples: ``[images, int64 targets]``;
- timm's ``fast_collate`` (``timm.data.loader``) of uint8 samples (its prefetcher path):
  ``(uint8 images, int64 targets)``, a tuple. Of float samples it truncates to uint8, so those run as given;
- anything else runs as given on the samples. timm's ``FastCollateMixup`` does too, with its own
  semantics (each sample mixed with its mirror ``B - 1 - i``, per-batch / pair / element lambdas,
  rounding to uint8): the engine's MixUp / CutMix follow torchvision's pairing, a different op, so
  the loader names it once (:attr:`Collation.note`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import default_collate

__all__ = ["Collation", "classify_collate"]


@dataclass(frozen=True)
class Collation:
    """How a loader's batches are made from the engine's slot.

    Attributes:
        kind: ``"list"`` (``[images, targets]``, default_collate's), ``"tuple"`` (``(images, targets)``,
            timm's fast_collate) or ``"samples"`` (the collate function runs on the samples).
        note: For a library's collate function that runs on the samples although the engine has an
            op of that name: why (said once per loader); None otherwise.
    """

    kind: str
    note: str | None = None

    @property
    def zero_copy(self) -> bool:
        return self.kind != "samples"

    def build(self, images: torch.Tensor, targets: torch.Tensor) -> Any:
        """The batch as the collate function would return it (``zero_copy`` kinds only)."""
        return (images, targets) if self.kind == "tuple" else [images, targets]


def _timm_attr(module: str, name: str) -> Any:
    # timm is only consulted when the caller already imported it (its classes cannot be in use otherwise).
    return getattr(sys.modules.get(module), name, None)


def classify_collate(collate_fn: Any, *, uint8_images: bool) -> Collation:
    """The :class:`Collation` of ``collate_fn`` for samples of a tensor (or CHW array) plan.

    Args:
        collate_fn: The loader's ``collate_fn``.
        uint8_images: The compiled transform yields uint8 images (else float).
    """
    if collate_fn is default_collate:
        return Collation("list")
    fast_collate = _timm_attr("timm.data.loader", "fast_collate")
    if fast_collate is not None and collate_fn is fast_collate:
        return Collation("tuple") if uint8_images else Collation("samples")
    mixup = _timm_attr("timm.data.mixup", "FastCollateMixup")
    if mixup is not None and isinstance(collate_fn, mixup):
        return Collation(
            "samples",
            note=(
                "timm's FastCollateMixup runs as the collate_fn on the engine's samples, with its own "
                "semantics (sample i mixed with sample B - 1 - i, rounded to uint8); the engine's MixUp / "
                "CutMix pair samples as torchvision's do, another op"
            ),
        )
    return Collation("samples")
