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
from quantune.strategy.accuracy.context import AccuracyContext, describe
from quantune.strategy.accuracy.staged import Stages
from quantune.strategy.registry import register_strategy


@register_strategy("quantune")
class QuantuneStrategy(AccuracyStrategy):
    """Rank by sensitivity, bisect the fallback size, prune, then tune latency.

    Stages: ``default`` (pass defaults; with several flows that quantize -- say a static and
    a dynamic one -- each flow's defaults, and the flow whose default misses least is tuned;
    the ``flow`` option picks one instead; if it meets, straight to ``latency``) -> ``recipes``
    (cle / smooth_quant values, when in the flow: accuracy without leaving int8) ->
    ``screen`` (one-at-a-time changes of the accuracy-relevant quantization parameters:
    per_channel, calibrate_method, ...; the one with the least loss becomes the base) ->
    ``bisect`` (groups ranked by one sensitivity run on the base; the smallest k such that
    the k most sensitive groups in high precision meet the criterion; when the model has
    repeated blocks -- transformer layers -- ``bisect blocks`` first finds how many of the
    most sensitive blocks must go to fp32 whole, then the groups are bisected inside those;
    option ``bisect_blocks: false`` skips it) -> ``prune`` (each of
    those k, least sensitive first, back to int8 if the criterion still holds; with
    ``precisions: [int16, fp32]``, int16 is tried before giving up a group) -> ``latency``
    (the sampler over the quantization parameters with the fallback fixed, for the remaining
    trials). Options: ``screen_trials`` (default 4), ``prune_trials`` (default 8),
    ``latency_trials`` (default: what ``stop.max_trials`` leaves).
    """

    name = "quantune"

    def stages(self) -> Stages:
        base, outcome = yield from self.stage_flows()
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

    def stage_flows(self) -> Step:
        """Stage: the defaults of every flow that quantizes; the one that misses least is tuned."""
        if "flow" in self.ctx.options:
            return (yield from self.stage_default())
        contexts = AccuracyContext.all_from_problem(self.problem, self.name, known=self.ctx)
        if len(contexts) <= 1:
            return (yield from self.stage_default())
        items = [(self.complete(ctx.base_point(), ctx), f"default: {ctx.flow_name}") for ctx in contexts]
        outcomes = yield from self.try_points(items)
        ranked = sorted(
            range(len(contexts)),
            key=lambda i: (
                outcomes[i].failed,
                not outcomes[i].meets,
                outcomes[i].violation if not outcomes[i].failed else float("inf"),
                outcomes[i].objective or 0.0,
            ),
        )
        chosen = ranked[0]
        self.ctx = contexts[chosen]
        return items[chosen][0], outcomes[chosen]

    def bisect(self, base: Point) -> Step:
        ranked_scores = self.ctx.ranked(base)
        ranked = [group for group, _ in ranked_scores]
        self.ranking = ranked
        blocks = self._blocks(ranked_scores)
        if blocks and self.ctx.options.get("bisect_blocks", True):
            found = yield from self._bisect_blocks(base, ranked, blocks)
            if found is not None:
                return found
        return (yield from self._bisect(base, ranked, "bisect"))

    def _bisect(self, base: Point, ranked: list[Group], label: str, known_feasible: bool = False) -> Step:
        """The smallest k such that ``ranked[:k]`` in fp32 meets the criterion (None: not even all)."""
        search = Bisection(len(ranked), hi=len(ranked) if known_feasible else None)
        while (k := search.next_k()) is not None:
            groups = ranked[:k]
            point = self.fallback(base, groups)
            outcome = yield from self.try_point(
                point, f"{label}: k={k}/{len(ranked)} {describe([g.name for g in groups])}"
            )
            search.record(k, bool(outcome.meets))
            if outcome.meets:
                self.note_meeting(k)
        if search.answer is None:
            return None
        return ranked[: search.answer]

    def _blocks(self, ranked_scores: list[tuple[Group, float]]) -> list[tuple[str, list[Group]]]:
        """Repeated blocks (transformer layers) with their candidate groups, most sensitive first."""
        blocks = self.ctx.capability.blocks()
        if len(blocks) < 2:
            return []
        score = {group.name: value for group, value in ranked_scores}
        order = [group for group, _ in ranked_scores]
        found = []
        for block, names in blocks.items():
            members = set(names)
            groups = [g for g in order if g.name in members]
            if groups:
                found.append((block, groups, sum(score[g.name] for g in groups)))
        if len(found) < 2:
            return []
        found.sort(key=lambda item: -item[2])
        return [(block, groups) for block, groups, _ in found]

    def _bisect_blocks(self, base: Point, ranked: list[Group], blocks: list[tuple[str, list[Group]]]) -> Step:
        """Stage: bisect over whole blocks (most sensitive first), then over the groups inside those.

        A transformer's sensitivity is spread over many small groups whose ranks are noisy; a
        block-level bisection first finds how many layers must keep some fp32 (few
        evaluations), and the group-level bisection then only ranks groups of those layers.
        """
        names = [block for block, _ in blocks]
        search = Bisection(len(blocks))
        while (k := search.next_k()) is not None:
            groups = [g for _, members in blocks[:k] for g in members]
            outcome = yield from self.try_point(
                self.fallback(base, groups), f"bisect blocks: {k}/{len(blocks)} in fp32 {describe(names[:k])}"
            )
            search.record(k, bool(outcome.meets))
            if outcome.meets:
                self.note_meeting(len(groups))
        if search.answer is None:
            return None
        inside = {g.name for _, members in blocks[: search.answer] for g in members}
        inner = [g for g in ranked if g.name in inside]  # sensitivity order
        return (yield from self._bisect(base, inner, "bisect", known_feasible=True))

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
