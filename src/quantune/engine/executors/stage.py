"""Heavy stages outside the main process: one spawned worker per stage run, like a trial's.

A stage such as a sensitivity analysis can blow up memory; in a worker under the trials'
limits its death, hang or error becomes a recorded cause (``stage_errors``) and the run goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from quantune import progress
from quantune.engine.executors.contexts import adopt_environment, child_environment
from quantune.engine.executors.crashsite import crash_site, log_since
from quantune.engine.executors.exits import WorkerStartError, exit_cause
from quantune.forkserver import EXIT_UNGUARDED_MAIN, worker_context
from quantune.memory import peak_tracker, take_stage_peaks
from quantune.userimport import load_plugins, plugin_files

log = logging.getLogger("quantune.stage")

_TAIL_LINES = 20


@dataclass
class StageLog:
    """What the run's stages left for ``results.json``: peak memory per stage, and failures."""

    peaks: dict[str, float] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)

    def note_peak(self, stage: str, mb: float | None) -> None:
        if mb is not None:
            self.peaks[stage] = round(max(self.peaks.get(stage, 0.0), mb), 1)

    def note_error(self, stage: str, error: str, log_tail: str = "") -> None:
        self.errors.append({"stage": stage, "error": error, "log_tail": log_tail})


@dataclass
class StageDeadline:
    """The ``time.perf_counter()`` reading by which every stage must be done (``None``: none), so a stage
    asked for late in the run is stopped rather than overrun ``stop.timeout_s``."""

    at: float | None = None
    reason: str = "stopped at the run's time limit (stop.timeout_s, less what the run's end needs)"
    # the run stopped the stage because it no longer needs it: not a failure
    unneeded: bool = False

    def left_s(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.perf_counter())


@dataclass(frozen=True)
class Isolation:
    """Where and under which limits stages run; ``inline`` runs them in this process."""

    log_dir: Path | None = None
    memory_limit_mb: int | None = None
    timeout_s: float | None = None
    inline: bool = False
    stages: StageLog = field(default_factory=StageLog)
    deadline: StageDeadline = field(default_factory=StageDeadline)


@dataclass
class StageOutcome:
    value: Any = None
    error: str | None = None
    peak_rss_mb: float | None = None
    log_tail: str = ""
    stage_peaks: dict[str, float] = field(default_factory=dict)  # of stages inside it (calibration)
    unneeded: bool = False  # stopped because the run no longer needed it (``StageDeadline.unneeded``)

    @property
    def ok(self) -> bool:
        return self.error is None


def _describe(exc: BaseException, memory_limit_mb: int | None) -> str:
    error = f"{type(exc).__name__}: {exc}"
    if memory_limit_mb and any(sign in error for sign in ("MemoryError", "bad_alloc", "Failed to allocate")):
        return f"out of memory (memory limit {memory_limit_mb} MB): {error}"
    return error


class _Prelude:
    """What a stage's worker does before it unpickles its job: take this process's environment (the fork
    server's is older), then import the plugin files this process imported, as a trial worker does when
    it starts: a plugin's class in the job (a pass, its config) lives in a module named by its file's
    path, found only once the file is imported. Placed before the job among the worker's arguments, it
    runs while they are unpickled."""

    def __init__(self) -> None:
        self.environment, self.plugins = child_environment(), plugin_files()

    def __reduce__(self) -> tuple[Callable[..., None], tuple[dict[str, str], list[str]]]:
        return _prelude, (self.environment, self.plugins)


def _prelude(environment: dict[str, str], plugins: list[str]) -> None:
    adopt_environment(environment)
    for file in plugins:
        with contextlib.suppress(Exception):  # one the job does not need (an earlier run's) must not fail it
            load_plugins([file], Path("/"))


def _stage_main(
    conn: Connection,
    stage: str,
    prelude: None,  # done (_Prelude)
    fn: Callable[..., Any],
    args: tuple,
    memory_limit_mb: int | None,
    log: str,
    parent_pid: int | None = None,
) -> None:
    from quantune.engine.executors.lifeline import enter_worker

    enter_worker(log, memory_limit_mb, parent_pid)  # as a trial worker: dies with the run, within its limit
    print(f"--- {stage} (worker pid {os.getpid()}) ---", flush=True)
    sending = threading.Lock()

    def send_progress(step: progress.Step) -> None:  # the stage's own start and end are the main process's
        if step.done > 0:
            with sending:
                conn.send(("progress", step))

    with peak_tracker() as peak, progress.listening(send_progress), progress.stage(stage):
        try:
            value, error = fn(*args), None
        except Exception as exc:
            import traceback

            traceback.print_exc()
            value, error = None, _describe(exc, memory_limit_mb)
    conn.send((value, error, peak.mb, take_stage_peaks()))


def _tail(path: Path, offset: int, text: str | None = None) -> str:
    """The last lines of the worker's log from ``offset`` (``text``: that part, already read)."""
    text = log_since(path, offset) if text is None else text
    return "\n".join(text.strip().splitlines()[-_TAIL_LINES:])


def _run_inline(fn: Callable[..., Any], args: tuple) -> StageOutcome:
    take_stage_peaks()
    outcome = StageOutcome()
    with peak_tracker() as peak:
        try:
            outcome.value = fn(*args)
        except Exception as exc:
            log.warning("stage failed in-process", exc_info=True)
            outcome.error = _describe(exc, None)
    outcome.peak_rss_mb = peak.mb
    outcome.stage_peaks = take_stage_peaks()
    return outcome


# how often a waiting stage looks at the run's deadline (which may move, or be now)
_POLL_S = 0.05


