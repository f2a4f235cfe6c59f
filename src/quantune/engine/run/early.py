"""A process executor's trial workers, or a Ray executor, started before the output folder is claimed, so they
build the run while the original is evaluated (a Ray executor before the builds ahead of the speed ceilings, which
then go to its nodes); a run that fails first stops them."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from quantune.engine.executors import Executor, WorkerSpec, create_executor
from quantune.engine.trials.runner import TrialRunner
from quantune.evaluate._exchange import scratch_root


class EarlyWorkers:
    def __init__(self) -> None:
        self.executor: Executor | None = None  # started, not yet taken by the run
        self.scratch: Path | None = None  # their first logs' folder

    def start(self, executor_config: Any, parts: Any, spec: WorkerSpec) -> None:
        """Starts them now, for a process or Ray executor only."""
        if executor_config.kind not in ("process", "ray"):
            return
        self.scratch = Path(tempfile.mkdtemp(prefix="quantune-workers-", dir=scratch_root()))
        self.executor = create_executor(executor_config, spec, TrialRunner(parts.context), self.scratch)

    def take(self, output_dir: Path) -> Executor | None:
        """The workers, their logs moved to ``output_dir``/workers (``None``: none were started)."""
        executor, self.executor = self.executor, None
        if executor is not None and hasattr(executor, "move_logs"):
            executor.move_logs(output_dir / "workers")
        return executor

    def stop(self) -> None:
        """The workers stopped, when the run did not take them (it failed first), and their scratch folder gone."""
        executor, self.executor = self.executor, None
        if executor is not None:
            executor.shutdown(kill=True)
        if self.scratch is not None:  # (the path stays named: a second stop removes nothing)
            shutil.rmtree(self.scratch, ignore_errors=True)
