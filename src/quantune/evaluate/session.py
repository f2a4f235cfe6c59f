"""One place where evaluation sessions are opened, so every measurement runs a model the same way.

Accuracy runs, latency timing and profiling all open an onnxruntime session here. Where a
model runs -- the execution provider and its options -- and how -- session options a flow
chose (graph optimization level, execution mode, memory pattern) -- are arguments, so a
target provider or a tuned session applies to the original and every candidate alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnxruntime as ort

DEFAULT_PROVIDER = "CPUExecutionProvider"

# Session-option names a config or a pass may set, and how each is applied.
_LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_MODES = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}


def session_options(
    *, threads: int, timing: bool = False, settings: Mapping[str, Any] | None = None
) -> ort.SessionOptions:
    """onnxruntime options for ``threads`` intra-op threads, with ``settings`` applied on top.

    ``timing`` fixes what makes timings comparable between models: one inter-op thread,
    sequential execution and no spinning (an idle spinning pool would eat the other core).
    ``settings`` keys: ``graph_optimization_level`` (disable_all|basic|extended|all),
    ``execution_mode`` (sequential|parallel), ``inter_op_num_threads``, ``enable_mem_pattern``,
    ``enable_cpu_mem_arena``, ``config`` (a dict of session config entries), and
    ``intra_op_num_threads`` (replaces ``threads``: a tuned session chose its own within the budget).
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    if timing:
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for key, value in (settings or {}).items():
        if key == "graph_optimization_level":
            options.graph_optimization_level = _LEVELS[str(value)]
        elif key == "execution_mode":
            options.execution_mode = _MODES[str(value)]
        elif key == "inter_op_num_threads":
            options.inter_op_num_threads = int(value)
        elif key == "enable_mem_pattern":
            options.enable_mem_pattern = bool(value)
        elif key == "enable_cpu_mem_arena":
            options.enable_cpu_mem_arena = bool(value)
        elif key == "intra_op_num_threads":
            options.intra_op_num_threads = int(value)
        elif key == "config":
            for entry, entry_value in dict(value).items():
                options.add_session_config_entry(str(entry), str(entry_value))
        else:
            raise ValueError(f"unknown session setting '{key}'")
    return options


def open_session(
    model: str | Path | bytes,
    *,
    threads: int,
    timing: bool = False,
    settings: Mapping[str, Any] | None = None,
    provider: str = DEFAULT_PROVIDER,
    provider_options: Mapping[str, Any] | None = None,
) -> ort.InferenceSession:
    """A session for ``model`` (a path or serialized bytes) on ``provider``."""
    options = session_options(threads=threads, timing=timing, settings=settings)
    source = model if isinstance(model, bytes) else str(model)
    providers: list[Any] = [provider if not provider_options else (provider, dict(provider_options))]
    if provider != DEFAULT_PROVIDER:
        providers.append(DEFAULT_PROVIDER)  # ops the provider does not take fall back to the CPU
    return ort.InferenceSession(source, options, providers=providers)
