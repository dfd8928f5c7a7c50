"""Pixels stage, native boundary: the engine's parameter structs built from plain values and read back.

:func:`to_native` builds a struct of :mod:`fastload.engine_abi`'s tables field by field (a misspelt
field is a ``ValueError``, a value of the wrong type the engine's ``TypeError`` naming the field);
:func:`from_native` reads one back as plain values. Apart from the tables because ``setup.py`` reads
those without importing ``fastload``; these functions need the built engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastload.engine_abi import ENUMS, STRUCTS

__all__ = ["from_native", "to_native"]


def _element(ctype: str) -> str | None:
    """The element type of ``list[T]``, or None."""
    return ctype[5:-1] if ctype.startswith("list[") and ctype.endswith("]") else None


def _value(engine: Any, ctype: str, value: Any, where: str) -> Any:
    if ctype in ENUMS:
        member = ENUMS[ctype][value] if isinstance(value, str) else ENUMS[ctype](int(value))
        return getattr(engine, ctype)(int(member))
    if ctype in STRUCTS:
        return value if isinstance(value, getattr(engine, ctype)) else to_native(engine, ctype, value)
    element = _element(ctype)
    if element is not None:
        return [_value(engine, element, v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def to_native(engine: Any, name: str, values: Mapping[str, Any] | None = None) -> Any:
    """The engine's ``name`` struct with ``values`` set, field by field, from :data:`STRUCTS`.

    Args:
        engine: The ``fastload._engine`` module.
        name: A struct of :data:`STRUCTS`.
        values: Field -> value; fields left out keep their defaults. Enum fields take a member, its
            int or its name; struct fields take a mapping (built recursively) or a native struct;
            ``list[...]`` fields any sequence of such values.

    Raises:
        ValueError: A field the struct does not have.
        TypeError: A value of the wrong type (the engine's own check).
    """
    types = {field: ctype for ctype, field, _default, _doc in STRUCTS[name]}
    obj = getattr(engine, name)()
    for field, value in (values or {}).items():
        if field not in types:
            raise ValueError(f"{name} has no field {field!r} (fields: {', '.join(types)})")
        try:
            setattr(obj, field, _value(engine, types[field], value, f"{name}.{field}"))
        except TypeError as exc:
            raise TypeError(f"{name}.{field}={value!r}: {exc}") from None
    return obj


def _plain(ctype: str, value: Any) -> Any:
    if ctype in ENUMS:
        return ENUMS[ctype](int(value))
    if ctype in STRUCTS:
        return from_native(value, ctype)
    element = _element(ctype)
    if element is not None:
        return [_plain(element, v) for v in value]
    return tuple(value) if "[" in ctype else value


def from_native(obj: Any, name: str) -> dict[str, Any]:
    """The fields of the engine's ``name`` struct ``obj`` as plain values, recursively.

    Enums become :data:`ENUMS` members, structs dicts, fixed-size arrays tuples, lists lists.
    """
    return {field: _plain(ctype, getattr(obj, field)) for ctype, field, _default, _doc in STRUCTS[name]}
