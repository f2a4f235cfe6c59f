"""Where a run's time went (``results.json``'s ``time_spent_s``), so a user who got fewer trials than hoped sees what
took it. Parallel trials share the search's wall time in proportion to their durations."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

from quantune.engine.executors.stage import stage_seconds_by_name
from quantune.engine.trials.trial import TrialRecord

# the engine's phases, in the order they run (the search's parts go between "original" and "confirmation")
START_UP = "start-up"  # process start (the CLI) or tune() to the engine's run: imports, config
SET_UP = "set-up"  # model, data, preparation, workers started, output claimed
ORIGINAL = "original"  # the original's evaluation and timing
CONFIRMATION = "confirmation"  # the side-by-side re-timing
CLOSEST_MISS = "closest miss"  # the untimed misses that may be the closest miss, timed at the end
SESSION_SETTINGS = "session settings"  # the winner's session settings timed on its provider (measure/session_search.py)
WRITING = "writing"  # results.json, best/ (report.html is drawn after: "report", on the console only)


# the one-off stages as a user reads them (run_stage's names)
STAGE_WORDS = {
    "speed_ceiling": "ceilings",
    "node_profile": "node profile",
    "first_guess": "first guess",
    "paired_latency": "paired timings",
}


class TimeBook:
    """Seconds per phase of one run, from marks taken as each phase ends."""

    def __init__(self, started: float) -> None:
        self.started = started
        self._last = started
        self.phases: dict[str, float] = {}
        self._search_from: float | None = None
        self._stages_before: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """``phase`` ends now: the seconds since the last mark are its (added, if it ran before)."""
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + max(0.0, now - self._last)
        self._last = now

    def search_starts(self) -> None:
        """The search counts from the last mark (waiting for a first guess built ahead is the search's)."""
        self._search_from = self._last
        self._stages_before = stage_seconds_by_name()

    def search_ends(self, records: Iterable[TrialRecord], replayed: set[int]) -> None:
        """The search's wall time split into its one-off stages and its trials' stages."""
        now = time.perf_counter()
        wall = max(0.0, now - (self._search_from if self._search_from is not None else self._last))
        self._last = now
        stages = {
            name: seconds - self._stages_before.get(name, 0.0)
            for name, seconds in stage_seconds_by_name().items()
            if seconds - self._stages_before.get(name, 0.0) >= 0.005
        }
        stages = {name: min(seconds, wall) for name, seconds in stages.items()}
        rest = max(0.0, wall - sum(stages.values()))
        by_stage: dict[str, float] = {}
        for record in records:
            if record.number in replayed:
                continue
            name = f"trials ({stage_name(record.stage)})"
            by_stage[name] = by_stage.get(name, 0.0) + float(record.durations.get("total_s") or 0.0)
        total = sum(by_stage.values())
        for name, seconds in stages.items():
            name = STAGE_WORDS.get(name, name)
            self.phases[name] = self.phases.get(name, 0.0) + seconds
        if total > 0:
            for name, seconds in by_stage.items():
                self.phases[name] = self.phases.get(name, 0.0) + rest * seconds / total
        elif rest >= 0.005:
            self.phases["search"] = self.phases.get("search", 0.0) + rest

    def figures(self) -> dict[str, float]:
        """Seconds per phase, rounded to milliseconds, in the order they ran."""
        return {name: round(seconds, 3) for name, seconds in self.phases.items()}


def stage_name(stage: str | None) -> str:
    """A trial's stage as the strategy named it, without its details and notes ("bisect: k=2" -> "bisect")."""
    name = re.split(r" \(| ->|:", stage or "")[0].strip()
    return name or "search"


def time_line(figures: dict[str, float], total_s: float) -> str:
    """One line for the console: ``time: set-up 0.6 s, original 0.9 s, ... (total 5.8 s)``."""
    parts = [f"{name} {seconds:.1f} s" for name, seconds in figures.items() if seconds >= 0.05]
    return f"time: {', '.join(parts)} (total {total_s:.1f} s)" if parts else ""
