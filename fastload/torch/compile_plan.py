"""Device stage (torch): the compiler's plan, the state it builds while walking the ops, and its rule type.

:class:`Plan` is what :func:`fastload.torch.compile.compile_transform` returns: the engine's part of
a transform (geometry, pixel ops, affine warp, output stage, erasing) and the ops left to run per
sample. :class:`CompileState` is the plan under construction; the rules of each library
(:mod:`fastload.torch.compile_torchvision`, :mod:`fastload.torch.compile_timm`) update it, and the
output-stage steps they share (to a tensor, a dtype conversion, Normalize) are its methods.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fastload.torch.placement import FLOAT_DTYPES, FloatOutput

__all__ = [
    "SUPPORTED_INTERPOLATIONS",
    "CompileState",
    "Plan",
    "Rule",
    "Unsupported",
    "add_pixel_op",
    "channel_values",
    "interpolation_name",
    "jitter_range",
    "op_name",
    "policy_fields",
    "resample_fields",
    "size_pair",
]

#: Resampling filters of engine ops without an ``interpolation`` field (torchvision's names).
SUPPORTED_INTERPOLATIONS = frozenset({"bilinear"})


class Unsupported(Exception):
    """An op the table knows, with parameters the engine does not implement."""


@dataclass(frozen=True)
class Plan:
    """A transform split into what the engine does and what runs per sample afterwards.

    Attributes:
        geometry: The fastload geometry op (crop / resize, flip fused), or None when nothing compiles.
        kind: What the compiled prefix produces per sample: ``"pil"`` (an RGB ``PIL.Image``) or
            ``"tensor"`` (CHW).
        tv_image: The tensor is a ``torchvision.tv_tensors.Image`` (after ``v2.ToImage``).
        as_numpy: Each sample is a CHW uint8 ``numpy.ndarray`` instead of a tensor (timm's ``ToNumpy``).
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
    as_numpy: bool = False
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
        m, sd = self.mean, self.std  # three values each (channel_values)
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
        return f"{done} in the engine; per sample: {', '.join(op_name(op) for op in self.rest)}"

    @property
    def key(self) -> tuple[Any, ...]:
        """Identifies what the engine does (two plans with equal keys decode identically)."""
        return (
            self.geometry,
            self.kind,
            self.tv_image,
            self.as_numpy,
            self.dtype,
            self.scale,
            self.mean,
            self.std,
            self.ops,
            self.erase,
            self.affine,
        )


@dataclass
class CompileState:
    """The plan being built while the compiler walks the ops (what the prefix so far produces)."""

    geometry: Any = None
    pending_flip: float | None = None
    kind: str = "pil"
    tv_image: bool = False
    as_numpy: bool = False
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
            raise Unsupported(f"{what} on a float tensor is not in the engine (it resizes uint8 images)")

    def set_geometry(self, op: Any) -> None:
        if self.geometry is not None:
            raise Unsupported("a second geometry op after the first is not in the engine")
        flips = {"flip": self.pending_flip or 0.0, "vflip": self.pending_vflip or 0.0}
        try:
            self.geometry = dataclasses.replace(op, **{k: v for k, v in flips.items() if v})
        except (ValueError, TypeError) as exc:
            raise Unsupported(str(exc)) from None
        self.pending_flip = self.pending_vflip = None

    def require_pixel_stage(self, what: str) -> None:
        """A pixel op runs in the engine only on the PIL image after the crop, before any output op."""
        if self.geometry is None:
            raise Unsupported(
                f"{what} before the crop / resize is not in the engine (it runs on the output-sized image)"
            )
        if self.kind != "pil":
            raise Unsupported(
                f"{what} on a tensor is not in the engine (its ops reproduce torchvision's PIL backend; the "
                "tensor backend rounds differently)"
            )
        if self.erase is not None:
            raise Unsupported(f"{what} after RandomErasing is not in the engine")

    # --- the output stage: shared by the rules of every library -------------------------

    def to_tensor(self, what: str, *, scaled: bool, dtype: torch.dtype | None = None) -> None:
        """The PIL image becomes a CHW tensor.

        uint8 (``PILToTensor``), float scaled to [0, 1] (``ToTensor``: ``scaled``), or float in 0..255
        (``dtype`` without ``scaled``: timm's ``ToTensor``).
        """
        if self.kind != "pil":
            raise Unsupported(f"{what} of a tensor")
        self.kind, self.tv_image, self.as_numpy = "tensor", False, False
        if scaled:
            self.dtype, self.scale = torch.float32, 1.0 / 255.0
        elif dtype is not None and dtype != torch.uint8:
            self.convert_dtype(dtype, scale=False)

    def convert_dtype(self, dtype: object, *, scale: bool) -> None:
        if self.erase is not None:
            raise Unsupported("a dtype conversion after RandomErasing is not in the engine (it erases the output)")
        if self.kind != "tensor":
            raise Unsupported("a dtype conversion of a PIL image")
        if not isinstance(dtype, torch.dtype):
            raise Unsupported(f"dtype={dtype!r} (per-type dtypes are not in the engine)")
        if dtype == self.dtype:
            return
        if dtype not in FLOAT_DTYPES:
            raise Unsupported(f"a conversion to {dtype} is not in the engine")
        if self.dtype == torch.uint8:
            self.scale = 1.0 / 255.0 if scale else 1.0
        self.dtype = dtype

    def normalize(self, mean: Any, std: Any) -> None:
        if self.kind != "tensor" or self.dtype == torch.uint8:
            raise Unsupported("Normalize of a non-float image")
        if self.erase is not None:
            raise Unsupported("Normalize after RandomErasing is not in the engine (it erases the output)")
        mean, std = channel_values(mean, "Normalize mean"), channel_values(std, "Normalize std")
        if any(s == 0 or not math.isfinite(s) for s in std) or not all(math.isfinite(m) for m in mean):
            raise Unsupported("Normalize with a zero or non-finite std")
        # ((x * scale - m0) / s0 - m1) / s1 == (x * scale - (m0 + m1 * s0)) / (s0 * s1)
        self.mean = tuple(m0 + m1 * s0 for m0, m1, s0 in zip(self.mean, mean, self.std, strict=False))
        self.std = tuple(s0 * s1 for s0, s1 in zip(self.std, std, strict=False))


def op_name(op: object) -> str:
    """The op as the warnings and ``Plan.describe`` name it."""
    text = repr(op)
    return text if len(text) <= 80 else type(op).__name__


def interpolation_name(value: object) -> str:
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
        raise Unsupported(f"interpolation={value!r} is not understood")
    return name


def resample_fields(state: CompileState, op: Any, spec_cls: type[Any]) -> dict[str, Any]:
    """The engine op's resampling fields for torchvision ``op``, or why the engine cannot match it.

    A PIL image is always resized with antialiasing (PIL's support-scaled filters); a tensor follows
    ``op.antialias``. Engine ops that take ``interpolation`` / ``antialias`` fields get them; with
    ops that have none, only antialiased bilinear matches.
    """
    mode = interpolation_name(getattr(op, "interpolation", "bilinear"))
    antialias = True if state.kind == "pil" else getattr(op, "antialias", True) is not False
    names = {f.name for f in dataclasses.fields(spec_cls)}
    if "interpolation" not in names:
        if mode not in SUPPORTED_INTERPOLATIONS:
            raise Unsupported(
                f"interpolation={mode!r} is not in the engine yet ({', '.join(sorted(SUPPORTED_INTERPOLATIONS))})"
            )
        if not antialias:
            raise Unsupported("antialias=False on a tensor is not in the engine yet")
        return {}
    fields: dict[str, Any] = {"interpolation": mode}
    if "antialias" in names:
        fields["antialias"] = antialias
    elif not antialias:
        raise Unsupported("antialias=False on a tensor is not in the engine yet")
    return fields


def size_pair(size: int | Sequence[int], what: str) -> tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    size = list(size)
    if len(size) == 1:
        return (int(size[0]), int(size[0]))
    if len(size) == 2:
        return (int(size[0]), int(size[1]))
    raise Unsupported(f"{what} size={size!r} is not understood")


def channel_values(values: float | list[float] | tuple[float, ...] | torch.Tensor, what: str) -> tuple[float, ...]:
    """One value per channel from a number, a sequence or a tensor (timm passes ``torch.tensor(mean)``)."""
    if isinstance(values, torch.Tensor):
        values = values.reshape(-1).tolist()
    values = [float(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise Unsupported(f"{what} with {len(values)} values for a 3-channel image")
    return tuple(values)


def add_pixel_op(state: CompileState, what: str, build: Callable[[], Any]) -> int:
    """Appends the engine pixel op ``build()`` makes (its ValueError / TypeError: why it cannot)."""
    state.require_pixel_stage(what)
    try:
        spec = build()
    except (ValueError, TypeError) as exc:
        raise Unsupported(str(exc)) from None
    state.ops = (*state.ops, spec)
    return 1


def jitter_range(value: Any) -> Any:
    """Torchvision stores a jitter as ``[min, max]`` (or None); fastload's op takes a pair."""
    return None if value is None else tuple(float(v) for v in value)


def policy_fields(op: Any) -> dict[str, Any]:
    fill = op.fill
    if isinstance(fill, dict):  # v2: a fill per tv_tensor type
        values = list(fill.values())
        if len(values) != 1:
            raise Unsupported("a fill per tensor type is not in the engine")
        fill = values[0]
    return {"interpolation": interpolation_name(op.interpolation), "fill": fill}


@dataclass(frozen=True)
class Rule:
    """One table entry: the classes it matches (``module:Name``) and the function that compiles it.

    ``apply(state, ops, i)`` folds ``ops[i]`` (and any ops after it that it takes along) into
    ``state`` and returns how many ops it consumed, or raises :class:`Unsupported` with the reason.
    """

    name: str
    classes: tuple[str, ...]
    apply: Callable[[CompileState, Sequence[Any], int], int]
