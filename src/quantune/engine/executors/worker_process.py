"""One trial worker process: its own log file and memory limit, the run rebuilt once, then one trial
at a time over a pipe."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import sys
import threading
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path

from quantune.engine.executors.base import failed_record
from quantune.engine.executors.contexts import child_environment
from quantune.engine.executors.crashsite import crash_site, log_since
from quantune.engine.executors.exits import (
    START_ATTEMPTS,
    STARTUP_TIMEOUT_S,
    TAIL_LINES,
    ExecutorClosed,
    WorkerStartError,
    exit_cause,
)
from quantune.engine.executors.worker import WorkerSpec
from quantune.engine.trials.trial import Trial, TrialRecord
from quantune.forkserver import worker_context


def _worker_main(
    conn: Connection,
    spec: WorkerSpec,
    memory_limit_mb: int | None,
    log_path: str,
    parent_pid: int | None = None,
    environment: dict[str, str] | None = None,
) -> None:
    from quantune.engine.executors.contexts import adopt_environment
    from quantune.engine.executors.lifeline import enter_worker

    adopt_environment(environment)
    enter_worker(log_path, memory_limit_mb, parent_pid)
    from quantune.engine.executors.base import failed_record
    from quantune.engine.executors.worker import launch_memory_probe, run_trial, runner_for

    try:  # build the run's shared parts before any trial's clock starts
        launch_memory_probe(runner_for(spec))
        conn.send(("ready", ""))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    while True:
        try:
            trial = conn.recv()
        except EOFError:
            return
        if trial is None:
            return
        if isinstance(trial, tuple) and trial[0] == "log":  # the run's output folder is claimed: log there
            _log_to(trial[1])
            continue
        with contextlib.suppress(OSError):  # a full disk under the log is the engine's to report
            print(f"--- trial {trial.number} ---", flush=True)
        try:
            record = run_trial(spec, trial)
        except Exception as exc:  # e.g. the worker cannot rebuild the run (a pass defined outside plugins)
            record = failed_record(trial, f"worker could not run the trial: {type(exc).__name__}: {exc}").to_dict()
        error = record.get("error") or ""
        if memory_limit_mb and any(sign in error for sign in ("MemoryError", "bad_alloc", "Failed to allocate")):
            record["error"] = f"out of memory (memory limit {memory_limit_mb} MB): {error}"
        conn.send(record)


def _log_to(path: str) -> None:
    """This worker's output and faults go to ``path`` from now on (``ProcessExecutor.move_logs``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class WorkerProcess:
    """One worker process, started and stopped by its slot thread or (at shutdown) by the engine;
    once ``closed`` no new process starts, so a racing shutdown leaves nothing running."""

    def __init__(self, index: int, spec: WorkerSpec, log_dir: Path, memory_limit_mb: int | None) -> None:
        self.index = index
        self.spec = spec
        self.memory_limit_mb = memory_limit_mb
        self.log_path = log_dir / f"worker-{index}.log"
        self._moved_log: str | None = None  # to tell the running process (move_log)
        self.process: mp.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.closed = False
        self._lock = threading.Lock()

    def ensure_started(self) -> None:
        """Starts the worker unless it runs; one killed by a signal while starting is started again, up to
        ``START_ATTEMPTS`` times, one that exits by itself fails the start at once."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start()
                return
            except WorkerStartError as exc:
                if exc.exit_code is None or exc.exit_code >= 0 or attempt == START_ATTEMPTS:
                    raise

    def _start(self) -> None:
        offset = self.log_offset()
        with self._lock:
            if self.closed:
                raise ExecutorClosed()
            if self.process is not None and self.process.is_alive():
                return
            ctx = worker_context()
            parent, child = ctx.Pipe()
            process = ctx.Process(
                target=_worker_main,
                args=(child, self.spec, self.memory_limit_mb, str(self.log_path), os.getpid(), child_environment()),
                daemon=True,
                name=f"quantune-worker-{self.index}",
            )
            process.start()
            child.close()
            self.process, self.conn = process, parent
            self._moved_log = None  # started on the current path
        # Wait for the worker to build the run (not part of any trial's time); a failure says why later.
        try:
            ready = wait([parent, process.sentinel], timeout=STARTUP_TIMEOUT_S)
        except (OSError, ValueError):  # the pipe was closed under us: only a shutdown does that
            ready = []
        if self.closed:
            raise ExecutorClosed()
        if parent in ready:
            with contextlib.suppress(EOFError, OSError):
                parent.recv()
                return
        if process.sentinel in ready:
            process.join(timeout=5)
            tail = self.tail(offset)
            self.stop(kill=True)
            raise WorkerStartError(self.index, process.exitcode, tail)

    def log_offset(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def tail(self, offset: int) -> str:
        return "\n".join(log_since(self.log_path, offset).strip().splitlines()[-TAIL_LINES:])

    def stop(self, *, kill: bool = False) -> None:
        with self._lock:
            process, conn = self.process, self.conn
            self.process = self.conn = None
        if process is None:
            return
        if not kill and conn is not None:
            with contextlib.suppress(OSError):
                conn.send(None)
            process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
        if conn is not None:
            conn.close()

    def close(self, *, kill: bool = False) -> None:
        """Stops the worker for good: a slot thread still starting one gives up."""
        self.closed = True
        self.stop(kill=kill)

    def move_log(self, path: Path) -> None:
        """The log continues at ``path``: copied there now, the process told before its next trial."""
        with self._lock:
            with contextlib.suppress(OSError):
                shutil.copyfile(self.log_path, path)
            self.log_path = path
            self._moved_log = str(path) if self.process is not None else None

    def run(self, trial: Trial, timeout_s: float | None, note: str = "") -> TrialRecord:
        self.ensure_started()
        assert self.process is not None and self.conn is not None
        if self._moved_log is not None:
            with contextlib.suppress(OSError):  # a dead pipe: the trial's send below restarts the worker
                self.conn.send(("log", self._moved_log))
            self._moved_log = None
        offset = self.log_offset()
        try:
            self.conn.send(trial)
        except OSError:
            self.stop(kill=True)
            self.ensure_started()
            assert self.conn is not None
            self.conn.send(trial)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait([self.conn, self.process.sentinel], timeout=remaining)
            if self.conn in ready:
                try:
                    return TrialRecord.from_dict(self.conn.recv())
                except (EOFError, OSError):
                    pass  # the worker died while answering: fall through to its exit status
            if ready:
                self.process.join(timeout=5)
                cause = exit_cause(self.process.exitcode) + crash_site(log_since(self.log_path, offset))
                tail = self.tail(offset)
                self.stop(kill=True)
                return failed_record(trial, f"worker crashed: {cause}", tail)
            if deadline is not None and time.monotonic() >= deadline:
                tail = self.tail(offset)
                self.stop(kill=True)
                error = f"timeout: the trial ran longer than {timeout_s:g} s and was killed{note}"
                return failed_record(trial, error, tail)
