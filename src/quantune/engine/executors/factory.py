"""Builds the executor a config asks for."""

from __future__ import annotations

import os
from pathlib import Path

from quantune.config.schema import ExecutorConfig
from quantune.engine.executors.base import Executor, InProcessExecutor
from quantune.engine.executors.process import ProcessExecutor
from quantune.engine.executors.worker import WorkerSpec
from quantune.engine.trials.limits import TrialLimit, original_evaluation_s, run_cap
from quantune.engine.trials.runner import TrialRunner


def eval_threads_for(workers: int) -> int:
    """Accuracy evaluations share the cores between workers (0: onnxruntime's default)."""
    if workers <= 1:
        return 0
    return max(1, (os.cpu_count() or 1) // workers)


def create_executor(config: ExecutorConfig, spec: WorkerSpec, runner: TrialRunner, output_dir: Path) -> Executor:
    if config.kind == "inline":
        return InProcessExecutor(runner)
    # a default limit, so a metric or loader that never returns cannot hang the run (trials/limits.py)
    limit = TrialLimit(config.trial_timeout_s, lambda: original_evaluation_s(runner), run_cap(spec.loaded.config))
    if config.kind == "ray":
        from quantune.engine.executors.ray_executor import RayExecutor

        return RayExecutor(
            spec,
            runner,
            workers=config.workers,
            address=config.address,
            cpus_per_trial=config.cpus_per_trial,
            gpus_per_trial=config.gpus_per_trial,
            resources=config.resources,
            trial_timeout_s=limit,
            target=config.target,
        )
    return ProcessExecutor(
        spec,
        workers=config.workers,
        log_dir=output_dir / "workers",
        trial_timeout_s=limit,
        memory_limit_mb=config.memory_limit_mb,
        cache_root=runner.context.cache.root,
    )
