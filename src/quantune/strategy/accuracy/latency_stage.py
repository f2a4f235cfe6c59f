"""The quantune strategy's end: stop at the speed ceiling, or a latency stage that changes the quant pass's
``graph_params`` one at a time, each candidate timed against the incumbent side by side and evaluated only when faster.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from quantune.evaluate.paired import MIN_GAIN
from quantune.graph.capability import Group, Precision
from quantune.space import Point, point_key
from quantune.strategy.accuracy.ceiling_rules import clearly_faster, not_surely_slower
from quantune.strategy.accuracy.common import Step
from quantune.strategy.accuracy.context import AccuracyContext
from quantune.strategy.accuracy.shared import Shared
from quantune.strategy.accuracy.speed import (
    COMPUTE_TYPES,
    SAFE_TYPES,
    Variant,
    fill_conditionals,
    preferred_values,
    speed_params,
)
from quantune.strategy.base import Outcome

log = logging.getLogger("quantune.strategy")
# The least gain that counts as faster when no paired timing decides: the confirmation's MIN_GAIN.
LEAST_GAIN = MIN_GAIN


def graph_params(ctx: AccuracyContext) -> list[str]:
    """The quant step's searched ``graph_params``, less the variant's speed class and the fallback."""
    from quantune.passes import get_pass

    declared = get_pass(ctx.quant_pass).graph_params
    held = set(ctx.fallback_keys)
    names = []
    for name in ctx.quant_params():
        short = name.split(".", 1)[1]
        if name in held or (declared is not None and short not in declared):
            continue
        names.append(name)
    return names


def surely_slower(result: Mapping[str, Any]) -> bool:
    """Whether the ratio's interval lies wholly above ``1 / (1 - LEAST_GAIN)``."""
    low = result.get("ratio_ci_low")
    return low is not None and float(low) > 1.0 / (1.0 - LEAST_GAIN)


def within_noise(result: Mapping[str, Any]) -> bool:
    """Whether neither model is faster beyond the noise, nor the first clearly by its median (``LEAST_GAIN``)."""
    if result.get("same_model"):
        return True
    if result.get("faster") or surely_slower(result):
        return False
    return float(result.get("ratio_median", 1.0)) >= 1.0 - LEAST_GAIN


