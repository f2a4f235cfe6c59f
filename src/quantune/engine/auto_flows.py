"""``flows: auto``: the flows a zero-knowledge config should try, from the passes it lists.

A user who knows nothing about the model lists the passes (each with ``search: true``) and
lets quantune place them, the way Olive's recipes do:

* every int8 quantizer (``static_quant``, ``dynamic_quant``) alone;
* ``transformer_opt`` alone (fused fp32) and before each quantizer and ``weight_only``
  (fusion, then quantization) -- only when the model is a transformer;
* ``weight_only`` alone, and before ``dynamic_quant`` (the MatMuls it leaves float may still
  go int8) -- only when the model has MatMuls with constant weights;
* ``bias_correction`` and ``fast_finetune`` each after ``static_quant`` (the flows the
  ``quantune`` strategy's recover stage tries before any fallback);
* ``fp16`` alone (and after ``transformer_opt``) -- only when size is an objective: on a CPU
  it rarely makes a model faster, so a latency run would spend its trials on it for nothing.

"Only when" is each pass's own :meth:`~quantune.passes.Pass.supports` on the model's facts,
for its default config: a flow the model cannot run is never built (and never sampled).
Other passes (graph_opt, cle, smooth_quant, plugins) need flows written by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantune.errors import ConfigError

QUANTIZERS = ("static_quant", "dynamic_quant")
REFINERS = ("bias_correction", "fast_finetune")  # after static_quant: the recover stage's flows
PLACED = (*QUANTIZERS, "transformer_opt", "weight_only", "fp16", *REFINERS)


def auto_flows(steps: Mapping[str, Any], facts: Mapping[str, Any], size_objective: bool) -> list[tuple[str, ...]]:
    """The flows over ``steps`` (step id -> :class:`~quantune.engine.plan.Step`) in a fixed order."""
    other = [step_id for step_id, step in steps.items() if step.pass_cls.name not in PLACED]
    if other:
        raise ConfigError(
            f"flows: auto places {', '.join(PLACED)}; write the flows by hand for {other} (a list of lists of step ids)"
        )

    def of(name: str) -> list[str]:
        return [step_id for step_id, step in steps.items() if step.pass_cls.name == name]

    fusions, weights, halves = of("transformer_opt"), of("weight_only"), of("fp16")
    quantizers = [step_id for step_id, step in steps.items() if step.pass_cls.name in QUANTIZERS]
    candidates: list[tuple[str, ...]] = [(q,) for q in quantizers]
    candidates += [(q, r) for q in of("static_quant") for name in REFINERS for r in of(name)]
    for fuse in fusions:
        candidates += [(fuse,), *((fuse, q) for q in quantizers), *((fuse, w) for w in weights)]
    for weight in weights:
        candidates += [(weight,), *((weight, q) for q in of("dynamic_quant"))]
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
