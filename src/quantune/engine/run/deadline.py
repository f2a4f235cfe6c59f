"""``stop.timeout_s`` over the whole run, its end included, counted from the process's start (:func:`process_started`).
The search leaves the re-timing and the results room (:meth:`EndBudget.reserve_s`); under a short limit the report's
drawing gives way first."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Loading one model into a session before its first timed round.
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


def least_end_cost_s(listeners: Sequence[Any]) -> float:
    """The least the run's listeners take when it ends (one without ``least_end_cost_s`` gives way whole)."""
    return sum(float(getattr(listener, "least_end_cost_s", 0.0) or 0.0) for listener in listeners)


def write_s(size_bytes: float) -> float:
    """About what writing results.json and copying the answer's model to best/ takes: ``WRITE_S`` at 500 MB."""
    return 0.1 + WRITE_S * max(0.0, size_bytes) / 500e6


def session_load_s(size_bytes: float) -> float:
    """About what loading a model of ``size_bytes`` into a session costs: ``SESSION_LOAD_S`` at 100 MB."""
    return 0.05 + SESSION_LOAD_S * max(0.0, size_bytes) / 100e6


@dataclass(frozen=True)
class TimeBudget:
    """The run loop's time, decided before it starts (:meth:`EndBudget.for_loop`); the defaults: no limit."""

    started: float  # the run's clock: ``stop.timeout_s`` counts from here
    end_reserve_s: float = 0.0  # of stop.timeout_s, left for the run's end (re-timing, results): the search stops there
    # what a trial may not end inside: the end's reserve less the whole report's drawing; None: all of end_reserve_s
    start_reserve_s: float | None = None
    # the latest moment the run's end can still confirm within stop.timeout_s (+5%): trials running then are abandoned
    abandon_at: float | None = None
    first_trial_s: float = 0.0  # what the first trial is expected to take (the original's evaluation), 0: unknown


@dataclass(frozen=True)
class EndBudget:
    """The run's limit, when its clock started, and its end's costs: results (``end_s``), report (``report_s``), least
    one."""

    timeout_s: float | None
    started: float
    end_s: float = WRITE_S
    report_s: float = 0.0
    load_s: float = SESSION_LOAD_S  # per model the re-timing loads
    least_report_s: float = 0.0

    @property
    def limited(self) -> bool:
        return bool(self.timeout_s)  # 0 means "stop at the first candidate", not a time limit

    def left_s(self) -> float:
        """Seconds of the limit left now (infinite without one)."""
        if not self.limited:
            return float("inf")
        return float(self.timeout_s) - (time.perf_counter() - self.started)

    def retiming_s(self, baseline_ms: float, top: int, warmup: int, min_rounds: int) -> float:
        """The fewest re-timing rounds of the original and ``top`` candidates, their sessions' loads included."""
        models = 1 + max(0, top)
        return 0.0 if top <= 0 else models * (self.load_s + (warmup + min_rounds) * baseline_ms / 1000.0)

    def reserve_s(self, baseline_ms: float, top: int, warmup: int, min_rounds: int) -> float:
        """What the search leaves for the end: the re-timing and writing, and the full report where it takes at most
        half."""
        if not self.limited:
            return 0.0
        needed = self.retiming_s(baseline_ms, top, warmup, min_rounds) + self.end_s
        return needed + (self.report_s if self.report_fits(needed) else min(self.least_report_s, self.report_s))

    def start_reserve_s(self, baseline_ms: float, top: int, warmup: int, min_rounds: int) -> float:
        """What a trial may not end inside: :meth:`reserve_s` with the least report only."""
        if not self.limited:
            return 0.0
        needed = self.retiming_s(baseline_ms, top, warmup, min_rounds) + self.end_s
        return needed + min(self.least_report_s, self.report_s)

    def abandon_at(self, baseline_ms: float, top: int, warmup: int, min_rounds: int) -> float | None:
        """The latest moment the re-timing and writing still end within the limit: a trial running then is abandoned."""
        if not self.limited:
            return None
        needed = self.retiming_s(baseline_ms, top, warmup, min_rounds) + self.end_s
        return self.started + float(self.timeout_s) - needed

    def for_loop(self, baseline_ms: float, top: int, warmup: int, min_rounds: int, first_trial_s: float) -> TimeBudget:
        """The run loop's share: where its search stops, what no trial may end inside, when a trial is left."""
        return TimeBudget(
            self.started,
            end_reserve_s=self.reserve_s(baseline_ms, top, warmup, min_rounds),
            start_reserve_s=self.start_reserve_s(baseline_ms, top, warmup, min_rounds),
            abandon_at=self.abandon_at(baseline_ms, top, warmup, min_rounds),
            first_trial_s=first_trial_s,
        )

    def report_fits(self, needed_s: float) -> bool:
        """Whether the report's drawing is kept from the limit besides ``needed_s`` (see :meth:`reserve_s`)."""
        return self.report_s > 0 and self.report_s <= (self.left_s() - needed_s) / 2

    def retiming_budget(self, wanted_s: float, minimum_s: float, models: int) -> tuple[float | None, str]:
        """(seconds the re-timing may take, ``""``), or (``None``, why it is skipped) when its rounds do not fit."""
        if not self.limited:
            return wanted_s, ""
        loads = models * self.load_s
        left = self.left_s() - self.end_s - loads
        full = (self.report_s,) if self.report_fits(minimum_s + loads + self.end_s) else ()  # a dropped one: none
        for report_s in (*full, min(self.least_report_s, self.report_s)):
            if left - report_s >= minimum_s:  # the report keeps its time too
                return min(wanted_s, left - report_s), ""
        if left + TOLERANCE * float(self.timeout_s) >= minimum_s:
            return max(minimum_s, min(wanted_s, left)), ""
        return None, (
            f"no time left within stop.timeout_s ({self.timeout_s:g} s): {max(0.0, self.left_s()):.1f} s left, "
            f"the fewest re-timing rounds need about {minimum_s + loads + self.end_s:.1f} s with the results' writing"
        )


# How far past stop.timeout_s the run's end may go to confirm its answer.
TOLERANCE = 0.05
