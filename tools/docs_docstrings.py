"""Griffe extension for the docs site: the library's docstrings read as Markdown.

fastload's docstrings are Google style with a few reStructuredText habits that Markdown would print
as written. Before mkdocstrings renders a docstring, this extension rewrites:

- Sphinx roles (``:class:`~fastload.errors.LoaderClosed```) as code spans of the name a reader
  would see (``~`` keeps the last component, ``text <target>`` the text);
- a paragraph ending in ``::`` (reST's "a literal block follows") to end in ``:``; the indented
  block after it is already a code block in Markdown;
- doctest runs (``>>>`` and ``...`` lines and their output), which Markdown would read as nested
  block quotes, as fenced ``pycon`` blocks.

``mkdocs.yml`` loads it (``extensions: [tools/docs_docstrings.py:MarkdownDocstrings]``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

__all__ = ["MarkdownDocstrings", "markdown_docstring"]

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const|ref):`([^`]+)`")
_LITERAL_MARK = re.compile(r"(\S)::$", re.MULTILINE)


def _shown(target: str) -> str:
    explicit = re.fullmatch(r"(.+?)\s*<[^>]+>", target)
    if explicit:
        return explicit.group(1)
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target


def _fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.lstrip().startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.append(f"{indent}```pycon")
        # The run: prompts, continuations and output, up to a blank line or a shallower line.
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


def markdown_docstring(text: str) -> str:
    """``text`` with the rewrites of the module docstring applied."""
    text = _ROLE.sub(lambda m: f"`{_shown(m.group(1))}`", text)
    text = _LITERAL_MARK.sub(r"\1:", text)
    return _fence_doctests(text)


class MarkdownDocstrings(griffe.Extension):
    """Rewrites every docstring griffe loads (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
