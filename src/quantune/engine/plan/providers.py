"""``target.providers``: the execution provider as a search axis, resolved and wired into the plan.

``auto`` becomes the providers that really run here (each opened on a tiny model; one that
falls back to the CPU is skipped with its reason). The list becomes an ``execution_provider``
step searched like any parameter; the original on ``target.provider`` stays the reference.
"""

from __future__ import annotations

import glob
import logging
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from quantune.config import LoadedConfig, PassEntry
from quantune.engine.plan.step import FLOW, Step
from quantune.errors import ConfigError, TrialError
from quantune.evaluate.backend import Backend, LocalBackend
from quantune.evaluate.session import open_session
from quantune.evaluate.target_client import TargetFault
from quantune.passes.onnx.execution_provider import STEP_ID, ExecutionProvider
from quantune.space.providers import CPU, NOT_LOCAL, THREADS_OPTION, refusal

log = logging.getLogger("quantune.providers")

PASS_NAME = ExecutionProvider.name


def provider_step(steps: Mapping[str, Step]) -> str | None:
    """The id of the plan's provider step, when the run searches providers."""
    return next((sid for sid, step in steps.items() if step.pass_cls.role == "provider"), None)


def resolve_providers(loaded: LoadedConfig, backend: Backend) -> tuple[list[str], dict[str, str]]:
    """The providers the run searches, and each one left out with why (``auto``); the reference
    provider first. A provider named in a list that cannot run here is a config error."""
    target = loaded.config.target
    wanted = target.providers
    available = list(backend.describe().get("providers_available") or [])
    named = available if wanted == "auto" else list(wanted or [])
    chosen = [target.provider]
    skipped: dict[str, str] = {}
    for provider in named:
        if provider in chosen:
            continue
        why = _cannot_run(backend, provider, available)
        if why is None:
            chosen.append(provider)
        elif wanted == "auto":
            skipped[provider] = why
            log.info("target.providers: %s skipped: %s", provider, why)
        else:
            raise ConfigError(f"target.providers: '{provider}' cannot run here: {why}")
    return chosen, skipped


def with_provider_axis(loaded: LoadedConfig, backend: Backend) -> tuple[LoadedConfig, dict[str, str]]:
    """``loaded`` with the provider step added (and ``target.providers`` resolved to a list), or
    as it is when the config does not search providers. Also returns the providers skipped."""
    config = loaded.config
    if config.target.providers is None or any(entry.name == PASS_NAME for entry in config.passes):
        return loaded, {}
    providers, skipped = resolve_providers(loaded, backend)
    threads = str(config.target.threads or config.evaluation.latency.threads)
    options = {p: {THREADS_OPTION[p]: threads} for p in providers if p in THREADS_OPTION}
    options[config.target.provider] = {str(k): str(v) for k, v in config.target.provider_options.items()}
    params: dict[str, Any] = {"options_by_provider": {p: o for p, o in options.items() if o}}
    params["reference"] = config.target.provider
    params["provider"] = {"search": providers} if len(providers) > 1 else providers[0]
    entry = PassEntry(name=PASS_NAME, id=STEP_ID, params=params)
    target = config.target.model_copy(update={"providers": providers})
    expanded = config.model_copy(update={"passes": [*config.passes, entry], "target": target})
    return LoadedConfig(expanded, loaded.base_dir, loaded.source), skipped


def provider_rule(
    steps: Mapping[str, Step], flows: Mapping[str, tuple[str, ...]], reference: str
) -> Callable[[Mapping[str, Any]], bool]:
    """A plan rule: a point whose flow makes a model its provider cannot load never runs, nor the
    original on the reference provider (that is the original)."""
    step_id = provider_step(steps)
    assert step_id is not None

    def allowed(values: Mapping[str, Any]) -> bool:
        provider = values.get(f"{step_id}.provider", reference)
        flow = flows[values[FLOW]] if FLOW in values else next(iter(flows.values()))
        if flow == (step_id,) and provider == reference:
            return False
        for sid in flow:
            config = {key.partition(".")[2]: value for key, value in values.items() if key.startswith(f"{sid}.")}
            if refusal(provider, steps[sid].pass_cls, config) is not None:
                return False
        return True

    return allowed


def _cannot_run(backend: Backend, provider: str, available: list[str]) -> str | None:
    """Why ``provider`` cannot run a model in the target environment, or None."""
    if provider in NOT_LOCAL:
        return NOT_LOCAL[provider]
    if provider not in available:
        return f"not in the target environment's onnxruntime (it has {', '.join(available)})"
    if provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider") and not glob.glob("/dev/nvidia[0-9]*"):
        return "no NVIDIA GPU device on this machine (/dev/nvidia0 absent)"
    return None if provider == CPU else _probe(backend, provider)


def _probe(backend: Backend, provider: str) -> str | None:
    """Opens a one-node model on ``provider``: None when it takes it, else onnxruntime's reason (one line)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with tempfile.TemporaryDirectory(prefix="quantune-probe-") as folder:
        path = Path(folder) / "probe.onnx"
        onnx.save(model, str(path))
        settings = {"provider": provider}
        try:
            if isinstance(backend, LocalBackend):
                used = open_session(path, threads=1, settings=settings).get_providers()
                if not used or used[0] != provider:
                    return f"onnxruntime put a session on {used}, not on {provider}"
            else:
                feed = {"x": np.zeros((1, 4), np.float32)}
                backend.outputs(path, [feed], threads=1, runner=None, settings=settings)
        except (TrialError, TargetFault, RuntimeError, ValueError) as exc:
            return " ".join(str(exc).split())[:300]
    return None
