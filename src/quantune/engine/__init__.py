"""The run loop and its parts: plan, trial runner, executors, output folder.

Names are imported on first use, so worker processes that need only the trial runner do
not load the search side (Optuna, strategies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantune._lazy import lazy_exports

_EXPORTS = {
    "Engine": "quantune.engine.engine",
    "RunListener": "quantune.engine.loop",
    "RunStatus": "quantune.engine.loop",
    "RunLoop": "quantune.engine.loop",
    "Judge": "quantune.engine.loop",
    "search_problem": "quantune.engine.problem",
    "Executor": "quantune.engine.executors",
    "InProcessExecutor": "quantune.engine.executors",
    "ProcessExecutor": "quantune.engine.executors",
    "create_executor": "quantune.engine.executors",
    "KnownFailures": "quantune.engine.failures",
    "classify_failure": "quantune.engine.failures",
    "run_sources": "quantune.engine.identity",
    "Plan": "quantune.engine.plan",
    "Step": "quantune.engine.plan",
    "build_plan": "quantune.engine.plan",
    "SensitivityProbe": "quantune.engine.sensitivity_probe",
    "ProbeJob": "quantune.engine.sensitivity_probe",
    "run_probe": "quantune.engine.sensitivity_probe",
    "RunContext": "quantune.engine.runner",
    "TrialRunner": "quantune.engine.runner",
    "Trial": "quantune.engine.trial",
    "TrialRecord": "quantune.engine.trial",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports("quantune.engine", _EXPORTS, globals())


if TYPE_CHECKING:  # names for type checkers and IDEs; loaded lazily above
    from quantune.engine.engine import Engine  # noqa: F401
    from quantune.engine.executors import Executor, InProcessExecutor, ProcessExecutor, create_executor  # noqa: F401
    from quantune.engine.failures import KnownFailures, classify_failure  # noqa: F401
    from quantune.engine.identity import run_sources  # noqa: F401
    from quantune.engine.loop import Judge, RunListener, RunLoop, RunStatus  # noqa: F401
    from quantune.engine.plan import Plan, Step, build_plan  # noqa: F401
    from quantune.engine.problem import search_problem  # noqa: F401
    from quantune.engine.runner import RunContext, TrialRunner  # noqa: F401
    from quantune.engine.sensitivity_probe import ProbeJob, SensitivityProbe, run_probe  # noqa: F401
    from quantune.engine.trial import Trial, TrialRecord  # noqa: F401
