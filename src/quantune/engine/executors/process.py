"""Isolated worker processes: a crash, a hang or a memory blow-up fails one trial, not the run.

Each worker is a spawned process serving one trial at a time over a pipe, with its stdout
and stderr (including onnxruntime's native logs and faulthandler's report of a segfault)
going to its own log file, and an address-space limit when ``memory_limit_mb`` is set.
A thread per worker waits on the pipe and the process at once: when the process dies or
the trial's time runs out, the trial is recorded as failed with its cause and the tail of
the log, and a fresh worker takes the next trial. Workers die with the run (lifeline.py), ignore
SIGINT and SIGTERM (stopping them is the engine's job: a signal to the whole process group
must not turn running trials into failed ones), and a trial failed by a full disk stops the
run with :class:`~quantune.errors.DiskFull` rather than being recorded.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from pathlib import Path

from quantune.engine.executors.base import Executor, failed_record
from quantune.engine.executors.contexts import child_environment, worker_context
from quantune.engine.executors.crashsite import crash_site, log_since
from quantune.engine.executors.lifeline import storage_fault
from quantune.engine.executors.limits import TrialLimit
from quantune.engine.executors.worker import WorkerSpec
from quantune.engine.trial import Trial, TrialRecord
from quantune.errors import QuantuneError

_SIGNALS = {
    signal.SIGSEGV: "segmentation fault (SIGSEGV)",
    signal.SIGABRT: "abort (SIGABRT)",
    signal.SIGKILL: "killed (SIGKILL: out-of-memory killer or external kill)",
    signal.SIGBUS: "bus error (SIGBUS)",
    signal.SIGFPE: "floating point exception (SIGFPE)",
    signal.SIGTERM: "terminated (SIGTERM)",
}
_TAIL_LINES = 20
_STARTUP_TIMEOUT_S = 600
_START_ATTEMPTS = 3
# a worker found the user's script calling quantune.tune() at its top level (a code no script
# would use: a metric's os._exit(3) was once taken for it)
_EXIT_UNGUARDED_MAIN = 89


def exit_cause(code: int | None) -> str:
    """A dead worker's exit status in words: the signal that killed it, or its exit code."""
    if code is not None and code < 0:
        return _SIGNALS.get(-code, f"killed by signal {-code}")
    if code == _EXIT_UNGUARDED_MAIN:
        return unguarded_advice()
    return (
        f"worker exited with code {code}: code it ran ended the process (a metric, loader or runner script "
        "calling os._exit or sys.exit?); return a value instead"
    )


def unguarded_advice() -> str:
    """What to do when workers found the user's script calling ``quantune.tune()`` at its top level."""
    script = getattr(sys.modules.get("__main__"), "__file__", "your script")
    return (
        f"worker processes import the script that started them ({script}), and it calls "
        'quantune.tune() at its top level: put the call under `if __name__ == "__main__":` '
        "(or use executor: {kind: inline})"
    )


class ExecutorClosed(Exception):
    """The executor shut down while a slot was starting its worker."""


class WorkerStartError(QuantuneError):
    """A worker process died before it was ready: no trial can run, so the run stops."""

    def __init__(self, index: int, exit_code: int | None, log_tail: str, cause: str | None = None) -> None:
        self.exit_code = exit_code
        if cause is None:
            cause = exit_cause(exit_code)
        message = f"executor: worker process {index} died while starting ({cause})"
        if log_tail:
            message += f"; its log ends with: {log_tail.splitlines()[-1]}"
        if exit_code == _EXIT_UNGUARDED_MAIN:
            message = f"executor: {unguarded_advice()}"
        super().__init__(message)


def refuse_in_starting_worker() -> None:
    """Stops a worker that, while importing the user's script, reached ``quantune.tune()``.

    Spawned workers import the main module first (so passes defined in a script exist in
    them too); a script that calls ``tune()`` unguarded would start a second run inside the
    worker and hang both. The worker exits with a code its parent turns into advice.
    """
    if getattr(mp.current_process(), "_inheriting", False):
        # at once, with the code: a worker forked by the fork server turns a SystemExit raised
        # while it prepares into exit code 1 (multiprocessing's forkserver), losing the advice
        sys.stderr.flush()
        os._exit(_EXIT_UNGUARDED_MAIN)


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


class _Worker:
    """One worker process, started and stopped by its slot thread or (at shutdown) by the engine.

    ``_lock`` guards swapping the process; once ``closed`` no new process starts, so a
    shutdown racing a start-up leaves nothing running.
    """

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
        """Starts the worker unless it runs. A worker killed by a signal while starting (the
        out-of-memory killer, a stray kill) is started again, up to ``_START_ATTEMPTS`` times in a
        row; one that exits by itself (a broken plugin, say) fails the start at once."""
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start()
                return
            except WorkerStartError as exc:
                if exc.exit_code is None or exc.exit_code >= 0 or attempt == _START_ATTEMPTS:
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
        # Wait for the worker to import and build the run (slow under load; not part of any trial's time).
        # A worker that cannot build the run says why again when it is given its trial.
        try:
            ready = wait([parent, process.sentinel], timeout=_STARTUP_TIMEOUT_S)
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
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(offset)
                text = handle.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.strip().splitlines()[-_TAIL_LINES:])

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
        """The log continues at ``path``: what it holds is copied there now, and the process is
        told before its next trial (it is idle until then)."""
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
        self._workers = [_Worker(index, spec, log_dir, memory_limit_mb) for index in range(workers)]
        self._threads = [
            threading.Thread(target=self._serve, args=(worker,), daemon=True, name=f"quantune-slot-{worker.index}")
            for worker in self._workers
        ]
        for thread in self._threads:
            thread.start()

    def _serve(self, worker: _Worker) -> None:
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
        """The workers' logs continue in ``log_dir``: the engine starts its workers before the
        run's output folder is claimed (they build the run meanwhile), logging to a scratch
        folder until then."""
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
