"""Isolated worker processes: a crash, a hang or a memory blow-up fails one trial, not the run.

Each worker serves one trial at a time over a pipe with its own log file; a thread per worker
waits on the pipe and the process, so a death or a timeout becomes a failed record and a fresh
worker. Workers ignore SIGINT and SIGTERM (stopping them is the engine's job), and a full disk
stops the run with :class:`~quantune.errors.DiskFull` instead of failing trials.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from pathlib import Path

from quantune.engine.executors.base import Executor, failed_record
from quantune.engine.executors.exits import ExecutorClosed, WorkerStartError
from quantune.engine.executors.lifeline import storage_fault
from quantune.engine.executors.worker import WorkerSpec
from quantune.engine.executors.worker_process import WorkerProcess
from quantune.engine.trials.limits import TrialLimit
from quantune.engine.trials.trial import Trial, TrialRecord

__all__ = ["ExecutorClosed", "ProcessExecutor", "WorkerStartError"]


class ProcessExecutor(Executor):
    """``workers`` isolated processes; each trial gets ``trial_timeout_s`` and ``memory_limit_mb``."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        workers: int = 1,
        log_dir: Path,
        trial_timeout_s: float | TrialLimit | None = None,
        memory_limit_mb: int | None = None,
        cache_root: Path | None = None,
    ) -> None:
        """``cache_root``: the cache whose full disk turns a failed trial into :class:`DiskFull`."""
        self.capacity = workers
        self.cache_root = cache_root
        self.log_dir = log_dir
        self.limit = trial_timeout_s if isinstance(trial_timeout_s, TrialLimit) else TrialLimit(trial_timeout_s)
        log_dir.mkdir(parents=True, exist_ok=True)
        self._queue: queue.Queue[tuple[Trial, Future[TrialRecord]] | None] = queue.Queue()
        self._workers = [WorkerProcess(index, spec, log_dir, memory_limit_mb) for index in range(workers)]
        self._threads = [
            threading.Thread(target=self._serve, args=(worker,), daemon=True, name=f"quantune-slot-{worker.index}")
            for worker in self._workers
        ]
        for thread in self._threads:
            thread.start()

    def _serve(self, worker: WorkerProcess) -> None:
        fatal: WorkerStartError | None = None
        try:
            worker.ensure_started()  # start up while the engine measures the original model
        except WorkerStartError as exc:
            fatal = exc
        except ExecutorClosed:
            pass  # shut down while starting: what is left in the queue ends below
        except Exception as exc:  # no process could be started at all (e.g. out of file handles)
            fatal = WorkerStartError(worker.index, None, "", cause=f"{type(exc).__name__}: {exc}")
        while True:
            item = self._queue.get()
            if item is None:
                return
            trial, future = item
            if not future.set_running_or_notify_cancel():
                continue
            if fatal is not None:  # no trial can run: the engine stops the run with this error
                future.set_exception(fatal)
                continue
            try:
                record = worker.run(trial, self.limit.seconds(), self.limit.note())
                fault = storage_fault(record, self.cache_root, self.log_dir)
                if fault is not None:  # the disk, not the trial: the engine stops the run with it
                    future.set_exception(fault)
                else:
                    future.set_result(record)
            except WorkerStartError as exc:  # a replacement worker died while starting
                fatal = exc
                future.set_exception(exc)
            except BaseException as exc:  # never leave the engine waiting on a future
                future.set_result(failed_record(trial, f"executor error: {type(exc).__name__}: {exc}"))

    def move_logs(self, log_dir: Path) -> None:
        """The workers' logs continue in ``log_dir`` (they log to a scratch folder until the output folder
        is claimed)."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        for worker in self._workers:
            worker.move_log(log_dir / worker.log_path.name)

    def submit(self, trial: Trial) -> Future[TrialRecord]:
        future: Future[TrialRecord] = Future()
        self._queue.put((trial, future))
        return future

    def shutdown(self, *, kill: bool = False) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for worker in self._workers:
            if kill:
                worker.close(kill=True)
        for thread in self._threads:
            thread.join(timeout=0 if kill else None)
        for worker in self._workers:
            worker.close(kill=kill)
