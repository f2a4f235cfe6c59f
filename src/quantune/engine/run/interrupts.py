"""Ctrl-C and SIGTERM at a safe moment: never between writing a trial to the run store and counting it
(:meth:`DeferredInterrupt.critical`). SIGTERM stops a run as Ctrl-C does once the command line installed
:func:`install_stop_signals`."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Terminated(KeyboardInterrupt):
    """SIGTERM: stops the run as Ctrl-C does, but exits with 143."""

    signum = signal.SIGTERM


def interrupt_for(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def stop_cause(exc: BaseException) -> str:
    """The stop in words, for ``stop_reason``."""
    return "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"


def exit_code(exc: BaseException) -> int:
    return EXIT_CODES[signal.SIGTERM] if isinstance(exc, Terminated) else EXIT_CODES[signal.SIGINT]


# The stop a signal asked for, kept beyond the exception it raised: code between the signal and the
# engine may catch that exception as an error (a library's file-lock clean-up that turns it into an
# OSError, a view drawn under ``except Exception``), and a stop must not be lost there.
_asked: list[int] = []


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    _asked[:] = [signum]
    raise interrupt_for(signum)


def stop_taken() -> None:
    """The engine caught the stop and acts on it (saves what finished, exits with its code)."""
    _asked.clear()


def raise_if_stopped() -> None:
    """Raises the stop a signal asked for during this run, should the code it landed in have swallowed it."""
    if _asked:
        raise interrupt_for(_asked[0])


def install_stop_signals() -> None:
    """For the command line: SIGINT (even when inherited ignored) and SIGTERM stop the run as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _raise_stop)
    signal.signal(signal.SIGTERM, _raise_stop)


class DeferredInterrupt:
    """While entered (main thread only), a stop signal raises ``KeyboardInterrupt``, deferred inside ``critical()``."""

    def __init__(self) -> None:
        self._depth = 0
        self._pending: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> DeferredInterrupt:
        _asked.clear()  # a stop asked of an earlier run in this process is not this one's
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous = signal.getsignal(signum)
                if previous is signal.SIG_IGN:  # a caller that ignores Ctrl-C keeps ignoring it
                    continue
                if signum == signal.SIGTERM and not callable(previous):
                    continue  # SIGTERM's default (end the process) stays unless quantune's CLI took it
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._depth:
            self._pending = signum
            return
        _raise_stop(signum, frame)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending is not None:
                signum, self._pending = self._pending, None
                _raise_stop(signum, None)
