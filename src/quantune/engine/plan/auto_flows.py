"""``flows: auto``: the flows a zero-knowledge config should try, from the passes it lists.

Where a pass goes is its ``auto_place`` trait (quantizers alone; a fusion alone and before
them; a weight pass before dynamic quantizers; half precision only when size is an objective;
refining passes after static quantizers), and each pass's ``supports`` on the model's facts
keeps a flow the model cannot run from being built. Passes without a place need hand-written flows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantune.errors import ConfigError
from quantune.passes.registry import PASSES


def auto_flows(steps: Mapping[str, Any], facts: Mapping[str, Any], size_objective: bool) -> list[tuple[str, ...]]:
    """The flows over ``steps`` (step id -> :class:`~quantune.engine.plan.plan.Step`) in a fixed order."""
    other = [step_id for step_id, step in steps.items() if step.pass_cls.auto_place is None]
    if other:
        placed = sorted(name for name, cls in PASSES.registered().items() if cls.auto_place is not None)
        raise ConfigError(
            f"flows: auto places {', '.join(placed)}; write the flows by hand for {other} (a list of lists of step ids)"
        )

    def of(place: str) -> list[str]:
        return [step_id for step_id, step in steps.items() if step.pass_cls.auto_place == place]

    fusions, weights, halves, quantizers = of("fuse"), of("weights"), of("half"), of("quantize")
    dynamic = [q for q in quantizers if steps[q].pass_cls.quantizes == "dynamic"]
    candidates: list[tuple[str, ...]] = [(q,) for q in quantizers]
    static = [q for q in quantizers if steps[q].pass_cls.quantizes == "static"]
    candidates += [(q, r) for q in static for r in of("refine")]
    for fuse in fusions:
        candidates += [(fuse,), *((fuse, q) for q in quantizers), *((fuse, w) for w in weights)]
    for weight in weights:
        candidates += [(weight,), *((weight, q) for q in dynamic)]
    if size_objective:
        candidates += [(half,) for half in halves] + [(fuse, half) for fuse in fusions for half in halves]
    flows = [flow for flow in candidates if _applies(flow, steps, facts)]
    if not flows:
        raise ConfigError(f"flows: auto found no flow of {list(steps)} that this model can run")
    return flows


def _applies(flow: tuple[str, ...], steps: Mapping[str, Any], facts: Mapping[str, Any]) -> bool:
    """Every step accepts the steps before it and supports the model, at its fixed values."""
    upstream: list[tuple[str, Any]] = []
    for step_id in flow:
        step = steps[step_id]
        try:
            config = step.pass_cls.Config.model_validate(dict(step.fixed))
        except ValueError:
            return True  # the space's own pruning decides point by point
        if upstream and not step.pass_cls.accepts(config, upstream):
            return False
        if facts and not step.pass_cls.supports(config, facts, upstream):
            return False
        upstream.append((step.pass_cls.name, config))
    return True
