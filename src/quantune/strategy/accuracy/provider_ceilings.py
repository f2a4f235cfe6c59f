"""The provider axis in the speed-first strategy: every provider's ceilings before any accuracy work.

Each variant is timed on each provider that loads it, with the originals on the others; a ceiling an original in budget
beats is dropped. The model in budget is then tried on every other provider (:meth:`ProviderCeilings.everywhere`),
judged side by side there (in a run of another objective, by that objective's figure: no timing decides), with a
recovery of their own where it misses, its culprits ranked as that provider runs the model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantune.passes.registry import find_pass
from quantune.space import Point
from quantune.space.providers import short_provider
from quantune.strategy.accuracy.common import Step
from quantune.strategy.accuracy.latency_stage import LatencyStage, surely_slower
from quantune.strategy.accuracy.shared import Shared
from quantune.strategy.accuracy.speed import Variant
from quantune.strategy.base import Outcome, SearchProblem

FLOW_KEY = "flow"


def _provider_step(pass_name: str) -> bool:
    found = find_pass(pass_name)
    return found is not None and found.role == "provider"


def provider_axis(problem: SearchProblem) -> tuple[str, list[str], str] | None:
    """(the provider step, the providers it searches, the reference provider), or None for one provider."""
    step = next((sid for sid, name in problem.step_passes.items() if _provider_step(name)), None)
    if step is None:
        return None
    param = problem.subspace([step], {}).params.get(f"{step}.provider")  # the step's own, not gated by flow
    choices = getattr(param, "choices", None)
    if not choices or len(choices) < 2:
        return None
    reference = str(problem.step_fixed.get(step, {}).get("reference", choices[0]))
    return step, [str(c) for c in choices], reference


def on_providers(problem: SearchProblem, variants: Sequence[tuple[Point, str]]) -> list[tuple[Point, str]]:
    """Each ``(point, label)`` on every searched provider that can run it, in the axis's order."""
    axis = provider_axis(problem)
    if axis is None:
        return list(variants)
    step, providers, _ = axis
    out = []
    for point, label in variants:
        for provider in providers:
            placed = {**point, f"{step}.provider": provider}
            if problem.space.is_valid(placed):
                out.append((placed, f"{label} on {short_provider(provider)}"))
    return out


def original_points(problem: SearchProblem) -> list[tuple[str, Point, tuple[str, ...]]]:
    """(provider, point, flow) of the original on each searched provider but the reference one."""
    axis = provider_axis(problem)
    if axis is None:
        return []
    step, providers, reference = axis
    flow = (step,)
    named = next((name for name, steps in problem.flows.items() if tuple(steps) == flow), None)
    out = []
    for provider in providers:
        if provider == reference:
            continue
        point: Point = {f"{step}.provider": provider}
        if named is not None and len(problem.flows) > 1:
            point[FLOW_KEY] = named
        if problem.space.is_valid(point):
            out.append((provider, point, flow))
    return out


