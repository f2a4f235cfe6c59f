"""The original's phase: its figures, and the strategy and listeners told. Timed quickly beside the builds ahead, the
original is timed again before the ceilings are (:func:`ceilings_ready`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from quantune.engine.executors import Executor
from quantune.engine.executors.stage import Isolation
from quantune.engine.measure.baseline import (
    RETIME_ROUNDS,
    original_figures,
    retime_original,
    store_original_latency,
    timed_quickly,
)
from quantune.engine.measure.prebuild import Prebuild
from quantune.engine.run.loop import RunListener
from quantune.engine.run.timebook import ORIGINAL, TimeBook
from quantune.engine.trials.runner import TrialRunner
from quantune.engine.trials.setup import RunParts
from quantune.evaluate.latency import LatencySpec, rounds_within
from quantune.strategy import Strategy

log = logging.getLogger("quantune")


def measure_original(
    runner: TrialRunner,
    opening: Any,
    executor: Executor,
    isolation: Isolation,
    book: TimeBook,
    listeners: Sequence[RunListener],
) -> tuple[dict[str, float], str]:
    """The original's figures and whether they were cached; a failure stops ``executor``'s workers."""
    parts = opening.parts
    try:
        baseline, baseline_cache = original_figures(runner, opening.spec, isolation, log_dir=isolation.log_dir)
    except BaseException:  # the original does not evaluate (or Ctrl-C): no run, no workers left behind
        executor.shutdown(kill=True)
        raise
    if opening.prebuild is None and timed_quickly(parts.context):  # an earlier run's quick timing
        baseline.update(retime_original(parts.context))
    book.mark(ORIGINAL)
    log.info("baseline (%s): %s", baseline_cache, baseline)
    announce_preparation(parts, listeners)
    return baseline, baseline_cache


def tell_baseline(
    opening: Any,
    baseline: dict[str, float],
    listeners: Sequence[RunListener],
    max_trials: int | None,
    time_left_s: Callable[[], float | None],
    isolation: Isolation,
) -> None:
    """The strategy and listeners get the original's figures; the first guess is waited for now."""
    strategy, parts = opening.strategy, opening.parts
    strategy.observe_baseline(baseline)
    if opening.prebuild is not None:  # built while the original was evaluated (measure/prebuild.py)
        opening.prebuild.wait_first_guess(time_left_s())
        parts.context.before_ceilings = ceilings_ready(opening.prebuild, parts, baseline, strategy, isolation)
    for listener in listeners:
        listener.on_start(max_trials, baseline)


def ceilings_ready(
    prebuild: Prebuild | None, parts: RunParts, baseline: dict[str, float], strategy: Strategy, isolation: Isolation
) -> Callable[[], None]:
    """What the ceilings' timing waits for: the builds, then the original's latency from its rounds (or timed alone)."""

    def timed(timings_s: Any) -> None:
        ctx = parts.context
        if timings_s is not None and len(timings_s) >= stand_in_rounds(ctx.evaluator.spec.latency, timings_s):
            fresh = store_original_latency(ctx, timings_s)
        else:
            fresh = retime_original(ctx, isolation.deadline.at)  # the re-timing stops at the run's limit
        baseline.update(fresh)
        strategy.baseline.update(fresh)

    def ready() -> None:
        if prebuild is None or parts.context.before_ceilings is None:
            return
        parts.context.before_ceilings = None
        # the builds, not the guess's worker evaluating its compute-only model
        prebuild.join(isolation.deadline.at, builds_only=True)  # the builds stop at the run's limit
        prebuild.keep_log(isolation.log_dir)
        parts.context.after_ceilings = prebuild.ceilings_timed
        if parts.context.baseline_status == "miss" or timed_quickly(parts.context):
            parts.context.original_timed = timed

    return ready


def stand_in_rounds(spec: LatencySpec, timings_s: Any) -> int:
    """The fewest ceilings' rounds that stand for the original's latency: ``RETIME_ROUNDS``, or its own timing's."""
    run_s = float(np.nanmedian(timings_s)) if len(timings_s) else 0.0
    return min(RETIME_ROUNDS, rounds_within(spec.repeats, spec.seconds, run_s))


def announce_preparation(parts: RunParts, listeners: Sequence[RunListener]) -> None:
    """The run log gets each change of model preparation; a listener with ``on_prepared`` gets the preparation."""
    preparation = parts.context.preparation
    if preparation is None:
        return
    for line in preparation.steps:
        log.info("prepared (%s): %s", preparation.cache, line)
    for line in preparation.warnings:
        log.warning("%s", line)
    if preparation.steps:
        log.info("trials start from the prepared model %s; the baseline is the original", preparation.model)
    for listener in listeners:
        hook = getattr(listener, "on_prepared", None)
        if hook is not None:
            hook(preparation)
