"""The quantune strategy's first trial: the likeliest speed ceiling, evaluated before any is timed, beside the
original's evaluation (its requests are declared ahead: :meth:`FirstGuess.first_requests`)."""

from __future__ import annotations

import logging

from quantune.strategy.accuracy.ceilings import CeilingStage
from quantune.strategy.accuracy.common import Step
from quantune.strategy.accuracy.latency_stage import LatencyStage
from quantune.strategy.accuracy.provider_ceilings import ProviderCeilings
from quantune.strategy.accuracy.shared import FirstRequests, Shared
from quantune.strategy.accuracy.speed import Variant, likeliest, stand_in

log = logging.getLogger("quantune.strategy")


class FirstGuess:
    """The first guess (``shared.guess``) and what the engine builds and evaluates ahead for it."""

    def __init__(
        self, shared: Shared, latency: LatencyStage, providers: ProviderCeilings, ceilings: CeilingStage
    ) -> None:
        self.shared, self.run, self.latency = shared, shared.run, latency
        self.providers, self.ceilings = providers, ceilings

    def _prepare(self) -> Variant | None:
        """The first guess set up: its context, the static ceilings on stand-ins, its lighter models; None if none."""
        wanted = self.shared.options.first_guess
        if wanted is None:
            wanted = self.run.problem.evaluates_ahead
        if not wanted or self.run.problem.objective != "latency":
            return None
        guess = likeliest(self.ceilings.ceiling_variants())
        if guess is None:
            return None
        self.shared.guess = guess
        self.run.ctx = guess.ctx
        self._stand_ins(guess)
        self.shared.build_ahead = self.latency.lighter_items(guess) if self.run.problem.evaluates_ahead else []
        self.shared.evaluate_ahead = self.shared.build_ahead[-1:]  # compute only
        return guess

    def first_requests(self) -> FirstRequests:
        """What the stages ask first (:data:`.shared.FirstRequests`); nothing when no ceiling is timed."""
        guess, problem = self._prepare(), self.run.problem
        variants = self.ceilings.ceiling_variants()
        if problem.objective != "latency" or not variants:
            return [], None, None, []
        items = [*self.providers.original_items(), *((v.timing_point, v.ctx.flow) for v in variants)]
        budget = self.shared.options.ceiling_share * problem.timeout_s if problem.timeout_s else None
        point = None if guess is None else self.run.complete(guess.point)
        if point is None or not self.run.ctx.valid(point):
            return items, budget, None, []
        items += [item for item in self.shared.build_ahead if item not in items]
        return items, budget, (point, self.run.flow_of(point)), list(self.shared.evaluate_ahead)

    def stage(self) -> Step:
        """Stage: the likeliest ceiling (:func:`.speed.likeliest`), evaluated before any is timed; its variant."""
        guess = self._prepare()
        if guess is None:
            return None
        outcome = yield from self.run.try_point(guess.point, f"first guess: {guess.label}")
        if self.shared.evaluate_ahead and not outcome.meets and not outcome.failed:
            yield from self.run.try_point(self.shared.evaluate_ahead[0][0], f"first guess: {guess.label}, compute only")
        return guess

    def _stand_ins(self, guess: Variant) -> None:
        """Static ceilings timed on stand-ins when the guess does not calibrate (``stand_ins: false``: never)."""
        if not self.shared.options.stand_ins or stand_in(guess.ctx, guess.point) is not None:
            return
        for variant in self.ceilings.ceiling_variants():
            if variant is not guess:
                variant.timed = stand_in(variant.ctx, variant.point)
        if any(variant.timed is not None for variant in self.shared.variants):
            log.info(
                "quantune strategy: the static ceilings are timed on models calibrated on two rows (the same "
                "graphs: scales only differ); a static variant is calibrated in full when it is tried"
            )
