"""Where trials run. The engine submits trials and collects futures; an executor decides
whether that is in this process, a pool of worker processes, or a cluster.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future

from quantune.engine.runner import TrialRunner
from quantune.engine.trial import Trial, TrialRecord


class Executor(ABC):
    """Runs up to ``capacity`` trials at once."""

    capacity: int = 1

    @abstractmethod
    def submit(self, trial: Trial) -> Future[TrialRecord]: ...

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Releases workers; the in-process executor has none."""


class InProcessExecutor(Executor):
    """Runs each trial in this process, one at a time, when it is submitted."""

    capacity = 1

    def __init__(self, runner: TrialRunner) -> None:
        self.runner = runner

    def submit(self, trial: Trial) -> Future[TrialRecord]:
        future: Future[TrialRecord] = Future()
        future.set_result(self.runner.run(trial))
        return future
