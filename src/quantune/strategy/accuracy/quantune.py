"""quantune's accuracy-driven strategy: few evaluations to the first feasible model, then speed.

Neural Compressor finds which operators must stay in fp32 by evaluating the model once per
operator. Here one sensitivity run ranks the groups, a bisection finds how many of the most
sensitive must stay in high precision (``O(log n)`` evaluations), a prune step re-quantizes
those the budget does not need, and the rest of the trials go to the sampler to minimise
latency with that fallback fixed.
"""

from __future__ import annotations

from quantune.passes.onnx.capability import Group, Precision
from quantune.space import Point
from quantune.strategy.accuracy.bisect import Bisection
from quantune.strategy.accuracy.common import AccuracyStrategy, Step
from quantune.strategy.accuracy.context import describe
from quantune.strategy.accuracy.staged import Stages
from quantune.strategy.registry import register_strategy


@register_strategy("quantune")
class QuantuneStrategy(AccuracyStrategy):
    """Rank by sensitivity, bisect the fallback size, prune, then tune latency.

    Stages: ``default`` (pass defaults; if it meets, straight to ``latency``) -> ``recipes``
    (cle / smooth_quant values, when in the flow: accuracy without leaving int8) ->
    ``screen`` (one-at-a-time changes of the accuracy-relevant quantization parameters:
    per_channel, calibrate_method, ...; the one with the least loss becomes the base) ->
    ``bisect`` (groups ranked by one sensitivity run on the base; the smallest k such that
    the k most sensitive groups in high precision meet the criterion) -> ``prune`` (each of
    those k, least sensitive first, back to int8 if the criterion still holds; with
    ``precisions: [int16, fp32]``, int16 is tried before giving up a group) -> ``latency``
    (the sampler over the quantization parameters with the fallback fixed, for the remaining
    trials). Options: ``screen_trials`` (default 4), ``prune_trials`` (default 8),
    ``latency_trials`` (default: what ``stop.max_trials`` leaves).
    """

    name = "quantune"

    def stages(self) -> Stages:
        base, outcome = yield from self.stage_default()
        if not outcome.meets and self.ctx.has_recipes():
            base, outcome = yield from self.stage_recipes(base)
        if outcome is not None and not outcome.meets:
            base, outcome = yield from self.stage_screen(base, int(self.ctx.options.get("screen_trials", 4)))
        fallback: dict[str, Precision] = {}
        if outcome is not None and not outcome.meets:
            found = yield from self.bisect(base)
            if found is None:
                return  # nothing meets: the engine reports the closest miss
            fallback = yield from self.prune(base, found)
        yield from self.latency(base, fallback)

    def bisect(self, base: Point) -> Step:
        ranked = [group for group, _ in self.ctx.ranked(base)]
        self.ranking = ranked
        search = Bisection(len(ranked))
        while (k := search.next_k()) is not None:
            groups = ranked[:k]
            point = self.fallback(base, groups)
            outcome = yield from self.try_point(
                point, f"bisect: k={k}/{len(ranked)} {describe([g.name for g in groups])}"
            )
            search.record(k, bool(outcome.meets))
            if outcome.meets:
                self.note_meeting(k)
        if search.answer is None:
            return None
        return ranked[: search.answer]

    def prune(self, base: Point, groups: list[Group]) -> Step:
        """Re-quantize fallen groups the budget does not need, least sensitive (last ranked) first."""
        limit = int(self.ctx.options.get("prune_trials", 8))
        assignment: dict[str, Precision] = {g.name: "fp32" for g in groups}
        if len(groups) <= 1 and "int16" not in self.ctx.precisions:
            return assignment
        for group in list(reversed(groups)) if len(groups) > 1 else list(groups):
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
                outcome = yield from self.try_point(point, f"prune: {group.name} -> {precision}")
                if outcome.meets:
                    assignment = trial
                    self.note_meeting(sum(1 for p in assignment.values() if p == "fp32"))
                    break
        return assignment

    def _lower_precisions(self) -> list[Precision]:
        """Cheaper precisions to try for a fallen group, cheapest first."""
        lower: list[Precision] = ["int8"]
        if "int16" in self.ctx.precisions:
            lower.append("int16")
        return lower

    def latency(self, base: Point, fallback: dict[str, Precision]) -> Step:
        """Stage: the sampler over the quant parameters, with the fallback found held fixed."""
        fixed = self.ctx.with_fallback(dict(self.ctx.flow_fixed), fallback)
        trials = int(self.ctx.options.get("latency_trials", self.remaining()))
        names = list(self.ctx.quant_params())
        label = f"latency ({sum(1 for p in fallback.values() if p == 'fp32')} groups in fp32)"
        tried = yield from self.stage_sampler(fixed, trials, label, names)
        return tried
