"""A trial's speed against the original in words, from the typed :class:`Result`.

:func:`quantune.wording.speed_words` (the base floor: it cannot import the engine's types)
reads the two parts of results.json it needs as plain dicts; the console, the closest-miss
lines and the page all have a :class:`Result` and a :class:`TrialRecord`, so they ask here.
"""

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
