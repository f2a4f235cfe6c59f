"""Choosing the result: the best trial that meets the criterion, the Pareto front, or the
closest miss.

Objectives are minimised: ``latency`` (median ms) and ``size`` (bytes) as measured, and
``accuracy`` as the loss against the original model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from quantune.engine.trial import TrialRecord

OBJECTIVE_METRICS = {"latency": "latency_ms", "size": "size_bytes"}


def objective_value(record: TrialRecord, objective: str) -> float:
    if objective == "accuracy":
        return record.accuracy_loss if record.accuracy_loss is not None else float("inf")
    return record.metrics[OBJECTIVE_METRICS[objective]]


def ranking(objectives: Sequence[str]) -> list[str]:
    """The declared objectives, then the remaining ones as tie-breakers."""
    rest = [name for name in ("latency", "size", "accuracy") if name not in objectives]
    return [*objectives, *rest]


def _feasible(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    return [r for r in records if r.status == "ok" and r.meets_criterion]


def select_best(records: Iterable[TrialRecord], objectives: Sequence[str]) -> TrialRecord | None:
    """The trial meeting the criterion that is best by ``objectives`` in order (ties: the
    other objectives, then the earlier trial)."""
    order = ranking(objectives)
    feasible = _feasible(records)
    if not feasible:
        return None
    return min(feasible, key=lambda r: (*(objective_value(r, name) for name in order), r.number))


def pareto_front(records: Iterable[TrialRecord], objectives: Sequence[str]) -> list[TrialRecord]:
    """Trials meeting the criterion that no other such trial beats on every objective."""
    feasible = _feasible(records)
    values = {r.number: tuple(objective_value(r, name) for name in objectives) for r in feasible}

    def dominated(record: TrialRecord) -> bool:
        mine = values[record.number]
        return any(
            all(a <= b for a, b in zip(other, mine, strict=True)) and other != mine
            for number, other in values.items()
            if number != record.number
        )

    front = [r for r in feasible if not dominated(r)]
    return sorted(front, key=lambda r: (values[r.number], r.number))


def closest_miss(records: Iterable[TrialRecord], objectives: Sequence[str]) -> TrialRecord | None:
    """The evaluated trial with the smallest accuracy loss (then the best objective)."""
    first = ranking(objectives)[0]
    evaluated = [r for r in records if r.status == "ok" and r.accuracy_loss is not None]
    if not evaluated:
        return None
    return min(evaluated, key=lambda r: (r.accuracy_loss, objective_value(r, first), r.number))
