"""A plotly figure as the JSON plotly.js reads, built as plain dicts.

``graph_objects`` validates and copies on every update, which dominated the report's time; the
tests build each figure through ``plotly.graph_objects.Figure`` once, so nothing goes unvalidated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def scatter(**properties: Any) -> dict[str, Any]:
    return {"type": "scatter", **properties}


def bar(**properties: Any) -> dict[str, Any]:
    return {"type": "bar", **properties}


def merged(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in, nested dicts key by key (plotly's ``update`` semantics)."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merged(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
    return base


def titled(text: str) -> dict[str, Any]:
    return {"title": {"text": text}}


class Spec:
    """One figure: its traces and layout; ``columns`` > 1 lays plots side by side as ``make_subplots`` does."""

    def __init__(self, columns: int = 1, titles: tuple[str, ...] = ()) -> None:
        self.data: list[dict[str, Any]] = []
        self.layout: dict[str, Any] = {}
        self.columns = columns
        if columns > 1:
            gap = 0.2 / columns
            width = (1.0 - gap * (columns - 1)) / columns
            annotations = []
            for index in range(columns):
                low = index * (width + gap)
                domain = [round(low, 10), round(low + width, 10)]
                suffix = "" if index == 0 else str(index + 1)
                self.layout[f"xaxis{suffix}"] = {"anchor": f"y{suffix}", "domain": domain}
                self.layout[f"yaxis{suffix}"] = {"anchor": f"x{suffix}", "domain": [0.0, 1.0]}
                if index < len(titles):
                    annotations.append(
                        {
                            "font": {"size": 16},
                            "showarrow": False,
                            "text": titles[index],
                            "x": round(low + width / 2, 10),
                            "xanchor": "center",
                            "xref": "paper",
                            "y": 1.0,
                            "yanchor": "bottom",
                            "yref": "paper",
                        }
                    )
            self.layout["annotations"] = annotations

    def add_trace(self, trace: dict[str, Any], col: int = 1) -> Spec:
        if col > 1:
            trace = {**trace, "xaxis": f"x{col}", "yaxis": f"y{col}"}
        self.data.append(trace)
        return self

    def add_hline(self, y: float, line: Mapping[str, Any], annotation_text: str = "") -> Spec:
        """A horizontal line across the plot at ``y`` (in the y axis' own units, log axes too),
        labelled at its right end above the line (``add_hline``'s default annotation place)."""
        shape = {"type": "line", "x0": 0, "x1": 1, "xref": "x domain", "y0": y, "y1": y, "yref": "y"}
        self.layout.setdefault("shapes", []).append({"line": dict(line), **shape})
        if annotation_text:
            label = {"showarrow": False, "text": annotation_text, "x": 1, "xanchor": "right", "xref": "x domain"}
            self.layout.setdefault("annotations", []).append({**label, "y": y, "yanchor": "bottom", "yref": "y"})
        return self

    def update_layout(self, **layout: Any) -> Spec:
        merged(self.layout, layout)
        return self

    def _axes(self, letter: str, col: int | None) -> list[str]:
        columns = range(1, self.columns + 1) if col is None else [col]
        return [f"{letter}axis{'' if index == 1 else index}" for index in columns]

    def update_xaxes(self, col: int | None = None, **axis: Any) -> Spec:
        """``axis`` merged into every x axis (``col``: only that plot's)."""
        for name in self._axes("x", col):
            merged(self.layout.setdefault(name, {}), axis)
        return self

    def update_yaxes(self, col: int | None = None, **axis: Any) -> Spec:
        """``axis`` merged into every y axis (``col``: only that plot's)."""
        for name in self._axes("y", col):
            merged(self.layout.setdefault(name, {}), axis)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"data": self.data, "layout": self.layout}
