"""Session settings searched on the winning model/provider pair by paired timing, on the target, and kept only when they
still meet the criterion. OpenVINO's model cache is judged by session creation alone (:func:`cache_effect`)."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantune.evaluate.latency import TimingRequest
from quantune.passes.onnx.session_tuning import LEVELS, MAX_WARMUP, merge_settings, search_groups, settings_copy

ROUNDS = 20
# Provider options that change speed for a fixed thread count, per provider (the first: its default).
OV = "OpenVINOExecutionProvider"
PROVIDER_OPTIONS: dict[str, list[dict[str, str]]] = {
    OV: [{}, {"precision": "ACCURACY"}, {"precision": "FP32"}],
}


def _ov_config(**properties: str) -> str:
    """OpenVINO properties for its CPU device, as the provider's ``load_config`` takes them (JSON)."""
    return json.dumps({"CPU": properties}, sort_keys=True)


def bf16_cpu() -> bool:
    """Whether this CPU has bf16 instructions (where OpenVINO's bf16 inference precision runs fast)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def ov_config_options() -> list[dict[str, str]]:
    """OpenVINO's own properties that change speed at a fixed thread count (the first: none)."""
    options = [{}, {"load_config": _ov_config(ENABLE_CPU_PINNING="YES")}]
    if bf16_cpu():  # fewer bits per activation: may cost accuracy, checked on the whole evaluation data
        options.append({"load_config": _ov_config(INFERENCE_PRECISION_HINT="bf16")})
    return options


def option_groups(provider: str) -> list[list[dict[str, Any]]]:
    """The groups tried in turn (the first option of each: onnxruntime's default)."""
    groups: list[list[dict[str, Any]]] = [
        [{"graph_optimization_level": level} for level in LEVELS],
        [{"execution_mode": mode} for mode in ("sequential", "parallel")],
    ]
    if provider in PROVIDER_OPTIONS:
        groups.append([{"provider_options": options} for options in PROVIDER_OPTIONS[provider]])
    if provider == OV:
        groups.append([{"provider_options": options} for options in ov_config_options()])
    return groups


def search_session(
    evaluator: Any, model: Path, settings: dict[str, Any], provider: str, deadline: float | None = None
) -> dict[str, Any]:
    """The settings for ``model`` from its own, and per group what was timed; no group starts past ``deadline``."""
    spec = evaluator.spec.latency
    spec = replace(spec, warmup=min(spec.warmup, MAX_WARMUP), repeats=ROUNDS)
    request = TimingRequest((), evaluator.latency_feed, spec, evaluator.spec.runner, deadline=deadline)
    with tempfile.TemporaryDirectory(prefix="quantune-session-") as folder:
        chosen, tried = search_groups(
            model, option_groups(provider), settings, request, evaluator.backend.time, Path(folder)
        )
    return {"settings": chosen, "tried": tried}


CACHE_PAIRS = 2  # fresh caches: a first open (compiles, writes) then a cached one (reads), each


def cache_effect(
    evaluator: Any, model: Path, settings: dict[str, Any], deadline: float | None = None
) -> dict[str, Any]:
    """OpenVINO's model cache on ``model``: fresh-cache opens against cached ones, deployed only when always faster."""
    threads = evaluator.spec.latency.threads
    firsts, cached_opens, written = [], [], 0
    with tempfile.TemporaryDirectory(prefix="quantune-session-") as folder:
        evaluator.backend.open_s(settings_copy(model, Path(folder) / "warm", settings), threads)
        for pair in range(CACHE_PAIRS):
            if pair and deadline is not None and time.perf_counter() >= deadline:
                break
            cache = Path(folder) / f"ov_cache-{pair}"
            cached = merge_settings(settings, {"provider_options": {"cache_dir": str(cache)}}, {"cache_dir"})
            took = []
            for index in range(2):  # two copies: a target that keeps a session per path opens each anew
                path = settings_copy(model, Path(folder) / f"cache-{pair}-{index}", cached)
                took.append(evaluator.backend.open_s(path, threads))
            firsts.append(took[0])
            cached_opens.append(took[1])
            written = max(
                written, sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) if cache.is_dir() else 0
            )
    return {
        "first_open_s": round(min(firsts), 4),
        "cached_open_s": round(max(cached_opens), 4),
        "opens": {"first_s": [round(t, 4) for t in firsts], "cached_s": [round(t, 4) for t in cached_opens]},
        "cache_bytes": written,
    }


def evaluate_settings(evaluator: Any, model: Path, settings: dict[str, Any], reference: Any) -> dict[str, float]:
    """``model``'s figures with ``settings`` (all of them, on the whole evaluation data)."""
    with tempfile.TemporaryDirectory(prefix="quantune-session-") as folder:
        path = settings_copy(model, Path(folder) / "chosen", settings)
        figures, _ = evaluator.evaluate(path, reference)
    return figures
