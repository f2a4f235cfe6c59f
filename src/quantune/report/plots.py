"""The report's plotly figures drawn from results.json: every trial, the Pareto front, the best so far.

These are the views Optuna has no notion of (the original, the budget, failure classes, the
closest miss); latency goes on a log axis when trials span more than a decade.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Any

from quantune.engine.outcome.result import Result
from quantune.engine.trials.trial import TrialRecord
from quantune.report.spec import Spec, scatter, titled
from quantune.report.study import objective_name, objective_value

GREEN, GRAY, RED, BLUE, GOLD, ORANGE = "#2ca02c", "#9a9a9a", "#d62728", "#1f77b4", "#f5c518", "#ff7f0e"


def loss_scale(results: Result) -> tuple[float, str]:
    """Accuracy loss as shown: percent of the original for a relative criterion, else metric units."""
    if results.criterion.kind == "relative":
        return 100.0, "accuracy loss (% of the original)"
    return 1.0, f"accuracy loss ({results.metric})"


def ok_trials(results: Result) -> list[TrialRecord]:
    return [
        t
        for t in results.trials
        if t.status == "ok" and t.accuracy_loss is not None and objective_value(results, t.metrics) is not None
    ]


def failed_trials(results: Result) -> list[TrialRecord]:
    return [t for t in results.trials if t.status != "ok"]


def chosen_trial(results: Result) -> tuple[TrialRecord | None, str]:
    """The trial the report centres on and what it is: the best, else the closest miss."""
    if results.best:
        return results.best, "best" if results.verdict == "improved" else "best candidate"
    if results.closest_miss:
        return results.closest_miss, "closest miss"
    return None, ""


def log_axis(values: Sequence[float]) -> bool:
    """True when the positive values span more than a decade."""
    positive = [v for v in values if v and v > 0]
    return bool(positive) and max(positive) / min(positive) > 10


def log_ticks(values: Sequence[float]) -> dict[str, Any]:
    """A log axis labelled 1, 2, 5, 10, 20, 50, ... (plotly's default writes 20 as a bare "2")."""
    positive = [v for v in values if v and v > 0]
    low, high = min(positive) / 1.5, max(positive) * 1.5
    ticks = [
        m * 10.0**k for k in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1) for m in (1, 2, 5)
    ]
    ticks = [t for t in ticks if low <= t <= high]
    return {"type": "log", "tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks]}


def _hover(trial: TrialRecord) -> str:
    """A trial's hover text; what came from the trial is escaped (plotly renders some HTML tags)."""
    e = html.escape
    params = "<br>".join(e(f"{k.split('.', 1)[-1]}={_short(v)}") for k, v in trial.params.items())
    head = e(f"trial {trial.number}: {trial.stage or ' > '.join(trial.flow)}")
    if trial.status != "ok":
        return f"{head}<br>FAILED: {e(str(trial.failure_class or trial.error or ''))}<br>{params}"
    return f"{head}<br>{params}"


def _short(value: Any) -> str:
    if isinstance(value, list | tuple):
        return f"[{len(value)} items]"
    if isinstance(value, dict):
        return f"{{{len(value)} entries}}"
    return str(value)


def trade_off(results: Result) -> Spec:
    """Every trial: objective against accuracy loss, with the original, the budget, the best or
    the closest miss, and the failed trials (no figures) in a strip above the plot."""
    scale, loss_label = loss_scale(results)
    trials = ok_trials(results)
    x_of = lambda t: objective_value(results, t.metrics)  # noqa: E731
    figure = Spec()
    for meets, color, name in ((True, GREEN, "meets the budget"), (False, GRAY, "misses it")):
        group = [t for t in trials if bool(t.meets_criterion) is meets]
        x, y = [x_of(t) for t in group], [scale * t.accuracy_loss for t in group]
        line = {"width": 0.5, "color": "#333"}
        figure.add_trace(_points(group, x, y, f"{name} ({len(group)})", color=color, size=9, line=line))
    xs = [x_of(t) for t in trials]
    base = objective_value(results, results.baseline)
    if base is not None:
        xs.append(base)
        figure.add_trace(
            scatter(
                x=[base],
                y=[0.0],
                mode="markers",
                marker={"symbol": "diamond", "size": 13, "color": BLUE},
                name="original",
                hovertext=[f"original: {base:.4g}"],
                hoverinfo="text",
            )
        )
    tolerable = results.criterion.tolerable_loss
    losses = [scale * t.accuracy_loss for t in trials] + [0.0]
    if tolerable is not None:
        budget = scale * tolerable
        losses.append(budget)
        figure.add_hline(budget, {"color": RED, "dash": "dash"}, "budget")
    if base is not None:  # a line trace, not a shape: shapes on a log axis take log10 coordinates
        figure.add_trace(_line([base, base], [min(losses), max(losses)], BLUE, "original"))
    _mark_chosen(figure, results, lambda t: (x_of(t), scale * t.accuracy_loss))
    failed = failed_trials(results)
    if failed:
        top = max(losses) + 0.08 * (max(losses) - min(losses) or 1.0)
        x = [base if base is not None else (min(xs) if xs else 0.0)] * len(failed)
        name = f"failed ({len(failed)}, no figures: drawn at the top)"
        figure.add_trace(_points(failed, x, [top] * len(failed), name, symbol="x", size=10, color=RED))
    figure.update_layout(title={"text": "every trial"}, xaxis=titled(objective_name(results)), yaxis=titled(loss_label))
    if log_axis(xs):
        figure.update_xaxes(**log_ticks(xs))
    return styled(figure)


def _mark_chosen(figure: Spec, results: Result, at: Callable[[TrialRecord], tuple[float, float]]) -> None:
    chosen, kind = chosen_trial(results)
    if chosen is None or chosen.status != "ok" or objective_value(results, chosen.metrics) is None:
        return
    x, y = at(chosen)
    star = kind != "closest miss"
    figure.add_trace(
        _points(
            [chosen],
            [x],
            [y],
            f"{kind} (trial {chosen.number})",
            symbol="star" if star else "diamond-open",
            size=20 if star else 16,
            color=GOLD if star else ORANGE,
            line={"width": 1.5, "color": "#000" if star else ORANGE},
        )
    )


def _points(trials: Sequence[TrialRecord], x: list[Any], y: list[Any], name: str, **marker: Any) -> dict[str, Any]:
    text = [_hover(t) for t in trials]
    return scatter(x=x, y=y, mode="markers", marker=marker, name=name, text=text, hoverinfo="text")


def pareto_numbers(results: Result) -> list[int]:
    """Trials no other finished trial beats on accuracy loss, latency and size at once."""
    points = {
        t.number: (t.accuracy_loss, t.metrics.get("latency_ms", math.inf), t.metrics.get("size_bytes", 0.0))
        for t in ok_trials(results)
    }
    front = []
    for number, p in points.items():
        dominated = any(
            all(a <= b for a, b in zip(q, p, strict=True)) and any(a < b for a, b in zip(q, p, strict=True))
            for other, q in points.items()
            if other != number
        )
        if not dominated:
            front.append(number)
    return sorted(front)


def pareto(results: Result) -> Spec:
    """The Pareto front of accuracy loss, latency and size: loss against latency (the front as a
    line) and size against latency (colour: loss), front members outlined in both."""
    scale, loss_label = loss_scale(results)
    trials = ok_trials(results)
    front = set(pareto_numbers(results))
    figure = Spec(columns=2, titles=("accuracy loss vs latency", "size vs latency (colour: accuracy loss)"))
    on = [t for t in trials if t.number in front]
    line = sorted(on, key=lambda t: t.metrics.get("latency_ms", math.inf))
    best_loss, stair = float("inf"), []
    for t in line:  # the 2-D front of loss against latency: each faster point that loses less
        if t.accuracy_loss < best_loss:
            best_loss = t.accuracy_loss
            stair.append(t)
    lat = [t.metrics.get("latency_ms") for t in trials]
    loss = [scale * t.accuracy_loss for t in trials]
    colors = [GREEN if t.meets_criterion else GRAY for t in trials]
    figure.add_trace(_points(trials, lat, loss, "trials (outlined: Pareto front)", color=colors, size=9), col=1)
    figure.add_trace(
        scatter(
            x=[t.metrics.get("latency_ms") for t in stair],
            y=[scale * t.accuracy_loss for t in stair],
            mode="lines",
            line={"shape": "hv", "color": "#000", "width": 1},
            name="front (loss vs latency)",
        ),
        col=1,
    )
    sizes = [t.metrics.get("size_bytes", 0.0) / 1024 for t in trials]
    outline = {"width": [2.5 if t.number in front else 0 for t in trials], "color": "#000"}
    marker = {"color": loss, "colorscale": "Viridis", "colorbar": {"title": "loss"}, "showscale": True}
    by_size = _points(trials, lat, sizes, "trials by size", size=10, line=outline, **marker)
    figure.add_trace({**by_size, "showlegend": False}, col=2)
    base = results.baseline
    if base.get("latency_ms") is not None:
        for col, y in ((1, 0.0), (2, base.get("size_bytes", 0.0) / 1024)):
            figure.add_trace(
                scatter(
                    x=[base["latency_ms"]],
                    y=[y],
                    mode="markers",
                    marker={"symbol": "diamond", "size": 13, "color": BLUE},
                    name="original",
                    showlegend=col == 1,
                ),
                col=col,
            )
    figure.update_xaxes(**titled("latency (ms)"), **(log_ticks(lat) if log_axis(lat) else {}))
    figure.update_yaxes(col=1, **titled(loss_label))
    figure.update_yaxes(col=2, **titled("size (KB)"))
    figure.update_layout(
        title={"text": f"Pareto front: {len(front)} of {len(trials)} finished trials"},
        legend={"orientation": "h", "y": -0.2, "x": 0},
    )
    return styled(figure, height=470)


def progress(results: Result) -> Spec:
    """The best objective within the budget after each trial; when nothing met the budget, the
    smallest accuracy loss so far against the budget instead, with the closest miss marked."""
    scale, loss_label = loss_scale(results)
    trials = sorted(results.trials, key=lambda t: t.number)
    met = any(t.status == "ok" and t.meets_criterion for t in trials)
    figure = Spec()
    value = (
        (lambda t: objective_value(results, t.metrics))
        if met
        else (lambda t: None if t.accuracy_loss is None else scale * t.accuracy_loss)
    )
    numbers, steps, current = [], [], None
    for t in trials:
        v = value(t) if t.status == "ok" else None
        if v is not None and (not met or t.meets_criterion):
            current = v if current is None else min(current, v)
        numbers.append(t.number)
        steps.append(current)
    for meets, color, name in ((True, GREEN, "meets the budget"), (False, GRAY, "misses it")):
        group = [t for t in trials if t.status == "ok" and bool(t.meets_criterion) is meets]
        x, y = [t.number for t in group], [value(t) for t in group]
        figure.add_trace(_points(group, x, y, name, color=color, size=7, opacity=0.7))
    figure.add_trace(
        scatter(
            x=numbers,
            y=steps,
            mode="lines",
            line={"shape": "hv", "color": GREEN if met else ORANGE, "width": 2.5},
            name="best within the budget so far" if met else "smallest loss so far",
        )
    )
    failed = failed_trials(results)
    finite = [v for v in steps if v is not None] + [v for t in trials if (v := value(t)) is not None]
    if failed and finite:
        x, y = [t.number for t in failed], [min(finite)] * len(failed)
        figure.add_trace(_points(failed, x, y, "failed", symbol="x", size=10, color=RED))
    if met:
        base = objective_value(results, results.baseline)
        if base is not None and numbers:  # a line trace: shapes on a log axis take log10 coordinates
            figure.add_trace(_line([min(numbers), max(numbers)], [base, base], BLUE, "original", legend=True))
        title, y_title = "best so far", f"{objective_name(results)}, best within the budget"
        if log_axis(finite + ([base] if base else [])):
            figure.update_yaxes(**log_ticks(finite + ([base] if base else [])))
    else:
        tolerable = results.criterion.tolerable_loss
        if tolerable is not None:
            figure.add_hline(scale * tolerable, {"color": RED, "dash": "dash"}, "budget")
        _mark_chosen(figure, results, lambda t: (t.number, scale * t.accuracy_loss))
        miss = results.closest_miss
        title = "no trial met the accuracy budget: the smallest loss so far" + (
            f" (closest miss: trial {miss.number})" if miss else ""
        )
        y_title = loss_label
    figure.update_layout(title={"text": title}, xaxis=titled("trial"), yaxis=titled(y_title))
    return styled(figure)


def _line(x: list[float], y: list[float], color: str, name: str, *, legend: bool = False) -> dict[str, Any]:
    return scatter(
        x=x, y=y, mode="lines", line={"color": color, "dash": "dot"}, name=name, showlegend=legend, hoverinfo="skip"
    )


def styled(figure: Spec, height: int = 420) -> Spec:
    """The page's figure layout (the theme is added as the page writes the figure, unvalidated)."""
    figure.update_layout(
        height=height,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        legend={"font": {"size": 11}},
        hoverlabel={"align": "left"},
    )
    return figure
