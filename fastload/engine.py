"""Native boundary: the one module that loads the C++ engine, ``fastload._engine``, and says why when it cannot.

The engine is built from this repository in one piece (``setup.py``): when it loads, every function
and struct it has is there, so callers never probe it for parts. It can be missing: a source install
that did not find libjpeg-turbo, a build with ``FASTLOAD_NO_EXTENSION=1``, a checkout where it was
not built yet; :func:`unavailable_reason` then says which. Pixel work (the decode, pixel ops, batch
mixing) can also be sent to the Pillow path at run time with ``FASTLOAD_DECODER=pillow``, read at
each call (:func:`pixel_engine`).

Stdlib only, below every stage that calls the engine (``records/``, ``pack/``, ``transforms/``,
``decode/``).
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["native", "pillow_forced", "pillow_reason", "pixel_engine", "unavailable_reason"]


def _load() -> tuple[ModuleType | None, str]:
    """The engine module and "", or None and why it could not be imported."""
    try:
        import fastload._engine as engine
    except ImportError as exc:
        if os.environ.get("FASTLOAD_NO_EXTENSION") == "1":
            cause = "FASTLOAD_NO_EXTENSION=1 is set: the package is built without it"
        else:
            cause = (
                "it is not built: libjpeg-turbo was not found when the package was installed, or a "
                "source checkout needs `python setup.py build_ext --inplace`"
            )
        return None, f"fastload._engine is not available ({exc}); {cause}"
    return engine, ""


# Loaded once, at first import; read through the functions below at each call (tests replace them).
_engine, _reason = _load()


def native() -> ModuleType | None:
    """The engine module, or None when it could not be loaded (:func:`unavailable_reason` says why)."""
    return _engine


def unavailable_reason() -> str:
    """Why the engine could not be loaded: the import error and its likely cause ("" when it loaded)."""
    return _reason


def pillow_forced() -> bool:
    """Whether ``FASTLOAD_DECODER=pillow`` sends pixel work to the Pillow path (read now)."""
    return os.environ.get("FASTLOAD_DECODER", "").strip().lower() == "pillow"


def pixel_engine() -> ModuleType | None:
    """The engine for pixel work now: None when it is not loaded or ``FASTLOAD_DECODER=pillow`` is set."""
    return None if pillow_forced() else _engine


def pillow_reason() -> str:
    """Why pixel work runs on the Pillow path now, or "" when it runs in the engine."""
    if _engine is None:
        return _reason
    return "FASTLOAD_DECODER=pillow" if pillow_forced() else ""