class ProviderCeilings:
    """The provider axis: originals on other providers, the ceilings they beat, the model in budget everywhere."""

    def __init__(self, shared: Shared, latency: LatencyStage) -> None:
        self.shared, self.run, self.latency = shared, shared.run, latency
        self.opening_met: dict[str, bool] = {}  # provider -> whether its original met the criterion
        self.original_ratio: dict[str, float | None] = {}  # provider -> its original's paired ratio
        self.originals: list[tuple[str, Point, tuple[str, ...]]] = []  # those timed with the ceilings
        self.carry_notes: list[str] = []  # why a provider was not tried (carry)

    def observe_opening(self, provider: str, outcome: Outcome, paired_ratio: float | None = None) -> None:
        """Whether the original on ``provider`` met the criterion there, and its paired ratio."""
        self.opening_met[provider] = bool(outcome.meets) and not outcome.failed
        if paired_ratio is not None:
            self.original_ratio.setdefault(provider, paired_ratio)

    def original_items(self) -> list[tuple[Point, tuple[str, ...]]]:
        """The originals on the other providers, as items of the ceilings' side-by-side session."""
        self.originals = original_points(self.run.problem)
        return [(point, flow) for _, point, flow in self.originals]

    def note_originals(self, ratios: Sequence[float | None]) -> None:
        """Their side-by-side ratios (in the order of :meth:`original_items`)."""
        for (provider, _, _), ratio in zip(self.originals, ratios, strict=False):
            if ratio is not None:  # else what its opening timed stands
                self.original_ratio[provider] = ratio

    def best_original(self) -> tuple[str, float] | None:
        """(provider, ratio) of the fastest original on another provider in budget; None when none is known."""
        ratios = self.original_ratio.items()
        timed = [(ratio, p) for p, ratio in ratios if ratio is not None and ratio < 1.0 and self.opening_met.get(p)]
        if not timed:
            return None
        ratio, provider = min(timed)
        return provider, ratio

    def beaten_by_original(self, ratio: float, margin: float) -> str | None:
        """Why a ceiling at ``ratio`` cannot win (an original in budget is not slower by the margin), or None."""
        best = self.best_original()
        if best is None or ratio < best[1] * (1.0 - margin) or not self.shared.options.drop_slow:
            return None
        provider, theirs = best
        return (
            f"dropped: {ratio:.2f}x fp32 latency, not below {theirs * (1.0 - margin):.2f}x: the original on "
            f"{short_provider(provider)} is in budget at {theirs:.2f}x"
        )

    # -- the model in budget on every provider ----------------------------------------------------
    def everywhere(self, base: Point, fallback: dict[str, Any], variant: Variant | None) -> Step:
        """Stage: the model in budget on each other provider, then the latency stage from the fastest."""
        carried = yield from self.carry(base, fallback, variant)
        if carried is None:  # a provider's model is at its ceiling: nothing faster is possible
            final = self.shared.settled
        else:
            final = yield from self.latency.stage_latency(*carried)
        if self.carry_notes:
            self.run.finished_reason = "; ".join([r for r in (self.run.finished_reason,) if r] + self.carry_notes)
        return final

    def carry(self, base: Point, fallback: dict[str, Any], variant: Variant | None) -> Step:
        """(base, fallback, variant) of the model in budget fastest on any provider, or None at a ceiling."""
        axis = provider_axis(self.run.problem)
        self.carry_notes = []
        if axis is None or variant is None:
            return base, fallback, variant
        key = f"{axis[0]}.provider"
        best = (base, fallback, variant)
        incumbent = self.run.complete(self.run.ctx.with_fallback(base, fallback))
        for twin in self._twins(variant, key):
            name = short_provider(str(twin.point[key]))
            if twin.failed:
                self.carry_notes.append(f"not tried on {name}: its speed ceiling there failed or was not timed")
                continue
            ceiling = self.latency.paired(self.run.complete(dict(twin.timing_point)), incumbent)
            if ceiling is not None and surely_slower(ceiling) and self.shared.options.drop_slow:
                ratio = float(ceiling.get("ratio_median", 1.0))
                self.carry_notes.append(
                    f"not built on {name}: its speed ceiling there is {ratio:.2f}x the incumbent side by side, "
                    "surely slower, so no model there could win"
                )
                continue
            if self.run.remaining() <= 0:
                break
            found = yield from self._on_provider(twin, {**base, key: twin.point[key]}, fallback, name)
            if found is None:
                continue
            point = self.run.complete(self.run.ctx.with_fallback(*found))
            result = self.latency.paired(point, incumbent)  # None where no timing decides: the objective does
            if result.get("faster") if result is not None else self.latency.faster(point, incumbent):
                self.shared.decisions.append(
                    f"on {name}: {self.latency.trial_of(point)[1]} is in budget, {self._versus(result, point, incumbent)}: "
                    "the search goes on from it"
                )
                best, incumbent, self.shared.in_play = (*found, twin), point, twin
                if self.latency.at_ceiling(twin, point):
                    return None
            else:
                self.shared.decisions.append(
                    f"on {name}: in budget, {self._versus(result, point, incumbent)}: not better beyond the noise"
                )
        self.run.ctx = best[2].ctx
        return best

    def _versus(self, result: Any, point: Point, incumbent: Point) -> str:
        """How ``point`` compares with ``incumbent``: their paired ratio, else their objective's figures."""
        if result is not None:
            return f"{float(result.get('ratio_median', 1.0)):.2f}x the incumbent side by side"
        mine, theirs = self.run.known(point), self.run.known(incumbent)
        figures = [o.objective if o is not None else None for o in (mine, theirs)]
        return f"{self.run.problem.objective} {figures[0]} against the incumbent's {figures[1]}"

    def _on_provider(self, twin: Variant, base: Point, fallback: dict[str, Any], name: str) -> Step:
        """(base, fallback) in budget on ``twin``'s provider: the one found elsewhere, else its own recovery."""
        self.run.ctx = twin.ctx
        point = self.run.ctx.with_fallback(base, fallback)
        kept = sum(1 for precision in fallback.values() if precision != "int8")
        stage = f"on {name}: the model in budget found on another provider ({kept} groups in higher precision)"
        outcome = yield from self.run.try_point(point, stage)
        if outcome.meets and not outcome.failed:
            return base, fallback
        if outcome.failed:
            self.carry_notes.append(f"the model in budget failed on {name}")
            return None
        held = (self.shared.in_play, self.shared.settled, self.run.finished_reason)
        self.shared.in_play, self.run.where = twin, f"on {name}, culprits ranked as {name} runs it: "
        try:
            found = yield from self.shared.recover(base, self.run.known(base))
        finally:
            self.run.where = ""
        self.shared.in_play, self.shared.settled, self.run.finished_reason = (
            held  # its ceiling stop is decided by carry
        )
        if found is None:
            self.carry_notes.append(f"no model in budget on {name}: its own recovery found none")
            return None
        return found

    def _twins(self, variant: Variant, key: str) -> list[Variant]:
        """``variant``'s quantization on the other providers, in the axis's order."""
        mine = {k: v for k, v in variant.point.items() if k != key}
        return [
            v
            for v in self.shared.variants
            if v is not variant
            and v.ctx.flow == variant.ctx.flow
            and v.point.get(key) != variant.point.get(key)
            and {k: x for k, x in v.point.items() if k != key} == mine
        ]
