"""A trial's speed against the original in words, for the reports that hold a typed :class:`Result`."""

from __future__ import annotations

from quantune.engine.outcome.result import Result
from quantune.engine.trials.trial import TrialRecord
from quantune.wording import speed_words


def speed_of(result: Result, record: TrialRecord) -> str:
    """``record``'s speed against the original: side by side when it was re-timed so, else by medians."""
    return speed_words(
        {"latency_confirmation": result.latency_confirmation, "baseline": result.baseline},
        {"number": record.number, "metrics": record.metrics},
    )
