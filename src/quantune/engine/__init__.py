"""The engine by job, each subpackage importing only those listed after it: ``run`` (the run,
its phases and the loop), ``outcome`` (the verdict and the files written), ``measure`` (the
original's figures, probes, paired timings, the confirmation), ``executors`` (where trials and
stages run), ``trials`` (a trial and its runner), ``plan`` (config to steps, flows and space).

Names are imported on first use, so worker processes that need only the trial runner do
not load the search side (Optuna, strategies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantune._lazy import lazy_exports

_EXPORTS = {
    "Engine": "quantune.engine.run.engine",
    "RunListener": "quantune.engine.run.loop",
    "RunStatus": "quantune.engine.run.loop",
    "RunLoop": "quantune.engine.run.loop",
    "Judge": "quantune.engine.run.loop",
    "search_problem": "quantune.engine.run.problem",
    "Executor": "quantune.engine.executors",
    "InProcessExecutor": "quantune.engine.executors",
    "ProcessExecutor": "quantune.engine.executors",
    "create_executor": "quantune.engine.executors",
    "KnownFailures": "quantune.engine.trials.failures",
    "classify_failure": "quantune.engine.trials.failures",
    "run_sources": "quantune.engine.trials.identity",
    "Plan": "quantune.engine.plan.plan",
    "Step": "quantune.engine.plan.plan",
    "build_plan": "quantune.engine.plan.plan",
    "SensitivityProbe": "quantune.engine.measure.sensitivity_probe",
    "ProbeJob": "quantune.engine.measure.sensitivity_probe",
    "run_probe": "quantune.engine.measure.sensitivity_probe",
    "RunContext": "quantune.engine.trials.runner",
    "TrialRunner": "quantune.engine.trials.runner",
    "Trial": "quantune.engine.trials.trial",
    "TrialRecord": "quantune.engine.trials.trial",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports("quantune.engine", _EXPORTS, globals())


if TYPE_CHECKING:  # names for type checkers and IDEs; loaded lazily above
    from quantune.engine.executors import Executor, InProcessExecutor, ProcessExecutor, create_executor  # noqa: F401
    from quantune.engine.measure.sensitivity_probe import ProbeJob, SensitivityProbe, run_probe  # noqa: F401
    from quantune.engine.plan.plan import Plan, Step, build_plan  # noqa: F401
    from quantune.engine.run.engine import Engine  # noqa: F401
    from quantune.engine.run.loop import Judge, RunListener, RunLoop, RunStatus  # noqa: F401
    from quantune.engine.run.problem import search_problem  # noqa: F401
    from quantune.engine.trials.failures import KnownFailures, classify_failure  # noqa: F401
    from quantune.engine.trials.identity import run_sources  # noqa: F401
    from quantune.engine.trials.runner import RunContext, TrialRunner  # noqa: F401
    from quantune.engine.trials.trial import Trial, TrialRecord  # noqa: F401
