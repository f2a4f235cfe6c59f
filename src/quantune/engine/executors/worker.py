"""The worker side: build the trial runner once per process, then run trials, for the process pool
and Ray tasks alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quantune.config import LoadedConfig
from quantune.engine.trials.runner import TrialRunner
from quantune.engine.trials.trial import Trial

if TYPE_CHECKING:
    from quantune.engine.trials.setup import Given

_RUNNERS: dict[str, TrialRunner] = {}


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to rebuild the run's shared parts (picklable)."""

    loaded: LoadedConfig
    key: str
    eval_threads: int = 0
    sources: dict[str, dict[str, str]] = field(default_factory=dict)  # the engine's (trials/identity.py); checked here
    run_id: str = ""  # this run of the engine: figures it computed ahead (the first guess) are its own work


def runner_for(spec: WorkerSpec, unpack: Callable[[], tuple[LoadedConfig, Given]] | None = None) -> TrialRunner:
    """``spec``'s runner, built by this process's first trial; ``unpack``: the config and the parts
    a worker received to build it from (a cluster node without the engine's files)."""
    runner = _RUNNERS.get(spec.key)
    if runner is None:
        from quantune.engine.trials.identity import check_unchanged
        from quantune.engine.trials.setup import build_run

        loaded, given = unpack() if unpack is not None else (spec.loaded, None)
        parts = build_run(loaded, eval_threads=spec.eval_threads, given=given)
        if spec.sources:  # data or scripts edited since the engine loaded them: never mix them into the run
            check_unchanged(spec.sources, parts.context.sources)
        runner = TrialRunner(parts.context)  # its first evaluation reads the baseline the engine cached
        runner.run_id = spec.run_id
        runner.criterion = parts.criterion  # (the first guess's worker judges its guess: engine/measure/ahead.py)
        _RUNNERS[spec.key] = runner
    return runner


def launch_memory_probe(runner: TrialRunner) -> None:
    """In a worker that evaluates: the memory probe's server started beside its first evaluation."""
    launch = getattr(runner.context.evaluator.backend, "launch_memory_probe", None)
    if launch is not None:
        launch()


def run_trial(spec: WorkerSpec, trial: Trial) -> dict:
    return runner_for(spec).run(trial).to_dict()
