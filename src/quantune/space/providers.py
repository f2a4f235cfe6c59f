"""Which pass outputs an execution provider can run: the provider axis's pruning, known up front.

With ``target.providers`` the provider is a parameter of every flow, so a point is a model *and*
where it runs. Some pairs are known not to work, and are never run:

* a pass that declares the providers its output serves (``Pass.providers``; None: all), such
  as dynamic quantization (its ConvInteger/MatMulInteger kernels exist on the CPU provider only:
  ``dynamic_quant.providers``), read from the pass, never from a list of pass names here;
* a pass's own per-provider value rules (``Pass.provider_rules``);
* the provider-side rules kept here, learned by running: a QOperator model does not load on
  OpenVINO ("dynamic rank", onnxruntime-openvino 1.24.1), and the GPU providers take QDQ only.

What is not known here is learned: a candidate that fails to load on a provider fails with one
line naming the provider, and ``engine/trials/failures.py`` skips the points sharing that failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CPU = "CPUExecutionProvider"
# Providers listed by some builds that do not run a model on this machine.
NOT_LOCAL = {"AzureExecutionProvider": "calls remote endpoints, it runs no model here"}

# Providers that load a quantizer's QDQ layout only (its ``knobs.layout`` at ``knobs.qdq``), whatever
# the pass (OpenVINO: QOperator models fail with "dynamic rank").
QDQ_ONLY = frozenset({"OpenVINOExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"})
# The provider option that sets a provider's own thread pool (it ignores intra_op_num_threads):
# set to the run's thread count, so every provider is timed with the threads the user deploys with.
THREADS_OPTION = {"OpenVINOExecutionProvider": "num_of_threads"}


def refusal(provider: str, pass_cls: Any, config: Mapping[str, Any]) -> str | None:
    """Why ``provider`` cannot run the output of ``pass_cls`` with ``config`` (its resolved
    parameter values), or None when nothing known rules it out."""
    name = getattr(pass_cls, "name", str(pass_cls))
    served = getattr(pass_cls, "providers", None)
    if served is not None and provider not in served:
        return f"{name}'s output runs on {', '.join(served)} only"
    knobs = getattr(pass_cls, "knobs", None)
    qdq = {knobs.layout: (knobs.qdq,)} if provider in QDQ_ONLY and knobs is not None and knobs.layout else {}
    rules = {**qdq, **getattr(pass_cls, "provider_rules", {}).get(provider, {})}
    for param, allowed in rules.items():
        if param in config and config[param] not in allowed:
            return f"{provider} loads {name}.{param} {' or '.join(map(str, allowed))} only, not {config[param]}"
    return None


def short_provider(provider: str) -> str:
    """``OpenVINOExecutionProvider`` -> ``OpenVINO``: for tables and console lines."""
    return provider.removesuffix("ExecutionProvider") or provider
