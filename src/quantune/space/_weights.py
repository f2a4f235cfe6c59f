"""Weights (priorities) on a list of values, as AMD Quark's: random sampling draws in proportion to
them, exhaustive enumeration visits higher weights first (ties keep the declared order)."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from itertools import accumulate


def check_weights(weights: Sequence[float] | None, count: int, what: str) -> tuple[float, ...] | None:
    """Validates weights against ``count`` values; ``None`` stays ``None`` (all values equal)."""
    if weights is None:
        return None
    values = tuple(float(weight) for weight in weights)
    if len(values) != count:
        raise ValueError(f"{what}: {len(values)} weights for {count} values; give one weight per value")
    for weight in values:
        if not math.isfinite(weight) or weight <= 0:
            # a zero weight: unreachable by random sampling, still visited by exhaustive search
            raise ValueError(f"{what}: weights must be finite and > 0, got {weight!r}; leave a value out instead")
    return values


def priority_order(count: int, weights: tuple[float, ...] | None) -> tuple[int, ...]:
    """Indices by decreasing weight; ties (and no weights) keep the declared order."""
    if weights is None:
        return tuple(range(count))
    return tuple(sorted(range(count), key=lambda index: -weights[index]))


def cumulative(weights: tuple[float, ...] | None) -> tuple[float, ...] | None:
    return None if weights is None else tuple(accumulate(weights))


def draw_index(rng: random.Random, count: int, cum: tuple[float, ...] | None) -> int:
    """An index drawn uniformly, or in proportion to the weights whose running sums are ``cum``."""
    if cum is None:
        return rng.randrange(count)
    return min(bisect.bisect_right(cum, rng.random() * cum[-1]), count - 1)
