"""Device stage (torch): the compiler's rules for timm's ops (``timm.data.create_transform``'s pipelines).

timm's training transform is ``RandomResizedCropAndInterpolation`` (or torchvision's flips, colour
jitter and grayscale after it), one of its own augmentation policies (``rand-*`` RandAugment,
AutoAugment, ``augmix-*``), then either ``MaybePILToTensor`` (timm's default prefetcher path: uint8
tensors that ``fast_collate`` stacks and the prefetcher normalizes) or ``MaybeToTensor`` +
``Normalize`` + timm's ``RandomErasing``; its evaluation transform is torchvision's ``Resize`` +
``CenterCrop`` followed by the same tail. The torchvision ops have their rules in
:mod:`fastload.torch.compile_torchvision`; timm's own classes have theirs here, each reproducing what
the timm op does:

- ``RandomResizedCropAndInterpolation(size, scale, ratio, interpolation)``: torchvision's area and
  aspect sampling (10 attempts, then the centred fallback) and PIL's antialiased resize of the crop,
  with one filter or, for ``interpolation='random'``, bilinear or bicubic drawn per image;
- ``RandAugment``, ``AutoAugment``, ``AugMixAugment`` (not ``blended``) with timm's ops and level
  functions (:mod:`fastload.transforms.timm_policy`; the 3-Augment ops Desaturate / GaussianBlur are
  not in the engine);
- ``MaybeToTensor`` (``ToTensor`` of a PIL image, a tensor passes), ``MaybePILToTensor``
  (``PILToTensor``), ``ToTensor(dtype)`` (unscaled values in ``dtype``), ``ToNumpy`` (CHW uint8
  arrays);
- ``RandomErasing(probability, min_area, max_area, min_aspect, max_aspect, mode, min_count,
  max_count)`` with one box per image, on the normalized float tensor: ``mode='const'`` fills zeros,
  ``'rand'`` one normal value per channel, ``'pixel'`` a normal value per element.

What does not compile stays per sample with the reason, like any other op.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fastload.torch.compile_plan import CompileState, Rule, Unsupported, add_pixel_op, resample_fields, size_pair

__all__ = ["TIMM_RULES"]


def _random_resized_crop(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomResizedCrop

    op = ops[i]
    state.require_uint8_image("RandomResizedCropAndInterpolation")
    if state.kind != "pil":
        raise Unsupported("RandomResizedCropAndInterpolation of a tensor (timm resizes PIL images)")
    modes = op.interpolation if isinstance(op.interpolation, (list, tuple)) else (op.interpolation,)
    names = []
    for mode in modes:
        names.append(resample_fields(state, _Interp(mode), RandomResizedCrop)["interpolation"])
    if len(names) > 1 and len(set(names)) != len(names):
        raise Unsupported(f"a random choice among repeated filters {names}")
    if len(names) > 2:
        raise Unsupported(f"a random choice among {len(names)} filters (the engine draws one of two)")
    interpolation: str | tuple[str, str] = names[0] if len(names) == 1 else (names[0], names[1])
    try:
        geo = RandomResizedCrop(
            size=size_pair(op.size, "RandomResizedCropAndInterpolation"),
            scale=tuple(op.scale),
            ratio=tuple(op.ratio),
            flip=0.0,
            interpolation=interpolation,
        )
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None
    state.set_geometry(geo)
    return 1


class _Interp:
    """One interpolation mode in the shape :func:`resample_fields` reads (an op's attribute)."""

    def __init__(self, mode: Any) -> None:
        self.interpolation = mode


def _maybe_to_tensor(state: CompileState, ops: Sequence[Any], i: int) -> int:
    if state.kind == "tensor":  # a tensor passes through unchanged
        return 1
    state.to_tensor("MaybeToTensor", scaled=True)
    return 1


def _maybe_pil_to_tensor(state: CompileState, ops: Sequence[Any], i: int) -> int:
    if state.kind == "tensor":
        return 1
    state.to_tensor("MaybePILToTensor", scaled=False)
    return 1


def _to_tensor(state: CompileState, ops: Sequence[Any], i: int) -> int:
    # timm's ToTensor: F.pil_to_tensor(img).to(dtype), no rescaling.
    dtype = ops[i].dtype
    if not isinstance(dtype, torch.dtype) or (dtype != torch.uint8 and not dtype.is_floating_point):
        raise Unsupported(f"ToTensor(dtype={dtype}) is not in the engine (uint8 or a float type)")
    state.to_tensor("ToTensor", scaled=False, dtype=dtype)
    return 1


def _to_numpy(state: CompileState, ops: Sequence[Any], i: int) -> int:
    if state.kind != "pil":
        raise Unsupported("ToNumpy of a tensor")
    state.to_tensor("ToNumpy", scaled=False)
    state.as_numpy = True
    return 1


def _random_erasing(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomErasing

    op = ops[i]
    if state.kind != "tensor" or state.as_numpy:
        raise Unsupported("RandomErasing of a PIL image or an array (timm erases tensors)")
    if state.erase is not None:
        raise Unsupported("a second RandomErasing is not in the engine")
    if state.dtype not in (torch.float32, torch.float16):
        raise Unsupported(f"RandomErasing of a {state.dtype} tensor (timm erases the normalized float tensor)")
    if op.min_count != 1 or op.max_count != 1:
        raise Unsupported(f"RandomErasing with {op.min_count}..{op.max_count} boxes is not in the engine (one box)")
    value: Any = "random" if op.per_pixel else "random_color" if op.rand_color else 0.0
    lo, hi = op.log_aspect_ratio
    try:
        state.erase = RandomErasing(
            p=float(op.probability),
            scale=(float(op.min_area), float(op.max_area)),
            ratio=(math.exp(lo), math.exp(hi)),
            value=value,
        )
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None
    return 1


def _augment_ops(ops: Sequence[Any]) -> tuple[list[tuple[str, float, float]], dict[str, Any]]:
    """The ``(name, prob, magnitude)`` of timm ``AugmentOp`` objects and the hparams they share, or why not."""
    from PIL import Image
    from timm.data import auto_augment as aa

    from fastload.transforms.timm_policy import TIMM_OP_NAMES

    triples, shared = [], None
    for op in ops:
        if type(op) is not aa.AugmentOp:
            raise Unsupported(f"it holds {type(op).__name__}, not timm's AugmentOp")
        if op.name not in TIMM_OP_NAMES:
            raise Unsupported(f"timm's {op.name} op is not in the engine")
        if op.aug_fn is not aa.NAME_TO_OP.get(op.name) or op.level_fn is not aa.LEVEL_TO_ARG.get(op.name):
            raise Unsupported(f"its {op.name} op was given another function")
        resample = op.kwargs.get("resample")
        random_pair = (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)
        codes = {Image.Resampling.NEAREST: "nearest", Image.Resampling.BILINEAR: "bilinear"}
        codes[Image.Resampling.BICUBIC] = "bicubic"
        if isinstance(resample, (list, tuple)):
            if tuple(resample) != random_pair:
                raise Unsupported(f"a random choice among {resample} filters (the engine draws bilinear / bicubic)")
            interpolation = None
        elif resample in codes:
            interpolation = codes[resample]
        else:
            raise Unsupported(f"resample={resample!r} is not in the engine (nearest, bilinear, bicubic)")
        hp = op.hparams
        fields = {
            "magnitude_std": float(hp.get("magnitude_std", 0.0)),
            "magnitude_max": hp.get("magnitude_max"),
            "translate_const": float(hp.get("translate_const", 250)),
            "translate_pct": float(hp.get("translate_pct", 0.45)),
            "fill": tuple(op.kwargs.get("fillcolor", (128, 128, 128))),
            "interpolation": interpolation,
        }
        if shared is None:
            shared = fields
        elif fields != shared:
            raise Unsupported("its ops have different hparams (the engine takes one set per policy)")
        triples.append((op.name, float(op.prob), float(op.magnitude)))
    if shared is None:
        raise Unsupported("it has no ops")
    return triples, shared


def _build(build: Any) -> Any:
    try:
        return build()
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None


def _rand_augment(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms.timm_policy import TimmRandAugment

    op = ops[i]
    state.require_pixel_stage("RandAugment")
    triples, hp = _augment_ops(op.ops)
    weights = None if op.choice_weights is None else tuple(float(w) for w in op.choice_weights)
    spec = _build(
        lambda: TimmRandAugment(ops=tuple(triples), num_layers=int(op.num_layers), choice_weights=weights, **hp),
    )
    return add_pixel_op(state, "RandAugment", lambda: spec)


def _auto_augment(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms.timm_policy import TimmAutoAugment

    op = ops[i]
    state.require_pixel_stage("AutoAugment")
    subs, shared = [], None
    for sub in op.policy:
        triples, hp = _augment_ops(sub)
        if shared is not None and hp != shared:
            raise Unsupported("its sub-policies have different hparams")
        shared = hp
        subs.append(tuple(triples))
    if shared is None:
        raise Unsupported("it has no sub-policies")
    hp = shared
    spec = _build(lambda: TimmAutoAugment(subpolicies=tuple(subs), **hp))
    return add_pixel_op(state, "AutoAugment", lambda: spec)


def _augmix(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms.timm_policy import TimmAugMix

    op = ops[i]
    state.require_pixel_stage("AugMixAugment")
    if op.blended:
        raise Unsupported("AugMixAugment(blended=True) is not in the engine (timm's faster approximation)")
    triples, hp = _augment_ops(op.ops)
    spec = _build(
        lambda: TimmAugMix(ops=tuple(triples), alpha=float(op.alpha), width=int(op.width), depth=int(op.depth), **hp),
    )
    return add_pixel_op(state, "AugMixAugment", lambda: spec)


#: timm's own classes (``module:Name``).
TIMM_RULES: tuple[Rule, ...] = (
    Rule(
        "RandomResizedCropAndInterpolation",
        ("timm.data.transforms:RandomResizedCropAndInterpolation",),
        _random_resized_crop,
    ),
    Rule("MaybeToTensor", ("timm.data.transforms:MaybeToTensor",), _maybe_to_tensor),
    Rule("MaybePILToTensor", ("timm.data.transforms:MaybePILToTensor",), _maybe_pil_to_tensor),
    Rule("ToTensor", ("timm.data.transforms:ToTensor",), _to_tensor),
    Rule("ToNumpy", ("timm.data.transforms:ToNumpy",), _to_numpy),
    Rule("RandomErasing", ("timm.data.random_erasing:RandomErasing",), _random_erasing),
    Rule("RandAugment", ("timm.data.auto_augment:RandAugment",), _rand_augment),
    Rule("AutoAugment", ("timm.data.auto_augment:AutoAugment",), _auto_augment),
    Rule("AugMixAugment", ("timm.data.auto_augment:AugMixAugment",), _augmix),
)
