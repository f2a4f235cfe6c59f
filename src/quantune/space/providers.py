"""Which pass outputs an execution provider can run: the provider axis's pruning, known up front.

A point is a model *and* where it runs; pairs known not to work are never run: a pass's own
``providers`` and ``provider_rules``, and the provider-side rules kept here (learned by running).
What is not known is learned: a load failure names the provider, and the points sharing it are
skipped (``engine/trials/failures.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CPU = "CPUExecutionProvider"
# Providers listed by some builds that do not run a model on this machine.
NOT_LOCAL = {"AzureExecutionProvider": "calls remote endpoints, it runs no model here"}

# Providers that load a quantizer's QDQ layout only (its ``knobs.layout`` at ``knobs.qdq``).
QDQ_ONLY = frozenset({"OpenVINOExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"})
# The provider option that sets a provider's own thread pool (it ignores intra_op_num_threads):
# set to the run's thread count, so every provider is timed with the threads the user deploys with.
THREADS_OPTION = {"OpenVINOExecutionProvider": "num_of_threads"}


def refusal(provider: str, pass_cls: Any, config: Mapping[str, Any]) -> str | None:
    """Why ``provider`` cannot run the output of ``pass_cls`` with ``config``, or None."""
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
