"""Targeted recovery: the worst units get a cheap fix in int8 (per-channel weights, or a fast fine-tune of just those
layers) before any of them goes to fp32. No 16-bit rung: the CPU provider has no 16-bit Conv/MatMul kernels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quantune.graph.capability import Group, Precision
from quantune.passes.registry import find_pass
from quantune.space import Point
from quantune.strategy.accuracy.ceilings import CeilingStage
from quantune.strategy.accuracy.common import Step
from quantune.strategy.accuracy.context import AccuracyContext, describe
from quantune.strategy.accuracy.latency_stage import LatencyStage
from quantune.strategy.accuracy.shared import Shared
from quantune.strategy.accuracy.speed import Variant

TARGETED = "recover targeted"
WEIGHTED = frozenset({"Conv", "Gemm", "MatMul"})


def weighted_nodes(ctx: AccuracyContext, groups: Sequence[Group]) -> list[str]:
    """The Conv/Gemm/MatMul nodes of ``groups`` (the layers a weight fix can reach)."""
    by_name = ctx.capability.by_name
    return [n for g in groups for n in g.nodes if n in by_name and by_name[n].op_type in WEIGHTED]


def per_channel_fixable(ctx: AccuracyContext, point: Mapping[str, Any]) -> bool:
    """A static per-tensor QDQ quant step whose pass takes per-channel weights on named nodes."""
    knobs = ctx.knobs
    if ctx.dynamic or knobs.channel_nodes is None:
        return False
    per_channel = knobs.per_channel is not None and ctx.value(point, knobs.per_channel)
    return not per_channel and (knobs.layout is None or ctx.value(point, knobs.layout) == knobs.qdq)


def _refining(name: object) -> int | None:
    """A refining pass's cost rank (its ``recover_cost`` trait), or None for any other pass."""
    cls = find_pass(str(name))
    return cls.recover_cost if cls is not None and cls.role == "recover" else None


