"""The last word on latency: the best candidates and the original, timed side by side.

During the search each model is timed once, when its trial ends, while other work shares
the machine (workers starting up, other trials' accuracy runs, other programs). A drift of
a few percent between those moments can crown the wrong model, and a baseline timed while
workers were importing onnxruntime inflates every speed-up. So a latency run ends by timing
its ``top`` best distinct models and the original again, interleaved round by round, and
chooses and reports on those figures. The search-time figure stays in ``latency_search_ms``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantune.engine.trial import TrialRecord
from quantune.evaluate import Evaluator

log = logging.getLogger("quantune.confirm")
_MIN_ROUNDS = 5
_FIGURES = ("latency_ms", "latency_p90_ms", "latency_mean_ms")


@dataclass
class Confirmation:
    """Which trials were re-timed (all trials sharing a re-timed model), and the original's old figure."""

    records: list[TrialRecord]
    baseline_search_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "trials": sorted(r.number for r in self.records),
            "baseline_search_ms": self.baseline_search_ms,
        }


def confirm_latency(
    evaluator: Evaluator,
    original: Path,
    baseline: dict[str, float],
    records: list[TrialRecord],
    top: int,
    budget_s: float | None = None,
) -> Confirmation | None:
    """Re-times the ``top`` fastest distinct models meeting the criterion with the original,
    updating their figures and the baseline's in place. ``None`` when no trial meets it.

    ``budget_s`` bounds the re-timing (estimated from the search-time figures): on a large
    model, fewer interleaved rounds (at least 5) rather than minutes of timing.
    """
    feasible = sorted(
        # a resumed run's models may be gone from a cleared cache: those cannot be re-timed
        (
            r
            for r in records
            if r.status == "ok" and r.meets_criterion and r.model_path and Path(r.model_path).is_file()
        ),
        key=lambda r: (r.metrics["latency_ms"], r.number),
    )
    chosen: list[str] = []
    for record in feasible:
        if record.model_path not in chosen and len(chosen) < top:
            chosen.append(str(record.model_path))
    if not chosen:
        return None
    round_s = (baseline["latency_ms"] + sum(_latency_of(feasible, path) for path in chosen)) / 1000.0
    warmup, repeats = timing_rounds(evaluator.spec.latency.warmup, evaluator.spec.latency.repeats, round_s, budget_s)
    try:
        figures = evaluator.latency_side_by_side(
            [original, *(Path(path) for path in chosen)], warmup=warmup, repeats=repeats
        )
    except Exception as exc:  # onnxruntime refused a model it ran before: keep the search's figures
        log.warning("latency re-timing skipped: %s: %s", type(exc).__name__, exc)
        return None
    baseline_search_ms = baseline["latency_ms"]
    _replace(baseline, figures[0])
    by_model = dict(zip(chosen, figures[1:], strict=True))
    confirmed = [r for r in feasible if r.model_path in by_model]
    for record in confirmed:
        _replace(record.metrics, by_model[str(record.model_path)])
        record.objective = record.metrics["latency_ms"]
    return Confirmation(confirmed, baseline_search_ms)


def _replace(metrics: dict[str, float], fresh: dict[str, float]) -> None:
    metrics["latency_search_ms"] = metrics["latency_ms"]
    for name in _FIGURES:
        metrics[name] = fresh[name]


def timing_rounds(warmup: int, repeats: int, round_s: float, budget_s: float | None) -> tuple[int, int]:
    """(warm-up, timed) rounds for a re-timing where one round of every model takes ``round_s``:
    the config's ``repeats`` when they fit ``budget_s``, else as many as fit, at least 5."""
    warmup = min(warmup, 2)  # each session is warmed before the first round; more adds nothing
    if budget_s is None:
        return warmup, repeats
    fitting = int(budget_s / max(round_s, 1e-9)) - warmup
    return warmup, max(_MIN_ROUNDS, min(repeats, fitting))


def _latency_of(records: list[TrialRecord], model_path: str) -> float:
    return next(r.metrics["latency_ms"] for r in records if r.model_path == model_path)
