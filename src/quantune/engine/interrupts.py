"""Ctrl-C at a safe moment: never between writing a trial to the run store and counting it.

Ctrl-C stops a run at once (the engine then saves what finished and exits with 130), except
while a finished trial is being recorded: a ``KeyboardInterrupt`` there would leave the
trial in ``run.db`` but not in ``results.json``. Inside :meth:`DeferredInterrupt.critical`
the interrupt waits for the block to end, then is raised as usual.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any


class DeferredInterrupt:
    """While entered (main thread only), SIGINT raises ``KeyboardInterrupt`` outside ``critical()``
    blocks and at the end of one inside them."""

    def __init__(self) -> None:
        self._depth = 0
        self._pending = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not signal.SIG_IGN:  # a caller that ignores Ctrl-C keeps ignoring it
                self._previous = signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._depth:
            self._pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending:
                self._pending = False
                raise KeyboardInterrupt
