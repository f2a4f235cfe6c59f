"""The closest miss in words a user can act on: how far from the budget, what it buys in speed.

When no model meets the budget the user chooses between the original and a relaxed budget; these
lines give the ``tolerable_loss`` that would accept each faster point of the front.
"""

from __future__ import annotations

import math

from quantune.engine.outcome.result import Result
from quantune.engine.trials.trial import TrialRecord
from quantune.report.speed import speed_of
from quantune.wording import format_loss

SHOWN = 5  # front points listed under the closest miss


def budget_value(result: Result) -> float | None:
    """The metric value the criterion accepts at worst (``None`` without the original's)."""
    base = result.baseline.get(result.metric)
    if base is None:
        return None
    return result.criterion.worst_accepted(base)


def accepting_loss(loss: float) -> float:
    """The smallest round ``tolerable_loss`` (4 decimals, rounded up) that accepts ``loss``."""
    return math.ceil(loss * 1e4 - 1e-9) / 1e4


def _speed(result: Result, record: TrialRecord) -> str:
    words = speed_of(result, record)
    return words.replace("faster", "faster than the original", 1) if "faster" in words else words


def miss_lines(result: Result, label: str) -> list[str]:
    """The closest miss and the front it heads, for the console (empty when there is none)."""
    miss = result.closest_miss
    if miss is None or result.best is not None:
        return []
    value = miss.metrics.get(result.metric, float("nan"))
    budget = budget_value(result)
    kind = result.criterion.kind
    head = f"closest miss: trial {miss.number}, {label} {value:.4f}"
    if budget is not None:
        head += f" (budget {budget:.4f}, {abs(budget - value):.4g} away; loss {format_loss(miss.accuracy_loss, kind)})"
    head += f", {_speed(result, miss)}"
    if miss.accuracy_loss is not None and miss.accuracy_loss > 0:
        head += f"; relax criterion.tolerable_loss to {accepting_loss(miss.accuracy_loss):g} to accept it"
    lines = [head, f"  saved in {result.output_dir / 'closest_miss'}"]
    by_number = {r.number: r for r in result.trials}
    rest = [by_number[n] for n in result.miss_front if n != miss.number and n in by_number]
    if rest:
        lines.append(
            f"  the accuracy-latency front of the models faster than the original ({len(rest) + 1} trials, "
            "results.json closest_miss_front) also holds:"
        )
        for record in rest[:SHOWN]:
            loss = format_loss(record.accuracy_loss, kind)
            lines.append(
                f"    trial {record.number}: {label} {record.metrics.get(result.metric, float('nan')):.4f} "
                f"(loss {loss}), {_speed(result, record)}"
            )
    elif not result.miss_front:
        lines.append("  no tried model was faster than the original beyond the search-time noise")
    return lines
