"""``quantune passes``: every pass, its parameters, defaults and default search values.

A parameter name is never cut: on a terminal too narrow for the table each parameter gets a
line of its own.
"""

from __future__ import annotations

import textwrap
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

VALUE_ROOM = 24  # columns the default and search values need at least, beside the names


def pass_rows() -> list[tuple[str, str, str, str]]:
    """(pass, parameter, default, default search values), one per parameter of every pass."""
    from quantune.passes import get_pass, pass_names

    rows = []
    for name in pass_names():
        pass_cls = get_pass(name)
        for param, field in pass_cls.Config.model_fields.items():
            space = pass_cls.search_space.get(param)
            joint = next((n for n, j in pass_cls.search_space.items() if param in getattr(j, "names", ())), None)
            if space is None and joint is not None:  # a default joint (fast_finetune's num_iter_lr)
                searched = f"with {joint}: {[list(v) for v in pass_cls.search_space[joint].values]}"
            else:
                searched = _searched(space)
            rows.append((name, param, repr(field.default), searched))
    return rows


def _searched(space: Any) -> str:
    if space is None:
        return ""
    if hasattr(space, "cases"):
        return "; ".join(f"when {k[0]}: {list(v)}" for k, v in space.cases.items())
    if hasattr(space, "choices"):
        return ", ".join(map(str, space.choices))
    return repr(space)


def render_passes(console: Console | None = None) -> None:
    console = console or Console()
    rows = pass_rows()
    name_width = max(len(row[0]) for row in rows)
    param_width = max(len(row[1]) for row in rows)
    if console.width >= name_width + param_width + VALUE_ROOM + 13:  # 13: the table's borders and padding
        table = Table(title="passes")
        table.add_column("name", no_wrap=True, min_width=name_width)
        table.add_column("parameter", no_wrap=True, min_width=param_width)
        table.add_column("default", overflow="fold")
        table.add_column("default search values", overflow="fold")
        previous = None
        for name, param, default, searched in rows:
            table.add_row(escape(name if name != previous else ""), escape(param), escape(default), escape(searched))
            previous = name
        console.print(table)
        return
    width = max(console.width, 20)
    previous = None
    for name, param, default, searched in rows:
        if name != previous:
            console.print(escape(name), style="bold", soft_wrap=True)
            previous = name
        indent = "  " if len(param) + 2 <= width else ""  # a name never cut, nor pushed past the edge
        console.print(f"{indent}{escape(param)}", soft_wrap=True)
        for label, value in (("default", default), ("search", searched)):
            if value:
                text = textwrap.fill(
                    f"{label}: {value}", width=width, initial_indent="    ", subsequent_indent="      "
                )
                console.print(escape(text), soft_wrap=True, highlight=False)
