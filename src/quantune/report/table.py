"""The report's trial table: every trial, sortable and filterable in the page (plain inline JS).

Long lists are summarized with the full list expandable; model links are relative to the page,
so they work wherever the run folder and the cache are opened together.
"""

from __future__ import annotations

import html
import os
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantune.engine.outcome.result import Result
from quantune.engine.trials.trial import TrialRecord
from quantune.report.plots import loss_scale
from quantune.report.precision import excluded, plays
from quantune.report.sections import loss_text
from quantune.report.study import objective_name, objective_value
from quantune.report.summarize import quantized_label

_COLUMNS = (
    ("#", "num"),
    ("stage", "text"),
    ("params", "text"),
    ("status", "text"),
    ("metric", "num"),
    ("loss", "num"),
    ("objective", "num"),
    ("size KB", "num"),
    ("quantized", "num"),
    ("meets", "text"),
    ("passes (s)", "num"),
    ("evaluation (s)", "num"),
    ("total (s)", "num"),
    ("cache hits", "num"),
    ("model", "text"),
)


def summarize_nodes(names: list[str], types: Mapping[str, str]) -> str:
    """ "37 nodes: 12 Add, 9 Mul, ..." (op types from ``types``, else guessed from the name)."""
    counts = Counter(types.get(name) or _guess_type(name) for name in names)
    parts = ", ".join(f"{n} {op}" for op, n in counts.most_common())
    return f"{len(names)} node{'s' if len(names) != 1 else ''}: {parts}"


def _guess_type(name: str) -> str:
    last = name.rsplit("/", 1)[-1]
    return re.sub(r"(_\d+)+$", "", last) or "?"


def nodes_cell(names: list[str], types: Mapping[str, str], label: str = "") -> str:
    items = "".join(
        f"<li>{html.escape(n)} <span class=dim>({html.escape(types.get(n, '?'))})</span></li>" for n in names
    )
    summary = html.escape(f"{label}{summarize_nodes(names, types)}")
    return f"<details><summary>{summary}</summary><ul class=nodes>{items}</ul></details>"


def trial_table(results: Result, page_dir: Path, types: Mapping[str, str]) -> str:
    metric = results.metric
    kind = results.criterion.kind
    scale, _ = loss_scale(results)
    best = results.best.number if results.best else None
    miss = results.closest_miss.number if results.closest_miss else None
    head = "".join(
        f'<th data-kind="{kind_}">{html.escape(_header(name, metric, results))}</th>' for name, kind_ in _COLUMNS
    )
    rows = []
    for trial in sorted(results.trials, key=lambda t: t.number):
        m = trial.metrics
        loss = trial.accuracy_loss
        objective = objective_value(results, m)
        durations = trial.durations or {}
        passes = durations.get("passes_s") or {}
        cache = trial.cache or {}
        hits = sum(1 for v in cache.values() if v == "hit")
        status = "ok" if trial.status == "ok" else f"failed: {trial.failure_class or ''}"
        cells = [
            (trial.number, html.escape(str(trial.number))),
            (None, html.escape(str(trial.stage))),
            (None, _params_cell(trial.params, types)),
            (None, _status_cell(trial, status)),
            (m.get(metric), _num(m.get(metric), "{:.4f}")),
            (None if loss is None else scale * loss, html.escape(loss_text(loss, kind))),
            (
                objective,
                "untimed"
                if objective is None and trial.untimed
                else _num(objective, "{:.4g}") + ("*" if "latency_search_ms" in m else ""),
            ),
            (_kb(m), _num(_kb(m), "{:.0f}")),
            (m.get("quantized_compute_fraction"), quantized_label(m)),
            (None, {True: "yes", False: "no"}.get(trial.meets_criterion, "")),
            (sum(passes.values()) if passes else None, _passes_cell(passes)),
            (durations.get("evaluation_s"), _num(durations.get("evaluation_s"), "{:.2f}")),
            (durations.get("total_s"), _num(durations.get("total_s"), "{:.2f}")),
            (hits if cache else None, f"{hits}/{len(cache)}" if cache else ""),
            (None, _model_link(trial.model_path, page_dir)),
        ]
        css = []
        if trial.number == best:
            css.append("best")
        if trial.number == miss:
            css.append("miss")
        if trial.status != "ok":
            css.append("failed")
        state = "failed" if trial.status != "ok" else ("meets" if trial.meets_criterion else "misses")
        tds = "".join(_td(value, text) for value, text in cells)
        rows.append(f'<tr class="{" ".join(css)}" data-state="{state}">{tds}</tr>')
    return (
        '<div class=controls><input id=filter type=search placeholder="filter rows (any text: stage, param, error)">'
        "<select id=state><option value=''>all trials</option><option value=meets>meet the budget</option>"
        "<option value=misses>miss it</option><option value=failed>failed</option></select>"
        " <span id=shown></span> <span class=dim>click a column to sort</span></div>"
        f"<div class=scroll><table id=trials><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _td(value: Any, text: str) -> str:
    """A cell; ``data-v`` holds the number the column sorts by."""
    return f"<td>{text}</td>" if value is None else f'<td data-v="{float(value)!r}">{text}</td>'


def _header(name: str, metric: str, results: Result) -> str:
    if name == "metric":
        return metric or "metric"
    if name == "objective":
        return objective_name(results)
    return name


def _num(value: Any, fmt: str) -> str:
    return "" if value is None else html.escape(fmt.format(value))


def _kb(metrics: Mapping[str, Any]) -> float | None:
    return None if "size_bytes" not in metrics else metrics["size_bytes"] / 1024


def _params_cell(params: Mapping[str, Any], types: Mapping[str, str]) -> str:
    parts = []
    nodes = excluded(params)
    for key, value in params.items():
        short = key.split(".", 1)[-1]
        if plays(key, lambda knobs: knobs.exclude):
            continue
        if isinstance(value, list | tuple | dict):
            parts.append(html.escape(f"{short}=[{len(value)} items]"))
        else:
            parts.append(html.escape(f"{short}={value}"))
    text = ", ".join(parts)
    if nodes:
        text += nodes_cell(nodes, types, "fp32: ")
    return text


def _status_cell(trial: TrialRecord, status: str) -> str:
    if trial.status == "ok":
        return "ok"
    error = html.escape(trial.error or "")
    return f'<span class=bad title="{error}">{html.escape(status)}</span>'


def _passes_cell(passes: Mapping[str, float]) -> str:
    return "<br>".join(html.escape(f"{name} {seconds:.2f}") for name, seconds in passes.items())


def _model_link(path: str | None, page_dir: Path) -> str:
    if not path:
        return ""
    target = Path(path).expanduser()
    try:
        relative = os.path.relpath(target, page_dir.resolve())
    except ValueError:  # another drive (Windows)
        relative = str(target)
    mark = "" if target.is_file() else " class=gone title='no longer in the cache'"
    return f'<a href="{html.escape(Path(relative).as_posix())}"{mark}>model.onnx</a>'
