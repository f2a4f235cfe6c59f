"""Trials as Ray tasks, on a cluster (``address``) or on a local Ray started for you.

Each task declares its resources (CPUs, GPUs, custom resources); workers rebuild the run's
shared parts once per Ray worker process and keep them. Artifacts go to the cache folder,
which every node must be able to read and write (a shared file system path). Latency is
still measured in one exclusive lane per machine (a lock file on each node), so trials that
share a node never time each other.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from quantune.engine.executors.base import Executor, failed_record
from quantune.engine.executors.worker import WorkerSpec, run_trial
from quantune.engine.trial import Trial, TrialRecord
from quantune.errors import QuantuneError


def _task(spec: WorkerSpec, trial: Trial) -> dict:
    return run_trial(spec, trial)


class RayExecutor(Executor):
    def __init__(
        self,
        spec: WorkerSpec,
        *,
        workers: int = 2,
        address: str | None = None,
        cpus_per_trial: float = 1.0,
        gpus_per_trial: float = 0.0,
        resources: dict[str, float] | None = None,
        trial_timeout_s: float | None = None,
    ) -> None:
        try:
            import ray
        except ImportError:
            raise QuantuneError(
                "executor.kind: 'ray' needs Ray; install it with: pip install 'quantune[ray]'"
            ) from None
        self._ray = ray
        self._started_here = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if address:
                kwargs["address"] = address
            else:
                kwargs["num_cpus"] = max(1, int(workers * cpus_per_trial))
            ray.init(**kwargs)
            self._started_here = True
        self.capacity = workers
        self.trial_timeout_s = trial_timeout_s
        self._remote = ray.remote(_task).options(
            num_cpus=cpus_per_trial, num_gpus=gpus_per_trial, resources=resources or {}, max_retries=0
        )
        self._spec = ray.put(spec)

    def submit(self, trial: Trial) -> Future[TrialRecord]:
        ray = self._ray
        ref = self._remote.remote(self._spec, trial)
        result: Future[TrialRecord] = Future()
        timer = None
        if self.trial_timeout_s is not None:
            timer = threading.Timer(self.trial_timeout_s, lambda: ray.cancel(ref, force=True))
            timer.daemon = True
            timer.start()

        def finish(done: Future) -> None:
            if timer is not None:
                timer.cancel()
            try:
                result.set_result(TrialRecord.from_dict(done.result()))
            except ray.exceptions.TaskCancelledError:
                result.set_result(
                    failed_record(trial, f"timeout: the trial ran longer than {self.trial_timeout_s:g} s")
                )
            except ray.exceptions.WorkerCrashedError as exc:
                result.set_result(failed_record(trial, f"worker crashed: {exc}"))
            except Exception as exc:
                result.set_result(failed_record(trial, f"ray task failed: {type(exc).__name__}: {exc}"))

        ref.future().add_done_callback(finish)
        return result

    def shutdown(self, *, kill: bool = False) -> None:
        if self._started_here:
            self._ray.shutdown()
