"""``flows: auto``: the flows a zero-knowledge config should try, from the passes it lists.

A user who knows nothing about the model lists the passes (each with ``search: true``) and
lets quantune place them, the way Olive's recipes do:

* every int8 quantizer (``auto_place = "quantize"``: ``static_quant``, ``dynamic_quant``) alone;
* a fusion (``"fuse"``: ``transformer_opt``) alone (fused fp32) and before each quantizer and
  weight pass (fusion, then quantization) -- only when the model is a transformer;
* a weight pass (``"weights"``: ``weight_only``) alone, and before each dynamic quantizer
  (``quantizes = "dynamic"``: ``dynamic_quant``; the MatMuls it leaves float may still go
  int8) -- only when the model has MatMuls with constant weights;
* a half-precision pass (``"half"``: ``fp16``) alone (and after a fusion) -- only when size is
  an objective: on a CPU it rarely makes a model faster, so a latency run would spend its
  trials on it for nothing;
* a refining pass (``"refine"``: ``bias_correction``, ``fast_finetune``) after each static
  quantizer (``quantizes = "static"``): the flows the ``quantune`` strategy's recover stage tries
  before any fallback.

Where a pass goes is its ``auto_place`` trait (:mod:`quantune.passes.base`). "Only when" is
each pass's own :meth:`~quantune.passes.Pass.supports` on the model's facts, for its default
config: a flow the model cannot run is never built (and never sampled). Passes without a
place (graph_opt, cle, smooth_quant, most plugins) need flows written by hand.
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
