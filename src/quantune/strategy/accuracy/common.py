"""Stages shared by the accuracy-driven strategies: generators used with ``yield from`` inside a strategy's ``stages``,
each returning what it learned."""

from __future__ import annotations

import logging
import math
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from quantune.graph.capability import Group, Precision
from quantune.space import Conditional, Point
from quantune.strategy.accuracy.context import FLOW_KEY, AccuracyContext, describe
from quantune.strategy.accuracy.staged import StagedStrategy
from quantune.strategy.base import Outcome, Proposal

log = logging.getLogger("quantune.strategy")

Step = Generator[list[Proposal], list[Outcome], Any]


class AccuracyStrategy(StagedStrategy):
    """Base of the fallback strategies: the context, and stages they share."""

    def setup(self) -> None:
        self.ctx = AccuracyContext.from_problem(self.problem, self.name)
        self.smallest_meeting_fallback: int | None = None  # groups kept in high precision
        self.where = ""  # said before every stage while a stage works on one provider ("on OpenVINO, ...: ")

    # -- evaluation -----------------------------------------------------------------------------
    def try_points(self, items: Sequence[tuple[Point, str]], speed_if_missed: bool = True) -> Step:
        """Evaluates ``(point, stage)`` pairs as one batch (``speed_if_missed=False``: a miss is left untimed)."""
        items = [(self.complete(point), stage) for point, stage in items]
        valid = [(i, point, stage) for i, (point, stage) in enumerate(items) if self.ctx.valid(point)]
        outcomes: list[Outcome] = [Outcome(None)] * len(items)
        if valid:
            told = yield [
                Proposal(point, flow=self.flow_of(point), stage=self.where + stage, speed_if_missed=speed_if_missed)
                for _, point, stage in valid
            ]
            for (index, _, _), outcome in zip(valid, told, strict=True):
                outcomes[index] = outcome
        return outcomes

    def complete(self, point: Point, ctx: AccuracyContext | None = None) -> Point:
        """``point`` with unset searched parameters at their defaults, so one model has one point and one evaluation."""
        ctx = ctx or self.ctx
        if self.flow_of(point) != ctx.flow:
            return point
        filled = dict(point)
        for name, param in ctx.quant_params().items():
            if name in filled or isinstance(param, Conditional):
                continue
            default = ctx.value(filled, name.split(".", 1)[1])
            if default is not None and default in _choices(param, filled):
                filled[name] = default
        return filled if filled != point and ctx.valid(filled) else point

    def known(self, point: Mapping[str, Any]) -> Outcome | None:
        return super().known(self.complete(dict(point)))

    def flow_of(self, point: Point) -> tuple[str, ...]:
        """The point's flow (its ``flow`` key names one), else the tuned flow."""
        name = point.get(FLOW_KEY)
        return tuple(self.problem.flows[name]) if name in self.problem.flows else self.ctx.flow

    def try_point(self, point: Point, stage: str, speed_if_missed: bool = True) -> Step:
        outcomes = yield from self.try_points([(point, stage)], speed_if_missed)
        return outcomes[0]

    def pick(self, tried: Sequence[tuple[Point, Outcome]]) -> tuple[Point, Outcome] | None:
        """Meeting points by lowest objective, else the smallest violation."""
        ok = [(p, o) for p, o in tried if not o.failed]
        if not ok:
            return None
        return min(ok, key=lambda po: (not po[1].meets, po[1].violation, po[1].objective or 0.0))

    def fallback(self, base: Point, groups: Sequence[Group], precision: Precision = "fp32") -> Point:
        return self.ctx.with_fallback(base, self.ctx.fallback_of((g.name for g in groups), precision))

    def assign(self, groups: Sequence[Group]) -> dict[str, Precision]:
        return {g.name: "fp32" for g in groups}

    def note_meeting(self, size: int) -> None:
        if self.smallest_meeting_fallback is None or size < self.smallest_meeting_fallback:
            self.smallest_meeting_fallback = size

    # -- shared stages --------------------------------------------------------------------------
    def stage_default(self) -> Step:
        """Stage: the pass defaults (plus the user's fixed values and constraints)."""
        base = self.ctx.base_point()
        outcome = yield from self.try_point(base, "default")
        return base, outcome

    def stage_recipes(self, base: Point) -> Step:
        """Stage: each value of the recipe passes' (cle, smooth_quant) searched parameters."""
        items = []
        for name, choices in self.ctx.recipe_params().items():
            for value in choices:
                if base.get(name) != value:
                    items.append(({**base, name: value}, f"recipes: {name.split('.', 1)[1]}={value}"))
        if not items:
            return base, self.known(base)
        outcomes = yield from self.try_points(items)
        tried = [(p, o) for (p, _), o in zip(items, outcomes, strict=True)]
        known = self.known(base)
        if known is not None:
            tried.append((base, known))
        best = self.pick(tried)
        return best if best is not None else (base, known)

    def stage_screen(self, base: Point, limit: int) -> Step:
        """Stage: one-at-a-time changes of the quant parameters that move accuracy most."""
        params = self.ctx.quant_params()
        items: list[tuple[Point, str]] = []
        for short in self.ctx.knobs.screen:
            name = self.ctx.key(short)
            param = params.get(name)
            if param is None:
                continue
            for value in _choices(param, base):
                if self.ctx.value(base, short) != value:
                    items.append(({**base, name: value}, f"screen: {short}={value}"))
        items = [(p, s) for p, s in items if self.ctx.valid(p)][:limit]
        if not items:
            return base, self.known(base)
        tried = []
        for point, stage in items:  # one at a time: the first change that meets ends the stage
            outcome = yield from self.try_point(point, stage)
            tried.append((point, outcome))
            if outcome.meets:
                break
        known = self.known(base)
        if known is not None:
            tried.append((base, known))
        best = self.pick(tried)
        return best if best is not None else (base, known)

    def stage_sampler(self, fixed: Point, trials: int, stage: str, names: Sequence[str] | None = None) -> Step:
        """Stage: a sampler over the flow's searched parameters (``names`` only), ``fixed`` held."""
        space = self.ctx.flow_space(fixed, names)
        tried: list[tuple[Point, Outcome]] = []
        if not space.params or trials <= 0:
            return tried
        sampler = self.problem.make_sampler()
        sampler.bind(space)
        for _ in range(trials):
            local = sampler.ask()
            if local is None:
                break
            point = {**fixed, **local}
            outcome = yield from self.try_point(point, stage)
            sampler.tell(local, outcome.feedback())
            tried.append((point, outcome))
        return tried

    def stage_accumulate(self, base: Point, ordered: Sequence[Group], stage: str) -> Step:
        """Stage: fall back the first 1, 2, ... groups of ``ordered`` until the criterion holds."""
        for count in range(1, len(ordered) + 1):
            groups = ordered[:count]
            point = self.fallback(base, groups)
            outcome = yield from self.try_point(point, f"{stage}: {count} in fp32 {describe([g.name for g in groups])}")
            if outcome.meets:
                self.note_meeting(count)
                return point, outcome, count
        return None

    def learned(self) -> dict[str, Any]:
        """Each tuned flow's sensitivity scores per group and the strategy's decisions on flows, for the report."""
        sensitivity: dict[str, dict[str, Any]] = {}
        for ctx in self.contexts():
            if ctx.scores:
                sensitivity.setdefault(ctx.flow_name, {}).update(
                    {name: {**entry, "score": _json_score(entry["score"])} for name, entry in ctx.scores.items()}
                )
        return {
            "strategy": self.name,
            "quant_step": self.ctx.quant_step,
            "sensitivity": sensitivity,
            "decisions": [],
        }

    def contexts(self) -> list[AccuracyContext]:
        """The flows' contexts whose sensitivity the report shows."""
        return [self.ctx]

    def remaining(self) -> int:
        """Trials left under ``stop.max_trials`` (a large number when unbounded)."""
        if self.problem.max_trials is None:
            return 1_000_000
        return max(0, self.problem.max_trials - self.evaluations())


def _choices(param: Any, point: Mapping[str, Any]) -> tuple[Any, ...]:
    try:
        return tuple(param.choices_given(point))
    except (KeyError, AttributeError, TypeError):
        return ()


def _json_score(score: float) -> float | None:
    """A score as JSON can hold it: a broken (NaN, ranked first as inf) measurement is null."""
    return score if math.isfinite(score) else None
