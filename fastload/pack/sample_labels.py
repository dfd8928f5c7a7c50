"""Write stage, labels of listed and streamed samples: numbers kept, class names made indices.

The rules, the same for every input format:

- an integer or a float label is kept as it is (stored as float32: integers up to 2**24 in
  magnitude, so every one is stored exactly);
- a list of numbers is a multi-label record (its length is the dataset's label width);
- a class name becomes an index: in sorted order where all names are known up front (a parquet
  ``ClassLabel``, a CSV / JSONL listing), in first-seen order for a streamed tar. The mapping is
  the manifest's ``classes``;
- the first good label decides the kind (numbers or names) and the width; a later label of
  another kind or width is a bad entry, like a missing one.

:class:`Labels` keeps that state while a source is read in order; its :meth:`Labels.state` is
what a resumed pack needs to go on exactly where an interrupted one stopped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["MAX_EXACT_INT", "LabelError", "Labels"]

#: Integers above this in magnitude are not exact in float32.
MAX_EXACT_INT = 1 << 24
_MAX_FLOAT32 = 3.4028234663852886e38


class LabelError(ValueError):
    """A label that cannot be stored; the message is the reason."""


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise LabelError(f"label {value!r} is a boolean, not a number or a class name")
    if isinstance(value, int):
        if abs(value) > MAX_EXACT_INT:
            raise LabelError(f"integer label {value} is not exact in float32 (|label| <= {MAX_EXACT_INT})")
        return float(value)
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > _MAX_FLOAT32:
            raise LabelError(f"label {value!r} is not a finite number that fits float32")
        return value
    raise LabelError(f"label of type {type(value).__name__} is not a number")


class Labels:
    """The label state of one source, read in order.

    Args:
        names: The class names when all are known up front (index = position); None: names are
            numbered as they are first seen.
        kind: ``"number"`` or ``"name"`` when already known (a resumed pack), else None.
        width: Labels per record when already known, else None.
    """

    def __init__(
        self, names: Iterable[str] | None = None, *, kind: str | None = None, width: int | None = None
    ) -> None:
        self.fixed = names is not None
        self.names: list[str] = list(names or [])
        self.index = {n: i for i, n in enumerate(self.names)}
        self.kind = kind
        self.width = width

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Labels:
        """The state :meth:`state` returned (names first-seen so far are numbered as before).

        Raises:
            TypeError: Not such a state.
            KeyError: A field missing.
        """
        names, kind, width = state["names"], state["kind"], state["width"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TypeError("label state: names must be a list of strings")
        if kind not in (None, "number", "name") or not (width is None or (isinstance(width, int) and width >= 1)):
            raise TypeError("label state: bad kind or width")
        labels = cls(names, kind=kind, width=width)
        labels.fixed = bool(state["fixed"])
        return labels

    def state(self, names: int | None = None) -> dict[str, Any]:
        """JSON-able state, with only the first ``names`` class names (the state at an earlier point)."""
        return {
            "kind": self.kind,
            "width": self.width,
            "fixed": self.fixed,
            "names": self.names if names is None else self.names[:names],
        }

    def classes(self) -> dict[str, int] | None:
        """Class name -> label for the manifest (None for numeric labels without names)."""
        if self.kind == "name" or (self.fixed and self.names):
            return dict(self.index)
        return None

    def _settle(self, kind: str, width: int) -> None:
        if self.kind is not None and kind != self.kind:
            if self.kind == "name":
                raise LabelError("label is a number where the labels are class names")
            raise LabelError("label is a class name where the labels are numbers")
        if self.width is not None and width != self.width:
            raise LabelError(f"{width} label(s) where the records have {self.width}")
        self.kind, self.width = kind, width

    def name(self, name: str) -> tuple[float, ...]:
        """The label of class ``name``.

        Raises:
            LabelError: Not a known name (fixed names), or names where numbers were seen.
        """
        if not name:
            raise LabelError("empty class name")
        if self.fixed and self.kind == "number":
            raise LabelError(f"class name {name!r} where the labels are numbers")
        label = self.index.get(name)
        if label is None:
            if self.fixed:
                raise LabelError(f"class name {name!r} is not one of the {len(self.names)} known classes")
            self._settle("name", 1)
            label = self.index[name] = len(self.names)
            self.names.append(name)
            return (float(label),)
        self._settle("name", 1)
        return (float(label),)

    def value(self, value: Any) -> tuple[float, ...]:
        """The labels of a decoded value: a number, a class name or a list of numbers.

        Raises:
            LabelError: Anything else, or a kind or width other than the earlier labels'.
        """
        if value is None:
            raise LabelError("no label (null)")
        if isinstance(value, str):
            return self.name(value)
        if isinstance(value, (list, tuple)):
            if not value:
                raise LabelError("empty label list")
            labels = tuple(_number(v) for v in value)
            self._settle("number", len(labels))
            return labels
        labels = (_number(value),)
        if self.fixed and self.names and self.kind != "name":
            # Numbers index the known names (a ClassLabel column): they must name one of them.
            if not (labels[0].is_integer() and 0 <= labels[0] < len(self.names)):
                raise LabelError(f"label {value!r} is not a class index in [0, {len(self.names)})")
            if self.kind is None:
                self.kind = "number"
        self._settle("number", 1)
        return labels

    def text(self, data: bytes | memoryview) -> tuple[float, ...]:
        """The labels of a text member such as WebDataset's ``cls``: an integer, a number or a class name.

        Raises:
            LabelError: Not UTF-8 text, or a kind other than the earlier labels'.
        """
        try:
            text = bytes(data).decode("utf-8").strip()
        except UnicodeDecodeError:
            raise LabelError("label member is not UTF-8 text") from None
        try:
            return self.value(int(text))
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            return self.name(text)
        return self.value(number) if math.isfinite(number) else self.name(text)
