"""The run loop and its parts: plan, trial runner, executors, output folder."""

from __future__ import annotations

from quantune.engine.engine import Engine, RunListener
from quantune.engine.executor import Executor, InProcessExecutor
from quantune.engine.plan import Plan, Step, build_plan
from quantune.engine.runner import RunContext, TrialRunner
from quantune.engine.trial import Trial, TrialRecord

__all__ = [
    "Engine",
    "Executor",
    "InProcessExecutor",
    "Plan",
    "RunContext",
    "RunListener",
    "Step",
    "Trial",
    "TrialRecord",
    "TrialRunner",
    "build_plan",
]
