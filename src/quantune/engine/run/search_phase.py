"""The search phase: what the run's end keeps from the limit, then the loop until it stops. The end's budget is decided
once, as the search starts, so the loop stops, and abandons a trial still running, in time for it."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from quantune.config import Config
from quantune.engine.executors import Executor
from quantune.engine.executors.stage import Isolation
from quantune.engine.measure.baseline import evaluation_seconds
from quantune.engine.measure.confirm import MIN_ROUNDS, retiming_warmup
from quantune.engine.run.deadline import WRITE_S, EndBudget, end_cost_s, least_end_cost_s, session_load_s, write_s
from quantune.engine.run.ending import retimes
from quantune.engine.run.interrupts import stop_cause, stop_taken
from quantune.engine.run.loop import Judge, RunListener, RunLoop
from quantune.engine.run.resume import Replay
from quantune.engine.run.timebook import TimeBook
from quantune.engine.trials.identity import check_model_unchanged
from quantune.evaluate.latency import timing_cost_s
from quantune.store import RunStore

log = logging.getLogger("quantune")


@dataclass
class Searched:
    """The loop that ran, why it stopped, the end's budget, the ``top`` the end re-times, and why none (``""``)."""

    loop: RunLoop
    stop_reason: str
    end: EndBudget
    top: int
    not_retimed: str


def search(
    config: Config,
    objectives: list[str],
    opening: Any,
    executor: Executor,
    store: RunStore,
    replay: Replay,
    baseline: dict[str, float],
    started: float,
    listeners: Sequence[RunListener],
    isolation: Isolation,
    book: TimeBook,
) -> Searched:
    parts, strategy = opening.parts, opening.strategy
    judge = Judge(parts.criterion, config.evaluation.metric, objectives)
    size = baseline.get("size_bytes", 0.0)
    report_s = end_cost_s(listeners) - WRITE_S
    least = least_end_cost_s(listeners)
    end = EndBudget(config.stop.timeout_s, started, write_s(size), report_s, session_load_s(size), least)
    not_retimed = retimes(objectives, config.evaluation.latency.confirm_top)
    top = 0 if not_retimed else config.evaluation.latency.confirm_top
    spec, original_s = config.evaluation.latency, baseline.get("latency_ms", 0.0) / 1000
    # the end keeps the fewest re-timing rounds of the original and the best candidate, warm-up included
    kept = min(top, 1)
    warmup = retiming_warmup(spec.warmup, spec.seconds, 1 + kept, (1 + kept) * original_s)
    # before any trial says (loop.py): a calibration and an evaluation as long as the original's, and a timing
    timing_s = timing_cost_s(spec.warmup, spec.repeats, spec.seconds, original_s)
    first_trial_s = 2 * evaluation_seconds(parts.context) + timing_s
    budget = end.for_loop(baseline.get("latency_ms", 0.0), kept, warmup, MIN_ROUNDS, first_trial_s)
    prebuild = opening.prebuild
    loop = RunLoop(
        judge,
        parts.plan,
        config.stop,
        listeners,
        strategy,
        executor,
        store,
        replay,
        baseline,
        budget,
        check_inputs=partial(check_model_unchanged, parts.context),  # a model file replaced meanwhile stops it
        evaluated_ahead=prebuild.ahead() if prebuild is not None else (),  # read from the cache
        wait_ahead=prebuild.wait_ahead if prebuild is not None else None,
    )
    book.search_starts()
    if end.limited:  # a strategy's stage (sensitivity, ceilings) stops there too
        isolation.deadline.at = started + float(config.stop.timeout_s or 0) - budget.end_reserve_s
    try:
        stop_reason = loop.run()
        log.info("search stopped (%s): %.1f s", stop_reason, time.perf_counter() - started)
        executor.shutdown(kill=bool(loop.abandoned))
    except KeyboardInterrupt as exc:
        stop_taken()
        stop_reason = f"interrupted ({stop_cause(exc)}): finished trials are saved; run again to resume"
        executor.shutdown(kill=True)
    except BaseException:  # e.g. workers that cannot start: stop them, then say why
        executor.shutdown(kill=True)
        raise
    book.search_ends(loop.records, loop.replayed_numbers)
    return Searched(loop, stop_reason, end, top, not_retimed)
