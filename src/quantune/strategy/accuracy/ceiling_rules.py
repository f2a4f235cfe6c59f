"""The fixed rules the speed ceilings are judged and ordered by, so that the same run twice recovers in the same variant
rather than following the noise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantune.evaluate.paired import MIN_GAIN
from quantune.strategy.accuracy.speed import Variant

TIE = MIN_GAIN  # ratios this close (relative) are one speed: the confirmation's rule
NEAR = 0.10  # ratios this close may be one speed: the fastest is checked side by side against the preferred
SETTLE_GAIN = 0.05  # ... and goes first only when faster than the preferred by this much, side by side
# A ceiling left undecided with its median less than this below the margin is a tie with it: dropped, as timed again it
# lands on either side.
UNSURE = 0.03


def clearly_faster(result: Mapping[str, Any]) -> bool:
    """Whether a candidate is faster beyond the noise and by ``SETTLE_GAIN``: enough to go before the preferred."""
    return bool(result.get("faster")) and float(result.get("ratio_median", 1.0)) <= 1.0 - SETTLE_GAIN


def ties_to_the_earlier(
    kept: list[Variant], baseline: float | None, order: dict[int, tuple[int, int]]
) -> list[Variant]:
    """``kept`` with variants within ``TIE`` of the fastest in a fixed ``order``, so the order ignores the noise."""
    rest, out = list(kept), []
    while rest:
        best = or_inf(rest[0].ratio(baseline))
        tied = [v for v in rest if or_inf(v.ratio(baseline)) <= best / (1.0 - TIE)] if best != float("inf") else rest
        pick = min(tied, key=lambda v: order[id(v)])
        out.append(pick)
        rest = [v for v in rest if v is not pick]
    return out


def not_surely_slower(variant: Variant, others: list[Variant], baseline: float | None) -> list[Variant]:
    """``others`` faster than ``variant``'s ceiling or within ``NEAR`` above it: maybe one speed with it."""
    mine = variant.ratio(baseline)
    if mine is None:
        return []
    return [v for v in others if (ratio := v.ratio(baseline)) is not None and ratio <= mine * (1.0 + NEAR)]


def or_inf(value: float | None) -> float:
    return float("inf") if value is None else value
