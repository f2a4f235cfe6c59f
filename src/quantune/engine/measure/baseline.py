"""The original model's evaluation, the run's first heavy stage, in a worker like any trial: a model whose evaluation
outgrows the machine must not take the run with it. The figures and reference outputs land in the artifact cache; a
failure ends the run before its output folder is claimed, in one line."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantune import progress
from quantune.engine.executors.stage import Isolation, run_stage
from quantune.engine.trials.limits import limit_source, original_limit
from quantune.engine.trials.runner import TrialRunner
from quantune.errors import ConfigError, QuantuneError
from quantune.evaluate.latency import TimingRequest, latency_figures
from quantune.memory import peak_tracker
from quantune.store import cache_key

STAGE = "baseline_evaluation"
RETIME_ROUNDS = 10  # the fewest ceiling rounds whose timings of the original stand for its latency


def evaluate_original(spec: Any, beside: bool = False) -> dict[str, float]:
    """In the stage worker: the original's figures, computed into the cache (``beside``: see :func:`shared_cores`)."""
    from quantune.engine.executors.worker import launch_memory_probe, runner_for

    runner = runner_for(spec)
    launch_memory_probe(runner)
    if beside:
        shared_cores(runner.context.evaluator)
    metrics, _ = runner.baseline(quick_timing=beside)
    return metrics


def shared_cores(evaluator: Any) -> None:
    """``evaluator`` set for an evaluation beside another one: half the cores, and a quick timing."""
    from quantune.engine.executors.factory import eval_threads_for

    evaluator.threads = eval_threads_for(2)
    evaluator.quick_timing = True


def timed_quickly(ctx: Any) -> bool:
    """Whether the original's cached latency is a quick timing, to be timed again before the run relies on it."""
    cached = ctx.cache.get_json("evals", ctx.eval_key(ctx.model.sha256))
    return bool(cached and cached.get("quick_timing"))


def cached_figures(runner: TrialRunner) -> dict[str, float] | None:
    """The original's figures when the cache holds them and its reference outputs (not read here)."""
    ctx = runner.context
    cached = ctx.cache.get_json("evals", ctx.eval_key(ctx.model.sha256))
    if cached is None or not _reference_file(runner).is_file():
        return None
    return cached["metrics"]


def cached_reference(runner: TrialRunner) -> dict[str, Any] | None:
    """The original's packed outputs once they are cached, else ``None`` (also for a damaged file)."""
    if not _reference_file(runner).is_file():
        return None
    ctx = runner.context
    return ctx.cache.get_arrays(cache_key("reference", ctx.eval_key(ctx.model.sha256)))


def _reference_file(runner: TrialRunner) -> Path:
    ctx = runner.context
    return ctx.cache.root / "outputs" / f"{cache_key('reference', ctx.eval_key(ctx.model.sha256))}.npz"


def original_figures(
    runner: TrialRunner, spec: Any, isolation: Isolation, *, log_dir: Path | None = None, beside: bool = False
) -> tuple[dict[str, float], str]:
    """(the original's figures, ``"hit"`` or ``"miss"``): from the cache, else from a stage worker."""
    if isolation.inline:
        with peak_tracker() as peak:
            metrics, status = runner.baseline()
        if status == "miss":
            isolation.stages.note_peak(STAGE, peak.mb)
        return metrics, status
    ctx = runner.context
    cached = cached_figures(runner)
    if cached is not None:
        return cached, ctx.baseline_status or "hit"
    with tempfile.TemporaryDirectory(prefix="quantune-stage-") as tmp:
        # never unbounded: a metric or loader that hangs on the original ends the run (trials/limits.py)
        limit = original_limit(spec.loaded.config) if isolation.timeout_s is None else isolation.timeout_s
        where = replace(isolation, log_dir=log_dir or Path(tmp), timeout_s=limit)
        outcome = run_stage(STAGE, evaluate_original, spec, beside, isolation=where, reported=True)
    if not outcome.ok and (outcome.error or "").startswith("timeout:"):
        raise QuantuneError(
            f"evaluating the original model was stopped after {limit:g} s ({limit_source(spec.loaded.config)}); "
            "does the metric, runner or data loader ever return?"
        )
    if not outcome.ok:
        raise _failure(outcome.error or "", outcome.log_tail)
    ctx.baseline_status = "miss"
    return outcome.value, "miss"


def evaluation_seconds(ctx: Any) -> float:
    """Seconds one evaluation of the original took (not its timing), 0 when unknown."""
    cached = ctx.cache.get_json("evals", ctx.eval_key(ctx.model.sha256)) or {}
    return float(cached.get("evaluation_s") or 0.0)


def original_costs(ctx: Any) -> tuple[float, float]:
    """(seconds one evaluation of the original took, seconds its timing took), 0 where unknown."""
    cached = ctx.cache.get_json("evals", ctx.eval_key(ctx.model.sha256)) or {}
    return float(cached.get("evaluation_s") or 0.0), float(cached.get("timing_s") or 0.0)


def retime_original(ctx: Any, deadline: float | None = None) -> dict[str, float]:
    """The original's latency timed again here, alone, into its cached figures; the new figures, or none."""
    if ctx.cache.get_json("evals", ctx.eval_key(ctx.model.sha256)) is None:
        return {}
    evaluator = ctx.evaluator
    spec = evaluator.spec
    with progress.stage("original timing"):
        request = TimingRequest((ctx.model.path,), evaluator.latency_feed, spec.latency, spec.runner, deadline=deadline)
        timings = evaluator.backend.time(request)
    return store_original_latency(ctx, timings[0])


def store_original_latency(ctx: Any, timings_s: Any) -> dict[str, float]:
    """The original's latency figures from ``timings_s`` into its cached figures; the figures (none when not cached)."""
    key = ctx.eval_key(ctx.model.sha256)
    cached = ctx.cache.get_json("evals", key)
    if cached is None:
        return {}
    fresh = latency_figures(timings_s)
    ctx.cache.put_json("evals", key, {**cached, "metrics": {**cached["metrics"], **fresh}, "quick_timing": False})
    return fresh


def _failure(error: str, tail: str) -> QuantuneError:
    """The worker's failure as the error the run ends with (a config mistake stays one)."""
    for kind in (ConfigError, QuantuneError):
        prefix = f"{kind.__name__}: "
        if error.startswith(prefix):
            return kind(error[len(prefix) :])
    last = tail.strip().splitlines()[-1] if tail.strip() else ""
    if last.startswith("Extension modules:"):  # the end of a crash report (its site is in the error)
        last = ""
    return QuantuneError(
        f"evaluating the original model failed in its worker: {error}" + (f" (last log line: {last})" if last else "")
    )
