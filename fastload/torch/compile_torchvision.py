"""Device stage (torch): the compiler's rules for torchvision's ops, one function per op (v1 and v2).

Each rule checks the op's parameters and folds it into the :class:`~fastload.torch.compile_plan.CompileState`,
or raises :class:`~fastload.torch.compile_plan.Unsupported` with the reason; :data:`TORCHVISION_RULES`
is their table (matched by exact type in :mod:`fastload.torch.compile`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from fastload.torch.compile_plan import (
    CompileState,
    Rule,
    Unsupported,
    add_pixel_op,
    interpolation_name,
    jitter_range,
    policy_fields,
    resample_fields,
    size_pair,
)

__all__ = ["TORCHVISION_RULES"]


def _random_resized_crop(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomResizedCrop

    op = ops[i]
    state.require_uint8_image("RandomResizedCrop")
    resample = resample_fields(state, op, RandomResizedCrop)
    try:
        geo = RandomResizedCrop(
            size=size_pair(op.size, "RandomResizedCrop"),
            scale=tuple(op.scale),
            ratio=tuple(op.ratio),
            flip=0.0,
            **resample,
        )
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None
    state.set_geometry(geo)
    return 1


def _resize(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import CenterCrop, Resize

    op = ops[i]
    state.require_uint8_image("Resize")
    if getattr(op, "max_size", None) is not None or op.size is None:
        raise Unsupported("Resize with max_size is not in the engine yet")
    size = op.size
    if isinstance(size, int) or len(size) == 1:
        shorter = int(size) if isinstance(size, int) else int(size[0])
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        if nxt is None or not _is_center_crop(nxt):
            raise Unsupported(
                "Resize to a shorter side makes images of different sizes; the engine takes it "
                "only when a CenterCrop follows"
            )
        resample = resample_fields(state, op, CenterCrop)
        try:
            geo: CenterCrop | Resize = CenterCrop(
                size=size_pair(nxt.size, "CenterCrop"), resize=shorter, flip=0.0, **resample
            )
        except (ValueError, TypeError) as exc:
            raise Unsupported(str(exc)) from None
        state.set_geometry(geo)
        return 2
    resample = resample_fields(state, op, Resize)
    try:
        geo = Resize(size=size_pair(size, "Resize"), flip=0.0, **resample)
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None
    state.set_geometry(geo)
    return 1


def _is_center_crop(op: Any) -> bool:
    from torchvision.transforms import CenterCrop
    from torchvision.transforms.v2 import CenterCrop as CenterCropV2

    return type(op) in (CenterCrop, CenterCropV2)


def _center_crop(state: CompileState, ops: Sequence[Any], i: int) -> int:
    raise Unsupported("CenterCrop without a Resize(s) before it is not in the engine yet")


def _flip_commutes(state: CompileState, what: str) -> None:
    """A flip is fused into the geometry, i.e. moved before the pixel ops: only colour ops commute with it."""
    from fastload.transforms import ColorJitter, RandomGrayscale

    if state.erase is not None or (state.kind != "pil" and state.dtype != torch.uint8):
        raise Unsupported(f"{what} after the output ops is not in the engine")
    if state.affine is not None:
        raise Unsupported(f"{what} after RandomAffine is not in the engine (the engine flips the crop before the warp)")
    if any(not isinstance(op, (ColorJitter, RandomGrayscale)) for op in state.ops):
        raise Unsupported(f"{what} after an AutoAugment-style policy is not in the engine (they do not commute)")


def _hflip(state: CompileState, ops: Sequence[Any], i: int) -> int:
    p = float(ops[i].p)
    _flip_commutes(state, "RandomHorizontalFlip")
    if state.geometry is None:
        if state.pending_flip is not None:
            raise Unsupported("a second horizontal flip is not in the engine")
        state.pending_flip = p
    else:
        if state.geometry.flip:
            raise Unsupported("a second horizontal flip is not in the engine")
        try:
            state.geometry = dataclasses.replace(state.geometry, flip=p)
        except ValueError as exc:
            raise Unsupported(str(exc)) from None
    return 1


def _vflip(state: CompileState, ops: Sequence[Any], i: int) -> int:
    p = float(ops[i].p)
    _flip_commutes(state, "RandomVerticalFlip")
    if state.geometry is None:
        if state.pending_vflip is not None:
            raise Unsupported("a second vertical flip is not in the engine")
        state.pending_vflip = p
        return 1
    if getattr(state.geometry, "vflip", 0.0) != 0.0:
        raise Unsupported("a second vertical flip is not in the engine")
    try:
        state.geometry = dataclasses.replace(state.geometry, vflip=p)
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None
    return 1


def _random_crop(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomCrop

    op = ops[i]
    state.require_uint8_image("RandomCrop")
    if getattr(op, "padding_mode", "constant") != "constant":
        raise Unsupported(f"padding_mode={op.padding_mode!r} is not in the engine (constant padding only)")
    fill = op.fill
    if isinstance(fill, dict):  # v2: a fill per tv_tensor type
        fill = next(iter(fill.values()), 0) if len(fill) == 1 else None
        if fill is None:
            raise Unsupported("a fill per tensor type is not in the engine")
    padding = op.padding
    if isinstance(padding, (list, tuple)) and len(padding) == 1:
        padding = padding[0]
    try:
        geo = RandomCrop(
            size=size_pair(op.size, "RandomCrop"),
            padding=tuple(padding) if isinstance(padding, (list, tuple)) else padding,
            fill=tuple(fill) if isinstance(fill, (list, tuple)) else (0 if fill is None else fill),
            pad_if_needed=bool(op.pad_if_needed),
        )
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None
    state.set_geometry(geo)
    return 1


def _color_jitter(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import ColorJitter

    op = ops[i]
    return add_pixel_op(
        state,
        "ColorJitter",
        lambda: ColorJitter(
            brightness=jitter_range(op.brightness),
            contrast=jitter_range(op.contrast),
            saturation=jitter_range(op.saturation),
            hue=jitter_range(op.hue),
        ),
    )


def _random_grayscale(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomGrayscale

    return add_pixel_op(state, "RandomGrayscale", lambda: RandomGrayscale(p=float(ops[i].p)))


def _auto_augment(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import AutoAugment

    op = ops[i]
    return add_pixel_op(state, "AutoAugment", lambda: AutoAugment(policy=op.policy.value, **policy_fields(op)))


def _rand_augment(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandAugment

    op = ops[i]
    return add_pixel_op(
        state,
        "RandAugment",
        lambda: RandAugment(
            num_ops=int(op.num_ops),
            magnitude=int(op.magnitude),
            num_magnitude_bins=int(op.num_magnitude_bins),
            **policy_fields(op),
        ),
    )


def _trivial_augment(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import TrivialAugmentWide

    op = ops[i]
    return add_pixel_op(
        state,
        "TrivialAugmentWide",
        lambda: TrivialAugmentWide(num_magnitude_bins=int(op.num_magnitude_bins), **policy_fields(op)),
    )


def _random_affine(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import OpKind, RandomAffine

    op = ops[i]
    state.require_pixel_stage("RandomAffine")
    if state.affine is not None:
        raise Unsupported("a second RandomAffine is not in the engine")
    if state.ops:
        # The engine warps before its pixel ops: a colour op first would leave the fill unjittered.
        raise Unsupported("RandomAffine after a colour op or policy is not in the engine")
    kinds = (OpKind.RANDOM_RESIZED_CROP, OpKind.RESIZE_CENTER_CROP, OpKind.RESIZE)
    if state.geometry.kind not in kinds or getattr(state.geometry, "vflip", 0.0) != 0.0:
        raise Unsupported("RandomAffine after RandomCrop or a vertical flip is not in the engine")
    fill = policy_fields(op)["fill"]

    def pair(value: Sequence[float] | None) -> Any:  # a tuple whose length RandomAffine checks
        return None if value is None else tuple(float(v) for v in value)

    try:
        state.affine = RandomAffine(
            degrees=pair(op.degrees),
            translate=pair(op.translate),
            scale=pair(op.scale),
            shear=pair(op.shear),
            interpolation=interpolation_name(op.interpolation),
            fill=tuple(fill) if isinstance(fill, (list, tuple)) else (0 if fill is None else fill),
            center=pair(op.center),
        )
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None
    return 1


def _random_erasing(state: CompileState, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomErasing

    op = ops[i]
    if state.kind != "tensor":
        raise Unsupported("RandomErasing of a PIL image")
    if state.erase is not None:
        raise Unsupported("a second RandomErasing is not in the engine")
    if state.dtype not in (torch.uint8, torch.float32, torch.float16):
        raise Unsupported(f"RandomErasing of a {state.dtype} tensor is not in the engine")
    value = op.value
    if isinstance(value, (list, tuple)):
        value = tuple(float(v) for v in value)
    try:
        state.erase = RandomErasing(p=float(op.p), scale=tuple(op.scale), ratio=tuple(op.ratio), value=value)
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None
    return 1


def _to_tensor(state: CompileState, ops: Sequence[Any], i: int) -> int:
    state.to_tensor("ToTensor", scaled=True)
    return 1


def _pil_to_tensor(state: CompileState, ops: Sequence[Any], i: int) -> int:
    state.to_tensor("PILToTensor", scaled=False)
    return 1


def _to_image(state: CompileState, ops: Sequence[Any], i: int) -> int:
    state.kind, state.tv_image = "tensor", True
    return 1


def _to_pure_tensor(state: CompileState, ops: Sequence[Any], i: int) -> int:
    state.tv_image = False  # a PIL image passes through unchanged
    return 1


def _convert_image_dtype(state: CompileState, ops: Sequence[Any], i: int) -> int:
    state.convert_dtype(ops[i].dtype, scale=True)
    return 1


def _to_dtype(state: CompileState, ops: Sequence[Any], i: int) -> int:
    state.convert_dtype(ops[i].dtype, scale=bool(ops[i].scale))
    return 1


def _normalize(state: CompileState, ops: Sequence[Any], i: int) -> int:
    state.normalize(ops[i].mean, ops[i].std)
    return 1


#: torchvision's ops, v1 and v2 classes (``module:Name``), in no particular order.
TORCHVISION_RULES: tuple[Rule, ...] = (
    Rule(
        "RandomResizedCrop",
        ("torchvision.transforms:RandomResizedCrop", "torchvision.transforms.v2:RandomResizedCrop"),
        _random_resized_crop,
    ),
    Rule("Resize", ("torchvision.transforms:Resize", "torchvision.transforms.v2:Resize"), _resize),
    Rule("CenterCrop", ("torchvision.transforms:CenterCrop", "torchvision.transforms.v2:CenterCrop"), _center_crop),
    Rule(
        "RandomHorizontalFlip",
        ("torchvision.transforms:RandomHorizontalFlip", "torchvision.transforms.v2:RandomHorizontalFlip"),
        _hflip,
    ),
    Rule("ToTensor", ("torchvision.transforms:ToTensor", "torchvision.transforms.v2:ToTensor"), _to_tensor),
    Rule(
        "PILToTensor", ("torchvision.transforms:PILToTensor", "torchvision.transforms.v2:PILToTensor"), _pil_to_tensor
    ),
    Rule("ToImage", ("torchvision.transforms.v2:ToImage",), _to_image),
    Rule("ToPureTensor", ("torchvision.transforms.v2:ToPureTensor",), _to_pure_tensor),
    Rule(
        "ConvertImageDtype",
        ("torchvision.transforms:ConvertImageDtype", "torchvision.transforms.v2:ConvertImageDtype"),
        _convert_image_dtype,
    ),
    Rule("ToDtype", ("torchvision.transforms.v2:ToDtype",), _to_dtype),
    Rule("Normalize", ("torchvision.transforms:Normalize", "torchvision.transforms.v2:Normalize"), _normalize),
    Rule(
        "RandomVerticalFlip",
        ("torchvision.transforms:RandomVerticalFlip", "torchvision.transforms.v2:RandomVerticalFlip"),
        _vflip,
    ),
    Rule("RandomCrop", ("torchvision.transforms:RandomCrop", "torchvision.transforms.v2:RandomCrop"), _random_crop),
    Rule("ColorJitter", ("torchvision.transforms:ColorJitter", "torchvision.transforms.v2:ColorJitter"), _color_jitter),
    Rule(
        "RandomGrayscale",
        ("torchvision.transforms:RandomGrayscale", "torchvision.transforms.v2:RandomGrayscale"),
        _random_grayscale,
    ),
    Rule("AutoAugment", ("torchvision.transforms:AutoAugment", "torchvision.transforms.v2:AutoAugment"), _auto_augment),
    Rule("RandAugment", ("torchvision.transforms:RandAugment", "torchvision.transforms.v2:RandAugment"), _rand_augment),
    Rule(
        "TrivialAugmentWide",
        ("torchvision.transforms:TrivialAugmentWide", "torchvision.transforms.v2:TrivialAugmentWide"),
        _trivial_augment,
    ),
    Rule(
        "RandomErasing",
        ("torchvision.transforms:RandomErasing", "torchvision.transforms.v2:RandomErasing"),
        _random_erasing,
    ),
    Rule(
        "RandomAffine",
        ("torchvision.transforms:RandomAffine", "torchvision.transforms.v2:RandomAffine"),
        _random_affine,
    ),
)
