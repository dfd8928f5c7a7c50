"""Shared test fixtures for every stage: datasets made by tools/make_dataset.py, JPEG bytes, skips.

Everything here is importable from test modules (pytest puts ``tests/`` on ``sys.path`` because the
folder has no ``__init__.py``)::

    from conftest import requires_torch, requires_mxnet, requires_engine, make_jpeg

Fixtures (session-scoped data is made once, in pytest's temporary folder, in well under a second;
treat the folders as read-only, since other tests share them: write outputs under ``tmp_path``):

- ``repo_root``: the repository root (also put on ``sys.path`` and ``PYTHONPATH``, so ``fastload``
  and the checkout's top-level ``bench`` and ``tools`` packages import uninstalled, in subprocesses
  too).
- ``tiny_folder``: ImageFolder tree of 40 small (60-200 px) realistic JPEGs over 3 classes.
- ``odd_folder`` / ``odd_files``: 12 small JPEGs over 3 classes plus the odd files of
  ``make_dataset(odd=True)``; ``odd_files`` maps each kind (``"grayscale"``, ``"cmyk"``,
  ``"progressive"``, ``"png"``, ``"truncated"``, ``"empty"``, ``"text"``) to its absolute path.
- ``realistic_folder``: 24 ImageNet-sized (about 400x350 px, ~90 KB) JPEGs over 4 classes.
- ``jpeg_bytes``: the :func:`make_jpeg` factory.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
# Subprocess tests (`python -m fastload ...`) must import this checkout too, from any cwd.
if str(REPO_ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)

# `make sanitize` runs the suite from a copy of the checkout with an ASan + UBSan engine: make sure
# that engine is the one imported, or the job would pass while testing the optimized build.
if os.environ.get("FASTLOAD_EXPECT_SANITIZED") == "1":
    _engine = importlib.import_module("fastload._engine")
    if not _engine.info().get("sanitized") or not _engine.__file__.startswith(str(REPO_ROOT)):
        raise RuntimeError(f"FASTLOAD_EXPECT_SANITIZED=1 but the engine imported is {_engine.__file__}, not sanitized")

from tools.make_dataset import ODD_MANIFEST, encode_jpeg, make_dataset, render_image

__all__ = [
    "HAVE_ENGINE",
    "HAVE_MXNET",
    "HAVE_TORCH",
    "REPO_ROOT",
    "load_odd_manifest",
    "make_jpeg",
    "requires_engine",
    "requires_mxnet",
    "requires_torch",
]


def _engine_importable() -> bool:
    try:
        importlib.import_module("fastload._engine")
    except ImportError:
        return False
    return True


# find_spec, not import: importing torch or mxnet costs seconds on every collection.
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_MXNET = importlib.util.find_spec("mxnet") is not None
HAVE_ENGINE = _engine_importable()

requires_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
requires_mxnet = pytest.mark.skipif(not HAVE_MXNET, reason="mxnet is not installed")
requires_engine = pytest.mark.skipif(
    not HAVE_ENGINE, reason="the C++ engine fastload._engine is not built (setup.py build_ext --inplace)"
)


def make_jpeg(
    width: int,
    height: int,
    *,
    quality: int = 90,
    subsampling: str = "4:2:0",
    mode: str = "RGB",
    progressive: bool = False,
    seed: int = 0,
) -> bytes:
    """JPEG bytes of a natural-looking image (cut from real photographs) of an exact size.

    Args:
        width: Width in pixels (any value >= 1, odd sizes welcome).
        height: Height in pixels.
        quality: JPEG quality 1-100.
        subsampling: ``"4:2:0"``, ``"4:2:2"`` or ``"4:4:4"`` (ignored for mode L).
        mode: ``"RGB"``, ``"L"`` (grayscale, one component) or ``"CMYK"``.
        progressive: Write a progressive JPEG.
        seed: Which image; the same arguments always give the same bytes.

    Returns:
        The encoded bytes.
    """
    img = render_image(width, height, seed=seed)
    return encode_jpeg(img, quality=quality, subsampling=subsampling, mode=mode, progressive=progressive)


def load_odd_manifest(root: Path) -> dict[str, Path]:
    """Map each odd-file kind in ``root/odd_files.json`` to the file's absolute path."""
    manifest = json.loads((Path(root) / ODD_MANIFEST).read_text())
    return {entry["kind"]: Path(root) / entry["path"] for entry in manifest["files"]}


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (on ``sys.path`` for the whole session)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """ImageFolder tree: 40 small realistic JPEGs in class_000..class_002 (seed 0)."""
    root = tmp_path_factory.mktemp("data") / "tiny"
    make_dataset(root, count=40, seed=0, classes=3, tiny=True, workers=2)
    return root


@pytest.fixture(scope="session")
def odd_folder(tmp_path_factory) -> Path:
    """12 small JPEGs over 3 classes plus every odd file; ``odd_files.json`` sits at the root."""
    root = tmp_path_factory.mktemp("data") / "odd"
    make_dataset(root, count=12, seed=1, classes=3, tiny=True, odd=True, workers=2)
    return root


@pytest.fixture(scope="session")
def odd_files(odd_folder) -> dict[str, Path]:
    """Odd-file kind -> absolute path inside ``odd_folder``."""
    return load_odd_manifest(odd_folder)


@pytest.fixture(scope="session")
def realistic_folder(tmp_path_factory) -> Path:
    """24 ImageNet-sized JPEGs (about 400x350 px) over 4 classes (seed 2)."""
    root = tmp_path_factory.mktemp("data") / "realistic"
    make_dataset(root, count=24, seed=2, classes=4, workers=2)
    return root


@pytest.fixture
def jpeg_bytes():
    """The :func:`make_jpeg` factory: ``jpeg_bytes(width, height, quality=..., mode=...) -> bytes``."""
    return make_jpeg
