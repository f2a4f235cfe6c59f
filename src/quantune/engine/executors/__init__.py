"""Where trials run: in this process, in isolated worker processes, or on a Ray cluster."""

from __future__ import annotations

from quantune.engine.executors.base import Executor, InProcessExecutor
from quantune.engine.executors.factory import create_executor
from quantune.engine.executors.process import ProcessExecutor
from quantune.engine.executors.worker import WorkerSpec

__all__ = ["Executor", "InProcessExecutor", "ProcessExecutor", "WorkerSpec", "create_executor"]
