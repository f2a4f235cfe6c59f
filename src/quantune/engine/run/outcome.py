"""The run's outcome: the verdict and the figures around it gathered into a :class:`Result`, then written and handed to
the listeners. After a confirmation only figures timed side by side compete."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from quantune.config import Config
from quantune.engine.executors.stage import StageLog
from quantune.engine.outcome.result import Result, write_outputs
from quantune.engine.outcome.verdict import decide
from quantune.engine.run.deadline import EndBudget
from quantune.engine.run.ending import Ending
from quantune.engine.run.loop import RunListener, RunLoop
from quantune.engine.run.timebook import WRITING, TimeBook
from quantune.engine.trials.runner import TrialRunner
from quantune.engine.trials.selection import closest_miss, miss_front, pareto_front
from quantune.engine.trials.setup import RunParts
from quantune.engine.trials.trial import TrialRecord

log = logging.getLogger("quantune")


def gather(
    config: Config,
    objectives: list[str],
    output_dir: Path,
    stages: StageLog,
    parts: RunParts,
    loop: RunLoop,
    baseline: dict[str, float],
    baseline_cache: str,
    stop_reason: str,
    ending: Ending,
) -> Result:
    """The verdict over the loop's records and all ``results.json`` holds but the time spent (see :func:`write`)."""
    records = sorted(loop.records, key=lambda r: r.number)
    # after a confirmation, only figures timed side by side compete, and their paired ratios decide
    confirmation = ending.confirmation
    kind, wins = parts.criterion.kind, loop.strategy.original_wins
    verdict = decide(records, objectives, baseline, confirmation, kind, wins, ending.unconfirmed)
    result = Result(
        baseline=baseline,
        trials=records,
        best=verdict.best,
        closest_miss=closest_miss(records, objectives, baseline.get("latency_ms")),
        miss_front=[r.number for r in miss_front(records, baseline.get("latency_ms"))],
        pareto_front=[r.number for r in pareto_front(records, objectives)] if len(objectives) > 1 else [],
        metric=config.evaluation.metric,
        criterion=parts.criterion,
        objective=objectives[0],
        objectives=objectives,
        stop_reason=stop_reason,
        duration_s=0.0,  # closed as results.json is written (write)
        output_dir=output_dir,
        cache_stats=_cache_stats([r for r in records if r.number not in loop.replayed_numbers], baseline_cache),
        step_configs=loop.step_configs,
        replayed=loop.replay.replayed,
        latency_confirmation=confirmation.to_dict() if confirmation else None,
        verdict=verdict.kind,
        verdict_reason=verdict.reason,
        preparation=parts.context.preparation.to_dict() if parts.context.preparation else None,
        stage_peak_rss_mb=_stage_peaks(stages, records),
        stage_errors=list(stages.errors),
    )
    result.skipped_known_failures = loop.skips.count
    result.strategy_notes = loop.strategy.learned()
    result.latency_confirmation_skipped = ending.skipped or None
    return result


def write(
    result: Result,
    book: TimeBook,
    end: EndBudget,
    listeners: Sequence[RunListener],
    started: float,
    runner: TrialRunner | None = None,
) -> Result:
    """``results.json`` and the chosen model's folder (rebuilt by ``runner`` if gone), then the listeners' ends."""

    def written() -> None:  # the models are saved; results.json is next and takes no time
        book.mark(WRITING)
        result.time_spent_s = book.figures()
        result.duration_s = time.perf_counter() - started

    rebuild = None if runner is None or (end.limited and end.left_s() <= end.end_s) else runner.rebuild
    write_outputs(result, before_json=written, rebuild=rebuild)
    result.time_left_s = end.left_s() if end.limited else None  # report.html is drawn only if it fits
    for listener in listeners:
        listener.on_end(result)
    log.info("results written: %.1f s", time.perf_counter() - started)
    return result


def _stage_peaks(stages: StageLog, records: list[TrialRecord]) -> dict[str, float]:
    """Peak resident memory per stage: the run's own stages, and the largest calibration any trial ran."""
    peaks = dict(stages.peaks)
    for record in records:
        for key, value in record.durations.items():
            if key.endswith("_peak_rss_mb") and isinstance(value, int | float):
                stage = key.removesuffix("_peak_rss_mb")
                peaks[stage] = max(peaks.get(stage, 0.0), float(value))
    return dict(sorted(peaks.items()))


def _cache_stats(records: list[TrialRecord], baseline_cache: str) -> dict[str, dict[str, int]]:
    """Cache hits and misses of the work this run did (replayed trials did none)."""
    stats: dict[str, dict[str, int]] = {"baseline": {"hits": 0, "misses": 0}}
    stats["baseline"]["hits" if baseline_cache == "hit" else "misses"] += 1
    for record in records:
        for step, outcome in record.cache.items():
            entry = stats.setdefault(step, {"hits": 0, "misses": 0})
            entry["hits" if outcome == "hit" else "misses"] += 1
    return stats
