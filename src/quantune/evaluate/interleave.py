"""The interleaved timing loop, written once: every timing in this process and a target's server run it. Standard
library and numpy only, Python 3.8-compatible: the target's server loads this file by its path, without quantune."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np


def round_orders(rounds: int, models: int) -> list[list[int]]:
    """The model order of each interleaved round: every model once in every place per block, from a fixed seed."""
    rng = np.random.default_rng(0)
    orders: list[list[int]] = []
    while len(orders) < rounds:
        cycle, shifts = rng.permutation(models), rng.permutation(models)
        orders += [np.roll(cycle, int(shift)).tolist() for shift in shifts]
    return orders[:rounds]


def fewest_within(fewest: int, share_s: float, round_s: float) -> int:
    """The fewest rounds at ``round_s`` a round: ``fewest``, or as many as ``share_s`` holds, at least one."""
    if round_s <= 0.0:
        return fewest
    return max(1, min(fewest, int(share_s / round_s)))


def interleaved(
    calls: Sequence[Callable[[], object] | None],
    rounds: int,
    *,
    first: int = 0,
    warmup: int = 0,
    warmup_s: float | None = None,
    end: float | None = None,
    fewest: int = 0,
    share_s: float | None = None,
    active: list[bool] | None = None,
    between: Callable[[], object] | None = None,
    after: Callable[[np.ndarray], bool] | None = None,
) -> np.ndarray:
    """Seconds, one row per call, one column per round that ran (NaN where a row sat out).

    Up to ``warmup`` calls of each first (at least one), within ``warmup_s``; then ``rounds`` rounds in
    :func:`round_orders` from round ``first``. No round starts past ``end`` once ``fewest`` ran (with ``share_s``:
    :func:`fewest_within`). ``active``: flags the caller may change between rounds. ``between``: called before each pass
    and round; ``after``: True ends the timing."""
    clock = time.perf_counter
    on = [call is not None for call in calls] if active is None else active
    started = clock()
    for index in range(warmup):
        if index and warmup_s is not None and clock() - started >= warmup_s:
            break
        if between is not None:
            between()
        for row, call in enumerate(calls):
            if on[row] and call is not None:
                call()
    timings = np.full((len(calls), rounds), np.nan)
    for index, order in enumerate(round_orders(first + rounds, len(calls))[first:]):
        if index >= fewest and end is not None and clock() >= end:
            return timings[:, :index]
        if between is not None:
            between()
        for row in order:
            if on[row] and calls[row] is not None:
                start = clock()
                calls[row]()
                if on[row]:
                    timings[row, index] = clock() - start
        if index == 0 and share_s is not None:  # the round's own calls: not a wait for the lane
            fewest = fewest_within(fewest, share_s, float(np.nansum(timings[:, 0])))
        if after is not None and after(timings[:, : index + 1]):
            return timings[:, : index + 1]
    return timings