class TargetedStage:
    """Per-channel / fine-tuned worst units before fp32; the refined flows a variant may recover in."""

    def __init__(self, shared: Shared, latency: LatencyStage, ceilings: CeilingStage) -> None:
        self.shared, self.run, self.latency, self.ceilings = shared, shared.run, latency, ceilings
        self.fitted: set[str] = set()  # variants whose worst layers were fine-tuned alone (recover.py reads it)

    def refined_variants(self, variant: Variant) -> list[Variant]:
        """Kept refined variants of ``variant``: its speed class first, then the fastest, cheapest refinement first."""
        ctx = variant.ctx
        steps = ctx.flow[: ctx.flow.index(ctx.quant_step) + 1]
        suffix = variant.label.split(": ", 1)[-1]
        baseline = self.run.baseline.get("latency_ms")
        found = []
        for other in [*self.shared.variants, *self.shared.refined]:
            flow = other.ctx.flow
            extra = flow[len(steps) :]
            if other is variant or flow[: len(steps)] != steps or not extra or not self.ceilings.keeps(other):
                continue
            passes = [self.run.problem.step_passes.get(step) for step in extra]
            costs = [_refining(name) for name in passes]
            if not costs or any(c is None for c in costs):
                continue
            ratio = other.ratio(baseline)
            cost = max(c for c in costs if c is not None)
            key = (other.label.split(": ", 1)[-1] != suffix, float("inf") if ratio is None else ratio, cost, len(extra))
            found.append((key, other))
        return [other for _, other in sorted(found, key=lambda item: item[0])]

    def recoverable(self, variant: Variant) -> bool:
        """Whether ``variant`` misses by at most ``recover_within`` budgets: refining mends rounding."""
        within = self.shared.options.recover_within
        tolerable = self.run.problem.tolerable_loss
        if within is None or tolerable is None or tolerable <= 0:
            return True
        return variant.violation <= within * tolerable

    def refining_passes(self, variant: Variant) -> list[str]:
        """The pass names of ``variant``'s steps after its quant step (its refining steps)."""
        ctx = variant.ctx
        return [str(self.run.problem.step_passes.get(step)) for step in ctx.flow[ctx.flow.index(ctx.quant_step) + 1 :]]

    def layer_fit(self, refined: Variant) -> tuple[str, str] | None:
        """(step, pass name) when ``refined``'s only refining step fits named layers (a ``nodes`` field), else None."""
        names = self.refining_passes(refined)
        cls = find_pass(names[0]) if len(names) == 1 else None
        ctx = refined.ctx
        return (
            (ctx.flow[ctx.flow.index(ctx.quant_step) + 1], names[0])
            if cls is not None and "nodes" in cls.Config.model_fields
            else None
        )

    def _layer_refined(self, variant: Variant) -> tuple[Variant, str, str] | None:
        """A kept refined variant whose only refining step fits named layers, with that step and its pass's name."""
        for refined in self.refined_variants(variant):
            if (fit := self.layer_fit(refined)) is not None:
                return refined, *fit
        return None

    def stage_targeted(self, variant: Variant) -> Step:
        """Stage: the worst units per channel, then fine-tuned alone (when a flow can); the point when one meets."""
        ctx, base = variant.ctx, variant.point
        channel = per_channel_fixable(ctx, base)
        found = self._layer_refined(variant) if self.recoverable(variant) else None
        if not (channel or found) or self.run.remaining() <= 1:
            return None  # no fix applies: no sensitivity measured for nothing
        ranked = [g for g, score in ctx.ranked(base) if score > 0 and weighted_nodes(ctx, [g])]
        worst = ranked[: self.shared.options.targeted_units]
        nodes = weighted_nodes(ctx, worst)
        if not nodes:
            return None
        names = [g.name for g in worst]
        if channel:
            point = {**base, ctx.key(str(ctx.knobs.channel_nodes)): sorted(nodes)}
            outcome = yield from self.run.try_point(point, f"{TARGETED}: per-channel weights on {describe(names)}")
            if outcome.meets:
                self._note(ctx, ["per-channel weights"], names)
                return point
        if found is None or self.run.remaining() <= 1:
            return None
        refined, step, fit = found
        self.fitted.add(variant.label)  # the recover stage then fits no whole model of it (recover.py)
        point = {**refined.point, f"{step}.nodes": sorted(nodes)}
        how = [fit]
        if channel and per_channel_fixable(refined.ctx, refined.point):
            point[refined.ctx.key(str(refined.ctx.knobs.channel_nodes))] = sorted(nodes)
            how = ["per-channel weights", fit]
        outcome = yield from self.run.try_point(point, f"{TARGETED}: {' + '.join(how)} on {describe(names)}")
        if outcome.meets:
            self.run.ctx = refined.ctx
            self._note(refined.ctx, how, names)
            return point
        return None

    def stage_targeted_units(
        self, variant: Variant, base: Point, fallback: Mapping[str, Precision], order: list[str]
    ) -> Step:
        """Stage: each fallen unit of ``order`` back to int8 with per-channel weights when the model still meets."""
        ctx = variant.ctx
        if not per_channel_fixable(ctx, base):
            return base, dict(fallback)
        groups = ctx.capability.group_by_name
        current, fixed, kept = dict(fallback), list(base.get(ctx.key(str(ctx.knobs.channel_nodes)), [])), []
        for name in order:
            nodes = weighted_nodes(ctx, [groups[name]])
            if not nodes or self.run.remaining() <= 1:
                continue
            trial = {k: v for k, v in current.items() if k != name}
            point = {**ctx.with_fallback(base, trial), ctx.key(str(ctx.knobs.channel_nodes)): sorted({*fixed, *nodes})}
            before = {**ctx.with_fallback(base, current), ctx.key(str(ctx.knobs.channel_nodes)): fixed}
            stage = f"{TARGETED}: {name} -> int8 (per-channel weights)"
            outcome = yield from self.run.try_point(point, stage, speed_if_missed=False)
            if self.latency.keeps_requantized(outcome, point, before, stage):
                current, fixed, kept = trial, sorted({*fixed, *nodes}), [*kept, name]
        if not kept:
            return base, dict(fallback)
        self._note(ctx, ["per-channel weights"], kept, sorted(n for n, p in current.items() if p == "fp32"))
        return {**base, ctx.key(str(ctx.knobs.channel_nodes)): fixed}, current

    def _note(self, ctx: AccuracyContext, how: list[str], units: list[str], fallen: list[str] | None = None) -> None:
        """``fallen`` None: fixed before any fallback; else after it (what still is in fp32)."""
        self.shared.recovered = {
            "flow": ctx.flow_name,
            "passes": how,
            "units": units,
            "fallen": fallen or [],
            "stage": "targeted",
            "before_fallback": fallen is None,
        }
