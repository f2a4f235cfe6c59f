"""Choosing the result: the best trial that meets the criterion, the Pareto front, or the
closest miss.

A model with no quantized compute op is the original in disguise, so it is never a candidate
(nor the closest miss).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from quantune.engine.trials.trial import TrialRecord

OBJECTIVE_METRICS = {"latency": "latency_ms", "size": "size_bytes", "memory": "peak_memory_mb"}
# How far apart two search-time latencies may be and still be the same speed: within it, the earlier trial.
SEARCH_NOISE = 0.10
MEASURED = frozenset({"latency", "memory"})  # objectives read from a measurement, not from the model's bytes


def earliest_as_fast(timed: Iterable[tuple[float, TrialRecord]]) -> TrialRecord:
    """Of (search-time ms, trial) pairs, the earliest trial within ``SEARCH_NOISE`` of the fastest."""
    timed = list(timed)
    band = min(ms for ms, _ in timed) * (1.0 + SEARCH_NOISE)
    return min((record for ms, record in timed if ms <= band), key=lambda r: r.number)


def objective_value(record: TrialRecord, objective: str) -> float:
    if objective == "accuracy":
        return record.accuracy_loss if record.accuracy_loss is not None else float("inf")
    # a run store from before the memory figure: unknown memory ranks last
    return record.metrics.get(OBJECTIVE_METRICS[objective], float("inf"))


def ranking(objectives: Sequence[str]) -> list[str]:
    """The declared objectives, then the remaining ones as tie-breakers."""
    rest = [name for name in ("latency", "size", "accuracy", "memory") if name not in objectives]
    return [*objectives, *rest]


def quantizes_nothing(record: TrialRecord) -> bool:
    """Whether the trial's model runs no compute op quantized nor in float16 on the original's
    provider (``False`` when not measured; on another provider it is a candidate of its own)."""
    return (
        record.status == "ok"
        and record.metrics.get("quantized_ops", 1) == 0
        and record.metrics.get("float16_ops", 0) == 0
        and not (record.session_settings or {}).get("provider")
    )


def is_candidate(record: TrialRecord) -> bool:
    """Meets the criterion and quantizes something."""
    return record.status == "ok" and bool(record.meets_criterion) and not quantizes_nothing(record)


def _feasible(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    return [r for r in records if is_candidate(r)]


def rank_key(record: TrialRecord, objectives: Sequence[str]) -> tuple[float, ...]:
    """Lower is better: the objectives in declared order, then the others, then the trial number."""
    return (*(objective_value(record, name) for name in ranking(objectives)), record.number)


def select_best(records: Iterable[TrialRecord], objectives: Sequence[str]) -> TrialRecord | None:
    """The trial meeting the criterion that is best by ``objectives`` in order (ties: the
    other objectives, then the earlier trial)."""
    feasible = _feasible(records)
    if not feasible:
        return None
    return min(feasible, key=lambda r: rank_key(r, objectives))


def better(record: TrialRecord, best: TrialRecord | None, objectives: Sequence[str]) -> TrialRecord | None:
    """The best of ``best`` and ``record``, for keeping the best up to date one trial at a time."""
    if not is_candidate(record):
        return best
    if best is None or rank_key(record, objectives) < rank_key(best, objectives):
        return record
    return best


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


def _evaluated_misses(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """Evaluated trials that may be a closest miss: not the original in disguise."""
    return [
        r
        for r in records
        if r.status == "ok" and r.accuracy_loss is not None and not (r.meets_criterion and quantizes_nothing(r))
    ]


def miss_front(records: Iterable[TrialRecord], original_latency_ms: float | None) -> list[TrialRecord]:
    """The accuracy--latency Pareto front of the quantized trials faster than the original.

    What a user can choose from when nothing meets the budget. A trial not faster beyond the
    search-time noise (``SEARCH_NOISE``) is left out, so the closest miss does not follow the
    noise. Most accurate first.
    """
    if not original_latency_ms or original_latency_ms <= 0:
        return []
    faster = [
        r
        for r in _evaluated_misses(records)
        if not quantizes_nothing(r)
        and 0 < r.metrics.get("latency_ms", float("inf")) * (1.0 + SEARCH_NOISE) < original_latency_ms
    ]
    front: list[TrialRecord] = []
    fastest_so_far = float("inf")
    for _, same in itertools.groupby(
        sorted(faster, key=lambda r: (r.accuracy_loss, r.number)), lambda r: r.accuracy_loss
    ):
        timed = [(r.metrics["latency_ms"], r) for r in same]
        fastest = min(ms for ms, _ in timed)
        if fastest >= fastest_so_far:
            continue  # more loss than every point before it, so it must be faster to count
        fastest_so_far = fastest
        # within the noise, the earliest trial, not the one a single timing favoured
        front.append(earliest_as_fast(timed))
    return front


def closest_miss(
    records: Iterable[TrialRecord], objectives: Sequence[str], original_latency_ms: float | None = None
) -> TrialRecord | None:
    """The most accurate point of :func:`miss_front`; when no tried model is faster than the
    original, the evaluated trial with the smallest accuracy loss. A model that quantizes
    nothing is the original in disguise, not a miss."""
    records = list(records)
    front = miss_front(records, original_latency_ms)
    if front:
        return front[0]
    first = ranking(objectives)[0]
    evaluated = _evaluated_misses(records)
    if not evaluated:
        return None
    least = min(r.accuracy_loss for r in evaluated)
    tied = [r for r in evaluated if r.accuracy_loss == least]
    if first in MEASURED:  # one timing each: within the noise, the earlier trial
        return earliest_as_fast((objective_value(r, first), r) for r in tied)
    return min(tied, key=lambda r: (objective_value(r, first), r.number))
