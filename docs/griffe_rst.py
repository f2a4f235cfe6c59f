"""A griffe extension: quantune's reStructuredText-flavoured docstrings as Markdown for the API page.

The docstrings are written for readers of the source (``pydoc``, an editor's hover): doctest
examples (``>>>``) and Sphinx roles (:class:`Name`). In Markdown a ``>>>`` line is a nested
quote and a role stays raw text, so this turns each doctest into a ``pycon`` code block and each
role into inline code, once, as mkdocstrings loads the package (``extensions:`` in mkdocs.yml).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`~?([^`]+)`")


def fence_doctests(text: str) -> str:
    """Each run of ``>>>`` lines (with their ``...`` continuations and output) inside a code fence."""
    out: list[str] = []
    in_example = False
    example_indent = ""
    for line in text.splitlines():
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith(">>>") and not in_example and len(indent) < 4:  # 4 spaces: a code block already
            out.append(f"{indent}```pycon")
            in_example = True
        elif in_example and not stripped:
            out.append(f"{example_indent}```")
            in_example = False
        if in_example and stripped.startswith(">>>"):
            example_indent = indent
        out.append(line)
    if in_example:
        out.append(f"{example_indent}```")
    return "\n".join(out)


def to_markdown(text: str) -> str:
    return ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", fence_doctests(text))


class RstToMarkdown(griffe.Extension):
    """Rewrites every docstring of the loaded package (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
