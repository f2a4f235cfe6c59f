"""The fallback strategies users of Neural Compressor know: basic, conservative, auto, mse, mse_v2. They differ in how
they choose which operators to keep in higher precision."""

from __future__ import annotations

from collections.abc import Sequence

from quantune.graph.capability import Group
from quantune.space import Point
from quantune.strategy.accuracy.common import AccuracyStrategy, Step
from quantune.strategy.accuracy.context import describe
from quantune.strategy.accuracy.staged import Stages
from quantune.strategy.base import Outcome
from quantune.strategy.options import FallbackOptions
from quantune.strategy.registry import register_strategy


class _Fallback(AccuracyStrategy):
    Options = FallbackOptions
    options: FallbackOptions

    def tuning_trials(self) -> int:
        return self.options.tuning_trials

    def start(self) -> Step:
        """default -> recipes -> parameter tuning; returns (reference point, its outcome, met?)."""
        base, outcome = yield from self.stage_default()
        if self.ctx.has_recipes():
            base, outcome = yield from self.stage_recipes(base)
        tried = yield from self.stage_sampler(self.ctx.base_point(), self.tuning_trials(), "op-type-wise tuning")
        best = self.pick([*tried, (base, outcome)] if outcome is not None else tried)
        if best is None:
            return base, outcome, False
        return best[0], best[1], bool(best[1].meets)

    def op_type_wise_fallback(self, base: Point) -> Step:
        """Stage: every group of one op type in fp32 at a time; returns the outcome per op type."""
        items = []
        for op_type in self.ctx.capability.op_types():
            groups = [g for g in self.ctx.candidates if g.op_type == op_type]
            if groups:
                items.append((self.fallback(base, groups), f"op-type-wise fallback: {op_type}"))
        outcomes = yield from self.try_points(items)
        return list(zip([p for p, _ in items], outcomes, strict=True))

    def block_wise(self, base: Point) -> Step:
        """Stage: each repeated block (transformer layer) in fp32 at a time."""
        blocks = self.ctx.capability.blocks()
        by_name = {g.name: g for g in self.ctx.candidates}
        for block, names in blocks.items():
            groups = [by_name[n] for n in names if n in by_name]
            if not groups:
                continue
            outcome = yield from self.try_point(self.fallback(base, groups), f"block-wise fallback: {block}")
            if outcome.meets:
                self.note_meeting(len(groups))
                return True
        return False

    def instance_wise(self, base: Point, base_outcome: Outcome | None) -> Step:
        """Stage: each group alone in fp32; returns the groups by impact (violation removed), largest first."""
        before = base_outcome.violation if base_outcome is not None and not base_outcome.failed else 1.0
        impacts: list[tuple[Group, float]] = []
        for group in self.ctx.candidates:
            outcome = yield from self.try_point(self.fallback(base, [group]), f"instance-wise fallback: {group.name}")
            if outcome.meets:
                self.note_meeting(1)
                return [], True
            impact = before - outcome.violation if not outcome.failed else float("-inf")
            impacts.append((group, impact))
        order = {g.name: i for i, g in enumerate(self.ctx.candidates)}
        impacts.sort(key=lambda gi: (-gi[1], order[gi[0].name]))
        return [g for g, _ in impacts], False


@register_strategy("basic")
class BasicStrategy(_Fallback):
    """Neural Compressor's basic recipe, one stage after another until the criterion holds.

    Stages: ``default`` -> ``recipes`` -> ``op-type-wise tuning`` -> ``op-type-wise fallback`` -> ``block-wise
    fallback`` -> ``instance-wise fallback`` (one evaluation per group, recording its impact) -> ``accumulated
    fallback`` (groups in order of impact)."""

    name = "basic"

    def stages(self) -> Stages:
        base, outcome, met = yield from self.start()
        if met:
            return
        yield from self.fallback_stages(base, outcome)

    def fallback_stages(self, base: Point, outcome: Outcome | None) -> Step:
        yield from self.op_type_wise_fallback(base)
        if (yield from self.block_wise(base)):
            return True
        ordered, met = yield from self.instance_wise(base, outcome)
        if met:
            return True
        found = yield from self.stage_accumulate(base, ordered, "accumulated fallback")
        return found is not None


