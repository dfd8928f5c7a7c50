"""The README and the docs pages: their Python snippets run, and the README stays a front door.

Every ```python block of the README and of the pages listed in ``PAGES`` runs, in order, in one
fresh interpreter per page (later blocks of a page may use what earlier ones defined, as a reader
would), from a folder holding the tiny dataset the snippets name: ``train/`` (an ImageFolder tree of
4 classes) and ``train-packed/`` (it, packed). A block whose line before the fence is an HTML
comment ``<!-- not run: REASON -->`` is skipped (it needs what a test cannot have: object storage
with credentials, a GPU, a cluster); the page says so to no reader, the source says why. The
``mkdocs build --strict`` of the whole site is ``make docs`` (a CI step), not a test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.make_dataset import make_dataset

from conftest import HAVE_ENGINE, HAVE_MXNET, HAVE_TORCH, REPO_ROOT

# The pages whose snippets are written to run as they are (pages added later join this list once
# their snippets do).
PAGES = (
    "README.md",
    "docs/index.md",
    "docs/getting-started.md",
    "docs/packing.md",
    "docs/decoding.md",
    "docs/augmentations.md",
    "docs/pytorch.md",
    "docs/mxnet.md",
    "docs/scaling-out.md",
    "docs/reliability.md",
    "docs/performance.md",
    "docs/contributing.md",
)

_FENCE = re.compile(r"^```python\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """``(line, code, reason_not_run)`` of every ```python block of a Markdown text (1-based line of the code)."""
    blocks = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 2
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _NOT_RUN.search(before)
        blocks.append((line, m.group(1), skip.group(1) if skip else None))
    return blocks


# Runs each block of one page in one namespace; a traceback names the page and its line.
_RUNNER = textwrap.dedent(
    """
    import json, sys
    page, blocks = sys.argv[1], json.loads(sys.stdin.read())
    namespace = {"__name__": "__main__"}
    for line, code in blocks:
        exec(compile("\\n" * (line - 1) + code, page, "exec"), namespace)
    """
)


@pytest.fixture(scope="module")
def snippet_folder(tmp_path_factory) -> Path:
    """A folder with ``train/`` (32 tiny JPEGs, 4 classes) and ``train-packed/`` (that tree, packed)."""
    from fastload.pack.packer import pack_folder

    root = tmp_path_factory.mktemp("snippets")
    make_dataset(root / "train", count=32, seed=0, classes=4, tiny=True, workers=2)
    pack_folder(str(root / "train"), str(root / "train-packed"), progress=False)
    return root


def _needs(code: str) -> str | None:
    if ("torch" in code or "torchvision" in code) and not HAVE_TORCH:
        return "torch is not installed"
    if "mxnet" in code and not HAVE_MXNET:
        return "mxnet is not installed"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_python_snippets_run(page, snippet_folder):
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    blocks = [(line, code) for line, code, skip in python_blocks(text) if skip is None]
    if not blocks:
        pytest.skip(f"{page} has no Python snippet to run")
    missing = {_needs(code) for _, code in blocks} - {None}
    if missing:
        pytest.skip(", ".join(sorted(missing)))
    if not HAVE_ENGINE:
        pytest.skip("the snippets' figures and outputs are the engine's")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH")))))
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(REPO_ROOT / page)],
        input=json.dumps(blocks),
        cwd=snippet_folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"a snippet of {page} failed:\n{proc.stderr[-4000:]}"


def test_python_blocks_are_found():
    text = "a\n\n```python\nx = 1\n```\n\n<!-- not run: needs a GPU -->\n```python\ny = 2\n```\n"
    assert python_blocks(text) == [(4, "x = 1\n", None), (9, "y = 2\n", "needs a GPU")]


def test_every_page_has_a_runnable_snippet_where_it_shows_python():
    # A page of PAGES whose every block is marked "not run" would test nothing: say so here.
    for page in PAGES:
        blocks = python_blocks((REPO_ROOT / page).read_text(encoding="utf-8"))
        if blocks:
            assert any(skip is None for _, _, skip in blocks), f"{page}: every Python snippet is marked not run"


def test_readme_is_a_front_door():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    first_block = re.search(r"^```(\w*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(2).splitlines()]
    assert commands[:2] == ["make demo", "make test"], "make demo and make test must be the README's first commands"
    quick_starts = [code for _, code, _ in python_blocks(text)]
    assert any("fastload.torch" in c for c in quick_starts) and any("fastload.mxnet" in c for c in quick_starts)
    for code in quick_starts:
        lines = [line for line in code.splitlines() if line.strip()]
        assert len(lines) <= 12, f"a README quick start has {len(lines)} lines:\n{code}"


def test_ci_runs_the_readme_test_command_first():
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    steps = [line.strip() for line in ci.splitlines() if line.strip().startswith("make ")]
    assert steps[0] == "make test"
    assert "make docs" in steps


# Words that tell the project's own history rather than what the library does ("met" is an
# ordinary word; the capitalized status word is not).
_HISTORY = re.compile(
    r"\bissue\s+#?\d+|\b(?:this|previous|earlier|last)\s+sessions?\b|\ban earlier run\b|\bprevious run\b",
    re.IGNORECASE,
)
_STATUS = re.compile(r"\bMET\b")


def test_docs_speak_of_the_library_not_its_history():
    files = [REPO_ROOT / "README.md", REPO_ROOT / "CHANGELOG.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    found = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in (*_HISTORY.finditer(line), *_STATUS.finditer(line)):
                found.append(f"{path.relative_to(REPO_ROOT)}:{n}: {m.group(0)!r}")
    assert not found, "notes about the project's history:\n" + "\n".join(found)


def test_docstrings_read_as_markdown():
    pytest.importorskip("griffe")  # the docs extra
    from tools.docs_docstrings import markdown_docstring

    text = (
        "See :class:`~fastload.errors.LoaderClosed`, :func:`fastload.open_dataset` and\n"
        ":meth:`Normalize.apply <fastload.transforms.Normalize.apply>`; the engine::\n"
        "\n"
        "    code\n"
        "\n"
        "Example:\n"
        "    >>> loader = Loader(path)\n"
        "    ...     # continued\n"
        "    (1, 2)\n"
        "\n"
        "After."
    )
    assert markdown_docstring(text) == (
        "See `LoaderClosed`, `fastload.open_dataset` and\n"
        "`Normalize.apply`; the engine:\n"
        "\n"
        "    code\n"
        "\n"
        "Example:\n"
        "    ```pycon\n"
        "    >>> loader = Loader(path)\n"
        "    ...     # continued\n"
        "    (1, 2)\n"
        "    ```\n"
        "\n"
        "After."
    )
