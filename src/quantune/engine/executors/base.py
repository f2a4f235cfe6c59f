"""The executor seam: the engine submits trials and waits on futures; an executor decides
whether a trial runs in this process, in a worker process, or on a cluster node."""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future

from quantune.engine.trials.runner import TrialRunner
from quantune.engine.trials.trial import Trial, TrialRecord


class Executor(ABC):
    """Runs up to ``capacity`` trials at once."""

    capacity: int = 1

    @abstractmethod
    def submit(self, trial: Trial) -> Future[TrialRecord]: ...

    def shutdown(self, *, kill: bool = False) -> None:  # noqa: B027 - optional hook
        """Stops workers (``kill``: at once, abandoning running trials); in-process has none."""


class InProcessExecutor(Executor):
    """Runs each trial in this process when it is submitted: no isolation, no start-up cost.
    For debugging (a breakpoint in a pass works) and for tests."""

    capacity = 1

    def __init__(self, runner: TrialRunner) -> None:
        self.runner = runner

    def submit(self, trial: Trial) -> Future[TrialRecord]:
        from quantune.engine.executors.lifeline import storage_fault

        future: Future[TrialRecord] = Future()
        record = self.runner.run(trial)
        fault = storage_fault(record, self.runner.context.cache.root)
        if fault is not None:  # a full disk stops the run (see lifeline.py)
            future.set_exception(fault)
        else:
            future.set_result(record)
        return future


def failed_record(trial: Trial, error: str, log_tail: str = "") -> TrialRecord:
    """The record of a trial whose worker died or timed out before it could report."""
    record = TrialRecord(trial.number, list(trial.flow), dict(trial.params), "failed", error=error)
    if log_tail:
        record.log_tail = log_tail
    return record
