"""The verdict: does the run's best candidate beat the original, or should the original stay?

``improved`` needs evidence beyond the noise (a side-by-side timing, an exact size, a loss below
the sampling noise); ``unconfirmed`` is a candidate faster in the search that could not be
confirmed side by side, since search-time figures drift by more than the gains they would crown;
``keep_original`` and ``no_candidate_in_budget`` say why in ``verdict_reason``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quantune.engine.measure.confirm import Confirmation
from quantune.engine.trials.selection import is_candidate, quantizes_nothing, select_best
from quantune.engine.trials.trial import TrialRecord
from quantune.evaluate.paired import MIN_GAIN
from quantune.evaluate.rows import noise_note
from quantune.wording import format_loss, format_ratio

IMPROVED = "improved"
UNCONFIRMED = "unconfirmed"
KEEP_ORIGINAL = "keep_original"
NO_CANDIDATE = "no_candidate_in_budget"
RETIME = (
    "time it again on a quieter machine or with more rounds (evaluation.latency.repeats, stop.timeout_s): "
    "`quantune run` with the same config on the same output re-times it"
)


@dataclass(frozen=True)
class Verdict:
    kind: str
    reason: str
    best: TrialRecord | None  # the best candidate: the result when improved, else for information


def decide(
    records: Sequence[TrialRecord],
    objectives: Sequence[str],
    baseline: dict[str, float],
    confirmation: Confirmation | None = None,
    loss_kind: str | None = None,
    original_wins: str = "",
    unconfirmed: str = "",
) -> Verdict:
    """The verdict on ``records`` (every trial of the run) against the original's ``baseline``.

    ``original_wins``: the strategy's reason when it measured that nothing beats the original.
    ``unconfirmed``: why a latency run has no side-by-side re-timing; a candidate faster by the
    search's figures is then ``unconfirmed``, never ``improved``.
    """
    verdict = _decide(records, objectives, baseline, confirmation, loss_kind, original_wins, unconfirmed)
    note = noise_note(verdict.best.metrics) if verdict.best is not None else ""
    return Verdict(verdict.kind, f"{verdict.reason}; {note}", verdict.best) if note else verdict


def _decide(
    records: Sequence[TrialRecord],
    objectives: Sequence[str],
    baseline: dict[str, float],
    confirmation: Confirmation | None,
    loss_kind: str | None,
    original_wins: str,
    unconfirmed: str,
) -> Verdict:
    if not any(is_candidate(r) for r in records):
        if original_wins:
            return Verdict(KEEP_ORIGINAL, f"keep the original: {original_wins}", None)
        return Verdict(NO_CANDIDATE, _why_none(records), None)
    objective = objectives[0]
    if objective == "latency" and confirmation is not None and confirmation.ratios:
        return _latency_side_by_side(confirmation, objectives)
    best = select_best(records, objectives)
    assert best is not None
    if objective == "latency":
        ratio = format_ratio(best.metrics["latency_ms"], baseline["latency_ms"])
        note = "timed during the search only, not side by side with the original, so not checked against the noise"
        note += f": {unconfirmed}" if unconfirmed else ""
        if best.metrics["latency_ms"] < baseline["latency_ms"]:
            why = unconfirmed or "it was not re-timed side by side with the original"
            return Verdict(
                UNCONFIRMED, f"trial {best.number} was {ratio} than the original during the search, but {why}", best
            )
        return Verdict(
            KEEP_ORIGINAL, f"no candidate was faster (best candidate trial {best.number}: {ratio}; {note})", best
        )
    if objective == "size":
        ratio = format_ratio(best.metrics["size_bytes"], baseline["size_bytes"], less="smaller", more="larger")
        if best.metrics["size_bytes"] < baseline["size_bytes"]:
            return Verdict(IMPROVED, f"trial {best.number} is {ratio} than the original", best)
        return Verdict(KEEP_ORIGINAL, f"no candidate was smaller (best candidate trial {best.number}: {ratio})", best)
    if objective == "memory":
        return _memory_verdict(best, baseline)
    loss = format_loss(best.accuracy_loss, loss_kind)
    if best.accuracy_loss is not None and best.accuracy_loss < 0:
        if not noise_note(best.metrics):  # more accurate beyond the evaluation's sampling noise, where it is known
            return Verdict(IMPROVED, f"trial {best.number} is more accurate than the original (loss {loss})", best)
        return Verdict(
            KEEP_ORIGINAL,
            f"no candidate was more accurate beyond the evaluation's sampling noise (best candidate trial "
            f"{best.number}: loss {loss})",
            best,
        )
    return Verdict(
        KEEP_ORIGINAL, f"no candidate was more accurate (best candidate trial {best.number}: loss {loss})", best
    )


def _latency_side_by_side(confirmation: Confirmation, objectives: Sequence[str]) -> Verdict:
    """``improved`` for a candidate surely faster; ``unconfirmed`` when none is but one measured faster
    and its interval could not decide (an undecided timing is no evidence that nothing is faster);
    else ``keep_original``."""
    rounds = confirmation.rounds
    faster = [r for r in confirmation.records if (ratio := confirmation.ratio_of(r)) is not None and ratio.faster]
    undecided = [r for r in confirmation.records if (ratio := confirmation.ratio_of(r)) is not None and ratio.undecided]
    pool = faster or undecided or confirmation.records
    best = select_best(pool, objectives)
    assert best is not None
    best = _tie_rule(best, pool, confirmation.ties, confirmation.preferred)
    ratio = confirmation.ratio_of(best)
    assert ratio is not None
    interval = (
        f"median paired ratio {ratio.median:.3f}, 90% interval {ratio.low:.3f}-{ratio.high:.3f}"
        if ratio.high != float("inf")
        else f"median paired ratio {ratio.median:.3f}, too few rounds for an interval"
    )
    words = format_ratio(ratio.median, 1.0)
    detail = f"{interval}, {rounds} interleaved rounds"
    if faster:
        return Verdict(IMPROVED, f"trial {best.number} is {words} than the original side by side ({detail})", best)
    if undecided:
        return Verdict(
            UNCONFIRMED,
            f"trial {best.number} measured {words} than the original side by side, but the timing did not decide it "
            f"({detail}: the interval reaches above {1.0 - MIN_GAIN:.2f}, too wide to tell the gain from the noise); "
            f"{RETIME}",
            best,
        )
    return Verdict(
        KEEP_ORIGINAL,
        f"no candidate was faster than the original beyond the timing noise (best candidate trial {best.number}: "
        f"{words}, {detail})",
        best,
    )


def _tie_rule(
    best: TrialRecord, pool: Sequence[TrialRecord], ties: Sequence[int], preferred: int | None = None
) -> TrialRecord:
    """Among the models tied with the fastest side by side, the strategy's own answer when it is one
    of them, else the earliest trial, so the same run twice picks the same model despite noise."""
    tied = [r for r in pool if r.number in ties]
    if best.number not in ties or len(tied) < 2:
        return best
    chosen = next((r for r in tied if r.number == preferred), None)
    return chosen if chosen is not None else min(tied, key=lambda r: r.number)


# Peak memory differs by a few percent between fresh processes: a smaller figure counts beyond that.
MEMORY_NOISE = 0.05


def _memory_verdict(best: TrialRecord, baseline: dict[str, float]) -> Verdict:
    mine, original = best.metrics.get("peak_memory_mb"), baseline.get("peak_memory_mb")
    if mine is None or original is None:
        return Verdict(KEEP_ORIGINAL, f"peak memory not measured (best candidate trial {best.number})", best)
    ratio = format_ratio(mine, original, less="less memory", more="more memory")
    if mine < original * (1 - MEMORY_NOISE):
        return Verdict(IMPROVED, f"trial {best.number} takes {ratio} than the original (peak {mine:.1f} MB)", best)
    return Verdict(
        KEEP_ORIGINAL,
        f"no candidate took less memory beyond the {MEMORY_NOISE:.0%} noise (best candidate trial {best.number}: "
        f"{mine:.1f} MB against {original:.1f} MB)",
        best,
    )


def _why_none(records: Sequence[TrialRecord]) -> str:
    failed = sum(r.status != "ok" for r in records)
    copies = [r.number for r in records if r.status == "ok" and r.meets_criterion and quantizes_nothing(r)]
    if not records:
        return "no trial ran"
    text = f"no trial met the criterion with a quantized model ({len(records)} trials, {failed} failed"
    if copies:
        shown = ", ".join(str(n) for n in copies[:5]) + (", ..." if len(copies) > 5 else "")
        text += f"; trial(s) {shown} met it but quantize no compute op, so they are the original in disguise"
    return text + ")"
