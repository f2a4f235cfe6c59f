"""Recover before falling back: bias correction and fast fine-tuning keep the graph and so the speed, where a unit in
fp32 gives it up. So a variant that misses is tried in each refined flow first, and fp32 units go back to int8 there."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from quantune.graph.capability import Precision
from quantune.space import Point
from quantune.strategy.accuracy.common import Step
from quantune.strategy.accuracy.context import FLOW_KEY, AccuracyContext
from quantune.strategy.accuracy.latency_stage import LatencyStage
from quantune.strategy.accuracy.shared import Shared
from quantune.strategy.accuracy.speed import Variant
from quantune.strategy.accuracy.targeted import TargetedStage, weighted_nodes

log = logging.getLogger("quantune.strategy")


RECOVER = "recover"


class RecoverStage:
    """Refined flows tried before and after the fallback."""

    def __init__(self, shared: Shared, latency: LatencyStage, targeted: TargetedStage) -> None:
        self.shared, self.run, self.latency, self.targeted = shared, shared.run, latency, targeted

    def stage_recover(self, variant: Variant) -> Step:
        """Stage: the worst units fixed in int8, then the variant in each refined flow; its point when one meets."""
        targeted = yield from self.targeted.stage_targeted(variant)
        if targeted is not None:
            return targeted
        if not self.targeted.recoverable(variant):
            self._not_recoverable(variant)
            return None
        for refined in self.targeted.refined_variants(variant):
            if self.run.remaining() <= 1:  # leave a trial for the fallback
                return None
            if variant.label in self.targeted.fitted and self.targeted.layer_fit(refined) is not None:
                continue  # its worst layers were fitted alone and missed: a fit of every layer costs
                # minutes on a large model and is unlikely to do better
            passes = self.targeted.refining_passes(refined)
            outcome = yield from self.run.try_point(refined.point, f"{RECOVER}: {refined.label} (+{', '.join(passes)})")
            if outcome.meets:
                self.run.ctx = refined.ctx
                self.shared.recovered = {"flow": refined.ctx.flow_name, "passes": passes, "units": "all", "fallen": []}
                return refined.point
        return None

    def stage_recover_units(
        self, variant: Variant, base: Point, fallback: Mapping[str, Precision], costs: Mapping[str, float]
    ) -> Step:
        """Stage: each fp32 unit back to int8 in a refined flow, costliest first; returns (point, fallback)."""
        fallen = [name for name, precision in fallback.items() if precision == "fp32"]
        if not fallen or self.latency.at_ceiling(variant, variant.ctx.with_fallback(base, fallback)):
            return base, dict(fallback)  # at the ceiling side by side already: no unit back in int8 is faster
        groups = variant.ctx.capability.group_by_name
        order = sorted(fallen, key=lambda name: -sum(costs.get(n, 0.0) for n in groups[name].nodes))
        before = self.shared.recovered
        base, fallback = yield from self.targeted.stage_targeted_units(variant, base, fallback, order)
        after = self.shared.recovered
        targeted = dict(after) if after is not None and after is not before else {}  # units it kept int8
        order = [name for name in order if fallback.get(name) == "fp32"]
        for refined in self.targeted.refined_variants(variant) if self.targeted.recoverable(variant) else []:
            ctx, passes = refined.ctx, self.targeted.refining_passes(refined)
            start = {**refined.point, **_quant_values(base, variant.ctx, ctx.quant_step)}
            current = dict(fallback)
            fit = self.targeted.layer_fit(refined)
            last = variant.ctx.with_fallback(base, current)  # the model before a step (refining keeps the graph)
            if fit is None:  # a whole-model refinement must hold the budget with the fallback first
                point = last = ctx.with_fallback(start, current)
                outcome = yield from self.run.try_point(point, f"{RECOVER}: {refined.label} with the fallback")
                if not outcome.meets:
                    continue
            kept: list[str] = []
            units = self.shared.options.targeted_units
            for name in order[:units] if fit is not None else order:  # a fit per try: the costliest few
                if self.run.remaining() <= 1:
                    break
                trial = {k: v for k, v in current.items() if k != name}
                point = ctx.with_fallback(start, trial)
                if fit is not None:  # fine-tune only the layers back in int8 (seconds, not a fit of every layer)
                    point[f"{fit[0]}.nodes"] = sorted(weighted_nodes(ctx, [groups[n] for n in [*kept, name]]))
                stage = f"{RECOVER}: {name} -> int8 (+{', '.join(passes)})"
                outcome = yield from self.run.try_point(point, stage)
                if self.latency.keeps_requantized(outcome, point, last, stage):
                    current, kept, last = trial, [*kept, name], point
                    if fit is not None:
                        start = {**start, f"{fit[0]}.nodes": point[f"{fit[0]}.nodes"]}
            if not kept:  # the same fallback, refined: no faster, try the next refining flow
                continue
            self.run.ctx = ctx
            how = {name: " + ".join(passes) for name in kept}
            if targeted:  # units kept int8 by per-channel weights first, in the same quant step
                how = {**{name: " + ".join(targeted["passes"]) for name in targeted["units"]}, **how}
                kept = [*targeted["units"], *kept]
            self.shared.recovered = {"flow": ctx.flow_name, "passes": passes, "units": kept, "fallen": sorted(current)}
            if targeted:
                self.shared.recovered["how"] = how
            return ctx.with_fallback(start, current), current
        return base, dict(fallback)

    def _not_recoverable(self, variant: Variant) -> None:
        refined = self.targeted.refined_variants(variant)
        if refined:  # asked once per variant (stage_recover)
            tolerable = self.run.problem.tolerable_loss
            over = variant.violation / tolerable if tolerable else float("inf")
            log.info(
                "quantune strategy: %s misses by %.1f budgets (recover_within: %s): its refined flows (%s) "
                "are not tried, a fallback is",
                variant.label,
                over,
                self.shared.options.recover_within,
                ", ".join(r.ctx.flow_name for r in refined),
            )


def _quant_values(point: Mapping[str, Any], ctx: AccuracyContext, into: str) -> Point:
    """``ctx``'s quant step's values of ``point`` renamed for the step ``into`` (fallback excluded)."""
    out: Point = {}
    for key, value in point.items():
        if key == FLOW_KEY or not key.startswith(f"{ctx.quant_step}.") or key in ctx.fallback_keys:
            continue
        out[f"{into}.{key.split('.', 1)[1]}"] = value
    return out
