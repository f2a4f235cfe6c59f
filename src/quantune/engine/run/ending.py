"""The run's end after the search: the side-by-side confirmation (a latency answer is only ``improved`` once confirmed),
or why there is none and how to confirm: ``quantune run`` on the same output."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quantune.engine.measure.confirm import MIN_ROUNDS, VERDICT_ROUNDS, Confirmation, confirm_latency, retiming_plan
from quantune.engine.run.deadline import EndBudget
from quantune.engine.run.interrupts import stop_cause, stop_taken
from quantune.engine.trials.trial import TrialRecord

log = logging.getLogger("quantune")

RERUN = "`quantune run` with the same config on the same output confirms it"


@dataclass
class Ending:
    """What the end did: the confirmation (or ``None``), why it was skipped or stays unconfirmed, the stop reason's
    notes."""

    confirmation: Confirmation | None = None
    skipped: str = ""
    unconfirmed: str = ""
    stop_note: str = ""
    interrupted: str = ""  # a signal stopped the end: the run's stop reason, before the search's

    def stop_reason(self, searched: str) -> str:
        """The run's stop reason after the end: the search's with the end's note, or the signal first."""
        if self.interrupted:
            return f"{self.interrupted} (the search had stopped: {searched})"
        return searched + self.stop_note


def retimes(objectives: Sequence[str], confirm_top: int) -> str:
    """``""`` when a run of ``objectives`` ends by re-timing its best models side by side, else why not."""
    if not objectives or objectives[0] != "latency":
        return "its objective is not latency"
    if confirm_top <= 0:
        return (
            "evaluation.latency.confirm_top is 0, so it was not re-timed side by side with the original "
            "(set it to 1 or more to confirm the answer)"
        )
    return ""


def _undecided(confirmation: Confirmation) -> bool:
    """No candidate surely faster, one measured faster whose interval could not decide it."""
    ratios = confirmation.ratios.values()
    return not any(r.faster for r in ratios) and any(r.undecided for r in ratios)


def confirm_end(
    evaluator: Any,
    original: Any,
    baseline: dict[str, float],
    records: list[TrialRecord],
    top: int,
    end: EndBudget,
    stop_reason: str,
    prefer: int | None = None,
) -> Ending:
    """Re-times the ``top`` best candidates (or the best alone) with the original within what the limit left."""
    if stop_reason.startswith("interrupted"):
        return Ending(unconfirmed=f"the run was interrupted before it could be re-timed side by side; {RERUN}")
    try:
        models, minimum_s = retiming_plan(evaluator, baseline, records, top, prefer)
        if not models:  # no candidate to confirm (or their models are gone from a cleared cache)
            return Ending(unconfirmed=f"its model could not be re-timed side by side (not in the cache); {RERUN}")
        wanted_s = max(3.0, 0.1 * (time.perf_counter() - end.started))
        budget_s, skipped = end.retiming_budget(wanted_s, minimum_s, models)
        if budget_s is None and top > 1:  # the best alone, as the search kept time for (search_phase.py)
            top = 1
            models, minimum_s = retiming_plan(evaluator, baseline, records, top)
            budget_s, skipped = end.retiming_budget(wanted_s, minimum_s, models)
        if budget_s is None:
            log.warning("latency re-timing skipped: %s", skipped)
            return Ending(
                skipped=skipped,
                unconfirmed=f"the run was stopped before it could be re-timed side by side ({skipped}); {RERUN}",
                stop_note="; latency re-timing skipped (no time left within stop.timeout_s)",
            )
        # a limited run's re-timing ends with its budget: under load the search-time figures underestimate the rounds
        deadline = time.perf_counter() + budget_s + models * end.load_s if end.limited else None
        confirmation = confirm_latency(
            evaluator, original, baseline, records, top, budget_s=budget_s, deadline=deadline, prefer=prefer
        )
        if confirmation is not None and (
            confirmation.rounds < MIN_ROUNDS
            or (_undecided(confirmation) and confirmation.rounds < max(evaluator.spec.latency.repeats, VERDICT_ROUNDS))
        ):
            # the first try's deadline is its budget plus the sessions' loads; a busy target can take longer: once more,
            # with all the limit leaves. Likewise when its cut rounds measured a candidate faster but too scattered to
            # decide it.
            wider_s = end.left_s() if end.limited else max(wanted_s, time.perf_counter() - end.started)
            again_s, _ = end.retiming_budget(wider_s, minimum_s, models)
            if again_s is not None and again_s >= minimum_s:
                log.info(
                    "latency re-timing: %d round(s) in its budget; again with %.1f s", confirmation.rounds, again_s
                )
                deadline = time.perf_counter() + again_s + models * end.load_s
                second = confirm_latency(
                    evaluator, original, baseline, records, top, budget_s=again_s, deadline=deadline, prefer=prefer
                )
                if second is not None and (
                    second.rounds > confirmation.rounds or (_undecided(confirmation) and not _undecided(second))
                ):
                    confirmation = second
    except KeyboardInterrupt as exc:  # the search is done and kept; the re-timing is cut, and the run
        stop_taken()
        cause = stop_cause(exc)  # stops as a signal during the search stops it (exit 130 or 143)
        return Ending(
            unconfirmed=f"the run was interrupted ({cause}) while it was re-timed side by side; {RERUN}",
            interrupted=f"interrupted ({cause}) during the latency re-timing: finished trials are saved; "
            "run again to confirm",
        )
    if confirmation is None:
        return Ending(unconfirmed=f"the side-by-side re-timing failed (see quantune.log); {RERUN}")
    if confirmation.rounds < MIN_ROUNDS:
        return Ending(
            unconfirmed=f"the side-by-side re-timing had too few rounds ({confirmation.rounds} of at least "
            f"{MIN_ROUNDS}) within stop.timeout_s ({end.timeout_s:g} s); {RERUN}",
            stop_note="; latency re-timing cut short (no time left within stop.timeout_s)",
        )
    return Ending(confirmation=confirmation)
