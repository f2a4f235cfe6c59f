"""quantune's accuracy-driven strategy: speed first, then accuracy at the right grain, few evaluations. It drops the
variants whose speed ceiling cannot beat the original and recovers accuracy only inside the fastest."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from quantune.graph.capability import Group, Precision
from quantune.space import Point
from quantune.strategy.accuracy.bisect import Bisection, repeated_blocks
from quantune.strategy.accuracy.ceilings import CEILING, CeilingStage
from quantune.strategy.accuracy.common import AccuracyStrategy, Step
from quantune.strategy.accuracy.context import AccuracyContext, describe
from quantune.strategy.accuracy.first_guess import FirstGuess
from quantune.strategy.accuracy.latency_stage import LatencyStage
from quantune.strategy.accuracy.provider_ceilings import ProviderCeilings
from quantune.strategy.accuracy.recover import RecoverStage
from quantune.strategy.accuracy.shared import FirstRequests, Shared
from quantune.strategy.accuracy.speed import COMPUTE_TYPES, SAFE_TYPES, coarse_costs, priced
from quantune.strategy.accuracy.staged import Stages
from quantune.strategy.accuracy.targeted import TargetedStage
from quantune.strategy.base import Outcome, Proposal
from quantune.strategy.options import QuantuneOptions
from quantune.strategy.registry import register_strategy

log = logging.getLogger("quantune.strategy")


@register_strategy("quantune")
class QuantuneStrategy(AccuracyStrategy):
    """Speed ceilings, then op-type-wise and per-group fallback inside the fastest variant, then latency.

    Stages: ``ceiling`` (each flow's fully quantized variants from Neural Compressor's accuracy defaults; one not faster
    than the original by ``speed_margin`` is dropped unless ``drop_slow: false``; ``flow`` restricts the flows) -> in
    the fastest kept variant that misses: ``recipes`` -> ``screen`` (``screen_trials``) -> ``op types``
    (``op_type_trials``) -> ``bisect`` (``bisect_blocks`` first when the model has repeated blocks) -> ``prune``
    (``prune_trials``, ``precisions``) -> ``latency`` (one graph-changing parameter at a time, timed against the
    incumbent side by side; ``latency_patience``, ``latency_trials``; then the tied variants and other providers). When
    recovery finds nothing in a variant, the next fastest is tried. A model in budget at its variant's speed ceiling
    ends the search (``stop_at_ceiling``)."""

    name = "quantune"
    Options = QuantuneOptions
    options: QuantuneOptions

    def setup(self) -> None:
        super().setup()
        self.ranking: list[Group] = []
        self.screened = False  # the accuracy parameters were screened before the fallback
        self.guessed_elsewhere = False  # the first guess was another variant: one evaluation spent
        self.shared = Shared(self, self.options, self.recover)
        self.latency = LatencyStage(self.shared)
        self.providers = ProviderCeilings(self.shared, self.latency)
        self.ceilings = CeilingStage(self.shared, self.latency, self.providers)
        self.first_guess = FirstGuess(self.shared, self.latency, self.providers, self.ceilings)
        self.targeted = TargetedStage(self.shared, self.latency, self.ceilings)
        self.recovery = RecoverStage(self.shared, self.latency, self.targeted)

    def stages(self) -> Stages:
        guess = yield from self.first_guess.stage()
        kept = yield from self.ceilings.stage_ceiling()
        for variant in kept:
            self.ctx = variant.ctx
            base = variant.point
            self.guessed_elsewhere = guess is not None and guess is not variant
            # the only accuracy evaluation a ceiling gets: the fastest kept variant's, first
            outcome = yield from self.try_point(base, f"{CEILING}: {variant.label}")
            self.ceilings.measure(variant, outcome)
            if variant.failed or not self.ceilings.verdict(variant)[0]:
                continue  # untimed variants are judged by their trial's latency
            self.shared.in_play = variant
            lighter: dict[str, Precision] | None = None
            if variant.meets:
                fallback: dict[str, Precision] | None = {}
                lighter = yield from self.latency.stage_lighter(base)  # fewer Q/DQ pairs, faster side by side?
                if lighter is not None:
                    fallback = lighter
                    variant, base = yield from self.latency.stage_tied(variant, base, fallback, kept)
                elif self.latency.at_ceiling(variant, base):  # the ceiling itself is in budget: nothing faster
                    return
            elif (refined := (yield from self.recovery.stage_recover(variant))) is not None:  # recover.py
                base, fallback = refined, {}
                if self.finished_reason or self.latency.at_ceiling(variant, base):
                    return  # the recovered, fully quantized model is at the ceiling
            else:
                found = yield from self.recover(base, self.known(base))
                if found is None:
                    continue
                base, fallback = yield from self.recovery.stage_recover_units(
                    variant, *found, coarse_costs(self.problem)
                )
                variant, base = yield from self.latency.stage_tied(variant, base, fallback or {}, kept)
                if self.finished_reason or self.latency.at_ceiling(
                    variant, self.ctx.with_fallback(base, fallback or {})
                ):
                    return  # a recovery stage's model is at the ceiling
            if fallback and lighter is None:  # a model in budget: can a calibration choice quantize all?
                full = yield from self.screen_full(variant.point)
                if full is not None:
                    base, fallback = full, {}
                    if self.latency.at_ceiling(variant, base):
                        return
            final = yield from self.providers.everywhere(
                base, fallback or {}, variant
            )  # on each provider, then latency
            if final is not None and self.shared.settled is None:
                self.shared.settled = self.complete(dict(final))
            return

    def answer(self) -> int | None:
        """The trial the search ended on in budget: at the speed ceiling, or the latency stage's incumbent."""
        outcome = self.known(self.shared.settled) if self.shared.settled is not None else None
        return None if outcome is None or not outcome.meets or outcome.failed else outcome.number

    def first_requests(self) -> FirstRequests:
        return self.first_guess.first_requests()

    def observe_opening(self, provider: str, outcome: Outcome, paired_ratio: float | None = None) -> None:
        """Told by ``WithOpenings``: the original on another provider (:mod:`.provider_ceilings`)."""
        self.providers.observe_opening(provider, outcome, paired_ratio)

    def annotate(self, proposal: Proposal, outcome: Outcome) -> str | None:
        return self.ceilings.annotate(proposal, outcome)

    def contexts(self) -> list[AccuracyContext]:
        return [self.ctx, *(v.ctx for v in [*self.shared.variants, *self.shared.refined])]

    def learned(self) -> dict[str, Any]:
        """results.json's ``strategy``, with the originals' ratios and what refining recovered."""
        notes = {**super().learned(), "decisions": list(self.shared.decisions)}
        if ratios := self.providers.original_ratio:
            notes["provider_original_ratios"] = dict(ratios)
        if self.shared.recovered:
            notes["recovered"] = self.shared.recovered
        return notes

    # -- recovery inside one variant --------------------------------------------------------------
    def recover(self, base: Point, outcome: Outcome | None) -> Step:
        """Recipes, op types, bisection, prune: (base point, fallback) or None, few evaluations to a model in budget."""
        if self.ctx.has_recipes():
            base, outcome = yield from self.stage_recipes(base)
            if outcome is not None and outcome.meets:
                return base, {}
        compute = [g for g in self.ctx.candidates if g.op_type in COMPUTE_TYPES]
        others = [g for g in self.ctx.candidates if g.op_type not in COMPUTE_TYPES]
        screen = self._screen_allowance(compute, others)
        if screen > 0:
            self.screened = True
            base, outcome = yield from self.stage_screen(base, screen)
            if outcome is not None and outcome.meets:
                return base, {}
        fallen: list[Group] = []
        if compute and others:
            held = yield from self.stage_op_types(base, compute, others)
            if held is not None:
                return base, self.assign(held)
            fallen = others  # no op-type set holds: bisect the compute groups with the rest in fp32
        pool = compute if fallen else list(self.ctx.candidates)
        found = yield from self.bisect(base, pool, fallen)
        if found is None:
            return None
        if self.latency.at_ceiling(self.shared.in_play, self.fallback(base, [*fallen, *found])):  # no prune can beat it
            return base, self.assign([*fallen, *found])
        assignment = yield from self.prune(base, found, fallen)
        if fallen:  # the op types put in fp32 wholesale: back to int8 those the budget does not need
            inner = {name: p for name, p in assignment.items() if name not in {g.name for g in fallen}}
            still = yield from self.add_back(base, list(fallen), inner)
            assignment = {**inner, **self.assign(still)}
        return base, assignment

    def _screen_allowance(self, compute: Sequence[Group], others: Sequence[Group]) -> int:
        """Screen trials before any fallback within the ``ceil(log2 n) + 3`` bound; at most ``screen_trials``."""
        limit = self.options.screen_trials
        units = len(self.ctx.candidates)
        bound = math.ceil(math.log2(max(units, 2))) + 3
        op_types = 0
        if compute and others:
            risky = [g for g in others if g.op_type not in SAFE_TYPES]
            op_types = 2 if risky and len(risky) < len(others) else 1
        pool = len(compute) if op_types else units
        bisect = math.ceil(math.log2(max(pool, 2))) + 1  # the assumed-feasible top may need its own trial
        guess = int(self.guessed_elsewhere)
        return max(0, min(limit, bound - 1 - guess - op_types - bisect))

    def screen_full(self, base: Point) -> Step:
        """Stage: accuracy parameters one at a time on the fully quantized variant; the point that meets, or None."""
        limit = self.options.screen_trials
        if limit <= 0 or self.screened:
            return None
        point, outcome = yield from self.stage_screen(base, limit)
        return point if outcome is not None and outcome.meets and point != base else None

    def stage_op_types(self, base: Point, compute: list[Group], others: list[Group]) -> Step:
        """Stage: quantize the safe types, else only compute; then add types back; returns fp32 groups or None."""
        risky = [g for g in others if g.op_type not in SAFE_TYPES]
        tries: list[tuple[list[Group], str]] = []
        if risky and len(risky) < len(others):
            safe = sorted({g.op_type for g in compute + others if g not in risky})
            tries.append((risky, f"op types: int8 {safe}, fp32 {sorted({g.op_type for g in risky})}"))
        tries.append((others, f"op types: int8 {sorted({g.op_type for g in compute})} only"))
        fallen: list[Group] | None = None
        for groups, stage in tries:
            outcome = yield from self.try_point(self.fallback(base, groups), stage, speed_if_missed=False)
            if outcome.meets:
                fallen = groups
                self.note_meeting(len(groups))
                break
        if fallen is None:
            return None
        if self.latency.at_ceiling(self.shared.in_play, self.fallback(base, fallen)):  # nothing to add back
            return fallen
        return (yield from self.add_back(base, fallen, {}))

    def add_back(self, base: Point, fallen: list[Group], fixed: dict[str, Precision]) -> Step:
        """Groups of ``fallen`` back to int8 but the fewest that must stay in fp32 (``fixed`` held); the groups still in
        fp32. Per group, ranked and bisected: one fragile Add must not keep every Add in fp32."""
        ranked_scores = priced(self.ctx.ranked(self.ctx.with_fallback(base, fixed), fallen), coarse_costs(self.problem))
        ranked = [g for g, _ in ranked_scores]
        before = self.ctx.with_fallback(base, {**fixed, **self.assign(fallen)})
        search, trials = Bisection(len(ranked), lo=-1, hi=len(ranked)), self.options.op_type_trials
        point, outcome = before, None
        while (k := search.next_k()) is not None and trials > 0:
            trial = self.ctx.with_fallback(base, {**fixed, **self.assign(ranked[:k])})
            if self.known(trial) is None:  # the fully quantized model (k = 0) is often known: free
                trials -= 1
            stage = (
                f"op types: + {len(ranked) - k}/{len(ranked)} to int8, fp32 {describe([g.name for g in ranked[:k]])}"
            )
            tried = yield from self.try_point(trial, stage, speed_if_missed=False)
            search.record(k, bool(tried.meets))
            if tried.meets and search.hi == k:
                point, outcome = trial, tried
        if outcome is None or search.hi is None:
            return fallen
        kept = ranked[: search.hi]
        if not self.latency.keeps_requantized(
            outcome, point, before, f"op types: {len(fallen) - len(kept)} groups to int8"
        ):
            return fallen
        self.note_meeting(len(kept) + sum(1 for p in fixed.values() if p == "fp32"))
        return kept

    def bisect(self, base: Point, pool: Sequence[Group], fallen: Sequence[Group]) -> Step:
        """The fewest of ``pool`` (by harm per time) in fp32, with ``fallen`` too, that meet; None if none."""
        start = self.fallback(base, fallen)
        ranked_scores = priced(self.ctx.ranked(start, pool), coarse_costs(self.problem))
        ranked = [group for group, _ in ranked_scores]
        self.ranking = ranked
        blocks = repeated_blocks(self.ctx.capability.blocks(), ranked_scores)
        if blocks and self.options.bisect_blocks:
            found = yield from self._bisect_blocks(base, ranked, blocks, fallen)
            if found is not None:
                return found
        return (yield from self._bisect(base, ranked, fallen, "bisect"))

    def _limit(self, ranked: Sequence[Group], fallen: Sequence[Group]) -> int:
        """The most of ``ranked`` that may fall back and leave some compute int8 (never all of it in fp32)."""
        down = {g.name for g in fallen}
        for k in range(len(ranked), -1, -1):
            rest = [g for g in ranked[k:] if g.name not in down]
            others = [g for g in self.ctx.candidates if g not in ranked and g.name not in down]
            if any(g.op_type in COMPUTE_TYPES for g in rest + others):
                return k
        return 0

    def _bisect(self, base: Point, ranked: list[Group], fallen: Sequence[Group], label: str) -> Step:
        """The smallest k with ``ranked[:k]`` and ``fallen`` in fp32 in budget, or None; the top is assumed feasible
        until a miss makes it doubtful (:meth:`_doubts_top`), then asked before the search climbs toward it."""
        top = self._limit(ranked, fallen)
        if top <= 0:
            return None
        search = Bisection(top, hi=top)
        start = self.known(self.fallback(base, fallen))
        met_any = asked_top = False
        while (k := search.next_k()) is not None:
            tried = yield from self._try_fallback(base, ranked[:k], fallen, f"{label}: k={k}/{len(ranked)}")
            search.record(k, bool(tried.meets))
            met_any = met_any or bool(tried.meets)
            if not met_any and not asked_top and search.next_k() is not None and _doubts_top(start, tried, k, top):
                asked_top = True
                at_top = yield from self._try_fallback(base, ranked[:top], fallen, f"{label}: k={top}/{len(ranked)}")
                if not at_top.meets:
                    log.info(
                        "bisect: even %d of %d groups in fp32 miss the budget: no fallback of them holds",
                        top,
                        len(ranked),
                    )
                    return None
                met_any = True
        if not met_any:  # the top was only assumed: evaluate it
            tried = yield from self._try_fallback(base, ranked[:top], fallen, f"{label}: k={top}/{len(ranked)}")
            if not tried.meets:
                return None
        return ranked[: search.answer]

    def _try_fallback(self, base: Point, groups: Sequence[Group], fallen: Sequence[Group], label: str) -> Step:
        point = self.fallback(base, [*fallen, *groups])
        outcome = yield from self.try_point(point, f"{label} {describe([g.name for g in groups])}", False)
        if outcome.meets:
            self.note_meeting(len(groups) + len(fallen))
        return outcome

    def _bisect_blocks(
        self, base: Point, ranked: list[Group], blocks: list[tuple[str, list[Group]]], fallen: Sequence[Group]
    ) -> Step:
        """Stage: bisect over whole blocks, then over their groups: a transformer's group ranks are noisy."""
        names = [block for block, _ in blocks]
        search = Bisection(len(blocks) - 1)  # never every block in fp32
        while (k := search.next_k()) is not None:
            groups = [g for _, members in blocks[:k] for g in members]
            stage = f"bisect blocks: {k}/{len(blocks)} in fp32 {describe(names[:k])}"
            outcome = yield from self.try_point(self.fallback(base, [*fallen, *groups]), stage, speed_if_missed=False)
            search.record(k, bool(outcome.meets))
            if outcome.meets:
                self.note_meeting(len(groups) + len(fallen))
        if search.answer is None:
            return None
        inside = {g.name for _, members in blocks[: search.answer] for g in members}
        inner = [g for g in ranked if g.name in inside]  # sensitivity order
        return (yield from self._bisect(base, inner, fallen, "bisect"))

    def prune(self, base: Point, groups: list[Group], fallen: Sequence[Group]) -> Step:
        """Re-quantize fallen groups the budget does not need, the costliest (most speed back) first."""
        limit = self.options.prune_trials
        assignment: dict[str, Precision] = {g.name: "fp32" for g in [*fallen, *groups]}
        if len(groups) <= 1 and "int16" not in self.ctx.precisions:
            return assignment
        costs = coarse_costs(self.problem)
        order = list(reversed(groups))  # least harmful first when there is no profile
        if costs:
            order.sort(key=lambda g: -sum(costs.get(n, 0.0) for n in g.nodes))
        for group in order if len(groups) > 1 else list(groups):
            for precision in self._lower_precisions():
                if limit <= 0:
                    return assignment
                trial = {**assignment}
                if precision == "int8":
                    trial.pop(group.name)
                else:
                    trial[group.name] = precision
                point = self.ctx.with_fallback(base, trial)
                if not self.ctx.valid(point):
                    continue
                limit -= 1
                stage = f"prune: {group.name} -> {precision}"
                outcome = yield from self.try_point(point, stage, speed_if_missed=False)
                if self.latency.keeps_requantized(outcome, point, self.ctx.with_fallback(base, assignment), stage):
                    assignment = trial
                    self.note_meeting(sum(1 for p in assignment.values() if p == "fp32"))
                    break
        return assignment

    def _lower_precisions(self) -> list[Precision]:
        """Cheaper precisions to try for a fallen group, cheapest first."""
        return ["int8", "int16"] if "int16" in self.ctx.precisions else ["int8"]


def _doubts_top(start: Outcome | None, missed: Outcome, k: int, top: int) -> bool:
    """Whether a miss with the ``k`` most harmful groups in fp32 makes it unlikely that all ``top`` would meet.

    The groups are ranked most harmful first, so each of the ``top - k`` left is expected to win back no more of
    the loss than the average of the first ``k``: when even that bound falls short of what is still missing, the
    top is asked next (one trial) instead of climbing toward it one miss at a time."""
    if start is None or start.failed or missed.failed or k <= 0:
        return False
    won_back = start.violation - missed.violation
    return won_back * (top - k) / k < missed.violation
