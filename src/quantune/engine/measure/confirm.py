"""The last word on latency: the best candidates and the original, timed side by side at the end of a latency run, since
search-time figures drift with the load. Only a candidate whose paired ratio's interval lies below 1 is faster."""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from quantune import progress
from quantune.engine.trials.selection import earliest_as_fast, is_candidate
from quantune.engine.trials.trial import TrialRecord
from quantune.evaluate import Evaluator, RatioInterval, paired_ratio
from quantune.evaluate.latency import TimingRequest, latency_figures, warmup_passes
from quantune.evaluate.paired import CONFIDENCE, MIN_GAIN
from quantune.evaluate.rounds import decided
from quantune.evaluate.session_file import read_session_settings
from quantune.model import external_data_files, files_sha256

log = logging.getLogger("quantune.confirm")
MIN_ROUNDS = 5  # the fewest interleaved rounds a re-timing runs
# Rounds the verdict asks for when they fit the budget, whatever ``repeats`` says: with 5, one disturbed round vetoes a
# real speed-up; with 30, a third of the rounds may be disturbed.
VERDICT_ROUNDS = 30
# ... unless the verdict is settled before (``verdict_settled``), asked from the 10th round.
SETTLED_CONFIDENCE = 0.99
_FIGURES = ("latency_ms", "latency_p90_ms", "latency_mean_ms")


@dataclass
class Confirmation:
    """Which trials were re-timed (all trials sharing a re-timed model), and the original's old figure."""

    records: list[TrialRecord]
    baseline_search_ms: float
    rounds: int = 0
    ratios: dict[int, RatioInterval] = field(default_factory=dict)  # trial number -> paired ratio to the original
    # trials the fastest re-timed model does not beat beyond the noise (its own included): the verdict breaks that tie
    # by a fixed rule
    ties: list[int] = field(default_factory=list)
    # the strategy's own answer (``Strategy.answer``) when it was re-timed: it takes a tie (outcome/verdict.py)
    preferred: int | None = None

    def ratio_of(self, record: TrialRecord) -> RatioInterval | None:
        return self.ratios.get(record.number)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trials": sorted(r.number for r in self.records),
            "baseline_search_ms": self.baseline_search_ms,
            "rounds": self.rounds,
            "method": (
                f"median of per-round paired ratios (candidate / original), {CONFIDENCE:.0%} interval from "
                "order statistics (sign test); faster only when the interval's upper end is below 0.98; "
                f"rounds stop once every ratio's {SETTLED_CONFIDENCE:.0%} interval lies on one side of 0.98 "
                "(and each runner-up's, to the fastest, on one side of 1/0.98)"
            ),
            "ratios": {str(number): ratio.to_dict() for number, ratio in sorted(self.ratios.items())},
            "ties": sorted(self.ties),
            "preferred": self.preferred,
        }


