"""How long a trial or the original's evaluation may run before its worker is killed.

A hung metric or loader must not hang the run, so without ``executor.trial_timeout_s`` a trial
gets a limit scaled from the original's own evaluation (with a floor for the passes it runs
first), and no trial runs past ``stop.timeout_s``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from quantune import progress
from quantune.userexit import REAL_EXIT as _REAL_EXIT

TRIAL_FLOOR_S = 600.0
PER_ORIGINAL = 50.0
ORIGINAL_LIMIT_S = 1800.0


def run_cap(config: Any) -> float | None:
    """``stop.timeout_s`` when it is a time limit (0 means "stop at the first trial that meets it")."""
    limit = config.stop.timeout_s
    return float(limit) if limit else None


def original_limit(config: Any) -> float:
    """The limit of the original model's evaluation (``config``: the run's Config)."""
    if config.executor.trial_timeout_s is not None:
        return float(config.executor.trial_timeout_s)
    cap = run_cap(config)
    return min(ORIGINAL_LIMIT_S, cap) if cap else ORIGINAL_LIMIT_S


def limit_source(config: Any) -> str:
    if config.executor.trial_timeout_s is not None:
        return "executor.trial_timeout_s"
    if run_cap(config) and run_cap(config) < ORIGINAL_LIMIT_S:
        return "stop.timeout_s"
    return "the default limit; set executor.trial_timeout_s to change it"


@dataclass
class TrialLimit:
    """A trial's time limit: ``configured``, else the default, read when the first trial starts."""

    configured: float | None = None
    original_s: Callable[[], float | None] = lambda: None  # the original's evaluation time, when known
    cap_s: float | None = None  # stop.timeout_s
    _resolved: float | None = None

    def seconds(self) -> float | None:
        if self.configured is not None:
            return self.configured
        if self._resolved is not None:
            return self._resolved
        original = self.original_s()
        limit = max(TRIAL_FLOOR_S, PER_ORIGINAL * original) if original else ORIGINAL_LIMIT_S
        limit = min(limit, self.cap_s) if self.cap_s else limit
        if original:
            self._resolved = limit
        return limit

    def note(self) -> str:
        if self.configured is not None:
            return " (executor.trial_timeout_s)"
        return (
            f" (the default limit: {PER_ORIGINAL:g}x the original model's evaluation, at least {TRIAL_FLOOR_S:g} s, "
            "at most stop.timeout_s; set executor.trial_timeout_s to change it)"
        )


def original_evaluation_s(runner: Any) -> float | None:
    """How long the original's evaluation took, from its cached figures (``runner``: a TrialRunner)."""
    ctx = runner.context
    cached = ctx.cache.get_json("evals", ctx.eval_key(ctx.model.sha256))
    value = (cached or {}).get("evaluation_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


@contextlib.contextmanager
def check_watchdog(config: Any) -> Iterator[None]:
    """:func:`watchdog` for ``quantune check``, whose line names the step it stopped in."""
    limit = original_limit(config)
    last: list[progress.Step] = []

    def message() -> str:
        head = f"check stopped after {limit:g} s ({limit_source(config)})"
        if not last:
            return f"{head}; do the data loader and the metric return?"
        step = last[-1]
        where = f"after {step.stage}" if step.done < 0 else f"while {step.stage}"
        if step.done >= 0 and step.total:
            where += f" ({step.done}/{step.total} {step.unit})"
        return (
            f"{head} {where}: give a model this slow more time (--set stop.timeout_s=SECONDS), "
            "or see whether the data loader and the metric return"
        )

    def keep(step: progress.Step) -> None:
        last[:] = [step]

    with progress.listening(keep), watchdog(limit, message):
        yield


@contextlib.contextmanager
def watchdog(seconds: float, message: str | Callable[[], str]) -> Iterator[None]:
    """Ends this process with exit code 2 and ``message`` if the block runs longer than ``seconds``:
    for user code run in the main process, where no worker can be killed in its place."""

    def expire() -> None:
        with contextlib.suppress(OSError):
            sys.stderr.write(f"quantune: error: {message if isinstance(message, str) else message()}\n")
            sys.stderr.flush()
        _REAL_EXIT(2)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