class LatencyStage:
    """The ceiling stop and the latency stage (the ``settled`` model: the strategy's answer)."""

    def __init__(self, shared: Shared) -> None:
        self.shared, self.run = shared, shared.run

    def faster(self, candidate: Point, reference: Point) -> bool:
        """Whether ``candidate`` is faster beyond the noise: by paired timing, else by ``LEAST_GAIN``."""
        result = self.paired(candidate, reference)
        if result is not None:
            return bool(result.get("faster"))
        mine, theirs = self.run.known(candidate), self.run.known(reference)
        if mine is None or theirs is None or mine.objective is None or theirs.objective is None:
            return False
        return mine.objective < theirs.objective * (1.0 - LEAST_GAIN)

    def keeps_requantized(self, outcome: Outcome, candidate: Point, reference: Point, step: str) -> bool:
        """Whether a group put back in int8 is kept: it meets and, in a latency run, is not slower beyond the noise."""
        if not outcome.meets:
            return False
        result = self.paired(self.run.complete(dict(candidate)), self.run.complete(dict(reference)))
        if result is None or not surely_slower(result):
            return True
        ratio = float(result.get("ratio_median", 1.0))
        self.shared.decisions.append(f"{step}: in budget, but {ratio:.2f}x the model before side by side: not kept")
        log.info("quantune strategy: %s", self.shared.decisions[-1])
        return False

    def paired(self, candidate: Point, reference: Point) -> Mapping[str, Any] | None:
        probe = self.run.problem.paired_latency
        if probe is None or self.run.problem.objective != "latency":
            return None
        return probe(dict(candidate), self.run.flow_of(candidate), dict(reference), self.run.flow_of(reference))

    def at_ceiling(self, variant: Variant | None, point: Point) -> bool:
        """Whether ``point`` is as fast as ``variant``'s ceiling within the noise, so the search ends
        (``stop_at_ceiling``)."""
        if variant is None or not self.shared.options.stop_at_ceiling or self.run.problem.objective != "latency":
            return False
        point, ceiling = self.run.complete(dict(point)), self.run.complete(dict(variant.point))
        outcome = self.run.known(point)
        if outcome is None or not outcome.meets or outcome.failed:
            return False
        ratio = variant.ratio(self.run.baseline.get("latency_ms"))
        margin = self.shared.options.speed_margin
        if ratio is not None and ratio >= 1.0 - margin:  # kept by drop_slow: false, no speed-up to bound
            return False
        how = ""
        if point_key(point) != point_key(ceiling):
            # the ceiling over this model, side by side (on its stand-in when it was timed on one)
            result = self.paired(self.run.complete(dict(variant.timing_point)), point)
            if result is None or not within_noise(result):
                return False
            how = (
                " (the same model)"
                if result.get("same_model")
                else f" (the ceiling is {float(result.get('ratio_median', 1.0)):.2f}x its latency side by side, "
                "within the noise)"
            )
        speed = "" if ratio is None else f", {ratio:.2f}x fp32 latency"
        self.shared.settled = point  # the search's answer (answer()): the confirmation's stable contender
        stage, trial = self.trial_of(point)
        self.run.finished_reason = (
            f"the {stage} stage: {trial} is in budget at the speed ceiling of the "
            f"fastest variant still in play ({variant.label}{speed}){how}: nothing faster is possible"
        )
        log.info("quantune strategy: %s", self.run.finished_reason)
        return True

    def stage_lighter(self, base: Point) -> Step:
        """Stage: lighter models timed against ``base``; the fastest clear one evaluated. Its fallback if it meets."""
        if not self.shared.options.stop_at_ceiling or self.run.problem.objective != "latency":
            return None
        sets = self.lighter_sets()
        compute = sorted({g.op_type for g in self.run.ctx.candidates if g.op_type in COMPUTE_TYPES})
        faster: list[tuple[float, list, str]] = []
        for fallen, words in sets:
            result = self.paired(
                self.run.complete(dict(self.run.fallback(base, fallen))), self.run.complete(dict(base))
            )
            if result is not None and result.get("faster"):
                faster.append((float(result.get("ratio_median", 1.0)), fallen, words))
        for ratio, fallen, words in self._lighter_first(base, faster):
            stage = f"lighter: int8 {compute} ({words}), {ratio:.2f}x the full model side by side"
            outcome = yield from self.run.try_point(self.run.fallback(base, fallen), stage)
            if outcome.meets:
                self.shared.decisions.append(f"{stage}: in budget, the search goes on from it")
                return self.run.assign(fallen)
        return None

    def _lighter_first(self, base: Point, faster: list[tuple[float, list, str]]) -> list[tuple[float, list, str]]:
        """Lighter models faster than the full one, compute-only first unless the other is :func:`clearly_faster`."""
        if len(faster) < 2:
            return faster
        *others, last = faster
        compute_only = self.run.complete(dict(self.run.fallback(base, last[1])))
        ahead = []
        for item in others:  # ahead only by a clear gain: the compute-only one is evaluated ahead already
            result = self.paired(self.run.complete(dict(self.run.fallback(base, item[1]))), compute_only)
            if result is not None and clearly_faster(result):
                ahead.append(item)
        return [*ahead, last, *(item for item in others if item not in ahead)]

    def lighter_sets(self) -> list[tuple[list[Group], str]]:
        """The groups the lighter models keep in float, with their words; none without both kinds of op types."""
        groups = list(self.run.ctx.candidates)
        compute = [g for g in groups if g.op_type in COMPUTE_TYPES]
        others = [g for g in groups if g.op_type not in COMPUTE_TYPES]
        if not compute or not others:
            return []
        risky = [g for g in others if g.op_type not in SAFE_TYPES]
        return ([(risky, "compute and Add/Mul")] if risky and len(risky) < len(others) else []) + [
            (others, "compute only")
        ]

    def lighter_items(self, variant: Variant | None) -> list[tuple[Point, tuple[str, ...]]]:
        """``variant``'s lighter models as (point, flow), the compute-only one last, for the engine to build ahead."""
        if variant is None or not self.shared.options.stop_at_ceiling or self.run.problem.objective != "latency":
            return []
        ctx, self.run.ctx = self.run.ctx, variant.ctx
        try:
            points = [self.run.complete(self.run.fallback(variant.point, groups)) for groups, _ in self.lighter_sets()]
            return [(point, self.run.flow_of(point)) for point in points]
        finally:
            self.run.ctx = ctx

    def trial_of(self, point: Point) -> tuple[str, str]:
        """(the stage that evaluated ``point``, "trial N (what it tried)") for a stop reason a person reads."""
        key = point_key(point)
        tried = next((t for t in self.run.history if point_key(t.point) == key), None)
        if tried is None:
            return "search", "its model"
        stage, _, detail = tried.stage.partition(":")
        stage = stage.split(" (")[0].strip() or "search"
        number = "a trial" if tried.outcome.number is None else f"trial {tried.outcome.number}"
        return stage, f"{number} ({detail.strip()})" if detail.strip() else number

    def stage_tied(
        self, variant: Variant, base: Point, fallback: Mapping[str, Precision], kept: Sequence[Variant]
    ) -> Step:
        """Stage: ``variant``'s fallback in later kept variants not surely slower; a faster one in budget wins."""
        fallen = sum(1 for p in fallback.values() if p == "fp32")
        if not fallback or self.run.problem.objective != "latency" or self.run.problem.paired_latency is None:
            return variant, base
        rest = [v for v in kept[kept.index(variant) + 1 :] if v.ctx is self.run.ctx]
        model = self.run.complete(self.run.ctx.with_fallback(base, fallback))
        for other in not_surely_slower(variant, rest, self.run.baseline.get("latency_ms")):
            if self.run.remaining() <= 0:
                break
            held = speed_params(self.run.ctx, base)
            moved = {k: v for k, v in base.items() if k not in held} | speed_params(self.run.ctx, other.point)
            moved = self.run.complete(fill_conditionals(self.run.ctx, moved))
            point = self.run.complete(self.run.ctx.with_fallback(moved, fallback))
            if not self.run.ctx.valid(point):
                continue
            stage = f"latency ({fallen} groups in fp32): the same fallback in {other.label}"
            outcome = yield from self.run.try_point(point, stage)
            if not outcome.meets or outcome.failed:
                continue
            if not self.faster(point, model):
                self.shared.decisions.append(f"{stage}: in budget, not faster side by side: {variant.label} stays")
                continue
            self.shared.decisions.append(f"{stage}: in budget and faster side by side: the search goes on from it")
            log.info("quantune strategy: %s", self.shared.decisions[-1])
            variant, base, model = other, moved, point
            self.shared.in_play, self.shared.settled = other, None  # its own ceiling bounds it now
            self.run.finished_reason = ""
        return variant, base

    def stage_latency(self, base: Point, fallback: dict[str, Precision], variant: Variant | None = None) -> Step:
        """Stage: from the model in budget, one graph-changing parameter at a time; returns the incumbent's point."""
        incumbent = self.run.complete(self.run.ctx.with_fallback(base, fallback))
        outcome = self.run.known(incumbent)
        if outcome is None or not outcome.meets:
            best = self.run.best_meeting()
            if best is None or self.run.flow_of(best.point) != self.run.ctx.flow:
                return None
            incumbent = best.point
        budget = self.shared.options.latency_trials
        trials = self.run.remaining() if budget is None else int(budget)
        patience = self.shared.options.latency_patience
        label = f"latency ({sum(1 for p in fallback.values() if p == 'fp32')} groups in fp32)"
        held = set(speed_params(self.run.ctx, incumbent))
        names = [name for name in graph_params(self.run.ctx) if name not in held]
        params = self.run.ctx.quant_params()
        spent = misses = timed_out = 0
        improved = True
        while improved:  # a new incumbent: its own neighbours, in the same order
            improved = False
            for point, change in self._neighbours(incumbent, names, params):
                if misses >= patience:
                    self.run.finished_reason = (
                        f"the latency stage: {misses} candidates in a row were not faster than "
                        f"{self.trial_of(incumbent)[1]} beyond the noise, side by side"
                    )
                    return incumbent
                if spent >= trials or self.run.remaining() <= 0:
                    return incumbent
                # speed first: a candidate not faster side by side costs a timing, not an accuracy evaluation
                paired = self.paired(point, incumbent)
                if paired is not None and not paired.get("faster"):
                    timed_out += 1
                    misses += 1
                    continue
                tried = yield from self.run.try_point(point, f"{label}: {change}")
                if tried.duplicate_of is not None:  # an earlier trial's model: its timing stands
                    continue
                spent += 1
                faster = bool(paired.get("faster")) if paired is not None else self.faster(point, incumbent)
                if tried.meets and not tried.failed and faster:
                    incumbent, misses, improved = point, 0, True
                    if self.at_ceiling(variant, incumbent):
                        return incumbent
                    break
                misses += 1
        trial = self.trial_of(incumbent)[1]
        timed = f"; {timed_out} more not faster side by side, never evaluated" if timed_out else ""
        self.run.finished_reason = (
            f"the latency stage: every setting that changes the executed graph was tried from {trial} "
            f"({spent} latency trials{timed}): none is faster beyond the noise"
            if spent or timed_out
            else f"the latency stage: no searched parameter changes the executed graph of {trial}: "
            "no latency trial could be faster"
        )
        return incumbent

    def _neighbours(self, incumbent: Point, names: list[str], params: Mapping[str, Any]) -> list[tuple[Point, str]]:
        """``incumbent`` with one of ``names`` changed; only valid points not yet evaluated."""
        out = []
        for name in names:
            for value in preferred_values(params[name], incumbent):
                if value is None or incumbent.get(name) == value:
                    continue
                point = self.run.complete(fill_conditionals(self.run.ctx, {**incumbent, name: value}))
                if self.run.ctx.valid(point) and self.run.known(point) is None:
                    out.append((point, f"{name.split('.', 1)[1]}={value}"))
        return out
