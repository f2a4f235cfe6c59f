"""Trials as Ray tasks, on a cluster (``address``) or on a local Ray started for you.

No node needs the engine's disk (ray_cargo.py), and every model is timed on the engine's
machine or on a target node's lane, the target nodes alike, so the search compares like timings.
A task whose node is lost is retried by Ray.
"""

from __future__ import annotations

import logging
import shutil
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from logging.handlers import BufferingHandler
from typing import Any

from quantune.engine.executors.base import Executor, failed_record
from quantune.engine.executors.ray_cargo import for_nodes, pack, receive, run_shipped, scratch_folder, script_places
from quantune.engine.executors.ray_stage import RayStages, send_stages
from quantune.engine.executors.worker import WorkerSpec
from quantune.engine.trials.limits import TrialLimit
from quantune.engine.trials.ray_env import TaskEnv, hinted
from quantune.engine.trials.ray_target import DRIVER, check_target, target_nodes
from quantune.engine.trials.runner import TrialRunner
from quantune.engine.trials.trial import Trial, TrialRecord
from quantune.errors import DiskFull, QuantuneError

log = logging.getLogger("quantune.ray")

# a task is run again when its node or worker process dies under it (not when the trial raises)
NODE_RETRIES = 1


def ray_logs_to_run_log() -> None:
    """Ray's warnings go to the run's log, not to the console as Python's last resort would print them."""
    ray_log = logging.getLogger("ray")
    ray_log.propagate = True
    if not any(isinstance(handler, logging.NullHandler) for handler in ray_log.handlers):
        ray_log.addHandler(logging.NullHandler())  # no log attached: nowhere, not the console


class RayExecutor(Executor):
    def __init__(
        self,
        spec: WorkerSpec,
        runner: TrialRunner,
        *,
        workers: int = 2,
        address: str | None = None,
        cpus_per_trial: float = 1.0,
        gpus_per_trial: float = 0.0,
        resources: dict[str, float] | None = None,
        trial_timeout_s: float | TrialLimit | None = None,
        target: str = DRIVER,
    ) -> None:
        try:
            import ray
        except ImportError:
            raise QuantuneError(
                "executor.kind: 'ray' needs Ray; install it with: pip install 'quantune[ray]'"
            ) from None
        self._ray = ray
        self._started_here = False
        self._local = not address
        # Ray's start-up lines, for the run's log when Ray starts before it (:meth:`move_logs`)
        self._start_up = BufferingHandler(capacity=1000)
        ray_logs_to_run_log()
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if address:
                kwargs["address"] = address
            else:  # a Ray of its own: not a cluster another program started on this machine ("local")
                kwargs.update(address="local", num_cpus=max(1, int(workers * cpus_per_trial)))
            logging.getLogger().addHandler(self._start_up)
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    ray.init(**kwargs)
                for warning in caught:
                    log.info("ray: %s", warning.message)
            finally:
                logging.getLogger().removeHandler(self._start_up)
            ray_logs_to_run_log()  # (ray.init replaces the ray logger's handlers)
            self._started_here = True
        lanes = 1  # the engine's machine times one model at a time; a named target, one per node
        if target != DRIVER:
            check_target(target)
            lanes = len(target_nodes(target))
        self.capacity = workers
        self.limit = trial_timeout_s if isinstance(trial_timeout_s, TrialLimit) else TrialLimit(trial_timeout_s)
        # each task's resources: a trial's, and a stage's sent to the cluster (ray_stage.py); and the
        # runtime_env the user's scripts need on every node (ray_env.py)
        self._env = TaskEnv(spec.loaded.runtime_env())
        options = {"num_cpus": cpus_per_trial, "num_gpus": gpus_per_trial, "resources": resources or {}}
        options.update(self._env.options)
        self._remote = ray.remote(run_shipped).options(num_returns="streaming", max_retries=NODE_RETRIES, **options)
        self._runner = runner
        self._loaded = spec.loaded
        self._spec = ray.put(for_nodes(spec))
        # the cargo's object reference, put again until the original's outputs are cached
        self._cargo: Any = None
        self._cargo_whole = False
        # the stages whose answer rests on no timing go to the nodes too (ray_stage.py)
        stages = RayStages(
            ray,
            {**options, "max_retries": NODE_RETRIES},
            self._spec,
            self._cargo_ref,
            runner,
            script_places(spec.loaded),
        )
        send_stages(stages)
        # the trials' timings: one at a time per timing node, never beside another timing there
        self._lane = ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="quantune-ray-timing")

    def move_logs(self, _folder: Any) -> None:
        """The run's log has begun (the executor started ahead of it): what was logged while Ray started goes there."""
        for record in self._start_up.buffer:
            logging.getLogger(record.name).handle(record)

    def _cargo_ref(self) -> Any:
        if not self._cargo_whole:
            cargo = pack(self._runner, self._loaded)
            self._cargo, self._cargo_whole = self._ray.put(cargo), cargo.whole
        return self._cargo

    def submit(self, trial: Trial) -> Future[TrialRecord]:
        """The trial as a task; its time limit (read when it starts: the default rests on the original's
        evaluation) counts from the task's word that its trial started (:func:`run_shipped`), as a
        worker process's clock starts once it has the run."""
        ray = self._ray
        task = self._remote.remote(self._spec, [self._cargo_ref()], trial)
        result: Future[TrialRecord] = Future()

        def settle(returned: dict[str, Any]) -> None:
            try:
                result.set_result(receive(self._runner, returned))
            except DiskFull as exc:  # the engine's cache is full: the run stops, as with the other executors
                result.set_exception(exc)
            except Exception as exc:
                error = (
                    f"the engine could not take its model from the Ray worker, or time it: {type(exc).__name__}: {exc}"
                )
                result.set_result(failed_record(trial, error))

        def follow() -> None:
            timer, limit = None, self.limit.seconds()
            try:
                ray.get(next(task))  # the trial started on its node
                if limit is not None:
                    timer = threading.Timer(limit, lambda: ray.cancel(task, force=True))
                    timer.daemon = True
                    timer.start()
                returned = ray.get(next(task))
            except ray.exceptions.TaskCancelledError:
                result.set_result(failed_record(trial, f"timeout: the trial ran longer than {limit:g} s"))
            except ray.exceptions.WorkerCrashedError as exc:
                result.set_result(failed_record(trial, f"worker crashed: {exc}"))
            except Exception as exc:
                cause = getattr(exc, "cause", None) or exc  # what the task raised, without Ray's wrapping
                error = hinted(f"ray task failed: {type(cause).__name__}: {cause}")
                result.set_result(failed_record(trial, error or ""))
            else:
                self._lane.submit(settle, returned)
            finally:
                if timer is not None:
                    timer.cancel()

        threading.Thread(target=follow, name=f"quantune-ray-trial-{trial.number}", daemon=True).start()
        return result

    def shutdown(self, *, kill: bool = False) -> None:
        send_stages(None)
        self._lane.shutdown(wait=not kill, cancel_futures=kill)
        self._env.close()
        if self._started_here:
            node = self._ray.get_runtime_context().get_node_id()
            self._ray.shutdown()
            if self._local:  # the one node was this machine, and its workers are gone: so goes its scratch
                shutil.rmtree(scratch_folder(node), ignore_errors=True)
