"""The last word on latency: the best candidates and the original, timed side by side.

During the search each model is timed once, when its trial ends, while other work shares
the machine (workers starting up, other trials' accuracy runs, other programs). A drift of
a few percent between those moments can crown the wrong model, and a baseline timed while
workers were importing onnxruntime inflates every speed-up. So a latency run ends by timing
its ``top`` best distinct models and the original again, interleaved round by round, and
chooses and reports on those figures. The search-time figure stays in ``latency_search_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantune.engine.trial import TrialRecord
from quantune.evaluate import Evaluator

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
    evaluator: Evaluator, original: Path, baseline: dict[str, float], records: list[TrialRecord], top: int
) -> Confirmation | None:
    """Re-times the ``top`` fastest distinct models meeting the criterion with the original,
    updating their figures and the baseline's in place. ``None`` when no trial meets it."""
    feasible = sorted(
        (r for r in records if r.status == "ok" and r.meets_criterion and r.model_path),
        key=lambda r: (r.metrics["latency_ms"], r.number),
    )
    chosen: list[str] = []
    for record in feasible:
        if record.model_path not in chosen and len(chosen) < top:
            chosen.append(str(record.model_path))
    if not chosen:
        return None
    figures = evaluator.latency_side_by_side([original, *(Path(path) for path in chosen)])
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
