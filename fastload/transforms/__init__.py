"""Augmentation specs handed to the decode engine, and the per-sample randomness they use.

Transforms are data, not code: small frozen, keyword-only dataclasses that the engine (C++ or the
Pillow fallback) interprets while decoding. One module per kind of op:

- :mod:`fastload.transforms.rng`: the counter-based generator keyed by ``(seed, epoch, index)``;
- :mod:`fastload.transforms.geometry`: the crop / resize / flip that maps the decoded image to the
  output size (``RandomResizedCrop``, ``CenterCrop``, ``Resize``) and its reference sampler;
- :mod:`fastload.transforms.output`: ``Normalize``, the output stage (dtype and normalization);
- :mod:`fastload.transforms.pipeline`: ``Pipeline(geometry, ops, normalize, erase)``, the whole
  per-sample transform.
"""

from fastload.transforms.geometry import (
    CenterCrop,
    OpKind,
    RandomResizedCrop,
    Resize,
    SampleParams,
    Transform,
    INTERPOLATIONS,
    eval_transform,
    resample,
    sample_params,
    train,
)
from fastload.transforms.output import Normalize
from fastload.transforms.pipeline import Pipeline, as_pipeline, op_counter_base
from fastload.transforms.rng import sample_key, splitmix64, uniform

__all__ = [
    "OpKind",
    "RandomResizedCrop",
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
]
