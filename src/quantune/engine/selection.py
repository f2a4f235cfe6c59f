"""Choosing the result: the best trial that meets the criterion, or the closest miss."""

from __future__ import annotations

from collections.abc import Iterable

from quantune.engine.trial import TrialRecord

OBJECTIVE_METRICS = {"latency": "latency_ms", "size": "size_bytes"}


def _tiebreak(objective: str) -> tuple[str, str]:
    first = OBJECTIVE_METRICS[objective]
    second = next(name for name in OBJECTIVE_METRICS.values() if name != first)
    return first, second


def select_best(records: Iterable[TrialRecord], objective: str) -> TrialRecord | None:
    """The trial meeting the criterion with the lowest objective; ties go to the other
    objective, then to the lower accuracy loss, then to the earlier trial."""
    first, second = _tiebreak(objective)
    feasible = [r for r in records if r.status == "ok" and r.meets_criterion]
    if not feasible:
        return None
    return min(feasible, key=lambda r: (r.metrics[first], r.metrics[second], r.accuracy_loss or 0.0, r.number))


def closest_miss(records: Iterable[TrialRecord], objective: str) -> TrialRecord | None:
    """The evaluated trial with the smallest accuracy loss (then the best objective)."""
    first, _ = _tiebreak(objective)
    evaluated = [r for r in records if r.status == "ok" and r.accuracy_loss is not None]
    if not evaluated:
        return None
    return min(evaluated, key=lambda r: (r.accuracy_loss, r.metrics[first], r.number))
