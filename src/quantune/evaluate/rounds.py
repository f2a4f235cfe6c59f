"""Side-by-side timing that stops as soon as the rounds decide: several candidates, one session. Speed ceilings only
sort variants into "faster than the original by the margin" or not, which a variant far from the margin says in a few
rounds."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from quantune import progress
from quantune.evaluate.interleave import fewest_within, interleaved
from quantune.evaluate.latency import (
    WARMUP_SHARE,
    LatencySpec,
    TimingRequest,
    latency_lane,
    open_all,
    timed_call,
    timing_end,
    timing_session,
)
from quantune.evaluate.paired import CONFIDENCE, MIN_GAIN, RatioInterval, paired_ratio
from quantune.evaluate.session import DEFAULT_PROVIDER

log = logging.getLogger("quantune.evaluate")


def _paired(timings: np.ndarray, reference: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each candidate row's seconds and the reference's, over the rounds both ran."""
    base = timings[reference]
    pairs = []
    for index, row in enumerate(timings):
        if index != reference:
            both = ~np.isnan(row) & ~np.isnan(base)
            pairs.append((row[both], base[both]))
    return pairs


def _intervals(timings: np.ndarray, reference: int = 0, confidence: float = CONFIDENCE) -> list[RatioInterval | None]:
    """Each candidate row's paired ratio to row ``reference`` (:func:`_paired`); None for a row that never ran."""
    return [paired_ratio(row, base, confidence) if len(row) else None for row, base in _paired(timings, reference)]


def decided(timings: np.ndarray, threshold: float, reference: int = 0, confidence: float = CONFIDENCE) -> list[bool]:
    """For each candidate row, whether its ratio to ``reference`` is surely on one side of ``threshold``."""
    return [i is None or i.high < threshold or i.low > threshold for i in _intervals(timings, reference, confidence)]


MIN_ROUNDS_TO_DECIDE = 5  # the fewest rounds a paired decision rests on (here and in engine/measure/paired_timing.py)
EARLY_ROUNDS = 2  # after this many rounds, a candidate far slower than the threshold sits out
FAR = 1.15  # far: every one of its ratios at least this factor above the threshold
EARLY_FLOOR_S = 0.010  # ... of an original that takes at least this long a call


def far_above(timings: np.ndarray, threshold: float, reference: int = 0) -> list[bool]:
    """For each candidate row, whether it ran ``EARLY_ROUNDS`` rounds or more, each paired ratio at least ``FAR`` times
    ``threshold``: plainly slower, it needs no more rounds. Only for a reference of ``EARLY_FLOOR_S`` a call or more: a
    model of microseconds is at the mercy of what ran before it."""
    base = timings[reference]
    if not np.any(~np.isnan(base)) or np.nanmedian(base) < EARLY_FLOOR_S:
        return [False] * (len(timings) - 1)
    return [
        len(row) >= EARLY_ROUNDS and bool(np.all(row / ref >= threshold * FAR))
        for row, ref in _paired(timings, reference)
    ]


def not_faster(timings: np.ndarray, row: int, reference: int) -> bool:
    """Whether ``row`` is surely not faster than ``reference`` beyond ``MIN_GAIN``."""
    interval = _intervals(timings[[reference, row]])[0]
    return interval is not None and interval.rounds >= MIN_ROUNDS_TO_DECIDE and interval.low > 1.0 - MIN_GAIN


def pair_decided(timings: np.ndarray, row: int, reference: int) -> bool:
    """Whether ``row``'s ratio to ``reference`` is surely on one side of ``1 - MIN_GAIN`` (a paired timing's rule)."""
    return decided(timings[[reference, row]], 1.0 - MIN_GAIN)[0]


def _fastest_below(intervals: list[RatioInterval | None], threshold: float) -> int | None:
    """The row (1..) of the candidate with the lowest median ratio among those surely below ``threshold``."""
    below = [(i.median, row) for row, i in enumerate(intervals, start=1) if i is not None and i.high < threshold]
    return min(below)[1] if below else None


def fastest_known(timings: np.ndarray, threshold: float) -> bool:
    """Whether the fastest candidate surely below ``threshold`` is surely ahead of the others (or tied with them)."""
    intervals = _intervals(timings)
    first = _fastest_below(intervals, threshold)
    if first is None:
        return True
    others = [row for row, i in enumerate(intervals, start=1) if i is not None and i.high < threshold and row != first]
    behind = _intervals(timings[[first, *others]])  # each other's time over the fastest's
    return all(
        i is None or i.low > 1.0 or (i.high <= 1.0 + MIN_GAIN and i.low >= 1.0 / (1.0 + MIN_GAIN)) for i in behind
    )