def confirm_latency(
    evaluator: Evaluator,
    original: Path,
    baseline: dict[str, float],
    records: list[TrialRecord],
    top: int,
    budget_s: float | None = None,
    deadline: float | None = None,
    prefer: int | None = None,
) -> Confirmation | None:
    """Re-times the ``top`` fastest distinct candidates with the original, updating figures in place, with each one's
    paired ratio (``None``: no candidate). ``budget_s`` and ``deadline`` bound the rounds; ``prefer``: the stable
    contender."""
    feasible, chosen, stable = _choose(records, top, prefer)
    if not chosen:
        return None
    round_s = _round_s(baseline, feasible, chosen)
    latency = evaluator.spec.latency
    models = [original, *(Path(path) for path in chosen)]
    _, repeats = timing_rounds(latency.warmup, latency.repeats, round_s, budget_s)
    warmup = retiming_warmup(latency.warmup, latency.seconds, len(models), round_s)
    # under load the rounds can take far longer than planned: the budget is also a deadline (beyond the fewest rounds)
    fewest = 1 if deadline is not None else MIN_ROUNDS
    if deadline is None and budget_s is not None:
        deadline = time.perf_counter() + budget_s
    # its time share: the budget, and at least the fewest rounds a verdict rests on at the planned cost of a round
    share_s = max(latency.seconds * len(models), budget_s or 0.0, MIN_ROUNDS * round_s)
    spec = replace(latency, warmup=warmup, repeats=repeats, seconds=share_s / len(models))
    feed, runner = evaluator.latency_feed, evaluator.spec.runner
    request = TimingRequest(
        tuple(models), feed, spec, runner, deadline=deadline, min_rounds=fewest, settled=verdict_settled
    )
    try:
        with progress.stage("confirmation"):
            timings = evaluator.backend.time(request)
    except Exception as exc:  # onnxruntime refused a model it ran before: keep the search's figures
        log.warning("latency re-timing skipped: %s: %s", type(exc).__name__, exc)
        return None
    baseline_search_ms = baseline.get("latency_search_ms", baseline["latency_ms"])  # kept by a first try
    _replace(baseline, latency_figures(timings[0]))
    by_model = dict(zip(chosen, timings[1:], strict=True))
    confirmed = [r for r in feasible if r.model_path in by_model]
    ratios: dict[int, RatioInterval] = {}
    itself = _timed_as(original)
    for record in confirmed:
        rounds = by_model[str(record.model_path)]
        _replace(record.metrics, latency_figures(rounds))
        record.objective = record.metrics["latency_ms"]
        same = _timed_as(str(record.model_path)) == itself  # the original itself is not faster than it: ratio 1
        ratios[record.number] = RatioInterval(1.0, 1.0, 1.0, len(rounds)) if same else paired_ratio(rounds, timings[0])
    ties = _ties(confirmed, by_model)
    preferred = stable if prefer is not None and stable is not None else None
    return Confirmation(
        confirmed, baseline_search_ms, rounds=int(timings.shape[1]), ratios=ratios, ties=ties, preferred=preferred
    )


def verdict_settled(timings: np.ndarray) -> bool:
    """Whether more rounds would not change the decision, at ``SETTLED_CONFIDENCE`` (asked every few rounds)."""
    if not all(decided(timings, 1.0 - MIN_GAIN, confidence=SETTLED_CONFIDENCE)):
        return False
    if len(timings) < 3:
        return True
    fastest = 1 + int(np.argmin([np.median(row) for row in timings[1:]]))
    candidates = np.delete(timings, 0, axis=0)  # the fastest compared with the others, round by round
    return all(decided(candidates, 1.0 / (1.0 - MIN_GAIN), reference=fastest - 1, confidence=SETTLED_CONFIDENCE))


def _ties(confirmed: list[TrialRecord], by_model: dict[str, Any]) -> list[int]:
    """The trials the fastest re-timed model does not beat beyond the noise (the latency stage's rule)."""
    if not confirmed:
        return []
    fastest = min(confirmed, key=lambda r: (r.metrics["latency_ms"], r.number))
    reference = by_model[str(fastest.model_path)]
    tied = []
    for record in confirmed:
        ratio = paired_ratio(by_model[str(record.model_path)], reference)
        if record.model_path == fastest.model_path or ratio.low <= 1.0 / (1.0 - MIN_GAIN):
            tied.append(record.number)
    return tied


