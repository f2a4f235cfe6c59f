"""What the engine adds to a :class:`SearchProblem` for accuracy-driven strategies.

Kept here, not in the engine, so the engine's edit is one call: the engine hands over its run
context and plan, and gets back the optional SearchProblem fields (the model's path, each
step's pass and fixed parameters, a sensitivity function, the strategy options).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantune.evaluate.sensitivity import SensitivityProbe
from quantune.space import Point
from quantune.strategy.accuracy.context import QUANT_PASSES


def accuracy_fields(
    context: Any, plan: Any, options: Mapping[str, Any] | None = None, isolation: Any = None
) -> dict[str, Any]:
    """SearchProblem fields from the engine's ``RunContext`` and ``Plan`` (duck-typed).

    ``isolation`` (the engine's ``executors.stage.Isolation``) runs the sensitivity analysis
    in a worker process; without it, it runs in this process.
    """
    step_passes = {step_id: step.pass_cls.name for step_id, step in plan.steps.items()}
    step_fixed = {step_id: dict(step.fixed) for step_id, step in plan.steps.items()}
    probes: dict[tuple[str, ...], SensitivityProbe] = {}
    options = dict(options or {})

    def sensitivity(point: Point, flow: tuple[str, ...]) -> Mapping[str, float]:
        quant = next((s for s in flow if step_passes.get(s) in QUANT_PASSES), None)
        if quant is None or context.calibration is None:
            return {}
        probe = probes.get(flow)
        if probe is None:
            probe = probes[flow] = SensitivityProbe(
                model_path=context.model.path,
                model_sha=context.model.sha256,
                flow=tuple(flow),
                quant_step=quant,
                configs_for=lambda p, steps: plan.configs_for(p, steps),
                calibration=context.calibration,
                input_names=list(context.evaluator.input_names),
                batch_size=context.batch_size,
                cache=context.cache,
                rows=int(options.get("sensitivity_rows", 128)),
                dynamic=step_passes.get(quant) == "dynamic_quant",
                isolation=isolation,
            )
        return probe(point)

    return {
        "model_path": context.model.path,
        "step_passes": step_passes,
        "step_fixed": step_fixed,
        "sensitivity": sensitivity,
        "options": options,
    }