@register_strategy("conservative")
class ConservativeStrategy(_Fallback):
    """Start from fp32 and quantize op types one at a time, keeping each that holds the criterion.

    Stages: ``fp32`` -> ``quantize <op type>`` for each op type, heaviest first, on top of the types kept so far."""

    name = "conservative"

    def stages(self) -> Stages:
        yield from self.conservative(self.ctx.base_point())

    def conservative(self, base: Point) -> Step:
        types = self.ctx.capability.op_types()
        heavy = [t for t in ("Conv", "MatMul", "Gemm", "ConvTranspose", "Attention") if t in types]
        order = heavy + [t for t in types if t not in heavy]
        all_groups = list(self.ctx.candidates)
        yield from self.try_point(self.fallback(base, all_groups), "fp32")
        kept: list[str] = []
        result = None
        for op_type in order:
            trial = [*kept, op_type]
            fallen = [g for g in all_groups if g.op_type not in trial]
            outcome = yield from self.try_point(self.fallback(base, fallen), f"quantize {op_type}")
            if outcome.meets:
                kept = trial
                self.note_meeting(len(fallen))
                result = (kept, len(fallen))
        return result


@register_strategy("auto")
class AutoStrategy(BasicStrategy, ConservativeStrategy):
    """Neural Compressor's default ``quant_level: auto``: default config, then conservative, then basic.

    Stages: ``default`` -> conservative's stages if it misses -> basic's tuning and fallback stages if some op type is
    still in fp32."""

    name = "auto"

    def stages(self) -> Stages:
        base, outcome = yield from self.stage_default()
        if outcome.meets:
            return
        if self.ctx.has_recipes():
            base, outcome = yield from self.stage_recipes(base)
            if outcome is not None and outcome.meets:
                return
        result = yield from self.conservative(self.ctx.base_point())
        if result is not None and result[1] == 0:
            return  # every op type quantized and the criterion holds
        # basic from here: op-type-wise tuning of the quantization parameters, then fallback
        tried = yield from self.stage_sampler(self.ctx.base_point(), self.tuning_trials(), "op-type-wise tuning")
        best = self.pick([*tried, (base, outcome)] if outcome is not None else tried)
        if best is not None and best[1].meets:
            return
        if best is not None:
            base, outcome = best
        yield from self.fallback_stages(base, outcome)


@register_strategy("mse")
class MSEStrategy(_Fallback):
    """basic, with the fallback order from one run instead of one evaluation per group.

    Stages: ``default`` -> ``recipes`` -> ``op-type-wise tuning`` -> ``accumulated fallback`` in order of per-group
    quantization error, measured once on the best configuration so far."""

    name = "mse"

    def stages(self) -> Stages:
        base, _, met = yield from self.start()
        if met:
            return
        ordered = [group for group, _ in self.ctx.ranked(base)]
        yield from self.stage_accumulate(base, ordered, "accumulated fallback (by error)")


@register_strategy("mse_v2")
class MSEv2Strategy(_Fallback):
    """Fall back the most harmful group until the criterion holds, then revert the ones not needed.

    Stages: ``default`` -> ``fallback`` (re-scores the remaining groups after each step) -> ``revert`` (least harmful
    first, each stays int8 if the criterion still holds)."""

    name = "mse_v2"

    def stages(self) -> Stages:
        base, outcome = yield from self.stage_default()
        if outcome.meets:
            return
        fallen: list[Group] = []
        scores: dict[str, float] = {}
        point = base
        met = False
        while len(fallen) < len(self.ctx.candidates):
            rest = [g for g in self.ctx.candidates if g not in fallen]
            ranked = self.ctx.ranked(point, rest)
            worst, score = ranked[0]
            scores[worst.name] = score
            fallen.append(worst)
            point = self.fallback(base, fallen)
            outcome = yield from self.try_point(point, f"fallback: {len(fallen)} in fp32 {describe([worst.name])}")
            if outcome.meets:
                met = True
                break
        if not met:
            return
        self.note_meeting(len(fallen))
        yield from self.revert(base, fallen, scores)

    def revert(self, base: Point, fallen: Sequence[Group], scores: dict[str, float]) -> Step:
        kept = list(fallen)
        for group in sorted(fallen, key=lambda g: scores.get(g.name, 0.0)):
            trial = [g for g in kept if g is not group]
            outcome = yield from self.try_point(self.fallback(base, trial), f"revert: {group.name} back to int8")
            if outcome.meets:
                kept = trial
                self.note_meeting(len(kept))
        return kept