def outrun(timings: np.ndarray, threshold: float) -> list[bool]:
    """For each candidate row, whether it is surely slower than the fastest candidate surely below ``threshold``."""
    first = _fastest_below(_intervals(timings), threshold)
    if first is None:
        return [False] * (len(timings) - 1)
    to_first = _intervals(timings, reference=first)  # every row but ``first``, in order
    to_first.insert(first, None)  # the fastest is not behind itself: positions are rows again
    return [i is not None and i.low > 1.0 / (1.0 - MIN_GAIN) for i in to_first[1:]]


class UnsureRatio(float):
    """A median paired ratio whose interval still held the threshold: "at the threshold, within the noise"."""


def ceiling_medians(timings: np.ndarray, threshold: float) -> list[float | None]:
    """Each candidate's median paired ratio (None: never ran), an :class:`UnsureRatio` if undecided at ``threshold``."""
    return [
        None if i is None else (i.median if i.high < threshold or i.low > threshold or far else UnsureRatio(i.median))
        for i, far in zip(_intervals(timings), far_above(timings, threshold), strict=True)
    ]


def time_until_decided(
    request: TimingRequest, provider: str = DEFAULT_PROVIDER, provider_options: dict | None = None
) -> np.ndarray:
    """Seconds per round, row 0 the original and one row per candidate; a decided candidate sits out the later rounds
    (NaN).

    At least ``min_rounds`` always run, whatever the ``deadline``; none starts past ``limit`` once one ran. ``early``: a
    candidate :func:`far_above` sits out after ``EARLY_ROUNDS``. ``original_rounds``: the original goes on alone until
    it ran that many (its figures are read from them). ``pairs``: see :func:`_still_timed`."""
    candidates = request.models[1:]
    max_rounds, min_rounds, deadline, limit = request.max_rounds, request.min_rounds, request.deadline, request.limit
    timing_spec = replace(request.spec, warmup=min(request.spec.warmup, 2))
    sessions = open_all(
        [partial(timing_session, m, timing_spec, provider, provider_options, request.settings) for m in request.models]
    )
    if isinstance(sessions[0], BaseException):
        raise sessions[0]
    calls: list[Callable[[], object] | None] = []
    for row, session in enumerate(sessions):  # a candidate onnxruntime cannot load or run sits out (a NaN row)
        if isinstance(session, BaseException):
            reason = (str(session).splitlines() or [type(session).__name__])[0][:200]
            log.warning("speed ceiling %s: onnxruntime cannot run it (%s)", candidates[row - 1], reason)
            calls.append(None)
        else:
            calls.append(timed_call(session, request.feed, request.runner))
    usable = [call is not None for call in calls]
    active = list(usable)

    def guarded(row: int, call: Callable[[], object]) -> Callable[[], object]:
        def run() -> None:  # a candidate that cannot run (without warm-up, it fails in a round) sits out
            try:
                call()
            except Exception as exc:
                if row == 0:
                    raise
                log.warning("speed ceiling %s: onnxruntime cannot run it (%s)", candidates[row - 1], exc)
                usable[row] = active[row] = False

        return run

    def after(timings: np.ndarray) -> bool:
        done = timings.shape[1]
        progress.tick(done, max_rounds, "rounds")
        if _past(limit):
            return True  # the run's limit: what is undecided stays so
        if not (request.early and done == EARLY_ROUNDS) and (done < min_rounds or (done - min_rounds) % request.chunk):
            return False
        if done >= min_rounds and _past(deadline):
            return True
        active[:], finished = _still_timed(timings, request, usable)
        return finished

    guarded_calls = [None if call is None else guarded(row, call) for row, call in enumerate(calls)]
    with latency_lane() as lane:
        between = None if lane is None else lane.between_rounds
        warmup_s = WARMUP_SHARE * timing_spec.seconds * len(calls)
        interleaved(guarded_calls, 0, warmup=timing_spec.warmup, warmup_s=warmup_s, active=active, between=between)
        share_end = timing_end(timing_spec, len(calls))
        timings = interleaved(
            guarded_calls,
            max_rounds,
            end=share_end,
            fewest=min_rounds,
            share_s=timing_spec.seconds * len(calls),
            active=active,
            between=between,
            after=after,
        )
    if timings.shape[1] < request.original_rounds:  # the original alone goes on in its warm session
        end = min((end for end in (deadline, limit, share_end) if end is not None), default=None)
        alone = interleaved(
            calls, request.original_rounds - timings.shape[1], end=end, active=[True] + [False] * len(candidates)
        )
        timings = np.concatenate([timings, alone], axis=1)
    return timings


def _past(*ends: float | None) -> bool:
    return any(end is not None and time.perf_counter() >= end for end in ends)