def _choose(
    records: list[TrialRecord], top: int, prefer: int | None = None
) -> tuple[list[TrialRecord], list[str], int | None]:
    """The re-timable candidates fastest first, the ``top`` distinct models to re-time, and the stable contender (or
    None): one per :func:`speed_class`, the earliest within ``SEARCH_NOISE`` and ``prefer``'s re-timed too."""
    feasible = sorted(
        # a resumed run's models may be gone from a cleared cache: those cannot be re-timed
        (r for r in records if is_candidate(r) and r.model_path and Path(r.model_path).is_file()),
        key=lambda r: (r.metrics["latency_ms"], r.number),
    )
    classes: dict[tuple, list[TrialRecord]] = {}
    for record in feasible:
        classes.setdefault(speed_class(record), []).append(record)
    contenders = sorted(
        (
            (
                float(statistics.median(r.metrics["latency_ms"] for r in members)),
                min(
                    members, key=lambda r: (r.accuracy_loss if r.accuracy_loss is not None else float("inf"), r.number)
                ),
            )
            for members in classes.values()
        ),
        key=lambda contender: (contender[0], contender[1].number),  # equal medians: the earlier trial
    )
    order = [record for _, record in contenders]
    stable: TrialRecord | None = None
    places = top
    if len(contenders) > 1 and top > 1:
        stable = earliest_as_fast(contenders)
        order = [order[0], stable, *order[1:]]
        preferred = next((r for r in feasible if r.number == prefer), None) if prefer is not None else None
        if preferred is not None:  # the strategy's answer: re-timed too, one more place when it needs one
            key = speed_class(preferred)
            stable = next(r for _, r in contenders if speed_class(r) == key)
            if stable not in order[:top]:
                order.insert(top, stable)
                places = top + 1
    chosen: list[str] = []
    for record in order:
        if str(record.model_path) not in chosen and len(chosen) < places:
            chosen.append(str(record.model_path))
    return feasible, chosen, None if stable is None else stable.number


def speed_class(record: TrialRecord) -> tuple[Any, ...]:
    """What decides a trial's executed graph: its flow, session settings and its pass's ``graph_params``."""
    from quantune.passes import get_pass

    kept = []
    for key, value in sorted(record.params.items()):
        name, _, short = key.partition(".")
        try:
            declared = get_pass(name).graph_params
        except Exception:  # not a registered pass name: keep the parameter (conservative)
            declared = None
        if declared is None or short in declared:
            kept.append((key, repr(value)))
    settings = sorted((record.session_settings or {}).items())
    return (tuple(record.flow), tuple(kept), repr(settings))


def _round_s(baseline: dict[str, float], feasible: list[TrialRecord], chosen: list[str]) -> float:
    return (baseline["latency_ms"] + sum(_latency_of(feasible, path) for path in chosen)) / 1000.0


def retiming_plan(
    evaluator: Evaluator, baseline: dict[str, float], records: list[TrialRecord], top: int, prefer: int | None = None
) -> tuple[int, float]:
    """(models the re-timing would load, 0 when there is no candidate; seconds its fewest rounds take)."""
    feasible, chosen, _ = _choose(records, top, prefer)
    if not chosen:
        return 0, 0.0
    latency, models, round_s = evaluator.spec.latency, 1 + len(chosen), _round_s(baseline, feasible, chosen)
    return models, (retiming_warmup(latency.warmup, latency.seconds, models, round_s) + MIN_ROUNDS) * round_s


def retiming_warmup(warmup: int, seconds: float, models: int, round_s: float) -> int:
    """The warm-up passes of a re-timing at ``round_s`` a round: at most two, cut by the config's share."""
    return warmup_passes(min(warmup, 2), seconds * models, round_s)


def _timed_as(model: str | Path) -> tuple[str, dict[str, Any] | None]:
    """What timing ``model`` runs: its bytes and the session settings beside it; two models alike in both are one model."""
    return files_sha256(model, external_data_files(model)), read_session_settings(model)


def _replace(metrics: dict[str, float], fresh: dict[str, float]) -> None:
    metrics.setdefault("latency_search_ms", metrics["latency_ms"])  # a second re-timing keeps the search's
    for name in _FIGURES:
        metrics[name] = fresh[name]


def timing_rounds(warmup: int, repeats: int, round_s: float, budget_s: float | None) -> tuple[int, int]:
    """(warm-up, timed) rounds at ``round_s`` a round: ``repeats`` (at least ``VERDICT_ROUNDS``) as fit, at least 5."""
    warmup = min(warmup, 2)  # each session is warmed before the first round; more adds nothing
    if budget_s is None:
        return warmup, repeats
    fitting = int(budget_s / max(round_s, 1e-9)) - warmup
    return warmup, max(MIN_ROUNDS, min(max(repeats, VERDICT_ROUNDS), fitting))


def _latency_of(records: list[TrialRecord], model_path: str) -> float:
    return next(r.metrics["latency_ms"] for r in records if r.model_path == model_path)
