"""Progress events (:mod:`quantune.progress`) as plain lines, for a console that is no terminal.

A CI log shows no progress bar, so every stage prints when it starts and ends, its events at most
every ``EVENT_GAP_S``, and a line at least every ``HEARTBEAT_S`` so a long unit still shows life.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from quantune.progress import Step

HEARTBEAT_S = 20.0  # while a stage runs, a line at least this often
EVENT_GAP_S = 5.0  # a stage's events print at most this often (its start, its end and its last always)


def describe(step: Step, elapsed_s: float) -> str:
    name = step.stage.replace("_", " ")
    if step.done == -1:
        return f"{name}: done ({elapsed_s:.0f} s)"
    if step.done == 0 and step.total is None:
        return f"{name}: started"
    count = f"{step.done}/{step.total}" if step.total else f"{step.done}"
    unit = f" {step.unit}" if step.unit else ""
    note = f", {step.note}" if step.note else ""
    return f"{name}: {count}{unit}{note} ({elapsed_s:.0f} s)"


class PlainProgress:
    """A progress listener writing plain lines through ``write``; :meth:`start` its heartbeat."""

    def __init__(self, write: Callable[[str], None], heartbeat_s: float = HEARTBEAT_S) -> None:
        self.write = write
        self.heartbeat_s = heartbeat_s
        self._running: dict[str, tuple[float, Step]] = {}  # stage -> (its start, monotonic; its last event)
        self._printed: dict[str, float] = {}  # stage -> when its last line was printed
        self._seen: dict[str, float] = {}  # stage -> when its last event came
        self._last_line = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, step: Step) -> None:
        now = time.monotonic()
        with self._lock:
            began, latest = self._running.get(step.stage, (now - step.elapsed_s, step))
            if step.done == -1:  # how far it got (unless that was printed), then its end
                if latest.done > 0 and self._printed.get(step.stage, -1.0) < self._seen.get(step.stage, 0.0):
                    self._line(describe(latest, now - began), step.stage, now)
                self._running.pop(step.stage, None)
                self._printed.pop(step.stage, None)
                self._seen.pop(step.stage, None)
            else:
                self._running[step.stage] = (began, step)
                self._seen[step.stage] = now
            first = step.stage not in self._printed
            last = step.done == -1 or (step.total is not None and step.done >= step.total)
            if first or last or now - self._printed[step.stage] >= EVENT_GAP_S:
                self._line(describe(step, now - began), step.stage, now)

    def _line(self, text: str, stage: str, now: float) -> None:
        if stage in self._running:
            self._printed[stage] = now
        self._last_line = now
        self.write(text)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="quantune-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat_s)):
            now = time.monotonic()
            with self._lock:
                if not self._running or now - self._last_line < self.heartbeat_s:
                    continue
                stage, (began, step) = next(reversed(self._running.items()))  # the innermost stage
                text = describe(step, now - began) if step.done > 0 else f"{stage.replace('_', ' ')}: running"
                self._line(text if step.done > 0 else f"{text} ({now - began:.0f} s)", stage, now)
