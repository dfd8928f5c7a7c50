"""Augmentation specs handed to the decode engine, and the per-sample randomness they use.

Transforms are data, not code: small frozen, keyword-only dataclasses that the engine (C++ or the
Pillow fallback) interprets while decoding. One module per kind of op:

- :mod:`fastload.transforms.rng`: the counter-based generator keyed by ``(seed, epoch, index)``;
- :mod:`fastload.transforms.geometry`: the crop / resize / flip that maps the decoded image to the
  output size (``RandomResizedCrop``, ``CenterCrop``, ``Resize``) and its reference sampler;
- :mod:`fastload.transforms.affine`: ``RandomAffine`` after the crop, and
  :mod:`fastload.transforms.mxnet_augment`: ``MXNetDefaultAugment`` (MXNet's augmenter geometry),
  both sampled once through :mod:`fastload.transforms.warp`'s plans;
- :mod:`fastload.transforms.output`: ``Normalize``, the output stage (dtype and normalization);
- :mod:`fastload.transforms.pipeline`: ``Pipeline(geometry, ops, normalize, erase)``, the whole
  per-sample transform;
- pixel ops on the output-sized image (:mod:`~fastload.transforms.color`,
  :mod:`~fastload.transforms.mxnet_color`, :mod:`~fastload.transforms.policy`,
  :mod:`~fastload.transforms.timm_policy`; counters and runner in
  :mod:`~fastload.transforms.pixel`), the output-stage :mod:`~fastload.transforms.erasing` and the
  batch-level :mod:`~fastload.transforms.mixing`.
"""

# Pixel, output-stage and batch ops.
from fastload.transforms.affine import AFFINE_PARAM_NAMES, AffineParams, RandomAffine, affine_plan
from fastload.transforms.color import ColorJitter, Grayscale, Lighting, RandomGrayscale
from fastload.transforms.erasing import RandomErasing
from fastload.transforms.geometry import (
    INTERPOLATIONS,
    PADDING_MODES,
    CenterCrop,
    CropWindow,
    ImageTooSmall,
    OpKind,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    SampleParams,
    Transform,
    eval_transform,
    random_crop_window,
    resample,
    sample_interpolation,
    sample_params,
    train,
)
from fastload.transforms.mixing import CutMix, MixUp, RandomChoice, mix_batch
from fastload.transforms.mxnet_augment import MXNET_PARAM_NAMES, MXNetDefaultAugment, MXNetParams, mxnet_plan
from fastload.transforms.mxnet_color import MXNetColorAugment
from fastload.transforms.output import Normalize
from fastload.transforms.pipeline import Pipeline, as_pipeline, op_counter_base
from fastload.transforms.policy import AutoAugment, AutoAugmentPolicy, RandAugment, TrivialAugmentWide
from fastload.transforms.rng import sample_key, splitmix64, uniform
from fastload.transforms.timm_policy import TimmAugMix, TimmAutoAugment, TimmRandAugment
from fastload.transforms.warp import WarpPlan, warp_image

__all__ = [
    "AFFINE_PARAM_NAMES",
    "INTERPOLATIONS",
    "MXNET_PARAM_NAMES",
    "PADDING_MODES",
    "AffineParams",
    "AutoAugment",
    "AutoAugmentPolicy",
    "CenterCrop",
    "ColorJitter",
    "CropWindow",
    "CutMix",
    "Grayscale",
    "ImageTooSmall",
    "Lighting",
    "MXNetColorAugment",
    "MXNetDefaultAugment",
    "MXNetParams",
    "MixUp",
    "Normalize",
    "OpKind",
    "Pipeline",
    "RandAugment",
    "RandomAffine",
    "RandomChoice",
    "RandomCrop",
    "RandomErasing",
    "RandomGrayscale",
    "RandomResizedCrop",
    "Resize",
    "SampleParams",
    "TimmAugMix",
    "TimmAutoAugment",
    "TimmRandAugment",
    "Transform",
    "TrivialAugmentWide",
    "WarpPlan",
    "affine_plan",
    "as_pipeline",
    "eval_transform",
    "mix_batch",
    "mxnet_plan",
    "op_counter_base",
    "random_crop_window",
    "resample",
    "sample_interpolation",
    "sample_key",
    "sample_params",
    "splitmix64",
    "train",
    "uniform",
    "warp_image",
]