def _run_spawned(stage: str, fn: Callable[..., Any], args: tuple, isolation: Isolation) -> StageOutcome:
    if isolation.deadline.left_s() == 0.0:
        return StageOutcome(error=f"not started: {isolation.deadline.reason}", unneeded=isolation.deadline.unneeded)
    log_dir = isolation.log_dir or Path.cwd()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{stage}.log"
    offset = log_path.stat().st_size if log_path.is_file() else 0
    ctx = worker_context()
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_stage_main,
        args=(child, stage, _Prelude(), fn, args, isolation.memory_limit_mb, str(log_path), os.getpid()),
        daemon=True,
        name=f"quantune-{stage}",
    )
    try:
        process.start()
    except Exception as exc:  # e.g. the job does not pickle
        return StageOutcome(error=f"could not start the {stage} worker: {type(exc).__name__}: {exc}")
    child.close()
    deadline = None if isolation.timeout_s is None else time.monotonic() + isolation.timeout_s
    try:
        while True:
            remaining = _POLL_S if deadline is None else min(_POLL_S, max(0.0, deadline - time.monotonic()))
            ready = wait([parent, process.sentinel], timeout=remaining)
            if parent in ready:
                with contextlib.suppress(EOFError, OSError):
                    message = parent.recv()
                    if message[0] == "progress":  # how far the stage is, for the console
                        progress.forward(message[1])
                        continue
                    value, error, peak, peaks = message
                    tail = _tail(log_path, offset) if error else ""
                    return StageOutcome(value, error, peak, tail, peaks)
            if ready:  # the process ended without an answer
                process.join(timeout=5)
                if process.exitcode == EXIT_UNGUARDED_MAIN:  # the user's script calls tune() unguarded
                    return StageOutcome(error=str(WorkerStartError(0, process.exitcode, "")))
                text = log_since(log_path, offset)  # read once: the crash site and the tail
                site = crash_site(text)  # the user's file and line, when it was theirs
                return StageOutcome(
                    error=f"worker crashed: {exit_cause(process.exitcode)}{site}",
                    log_tail=_tail(log_path, offset, text),
                )
            if isolation.deadline.left_s() == 0.0:  # the run's limit (or the run's end) comes first
                return StageOutcome(
                    error=isolation.deadline.reason,
                    log_tail=_tail(log_path, offset),
                    unneeded=isolation.deadline.unneeded,
                )
            if deadline is not None and time.monotonic() >= deadline:
                return StageOutcome(
                    error=f"timeout: the stage ran longer than {isolation.timeout_s:g} s and was killed",
                    log_tail=_tail(log_path, offset),
                )
    finally:
        if process.is_alive():
            process.kill()
        process.join(timeout=5)
        parent.close()


_STAGE_SECONDS = 0.0  # wall seconds spent in stages by this process, ever (see stage_seconds)
_BY_NAME: dict[str, float] = {}  # the same, per stage, of the stages the main thread waited for


def count_stage_seconds(seconds: float, stage: str = "speed_ceiling") -> None:
    """Adds work done in this process on a stage's behalf (ceilings timed here) to :func:`stage_seconds`."""
    global _STAGE_SECONDS
    _STAGE_SECONDS += seconds
    _count(stage, seconds)


def _count(stage: str, seconds: float) -> None:
    if threading.current_thread() is threading.main_thread():  # not the builds beside it (measure/prebuild.py)
        _BY_NAME[stage] = _BY_NAME.get(stage, 0.0) + seconds


def stage_seconds_by_name() -> dict[str, float]:
    """Wall seconds the main thread has spent in each stage so far, for the run's time breakdown."""
    return dict(_BY_NAME)


def stage_seconds() -> float:
    return _STAGE_SECONDS


# where a run's executor takes the stages it can run elsewhere (ray_stage.py): their outcome, or None: here
remote: Callable[[str, Callable[..., Any], tuple, Isolation], StageOutcome | None] | None = None


def run_stage(
    stage: str, fn: Callable[..., Any], *args: Any, isolation: Isolation, reported: bool = False
) -> StageOutcome:
    """``fn(*args)`` in a worker (in-process when ``isolation.inline``); never raises for the stage's faults.

    ``fn`` and ``args`` must pickle. The peak and any failure are recorded under ``stage``;
    ``reported``: the caller reports the failure itself, so it is only logged, not warned about.
    """
    global _STAGE_SECONDS
    started = time.perf_counter()
    try:
        with progress.stage(stage):
            outcome = None if remote is None or isolation.inline else remote(stage, fn, args, isolation)
            if outcome is None:
                outcome = _run_inline(fn, args) if isolation.inline else _run_spawned(stage, fn, args, isolation)
    finally:
        _STAGE_SECONDS += time.perf_counter() - started
        _count(stage, time.perf_counter() - started)
    log.info("%s stage: %.1f s", stage, time.perf_counter() - started)  # bench/startup.py reads the timeline
    isolation.stages.note_peak(stage, outcome.peak_rss_mb)
    for name, mb in outcome.stage_peaks.items():  # e.g. the calibration the stage ran
        isolation.stages.note_peak(name, mb)
    if outcome.error is not None and outcome.unneeded:
        log.info("%s stage stopped: %s", stage, outcome.error)
    elif outcome.error is not None:
        level = logging.INFO if reported else logging.WARNING
        tail = f"\n{outcome.log_tail}" if outcome.log_tail else ""
        log.log(level, "%s stage failed: %s%s", stage, outcome.error, tail)
        isolation.stages.note_error(stage, outcome.error, outcome.log_tail)
    return outcome
