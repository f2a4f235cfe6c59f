"""The quantune strategy's first stage: each flow's speed ceiling, timed before any accuracy work. A variant whose fully
quantized model is not faster than the original by the margin can never win and is dropped."""

from __future__ import annotations

import logging

from quantune.evaluate.rounds import UnsureRatio
from quantune.space import Point
from quantune.strategy.accuracy.ceiling_rules import (
    NEAR,
    TIE,
    UNSURE,
    clearly_faster,
    or_inf,
    ties_to_the_earlier,
)
from quantune.strategy.accuracy.common import Step
from quantune.strategy.accuracy.context import AccuracyContext
from quantune.strategy.accuracy.latency_stage import LatencyStage
from quantune.strategy.accuracy.provider_ceilings import ProviderCeilings, on_providers
from quantune.strategy.accuracy.shared import Shared
from quantune.strategy.accuracy.speed import (
    Variant,
    build_order,
    slower_twins,
    speed_variants,
    unrefined_flow,
)
from quantune.strategy.base import Outcome, Proposal

log = logging.getLogger("quantune.strategy")
CEILING = "ceiling"


class CeilingStage:
    """The ceiling stage (``shared.variants``, ``shared.refined``) and the verdict on each variant."""

    def __init__(self, shared: Shared, latency: LatencyStage, providers: ProviderCeilings) -> None:
        self.shared, self.run, self.latency, self.providers = shared, shared.run, latency, providers
        self.skipped: list[str] = []  # variants never built: a faster twin is among them (speed.slower_twins)
        self.by_stage: dict[str, Variant] = {}  # a ceiling trial's stage -> its variant
        self.tied: set[int] = set()  # ids of variants kept by a tie at the margin (_ties_at_the_margin)

    def ceiling_variants(self) -> list[Variant]:
        """Every flow's fully-quantized variants, in build order (what is built first is surely timed)."""
        if not self.shared.variants:
            contexts = AccuracyContext.all_from_problem(self.run.problem, self.run.name, known=self.run.ctx)
            flows = {ctx.flow for ctx in contexts}
            for ctx in contexts:
                twin_flow = unrefined_flow(self.run.problem.step_passes, ctx.flow, ctx.quant_step)
                for point, label in on_providers(self.run.problem, speed_variants(ctx)):  # each provider's
                    point = self.run.complete(point, ctx)
                    variant = Variant(ctx, point, label)
                    if twin_flow is not None and twin_flow in flows:  # its twin's speed (twin_speeds)
                        self.shared.refined.append(variant)
                        continue
                    self.shared.variants.append(variant)
                    self.by_stage[f"{CEILING}: {label}"] = variant
            self.shared.variants.sort(key=lambda v: build_order(v.ctx, v.point))  # stable: the flows' order within
            if self.shared.options.skip_slower_twins:
                for variant, twin, why in slower_twins(self.shared.variants, self.run.problem.provider):
                    self.shared.variants.remove(variant)
                    self.by_stage.pop(f"{CEILING}: {variant.label}", None)
                    self.skipped.append(f"{variant.label} skipped: {why}; {twin.label} is the same quantization there")
        return self.shared.variants

    def stage_ceiling(self) -> Step:
        """Stage: the fully quantized variants timed against the original; the kept ones, fastest first."""
        self.ceiling_variants()
        self.shared.decisions.extend(self.skipped)
        if self._time_ceilings(self.shared.variants):
            for variant in self.shared.variants:
                self.shared.decisions.append(f"{variant.label} {self.verdict(variant)[1]}")
        else:  # nothing times models side by side here: each ceiling's trial says how fast it is
            outcomes = yield from self.run.try_points(
                [(v.point, f"{CEILING}: {v.label}") for v in self.shared.variants]
            )
            for variant, outcome in zip(self.shared.variants, outcomes, strict=True):
                self.measure(variant, outcome)
                self.shared.decisions.append(f"{variant.label} {self.verdict(variant)[1]}")
        self.twin_speeds()
        self._ties_at_the_margin()
        kept = [v for v in self.shared.variants if self.keeps(v)]
        order = {id(v): i for i, v in enumerate(self.shared.variants)}
        baseline = self.run.baseline.get("latency_ms")
        kept.sort(key=lambda v: (or_inf(v.ratio(baseline)), or_inf(v.latency_ms), order[id(v)]))
        # within a tie, a variant already in budget (the first guess) costs no evaluation: it goes first
        preference = {
            id(v): (int(not ((o := self.run.known(v.point)) is not None and o.meets)), order[id(v)]) for v in kept
        }
        kept = ties_to_the_earlier(kept, baseline, preference)
        kept = self.settle_first(kept, baseline, preference)
        for line in self.shared.decisions:
            log.info("quantune strategy: %s", line)
        if not kept:
            measured = any(v.failed is False for v in self.shared.variants)
            if measured and (best := self.providers.best_original()) is not None:  # the original there is the answer
                self.run.finished_reason = (
                    f"the original on {best[0]} is in budget at {best[1]:.2f}x fp32 latency, faster than every "
                    f"quantized variant's speed ceiling ({self.ceilings_in_brief()}), so no fallback could win"
                )
                log.info("quantune strategy: %s", self.run.finished_reason)
                return kept
            within = self._within_the_margin(baseline)
            if measured:
                # a guess in budget within the margin stands: whether it beats the original is the re-timing's
                guess = (
                    self.latency.trial_of(self.shared.guess.point)[1]
                    if within and self.shared.guess and self._guess_met()
                    else ""
                )
                log.info(
                    "quantune strategy: no variant is faster than the original by the margin: %s",
                    "the first guess stands" if guess else "keep the original",
                )
                self.run.finished_reason = (
                    f"no quantized variant was faster than the original{' by the margin' if within else ''} "
                    f"(each fully quantized flow's speed ceiling was slower{', within the margin' if within else ''} "
                    f"or failed: {self.ceilings_in_brief()}), so no fallback could win"
                ) + (f"; {guess}, in budget already, is timed against the original at the end" if guess else "")
            else:  # nothing was timed: that says nothing about speed (a short time limit on a loaded machine)
                self.run.finished_reason = (
                    f"no speed ceiling was timed: each of the {len(self.shared.variants)} fully quantized variants "
                    "failed, or was not built within the ceiling stage's share of the time limit (a longer "
                    "stop.timeout_s gives it more), so no fallback was tried"
                )
                log.info("quantune strategy: %s", self.run.finished_reason)
            if measured:  # measured slower, not only failed
                self.run.original_wins = (
                    f"no quantized variant was faster than the original by the margin side by side ({self.ceilings_in_brief()})"
                    if within
                    else f"every quantized variant was slower than the original side by side ({self.ceilings_in_brief()})"
                )
        return kept

    def _anchor(self, variants: list[Variant], offset: int) -> int | None:
        """The first guess's item among the ceilings' (after ``offset`` others) when it met the budget."""
        if self.shared.guess is None or self.shared.guess not in variants or not self._guess_met():
            return None
        return offset + variants.index(self.shared.guess)

    def _guess_met(self) -> bool:
        """Whether the first guess was evaluated and met the budget."""
        outcome = None if self.shared.guess is None else self.run.known(self.shared.guess.point)
        return outcome is not None and bool(outcome.meets) and not outcome.failed

    def _within_the_margin(self, baseline: float | None) -> bool:
        """Whether a ceiling timed faster than the original, though not surely below the margin."""
        return any((r := v.ratio(baseline)) is not None and r < 1.0 for v in self.shared.variants if not v.failed)

    def _ties_at_the_margin(self) -> None:
        """An unsure ceiling within ``TIE`` of a kept one is kept too: one speed, one verdict."""
        baseline = self.run.baseline.get("latency_ms")
        every = [*self.shared.variants, *self.shared.refined]
        sure = [(v, r) for v in every if self.keeps(v) and (r := v.ratio(baseline)) is not None]
        for variant in every:
            ratio = variant.ratio(baseline)
            if variant.failed is not False or not isinstance(ratio, UnsureRatio) or self.keeps(variant):
                continue
            twin = next((v for v, r in sure if abs(ratio - r) <= TIE * max(ratio, r)), None)
            if twin is not None:
                self.tied.add(id(variant))
                self.shared.decisions.append(f"{variant.label} {self.verdict(variant)[1]}")

    def ceilings_in_brief(self) -> str:
        """The ceilings in one clause for a reason: each ratio to fp32, fastest first, and how many were not built."""
        baseline = self.run.baseline.get("latency_ms")
        order = sorted(self.shared.variants, key=lambda v: or_inf(None if v.failed else v.ratio(baseline)))
        parts = []
        for variant in order:
            ratio = None if variant.failed else variant.ratio(baseline)
            parts.append(f"{variant.label} {'failed' if ratio is None else f'{ratio:.2f}x'}")
        brief = "to fp32 latency: " + ", ".join(parts) + f"; the margin {1.0 - self.shared.options.speed_margin:.2f}x"
        if self.skipped:
            brief += f"; {len(self.skipped)} more not built, slower twins of these where the model runs"
        return brief

    def settle_first(
        self, kept: list[Variant], baseline: float | None, preference: dict[int, tuple[int, int]]
    ) -> list[Variant]:
        """The fastest kept variant, first only when clearly faster than the preferred one within ``NEAR``."""
        if len(kept) < 2:
            return kept
        fastest = or_inf(kept[0].ratio(baseline))
        near = [v for v in kept[1:] if or_inf(v.ratio(baseline)) <= fastest * (1.0 + NEAR)]
        rivals = [v for v in near if preference[id(v)] < preference[id(kept[0])]]
        if not rivals:
            return kept
        rival = min(rivals, key=lambda v: preference[id(v)])
        result = self.latency.paired(
            kept[0].timing_point, rival.timing_point
        )  # the fastest over the preferred, side by side
        if result is None or clearly_faster(result):
            return kept
        log.info(
            "quantune strategy: %s is not faster than %s beyond the noise: %s first",
            kept[0].label,
            rival.label,
            rival.label,
        )
        return [rival, *(v for v in kept if v is not rival)]

    def twin_speeds(self) -> None:
        """Refined variants take their unrefined twin's speed: refining never changes the graph."""
        for variant in self.shared.refined:
            twin_flow = unrefined_flow(self.run.problem.step_passes, variant.ctx.flow, variant.ctx.quant_step)
            suffix = variant.label.split(": ", 1)[-1]
            twin = next(
                (v for v in self.shared.variants if v.ctx.flow == twin_flow and v.label.split(": ", 1)[-1] == suffix),
                None,
            )
            if twin is None:  # its twin was never a ceiling (a slower twin skipped): nothing to recover in
                variant.failed = True
                self.shared.decisions.append(f"{variant.label} dropped: no unrefined twin was timed")
                continue
            variant.side_by_side, variant.latency_ms, variant.failed = twin.side_by_side, twin.latency_ms, twin.failed
            self.shared.decisions.append(
                f"{variant.label} {self.verdict(variant)[1]} (the speed of {twin.label}: its refining steps "
                "keep the graph; built only when the recover stage tries it)"
            )

    def _time_ceilings(self, variants: list[Variant]) -> bool:
        """Each variant's side-by-side ratio; False when nothing here times models (then the ceilings' trials must)."""
        if self.run.problem.objective != "latency" or not variants:
            return False
        margin, share = self.shared.options.speed_margin, self.shared.options.ceiling_share
        budget = share * self.run.problem.timeout_s if self.run.problem.timeout_s else None
        originals = self.providers.original_items()  # the originals on the other providers, in the same session:
        items = [*originals, *((v.timing_point, v.ctx.flow) for v in variants)]  # first (nothing to build)
        if self.run.problem.ceiling_ratios is not None:
            anchor = self._anchor(variants, len(originals))  # in budget: its margin is the confirmation's
            companions, pairs = self._companions(variants, anchor, len(originals))
            more: dict[str, object] = {"pairs": pairs} if pairs else {}
            if anchor is not None:
                more["anchor"] = anchor
            ratios = self.run.problem.ceiling_ratios([*items, *companions], 1.0 - margin, budget, **more)[: len(items)]
        elif self.run.problem.latency_ratio is not None:
            ratios = [self.run.problem.latency_ratio(point, flow) for point, flow in items]
        else:
            return False
        self.providers.note_originals(ratios[: len(originals)])
        for variant, ratio in zip(variants, ratios[len(originals) :], strict=True):
            variant.side_by_side = ratio
            variant.failed = ratio is None  # its passes failed, or the stage's time share ran out first
        return True

    def _companions(
        self, variants: list[Variant], reference: int | None, offset: int
    ) -> tuple[list[tuple[Point, tuple[str, ...]]], list[tuple[int, int]]]:
        """The guess's lighter models and (item, guess item) pairs to time with the ceilings when it is in budget."""
        if reference is None or self.shared.guess is None:
            return [], []
        lighter = self.latency.lighter_items(self.shared.guess)
        first = offset + len(variants)
        return lighter, [(first + index, reference) for index in range(len(lighter))]

    def measure(self, variant: Variant, outcome: Outcome | None) -> None:
        if outcome is None or outcome.failed:
            variant.failed = True
            return
        variant.latency_ms = outcome.metrics.get("latency_ms")
        variant.meets = bool(outcome.meets)
        variant.violation = outcome.violation

    def keeps(self, variant: Variant) -> bool:
        return variant.failed is False and self.verdict(variant)[0]

    def verdict(self, variant: Variant) -> tuple[bool, str]:
        if variant.failed:
            return False, "dropped: failed (or not built within the ceiling stage's share of the time limit)"
        baseline = self.run.baseline.get("latency_ms")
        ratio = variant.ratio(baseline)
        if self.run.problem.objective != "latency":
            return True, f"kept (objective: {self.run.problem.objective}, not latency)"
        if ratio is None:
            return True, "kept (no baseline latency to compare)"
        margin = self.shared.options.speed_margin
        if id(variant) in self.tied:
            return True, (
                f"kept after all: {ratio:.2f}x fp32 latency, unsure at the margin yet one speed with a variant "
                "kept below it"
            )
        unsure = isinstance(ratio, UnsureRatio) and ratio >= 1.0 - margin - UNSURE
        if (ratio >= 1.0 - margin or unsure) and not self.shared.options.drop_slow:
            return True, f"kept: {ratio:.2f}x fp32 latency (drop_slow: false)"
        if ratio >= 1.0 - margin:
            return False, f"dropped: {ratio:.2f}x fp32 latency, not below {1.0 - margin:.2f}x"
        if unsure:
            return False, (
                f"dropped: {ratio:.2f}x fp32 latency, not surely below {1.0 - margin:.2f}x (the rounds left it "
                "on both sides: the original's speed within the noise)"
            )
        if (beaten := self.providers.beaten_by_original(ratio, margin)) is not None:
            return False, beaten
        return True, f"kept: {ratio:.2f}x fp32 latency"

    def annotate(self, proposal: Proposal, outcome: Outcome) -> str | None:
        """A ceiling trial's stage says whether its variant was kept or dropped, and why."""
        variant = self.by_stage.get(proposal.stage)
        if variant is None:
            return None
        self.measure(variant, outcome)
        return self.verdict(variant)[1]
