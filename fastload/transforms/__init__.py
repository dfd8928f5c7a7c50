"""Augmentation specs handed to the decode engine, and the per-sample randomness they use.

Transforms are data, not code: small frozen, keyword-only dataclasses that the engine (C++ or the
Pillow fallback) interprets while decoding. One module per kind of op:

- :mod:`fastload.transforms.rng`: the counter-based generator keyed by ``(seed, epoch, index)``;
- :mod:`fastload.transforms.geometry`: the crop / resize / flip that maps the decoded image to the
  output size (``RandomResizedCrop``, ``CenterCrop``, ``Resize``) and its reference sampler;
- :mod:`fastload.transforms.output`: ``Normalize``, the output stage (dtype and normalization);
- :mod:`fastload.transforms.pipeline`: ``Pipeline(geometry, ops, normalize, erase)``, the whole
  per-sample transform;
- pixel ops on the output-sized image (:mod:`~fastload.transforms.color`,
  :mod:`~fastload.transforms.mxnet_color`, :mod:`~fastload.transforms.policy`; counters and runner in
  :mod:`~fastload.transforms.pixel`), the output-stage :mod:`~fastload.transforms.erasing` and the
  batch-level :mod:`~fastload.transforms.mixing`.
"""

from fastload.transforms.geometry import (
    PADDING_MODES,
    CenterCrop,
    OpKind,
    CropWindow,
    ImageTooSmall,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    SampleParams,
    Transform,
    INTERPOLATIONS,
    eval_transform,
    random_crop_window,
    resample,
    sample_params,
    train,
)
from fastload.transforms.output import Normalize
from fastload.transforms.pipeline import Pipeline, as_pipeline, op_counter_base
from fastload.transforms.rng import sample_key, splitmix64, uniform

# Pixel, output-stage and batch ops.
from fastload.transforms.color import ColorJitter, Grayscale, Lighting, RandomGrayscale  # noqa: E402
from fastload.transforms.erasing import RandomErasing  # noqa: E402
from fastload.transforms.mixing import CutMix, MixUp, RandomChoice, mix_batch  # noqa: E402
from fastload.transforms.mxnet_color import MXNetColorAugment  # noqa: E402
from fastload.transforms.policy import AutoAugment, AutoAugmentPolicy, RandAugment, TrivialAugmentWide  # noqa: E402

__all__ = [
    "OpKind",
    "RandomResizedCrop",
    "RandomCrop",
    "CropWindow",
    "ImageTooSmall",
    "random_crop_window",
    "PADDING_MODES",
    "CenterCrop",
    "Resize",
    "Transform",
    "SampleParams",
    "train",
    "eval_transform",
    "sample_params",
    "resample",
    "INTERPOLATIONS",
    "Normalize",
    "Pipeline",
    "as_pipeline",
    "op_counter_base",
    "splitmix64",
    "sample_key",
    "uniform",
    "ColorJitter",
    "RandomGrayscale",
    "Grayscale",
    "Lighting",
    "MXNetColorAugment",
    "AutoAugment",
    "AutoAugmentPolicy",
    "RandAugment",
    "TrivialAugmentWide",
    "RandomErasing",
    "MixUp",
    "CutMix",
    "RandomChoice",
    "mix_batch",
]
