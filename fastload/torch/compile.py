"""Device stage (torch): compile a torchvision or timm transform pipeline into fastload's engine ops.

``compile_transform(Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
Normalize(mean, std)]))`` walks the ops in order and folds every op it knows into one engine plan
(:class:`~fastload.torch.compile_plan.Plan`): a geometry op of :mod:`fastload.transforms` (the crop /
resize with the flip fused), pixel ops on the output-sized image, and an output stage (``(x * scale
- mean) / std`` in a float dtype, or uint8), which :meth:`Plan.engine_transform` turns into the
engine's ``Pipeline(geometry, normalize=Normalize(...))``: the engine writes the final values into
the batch itself. It stops at the first op it cannot take; that op and everything after it stay *the
original objects* and run per sample, with their own semantics, on what the compiled prefix produced
(a PIL image, a uint8 tensor, a float tensor or a ``tv_tensors.Image``: whatever the original
pipeline had at that point), and :attr:`Plan.stop` says why.

The compiler is a table (:data:`RULES`): one entry per op class, each a function that checks the
op's parameters and updates the plan, or says why it cannot. Types are matched exactly (a subclass
may override what the op does). The entries live with their library:

- :mod:`fastload.torch.compile_torchvision`: torchvision's ops, v1 and v2 (RandomResizedCrop,
  Resize + CenterCrop, RandomCrop, the flips, RandomAffine, ColorJitter, RandomGrayscale, AutoAugment,
  RandAugment, TrivialAugmentWide, the tensor conversions, Normalize, RandomErasing);
- :mod:`fastload.torch.compile_timm`: timm's (``timm.data.create_transform``'s
  RandomResizedCropAndInterpolation, its RandAugment / AutoAugment / AugMix policies, RandomErasing,
  ``ToNumpy`` / ``ToTensor`` / ``MaybeToTensor`` / ``MaybePILToTensor``); its entries are looked up
  only once timm is imported.

Preset classes whose ``__call__`` is exactly ``return self.transforms(img)`` (torchvision's reference
scripts' ``ClassificationPresetTrain`` / ``Eval``) are looked through.

Randomness: the engine draws the crop, flip, affine and pixel-op parameters from its counter-based
generator, not from torch's, Python's or numpy's RNG; the *distributions* are the libraries' (same
area / aspect-ratio sampling, same fallback, same probabilities and magnitude ranges), the individual
draws are not.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

from fastload.torch.compile_plan import SUPPORTED_INTERPOLATIONS, CompileState, Plan, Rule, Unsupported, op_name
from fastload.torch.compile_timm import TIMM_RULES
from fastload.torch.compile_torchvision import TORCHVISION_RULES

if TYPE_CHECKING:
    from fastload.transforms import Pipeline, Transform

__all__ = ["RULES", "SUPPORTED_INTERPOLATIONS", "Plan", "compile_transform", "is_fastload_transform"]

#: The compiler's table, in no particular order; ``classes`` are ``module:Name``.
RULES: tuple[Rule, ...] = TORCHVISION_RULES + TIMM_RULES

#: Libraries whose entries resolve only once the library is imported: their classes cannot be in a
#: transform before that, and importing them here would cost every caller (timm takes seconds).
_LAZY_PACKAGES = frozenset({"timm"})

_TABLE: tuple[frozenset[str], dict[type, Rule]] | None = None


def _table() -> dict[type, Rule]:
    """Op class -> rule, for the classes importable now (rebuilt when a lazy library gets imported)."""
    global _TABLE
    loaded = frozenset(p for p in _LAZY_PACKAGES if p in sys.modules)
    if _TABLE is None or _TABLE[0] != loaded:
        table: dict[type, Rule] = {}
        for rule in RULES:
            for spec in rule.classes:
                module, name = spec.split(":")
                package = module.split(".")[0]
                if package in _LAZY_PACKAGES and package not in loaded:
                    continue
                try:
                    cls = getattr(importlib.import_module(module), name)
                except (ImportError, AttributeError):
                    continue
                table[cls] = rule
        _TABLE = (loaded, table)
    return _TABLE[1]


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
    state = CompileState()
    i, stop = 0, None
    while i < len(ops):
        op = ops[i]
        rule = table.get(type(op))
        if rule is None:
            stop = f"{op_name(op)} is not an op fastload compiles"
            break
        snapshot = dataclasses.replace(state, compiled=list(state.compiled))
        try:
            consumed = rule.apply(state, ops, i)
        except Unsupported as exc:
            state = snapshot
            stop = f"{op_name(op)}: {exc}"
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
        as_numpy=state.as_numpy,
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
