"""How a worker process ends, in words (a signal, an exit code, a death while starting, a script
calling ``quantune.tune()`` at its top level), for the trial and stage workers alike."""

from __future__ import annotations

import signal
import sys

from quantune.errors import QuantuneError
from quantune.forkserver import EXIT_UNGUARDED_MAIN, refuse_in_starting_worker

__all__ = ["ExecutorClosed", "WorkerStartError", "exit_cause", "refuse_in_starting_worker", "unguarded_advice"]

_SIGNALS = {
    signal.SIGSEGV: "segmentation fault (SIGSEGV)",
    signal.SIGABRT: "abort (SIGABRT)",
    signal.SIGKILL: "killed (SIGKILL: out-of-memory killer or external kill)",
    signal.SIGBUS: "bus error (SIGBUS)",
    signal.SIGFPE: "floating point exception (SIGFPE)",
    signal.SIGTERM: "terminated (SIGTERM)",
}
TAIL_LINES = 20
STARTUP_TIMEOUT_S = 600
START_ATTEMPTS = 3


def exit_cause(code: int | None) -> str:
    """A dead worker's exit status in words: the signal that killed it, or its exit code."""
    if code is not None and code < 0:
        return _SIGNALS.get(-code, f"killed by signal {-code}")
    if code == EXIT_UNGUARDED_MAIN:
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
        if exit_code == EXIT_UNGUARDED_MAIN:
            message = f"executor: {unguarded_advice()}"
        super().__init__(message)
