"""``stop.timeout_s`` over the whole run, its end included: the clock, and the end's reserve.

A time limit a user (or a fair bench) sets counts from when quantune started, not from when
the search began: set-up, model preparation and the original's evaluation take a good part of
a short limit. The CLI starts the clock at the process's start (:func:`process_started`); the
Python API when ``tune()`` is called. After the search the run still has two things to do:
time its best models again side by side with the original (``engine/confirm.py``) and write
its results and report. So the search stops early enough to leave them room
(:meth:`EndBudget.reserve_s`), and the re-timing gets what is left of the limit -- fewer rounds
when time is short, none (with the reason in ``results.json``) when even the fewest do not fit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Loading one model into a session before its first timed round (a large model's load is what
# a re-timing of 5 rounds mostly costs).
SESSION_LOAD_S = 0.5
# Writing results.json and best/ and stopping the workers.
WRITE_S = 1.0


def process_started() -> float:
    """The ``time.perf_counter()`` reading at this process's start (Linux), else now."""
    try:
        with open("/proc/self/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks
    except (OSError, ValueError, IndexError):
        return time.perf_counter()
    return time.perf_counter() - age if 0.0 <= age < 3600.0 else time.perf_counter()


def end_cost_s(listeners: Sequence[Any]) -> float:
    """What the run's listeners take when it ends (``end_cost_s`` attributes: report.html's drawing)."""
    return WRITE_S + sum(float(getattr(listener, "end_cost_s", 0.0) or 0.0) for listener in listeners)


@dataclass(frozen=True)
class EndBudget:
    """The run's limit (``None`` or 0: none to keep), when its clock started, and what its end costs
    besides the re-timing (writing the results, drawing the report)."""

    timeout_s: float | None
    started: float
    end_s: float = WRITE_S

    @property
    def limited(self) -> bool:
        return bool(self.timeout_s)  # 0 means "stop at the first candidate", not a time limit

    def left_s(self) -> float:
        """Seconds of the limit left now (infinite without one)."""
        if not self.limited:
            return float("inf")
        return float(self.timeout_s) - (time.perf_counter() - self.started)

    def reserve_s(self, baseline_ms: float, top: int, warmup: int, min_rounds: int) -> float:
        """What the search leaves for the end: the fewest re-timing rounds of the original and
        ``top`` candidates (taken as fast as the original), their sessions' loads, and the end's writing."""
        if not self.limited:
            return 0.0
        models = 1 + max(0, top)
        retiming = 0.0 if top <= 0 else models * (SESSION_LOAD_S + (warmup + min_rounds) * baseline_ms / 1000.0)
        return retiming + self.end_s

    def retiming_budget(self, wanted_s: float, minimum_s: float, models: int) -> tuple[float | None, str]:
        """(seconds the re-timing may take, ``""``), or (``None``, why it is skipped) when the
        fewest rounds (``minimum_s``, sessions' loads excluded) do not fit what is left of the limit."""
        if not self.limited:
            return wanted_s, ""
        loads = models * SESSION_LOAD_S
        left = self.left_s() - self.end_s - loads
        if left < minimum_s:
            return None, (
                f"no time left within stop.timeout_s ({self.timeout_s:g} s): {max(0.0, self.left_s()):.1f} s left, "
                f"the fewest re-timing rounds need about {minimum_s + loads + self.end_s:.1f} s with the results' "
                "writing; the search-time figures decide"
            )
        return min(wanted_s, left), ""
