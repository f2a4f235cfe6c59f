"""Quark's two-stage search: calibration settings first, then everything else from the best, in ``a + b`` trials instead
of ``a * b``, each second-stage trial reusing the cached calibration ranges."""

from __future__ import annotations

from quantune.strategy.accuracy.common import AccuracyStrategy
from quantune.strategy.accuracy.staged import Stages
from quantune.strategy.options import TwoStageOptions
from quantune.strategy.registry import register_strategy


@register_strategy("two_stage")
class TwoStageStrategy(AccuracyStrategy):
    """Stages: ``calibration`` (a sampler over the quant pass's calibration knobs, the rest at defaults;
    ``calibration_trials`` trials, default half of ``stop.max_trials``) -> ``rest`` (a sampler over the other parameters
    with the best calibration fixed)."""

    name = "two_stage"
    Options = TwoStageOptions
    options: TwoStageOptions

    def stages(self) -> Stages:
        params = list(self.ctx.quant_params())
        calibration = [p for p in params if p.split(".", 1)[1] in self.ctx.knobs.calibration]
        rest = [p for p in params if p not in calibration]
        base = self.ctx.base_point()
        budget = self.remaining() if self.problem.max_trials is not None else 16
        first = self.options.calibration_trials if self.options.calibration_trials is not None else max(1, budget // 2)
        tried = yield from self.stage_sampler(base, first, "calibration", calibration)
        if not tried:
            outcome = yield from self.try_point(base, "calibration")
            tried = [(base, outcome)]
        best = self.pick(tried)
        chosen = best[0] if best is not None else base
        fixed = {**base, **{k: v for k, v in chosen.items() if k in calibration}}
        yield from self.stage_sampler(fixed, max(1, self.remaining()), "rest", rest)