def _still_timed(timings: np.ndarray, request: TimingRequest, usable: Sequence[bool]) -> tuple[list[bool], bool]:
    """Which rows the next rounds time, and whether timing is over.

    ``anchor``: a model already in budget; the confirmation places it, so neither it nor a ceiling surely not faster
    than it needs rounds. A companion of ``pairs`` (row, reference row) is timed, with its reference, until its ratio is
    decided at ``1 - MIN_GAIN``; the ceilings' rules see only the other rows."""
    threshold, pairs, anchor = float(request.threshold or 0.0), request.pairs, request.anchor
    companions = {row for row, _ in pairs}
    rows = [row for row in range(len(timings)) if row not in companions]  # 0 (the original) first
    own = timings[rows]
    behind = outrun(own, threshold)
    far = far_above(own, threshold) if request.early else [False] * (len(own) - 1)
    settled = [flag or late or slow for flag, late, slow in zip(decided(own, threshold), behind, far, strict=True)]
    if anchor is not None:  # the model in budget already, and each ceiling surely not faster than it
        each = zip(settled, rows[1:], strict=True)
        settled = [flag or row == anchor or not_faster(timings, row, anchor) for flag, row in each]
    ranked = fastest_known(own, threshold)
    below = [bool(np.any(~np.isnan(row)) and np.nanmedian(row / own[0]) < threshold) for row in own[1:]]
    active = [False] * len(timings)
    active[0] = True
    for row, flag, fast in zip(rows[1:], settled, below, strict=True):
        active[row] = usable[row] and (not flag or (fast and not ranked))
    if anchor is not None and any(active[row] for row in rows[1:] if row != anchor):
        active[anchor] = usable[anchor]  # the others are judged against it too
    open_pairs = False
    for row, reference in pairs:
        pending = usable[row] and usable[reference] and not pair_decided(timings, row, reference)
        active[row] = pending
        active[reference] = active[reference] or pending
        open_pairs = open_pairs or pending
    return active, all(settled) and ranked and not open_pairs


Timings = Callable[[list[Path | None], LatencySpec, int], np.ndarray]
"""A backend's side-by-side rounds of the models given (a ``None`` sits out: a NaN row), the rounds'
order going on from the round given (:func:`.interleave.round_orders`); seconds."""


def decide_in_chunks(timings: Timings, request: TimingRequest) -> np.ndarray:
    """:func:`time_until_decided` for a backend that times whole batches of rounds elsewhere (a target's server)."""
    models = list(request.models)
    min_rounds, max_rounds, limit, deadline = request.min_rounds, request.max_rounds, request.limit, request.deadline
    usable = [True] * len(models)
    spec = replace(request.spec, warmup=min(request.spec.warmup, 2))

    def batch(rows: list[int], rounds: int, first: int) -> np.ndarray:
        try:
            return timings(
                [m if row in rows else None for row, m in enumerate(models)], replace(spec, repeats=rounds), first
            )
        except Exception:
            if len(rows) < 2:
                raise
        for row in rows[1:]:  # which candidate the backend cannot run: each once beside the original
            try:
                timings([models[0], models[row]], replace(spec, warmup=0, repeats=1), 0)
            except Exception as exc:
                log.warning("speed ceiling %s: the backend cannot run it (%s)", models[row], str(exc)[:200])
                usable[row] = False
        if all(usable[row] for row in rows):
            raise RuntimeError(f"the backend could not time {len(rows)} models side by side, yet each alone")
        return batch([row for row in rows if usable[row]], rounds, first)

    first = min(EARLY_ROUNDS, min_rounds) if request.early else min_rounds
    share_end = timing_end(spec, len(models))
    columns = [batch(list(range(len(models))), max(1, min(first, max_rounds)), 0)]
    # the fewest rounds cut to what the share holds at the first round's cost, as in-process (interleaved)
    fewest = fewest_within(min_rounds, spec.seconds * len(models), float(np.nansum(columns[0][:, 0])))
    while (done := sum(c.shape[1] for c in columns)) < max_rounds:
        progress.tick(done, max_rounds, "rounds")
        if _past(limit) or (done >= fewest and _past(deadline, share_end)):
            break
        active, finished = _still_timed(np.concatenate(columns, axis=1), request, usable)
        if finished:
            break
        size = fewest - done if done < fewest else request.chunk  # to the fewest after the early ones
        columns.append(batch([row for row, on in enumerate(active) if on], min(size, max_rounds - done), done))
    if (done := sum(c.shape[1] for c in columns)) < request.original_rounds and not _past(deadline, limit, share_end):
        columns.append(batch([0], request.original_rounds - done, done))  # the original alone, as above
    return np.concatenate(columns, axis=1)
