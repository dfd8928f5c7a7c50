"""Shared data fixtures of the pack/records tests (small realistic JPEG trees made by tools/make_dataset.py).

Import the fixtures into a test module with ``from test_records_data import tiny_folder, odd_folder``.
"""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> str:
    """40 small JPEGs in 4 class folders."""
    from tools.make_dataset import make_dataset

    out = str(tmp_path_factory.mktemp("tiny") / "tiny")
    make_dataset(out, count=40, seed=3, classes=4, tiny=True, workers=1)
    return out


@pytest.fixture(scope="session")
def odd_folder(tmp_path_factory) -> str:
    """20 small JPEGs plus the odd files (grayscale, CMYK, progressive, PNG, truncated, empty, text)."""
    from tools.make_dataset import make_dataset

    out = str(tmp_path_factory.mktemp("odd") / "odd")
    make_dataset(out, count=20, seed=5, classes=7, odd=True, tiny=True, workers=1)
    return out
