"""Device stage (torch): compile a torchvision transform pipeline into fastload's engine ops.

``compile_transform(Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
Normalize(mean, std)]))`` walks the ops in order and folds every op it knows into one engine plan:
a geometry op of :mod:`fastload.transforms` (the crop / resize with the flip fused) and an output
stage (``(x * scale - mean) / std`` in a float dtype, or uint8), which :meth:`Plan.engine_transform`
turns into the engine's ``Pipeline(geometry, normalize=Normalize(...))``: the engine writes the
final values into the batch itself. It stops at the first op it cannot
take; that op and everything after it stay *the original objects* and run per sample, with their
own semantics, on what the compiled prefix produced (a PIL image, a uint8 tensor, a float tensor or a
``tv_tensors.Image``: whatever the original pipeline had at that point).

The compiler is a table (:data:`RULES`): one entry per torchvision op, v1 and v2 classes alike, each a
function that checks the op's parameters and updates the plan, or says why it cannot. A new engine
op is one new entry. Types are matched exactly (a subclass may override what the op does).

What compiles today (everything on the PIL image that ``ImageFolder`` yields, or on a uint8 tensor):

- ``RandomResizedCrop(size, scale, ratio, interpolation)``;
- ``Resize((h, w))``; ``Resize(s)`` followed by ``CenterCrop(c)`` (no ``max_size``);
- the interpolations the engine's geometry ops take (antialiased bilinear until they take an
  ``interpolation`` field; PIL images are always resized with antialiasing, tensors per ``antialias``);
- ``RandomHorizontalFlip(p)``, before or after the geometry (a flip commutes with the crop's
  sampling and with per-pixel ops);
- ``RandomCrop`` (constant padding), ``RandomVerticalFlip``;
- ``RandomAffine(degrees, translate, scale, shear, interpolation, fill, center)`` on the PIL image
  right after the crop (before any colour op or policy, no flip after it), composed with the crop
  into one resampling pass: ``nearest`` (torchvision's default) gives torchvision's two-pass pixels,
  ``bilinear`` / ``bicubic`` interpolate once instead of twice (slightly sharper);
- ``ColorJitter``, ``RandomGrayscale``, ``AutoAugment``, ``RandAugment``, ``TrivialAugmentWide`` on
  the PIL image after the crop (torchvision's PIL backend), ``RandomErasing`` on the output tensor;
- ``ToTensor``, ``PILToTensor``, ``v2.ToImage``, ``ConvertImageDtype``, ``v2.ToDtype(float, scale)``,
  ``Normalize`` (chains of them too), ``v2.ToPureTensor``;
- preset classes whose ``__call__`` is exactly ``return self.transforms(img)`` (torchvision's reference
  scripts' ``ClassificationPresetTrain`` / ``Eval``) are looked through.

Randomness: the engine draws the crop, flip, affine and pixel-op parameters from its counter-based
generator, not from torch's RNG; the *distributions* are torchvision's (same area / aspect-ratio
sampling, same fallback, same flip probability, same angle / translation / scale / shear ranges),
the individual draws are not.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from fastload.torch.placement import FLOAT_DTYPES, FloatOutput

if TYPE_CHECKING:
    from fastload.transforms import Pipeline, Transform

__all__ = ["RULES", "SUPPORTED_INTERPOLATIONS", "Plan", "compile_transform"]

#: Resampling filters the engine implements (torchvision's names).
SUPPORTED_INTERPOLATIONS = frozenset({"bilinear"})


class _Unsupported(Exception):
    """An op the table knows, with parameters the engine does not implement."""


@dataclass(frozen=True)
class Plan:
    """A transform split into what the engine does and what runs per sample afterwards.

    Attributes:
        geometry: The fastload geometry op (crop / resize, flip fused), or None when nothing compiles.
        kind: What the compiled prefix produces per sample: ``"pil"`` (an RGB ``PIL.Image``) or
            ``"tensor"`` (CHW).
        tv_image: The tensor is a ``torchvision.tv_tensors.Image`` (after ``v2.ToImage``).
        dtype: ``torch.uint8`` or a float dtype.
        scale: Multiplier of the uint8 pixels before ``mean`` / ``std`` (1/255 after ToTensor).
        mean: Per-channel mean subtracted (after scaling).
        std: Per-channel std divided by.
        ops: Pixel ops of :mod:`fastload.transforms` run by the engine after the geometry (colour,
            AutoAugment policies), in order.
        affine: The engine's ``RandomAffine`` composed with the geometry into one resampling pass,
            or None.
        erase: The engine's ``RandomErasing`` on the compiled prefix's output, or None.
        rest: The ops after the compiled prefix (the original objects), run per sample.
        compiled: Names of the ops folded into the engine plan, in order.
        stop: Why ``rest[0]`` did not compile (None when everything did).
    """

    geometry: Any
    kind: str = "pil"
    tv_image: bool = False
    dtype: torch.dtype = torch.uint8
    scale: float = 1.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    ops: tuple[Any, ...] = ()
    erase: Any = None
    rest: tuple[Any, ...] = ()
    compiled: tuple[str, ...] = ()
    stop: str | None = None
    affine: Any = None

    @property
    def is_tensor(self) -> bool:
        return self.kind == "tensor"

    @property
    def is_float(self) -> bool:
        return self.dtype != torch.uint8

    def float_output(self) -> FloatOutput | None:
        """The uint8 -> float conversion of the compiled prefix (None when it ends in uint8)."""
        if not self.is_float:
            return None
        return FloatOutput(self.dtype, self.scale, self.mean, self.std)

    def engine_transform(self) -> tuple[Any, FloatOutput | None]:
        """What the engine runs, and the conversion left to torch (None when the engine writes it all).

        With the engine's output stage (``fastload.transforms.Pipeline`` and ``Normalize``), a float
        plan becomes ``Pipeline(geometry, normalize=Normalize(mean, std, scale, dtype))``: the engine
        writes the normalized float32 / float16 values straight into the batch, with no second pass.
        Without it (or for float64 / bfloat16), the engine writes uint8 and torch converts after.
        """
        import fastload.transforms as transforms

        if not self.is_float:
            if not self.ops and self.erase is None and self.affine is None:
                return self.geometry, None
            return (
                transforms.Pipeline(geometry=self.geometry, ops=self.ops, erase=self.erase, affine=self.affine),
                None,
            )
        dtypes = {torch.float32: "float32", torch.float16: "float16"}
        if self.dtype not in dtypes:
            # float64 / bfloat16: the engine writes uint8, torch converts (compile() never folds
            # RandomErasing into such a plan, whose values the engine does not write).
            if self.ops or self.affine is not None:
                spec = transforms.Pipeline(geometry=self.geometry, ops=self.ops, affine=self.affine)
            else:
                spec = self.geometry
            return spec, self.float_output()
        m, sd = self.mean, self.std  # three values each (_scalars)
        normalize = transforms.Normalize(
            mean=(m[0], m[1], m[2]), std=(sd[0], sd[1], sd[2]), scale=self.scale, dtype=dtypes[self.dtype]
        )
        spec = transforms.Pipeline(
            geometry=self.geometry, ops=self.ops, normalize=normalize, erase=self.erase, affine=self.affine
        )
        return spec, None

    def describe(self) -> str:
        done = " + ".join(self.compiled) if self.compiled else "nothing"
        if not self.rest:
            return f"{done} (all in the engine)"
        return f"{done} in the engine; per sample: {', '.join(_name(op) for op in self.rest)}"

    @property
    def key(self) -> tuple[Any, ...]:
        """Identifies what the engine does (two plans with equal keys decode identically)."""
        return (
            self.geometry,
            self.kind,
            self.tv_image,
            self.dtype,
            self.scale,
            self.mean,
            self.std,
            self.ops,
            self.erase,
            self.affine,
        )


@dataclass
class _State:
    geometry: Any = None
    pending_flip: float | None = None
    kind: str = "pil"
    tv_image: bool = False
    dtype: torch.dtype = torch.uint8
    scale: float = 1.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    pending_vflip: float | None = None
    ops: tuple[Any, ...] = ()
    erase: Any = None
    affine: Any = None
    compiled: list[str] = field(default_factory=list)

    def require_uint8_image(self, what: str) -> None:
        if self.dtype != torch.uint8:
            raise _Unsupported(f"{what} on a float tensor is not in the engine (it resizes uint8 images)")

    def set_geometry(self, op: Any) -> None:
        if self.geometry is not None:
            raise _Unsupported("a second geometry op after the first is not in the engine")
        flips = {"flip": self.pending_flip or 0.0, "vflip": self.pending_vflip or 0.0}
        try:
            self.geometry = dataclasses.replace(op, **{k: v for k, v in flips.items() if v})
        except (ValueError, TypeError) as exc:
            raise _Unsupported(str(exc)) from None
        self.pending_flip = self.pending_vflip = None

    def require_pixel_stage(self, what: str) -> None:
        """A pixel op runs in the engine only on the PIL image after the crop, before any output op."""
        if self.geometry is None:
            raise _Unsupported(
                f"{what} before the crop / resize is not in the engine (it runs on the output-sized image)"
            )
        if self.kind != "pil":
            raise _Unsupported(
                f"{what} on a tensor is not in the engine (its ops reproduce torchvision's PIL backend; the "
                "tensor backend rounds differently)"
            )
        if self.erase is not None:
            raise _Unsupported(f"{what} after RandomErasing is not in the engine")


def _name(op: object) -> str:
    text = repr(op)
    return text if len(text) <= 80 else type(op).__name__


def _interpolation(value: object) -> str:
    from torchvision.transforms import InterpolationMode

    name: str  # an InterpolationMode's value
    if isinstance(value, InterpolationMode):
        name = value.value
    elif isinstance(value, str):
        name = InterpolationMode(value).value
    elif isinstance(value, int):
        from torchvision.transforms.functional import _interpolation_modes_from_int

        name = _interpolation_modes_from_int(value).value
    else:
        raise _Unsupported(f"interpolation={value!r} is not understood")
    return name


def _resample_fields(state: _State, op: Any, spec_cls: type[Any]) -> dict[str, Any]:
    """The engine op's resampling fields for torchvision ``op``, or why the engine cannot match it.

    A PIL image is always resized with antialiasing (PIL's support-scaled filters); a tensor follows
    ``op.antialias``. Engine ops that take ``interpolation`` / ``antialias`` fields get them; with
    ops that have none, only antialiased bilinear matches.
    """
    mode = _interpolation(getattr(op, "interpolation", "bilinear"))
    antialias = True if state.kind == "pil" else getattr(op, "antialias", True) is not False
    names = {f.name for f in dataclasses.fields(spec_cls)}
    if "interpolation" not in names:
        if mode not in SUPPORTED_INTERPOLATIONS:
            raise _Unsupported(
                f"interpolation={mode!r} is not in the engine yet ({', '.join(sorted(SUPPORTED_INTERPOLATIONS))})"
            )
        if not antialias:
            raise _Unsupported("antialias=False on a tensor is not in the engine yet")
        return {}
    fields: dict[str, Any] = {"interpolation": mode}
    if "antialias" in names:
        fields["antialias"] = antialias
    elif not antialias:
        raise _Unsupported("antialias=False on a tensor is not in the engine yet")
    return fields


def _pair(size: int | Sequence[int], what: str) -> tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    size = list(size)
    if len(size) == 1:
        return (int(size[0]), int(size[0]))
    if len(size) == 2:
        return (int(size[0]), int(size[1]))
    raise _Unsupported(f"{what} size={size!r} is not understood")


def _scalars(values: float | list[float] | tuple[float, ...], what: str) -> tuple[float, ...]:
    values = [float(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise _Unsupported(f"{what} with {len(values)} values for a 3-channel image")
    return tuple(values)


# --- the rules: one function per torchvision op ---------------------------------------------


def _random_resized_crop(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomResizedCrop

    op = ops[i]
    state.require_uint8_image("RandomResizedCrop")
    resample = _resample_fields(state, op, RandomResizedCrop)
    try:
        geo = RandomResizedCrop(
            size=_pair(op.size, "RandomResizedCrop"), scale=tuple(op.scale), ratio=tuple(op.ratio), flip=0.0, **resample
        )
    except (ValueError, TypeError) as exc:
        raise _Unsupported(str(exc)) from None
    state.set_geometry(geo)
    return 1


def _resize(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import CenterCrop, Resize

    op = ops[i]
    state.require_uint8_image("Resize")
    if getattr(op, "max_size", None) is not None or op.size is None:
        raise _Unsupported("Resize with max_size is not in the engine yet")
    size = op.size
    if isinstance(size, int) or len(size) == 1:
        shorter = int(size) if isinstance(size, int) else int(size[0])
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        if nxt is None or type(nxt) not in _types("CenterCrop"):
            raise _Unsupported(
                "Resize to a shorter side makes images of different sizes; the engine takes it "
                "only when a CenterCrop follows"
            )
        resample = _resample_fields(state, op, CenterCrop)
        try:
            geo: CenterCrop | Resize = CenterCrop(
                size=_pair(nxt.size, "CenterCrop"), resize=shorter, flip=0.0, **resample
            )
        except (ValueError, TypeError) as exc:
            raise _Unsupported(str(exc)) from None
        state.set_geometry(geo)
        return 2
    resample = _resample_fields(state, op, Resize)
    try:
        geo = Resize(size=_pair(size, "Resize"), flip=0.0, **resample)
    except (ValueError, TypeError) as exc:
        raise _Unsupported(str(exc)) from None
    state.set_geometry(geo)
    return 1


def _center_crop(state: _State, ops: Sequence[Any], i: int) -> int:
    raise _Unsupported("CenterCrop without a Resize(s) before it is not in the engine yet")


def _flip_commutes(state: _State, what: str) -> None:
    """A flip is fused into the geometry, i.e. moved before the pixel ops: only colour ops commute with it."""
    from fastload.transforms import ColorJitter, RandomGrayscale

    if state.erase is not None or (state.kind != "pil" and state.dtype != torch.uint8):
        raise _Unsupported(f"{what} after the output ops is not in the engine")
    if state.affine is not None:
        raise _Unsupported(
            f"{what} after RandomAffine is not in the engine (the engine flips the crop before the warp)"
        )
    if any(not isinstance(op, (ColorJitter, RandomGrayscale)) for op in state.ops):
        raise _Unsupported(f"{what} after an AutoAugment-style policy is not in the engine (they do not commute)")


def _hflip(state: _State, ops: Sequence[Any], i: int) -> int:
    p = float(ops[i].p)
    _flip_commutes(state, "RandomHorizontalFlip")
    if state.geometry is None:
        if state.pending_flip is not None:
            raise _Unsupported("a second horizontal flip is not in the engine")
        state.pending_flip = p
    else:
        if state.geometry.flip:
            raise _Unsupported("a second horizontal flip is not in the engine")
        try:
            state.geometry = dataclasses.replace(state.geometry, flip=p)
        except ValueError as exc:
            raise _Unsupported(str(exc)) from None
    return 1


def _vflip(state: _State, ops: Sequence[Any], i: int) -> int:
    p = float(ops[i].p)
    _flip_commutes(state, "RandomVerticalFlip")
    if state.geometry is None:
        if state.pending_vflip is not None:
            raise _Unsupported("a second vertical flip is not in the engine")
        state.pending_vflip = p
        return 1
    if getattr(state.geometry, "vflip", 0.0) != 0.0:
        raise _Unsupported("a second vertical flip is not in the engine")
    try:
        state.geometry = dataclasses.replace(state.geometry, vflip=p)
    except (ValueError, TypeError) as exc:
        raise _Unsupported(str(exc)) from None
    return 1


def _random_crop(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomCrop

    op = ops[i]
    state.require_uint8_image("RandomCrop")
    if getattr(op, "padding_mode", "constant") != "constant":
        raise _Unsupported(f"padding_mode={op.padding_mode!r} is not in the engine (constant padding only)")
    fill = op.fill
    if isinstance(fill, dict):  # v2: a fill per tv_tensor type
        fill = next(iter(fill.values()), 0) if len(fill) == 1 else None
        if fill is None:
            raise _Unsupported("a fill per tensor type is not in the engine")
    padding = op.padding
    if isinstance(padding, (list, tuple)) and len(padding) == 1:
        padding = padding[0]
    try:
        geo = RandomCrop(
            size=_pair(op.size, "RandomCrop"),
            padding=tuple(padding) if isinstance(padding, (list, tuple)) else padding,
            fill=tuple(fill) if isinstance(fill, (list, tuple)) else (0 if fill is None else fill),
            pad_if_needed=bool(op.pad_if_needed),
        )
    except (ValueError, TypeError) as exc:
        raise _Unsupported(str(exc)) from None
    state.set_geometry(geo)
    return 1


def _add_pixel_op(state: _State, what: str, build: Callable[[], Any]) -> int:
    state.require_pixel_stage(what)
    try:
        spec = build()
    except (ValueError, TypeError) as exc:
        raise _Unsupported(str(exc)) from None
    state.ops = (*state.ops, spec)
    return 1


def _range(value: Any) -> Any:
    """Torchvision stores a jitter as ``[min, max]`` (or None); fastload's op takes a pair."""
    return None if value is None else tuple(float(v) for v in value)


def _color_jitter(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import ColorJitter

    op = ops[i]
    return _add_pixel_op(
        state,
        "ColorJitter",
        lambda: ColorJitter(
            brightness=_range(op.brightness),
            contrast=_range(op.contrast),
            saturation=_range(op.saturation),
            hue=_range(op.hue),
        ),
    )


def _random_grayscale(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomGrayscale

    return _add_pixel_op(state, "RandomGrayscale", lambda: RandomGrayscale(p=float(ops[i].p)))


def _policy_fields(op: Any) -> dict[str, Any]:
    fill = op.fill
    if isinstance(fill, dict):  # v2: a fill per tv_tensor type
        values = list(fill.values())
        if len(values) != 1:
            raise _Unsupported("a fill per tensor type is not in the engine")
        fill = values[0]
    return {"interpolation": _interpolation(op.interpolation), "fill": fill}


def _auto_augment(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import AutoAugment

    op = ops[i]
    return _add_pixel_op(state, "AutoAugment", lambda: AutoAugment(policy=op.policy.value, **_policy_fields(op)))


def _rand_augment(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandAugment

    op = ops[i]
    return _add_pixel_op(
        state,
        "RandAugment",
        lambda: RandAugment(
            num_ops=int(op.num_ops),
            magnitude=int(op.magnitude),
            num_magnitude_bins=int(op.num_magnitude_bins),
            **_policy_fields(op),
        ),
    )


def _trivial_augment(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import TrivialAugmentWide

    op = ops[i]
    return _add_pixel_op(
        state,
        "TrivialAugmentWide",
        lambda: TrivialAugmentWide(num_magnitude_bins=int(op.num_magnitude_bins), **_policy_fields(op)),
    )


def _random_affine(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import OpKind, RandomAffine

    op = ops[i]
    state.require_pixel_stage("RandomAffine")
    if state.affine is not None:
        raise _Unsupported("a second RandomAffine is not in the engine")
    if state.ops:
        # The engine warps before its pixel ops: a colour op first would leave the fill unjittered.
        raise _Unsupported("RandomAffine after a colour op or policy is not in the engine")
    kinds = (OpKind.RANDOM_RESIZED_CROP, OpKind.RESIZE_CENTER_CROP, OpKind.RESIZE)
    if state.geometry.kind not in kinds or getattr(state.geometry, "vflip", 0.0) != 0.0:
        raise _Unsupported("RandomAffine after RandomCrop or a vertical flip is not in the engine")
    fill = _policy_fields(op)["fill"]

    def pair(value: Sequence[float] | None) -> Any:  # a tuple whose length RandomAffine checks
        return None if value is None else tuple(float(v) for v in value)

    try:
        state.affine = RandomAffine(
            degrees=pair(op.degrees),
            translate=pair(op.translate),
            scale=pair(op.scale),
            shear=pair(op.shear),
            interpolation=_interpolation(op.interpolation),
            fill=tuple(fill) if isinstance(fill, (list, tuple)) else (0 if fill is None else fill),
            center=pair(op.center),
        )
    except (ValueError, TypeError) as exc:
        raise _Unsupported(str(exc)) from None
    return 1


def _random_erasing(state: _State, ops: Sequence[Any], i: int) -> int:
    from fastload.transforms import RandomErasing

    op = ops[i]
    if state.kind != "tensor":
        raise _Unsupported("RandomErasing of a PIL image")
    if state.erase is not None:
        raise _Unsupported("a second RandomErasing is not in the engine")
    if state.dtype not in (torch.uint8, torch.float32, torch.float16):
        raise _Unsupported(f"RandomErasing of a {state.dtype} tensor is not in the engine")
    value = op.value
    if isinstance(value, (list, tuple)):
        value = tuple(float(v) for v in value)
    try:
        state.erase = RandomErasing(p=float(op.p), scale=tuple(op.scale), ratio=tuple(op.ratio), value=value)
    except (ValueError, TypeError) as exc:
        raise _Unsupported(str(exc)) from None
    return 1


def _to_tensor(state: _State, ops: Sequence[Any], i: int) -> int:
    if state.kind != "pil":
        raise _Unsupported("ToTensor of a tensor")
    state.kind, state.dtype, state.scale, state.tv_image = "tensor", torch.float32, 1.0 / 255.0, False
    return 1


def _pil_to_tensor(state: _State, ops: Sequence[Any], i: int) -> int:
    if state.kind != "pil":
        raise _Unsupported("PILToTensor of a tensor")
    state.kind, state.tv_image = "tensor", False
    return 1


def _to_image(state: _State, ops: Sequence[Any], i: int) -> int:
    state.kind, state.tv_image = "tensor", True
    return 1


def _to_pure_tensor(state: _State, ops: Sequence[Any], i: int) -> int:
    state.tv_image = False  # a PIL image passes through unchanged
    return 1


def _convert_dtype(state: _State, dtype: object, scale: bool) -> None:
    if state.erase is not None:
        raise _Unsupported("a dtype conversion after RandomErasing is not in the engine (it erases the output)")
    if state.kind != "tensor":
        raise _Unsupported("a dtype conversion of a PIL image")
    if not isinstance(dtype, torch.dtype):
        raise _Unsupported(f"dtype={dtype!r} (per-type dtypes are not in the engine)")
    if dtype == state.dtype:
        return
    if dtype not in FLOAT_DTYPES:
        raise _Unsupported(f"a conversion to {dtype} is not in the engine")
    if state.dtype == torch.uint8:
        state.scale = 1.0 / 255.0 if scale else 1.0
    state.dtype = dtype


def _convert_image_dtype(state: _State, ops: Sequence[Any], i: int) -> int:
    _convert_dtype(state, ops[i].dtype, scale=True)
    return 1


def _to_dtype(state: _State, ops: Sequence[Any], i: int) -> int:
    _convert_dtype(state, ops[i].dtype, scale=bool(ops[i].scale))
    return 1


def _normalize(state: _State, ops: Sequence[Any], i: int) -> int:
    op = ops[i]
    if state.kind != "tensor" or state.dtype == torch.uint8:
        raise _Unsupported("Normalize of a non-float image")
    if state.erase is not None:
        raise _Unsupported("Normalize after RandomErasing is not in the engine (it erases the output)")
    mean, std = _scalars(op.mean, "Normalize mean"), _scalars(op.std, "Normalize std")
    if any(s == 0 or not math.isfinite(s) for s in std) or not all(math.isfinite(m) for m in mean):
        raise _Unsupported("Normalize with a zero or non-finite std")
    # ((x * scale - m0) / s0 - m1) / s1 == (x * scale - (m0 + m1 * s0)) / (s0 * s1)
    state.mean = tuple(m0 + m1 * s0 for m0, m1, s0 in zip(state.mean, mean, state.std, strict=False))
    state.std = tuple(s0 * s1 for s0, s1 in zip(state.std, std, strict=False))
    return 1


@dataclass(frozen=True)
class Rule:
    """One table entry: the torchvision class names it matches and the function that compiles it."""

    name: str
    classes: tuple[str, ...]
    apply: Callable[[_State, Sequence[Any], int], int]


#: The compiler's table, in no particular order; ``classes`` are ``module:Name`` of v1 and v2 ops.
RULES: tuple[Rule, ...] = (
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

_TABLE: dict[type, Rule] | None = None


def _table() -> dict[type, Rule]:
    global _TABLE
    if _TABLE is None:
        import importlib

        table: dict[type, Rule] = {}
        for rule in RULES:
            for spec in rule.classes:
                module, name = spec.split(":")
                try:
                    cls = getattr(importlib.import_module(module), name)
                except (ImportError, AttributeError):
                    continue
                table[cls] = rule
        _TABLE = table
    return _TABLE


def _types(rule_name: str) -> tuple[type, ...]:
    return tuple(cls for cls, rule in _table().items() if rule.name == rule_name)


class _Delegate:
    """Reference shape of a preset class's call, e.g. torchvision's ClassificationPresetTrain."""

    transforms: Callable[[Any], Any]

    def __call__(self, img: Any) -> Any:
        return self.transforms(img)


def _delegates_to_transforms(obj: object) -> bool:
    """True when ``type(obj).__call__`` is exactly ``return self.transforms(arg)`` (same bytecode).

    Training scripts wrap their Compose in preset classes (torchvision's reference scripts do); the
    wrapper adds nothing, so the compiler looks through it, but only when its ``__call__`` provably
    does nothing else.
    """
    call = getattr(type(obj), "__call__", None)  # noqa: B004 - the class's own __call__, not a callable test
    code = getattr(call, "__code__", None)
    ref = _Delegate.__call__.__code__
    return (
        code is not None
        and code.co_code == ref.co_code
        and code.co_names == ref.co_names
        and code.co_argcount == ref.co_argcount
        and code.co_consts == ref.co_consts
        and hasattr(obj, "transforms")
    )


def _flatten(transform: Any) -> list[Any]:
    ops = getattr(transform, "transforms", None)
    compose = type(transform).__name__ == "Compose" and type(transform).__module__.startswith("torchvision.transforms")
    if compose and isinstance(ops, (list, tuple)):
        return [leaf for op in ops for leaf in _flatten(op)]
    if not compose and _delegates_to_transforms(transform):
        return _flatten(transform.transforms)
    return [transform]


def is_fastload_transform(transform: Any) -> TypeGuard[Pipeline | Transform]:
    """True for a fastload transform spec (a geometry op or a ``Pipeline``): the engine runs it as is."""
    import typing

    from fastload.transforms import Pipeline, Transform

    return isinstance(transform, (Pipeline, *typing.get_args(Transform)))


def compile_transform(transform: Callable[..., Any]) -> Plan:
    """Split ``transform`` into an engine plan and the ops that run per sample.

    Args:
        transform: A torchvision transform (``Compose`` of v1 or v2 ops, or a single op), a fastload
            geometry op, or any callable.

    Returns:
        A :class:`Plan`. ``plan.geometry is None`` when nothing before the first unknown op gives the
        engine a fixed output size (then the whole transform runs per sample).
    """
    if is_fastload_transform(transform):
        return Plan(geometry=transform, kind="tensor", compiled=(type(transform).__name__,))
    ops = _flatten(transform)
    table = _table()
    state = _State()
    i, stop = 0, None
    while i < len(ops):
        op = ops[i]
        rule = table.get(type(op))
        if rule is None:
            stop = f"{_name(op)} is not an op fastload compiles"
            break
        snapshot = dataclasses.replace(state, compiled=list(state.compiled))
        try:
            consumed = rule.apply(state, ops, i)
        except _Unsupported as exc:
            state = snapshot
            stop = f"{_name(op)}: {exc}"
            break
        state.compiled.extend(type(o).__name__ for o in ops[i : i + consumed])
        i += consumed
    if state.geometry is None:
        return Plan(geometry=None, rest=tuple(ops), stop=stop or "no crop or resize gives the engine a fixed size")
    if state.pending_flip is not None or state.pending_vflip is not None:  # set_geometry consumed them
        raise AssertionError("a pending flip with a geometry")
    return Plan(
        geometry=state.geometry,
        kind=state.kind,
        tv_image=state.tv_image,
        dtype=state.dtype,
        scale=state.scale,
        mean=state.mean,
        std=state.std,
        ops=state.ops,
        erase=state.erase,
        affine=state.affine,
        rest=tuple(ops[i:]),
        compiled=tuple(state.compiled),
        stop=stop,
    )
