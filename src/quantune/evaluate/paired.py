"""Is a candidate faster than the original beyond the timing noise? Paired ratios decide.

Interleaved rounds slow all models alike, so the ratio *candidate time / original time in the
same round* cancels the drift. Its median gets a distribution-free confidence interval from the
order statistics (a sign test's: exact, no resampling, no seed). A candidate is faster only when
the upper end of that interval is below ``1 - MIN_GAIN``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.90  # two-sided; each end is a one-sided 95% bound
# The least gain that counts as faster: a smaller one does not survive a second timing on a shared machine.
MIN_GAIN = 0.02


@dataclass(frozen=True)
class RatioInterval:
    """The median paired ratio (below 1: faster) and its interval (``inf`` when too few rounds bound it)."""

    median: float
    low: float
    high: float
    rounds: int

    @property
    def faster(self) -> bool:
        """Faster beyond the noise: the whole interval below ``1 - MIN_GAIN``."""
        return self.high < 1.0 - MIN_GAIN

    @property
    def undecided(self) -> bool:
        """The median says faster but the interval reaches above ``1 - MIN_GAIN``: no evidence either way."""
        return not self.faster and self.median < 1.0 - MIN_GAIN

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "ratio_median": self.median,
            "ratio_ci_low": self.low if self.low > 0 else None,
            "ratio_ci_high": self.high if math.isfinite(self.high) else None,
            "confidence": CONFIDENCE,
            "rounds": self.rounds,
        }


def _upper_rank(rounds: int, tail: float) -> int | None:
    """The smallest 1-based rank ``u`` with ``P(Binomial(rounds, 1/2) >= u) <= tail``."""
    total = 2.0**rounds
    above = 0.0  # P(B >= u) * 2**rounds, built from u = rounds downwards
    rank = None
    for u in range(rounds, 0, -1):
        above += math.comb(rounds, u)
        if above / total > tail:
            break
        rank = u
    return rank


def paired_ratio(candidate_s: np.ndarray, original_s: np.ndarray, confidence: float = CONFIDENCE) -> RatioInterval:
    """The median of ``candidate_s[i] / original_s[i]`` over rounds ``i`` and its interval."""
    ratios = np.sort(np.asarray(candidate_s, dtype=np.float64) / np.asarray(original_s, dtype=np.float64))
    rounds = len(ratios)
    if rounds == 0:
        raise ValueError("paired_ratio needs at least one round")
    rank = _upper_rank(rounds, (1.0 - confidence) / 2)
    if rank is None:
        return RatioInterval(float(np.median(ratios)), 0.0, math.inf, rounds)
    low_rank = rounds + 1 - rank  # the mirror order statistic
    return RatioInterval(float(np.median(ratios)), float(ratios[low_rank - 1]), float(ratios[rank - 1]), rounds)
