"""The run loop and its parts: plan, trial runner, executors, output folder."""

from __future__ import annotations

from quantune.engine.engine import Engine, RunListener, RunStatus
from quantune.engine.executors import Executor, InProcessExecutor, ProcessExecutor, create_executor
from quantune.engine.plan import Plan, Step, build_plan
from quantune.engine.runner import RunContext, TrialRunner
from quantune.engine.trial import Trial, TrialRecord

__all__ = [
    "Engine",
    "Executor",
    "InProcessExecutor",
    "Plan",
    "ProcessExecutor",
    "RunContext",
    "RunListener",
    "RunStatus",
    "Step",
    "Trial",
    "TrialRecord",
    "TrialRunner",
    "build_plan",
    "create_executor",
]
