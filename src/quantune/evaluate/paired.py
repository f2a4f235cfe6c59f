"""Is a candidate faster than the original beyond the timing noise? Paired ratios decide.

The end-of-run re-timing runs the original and the candidates once per round, interleaved,
so whatever else the machine does in a round slows them all alike. The ratio *candidate time /
original time in the same round* cancels that drift; across rounds it still scatters. Its
median gets a distribution-free confidence interval from the order statistics (the interval
a sign test gives, exact for any number of rounds, no resampling, no seed): with ``n`` rounds
and the ratios sorted, the true median lies below the ``u``-th smallest ratio with
probability at least ``1 - P(Binomial(n, 1/2) >= u)``. A candidate is faster only when the
upper end of that interval is below ``1 - MIN_GAIN`` (0.98) — with 5 rounds that means all 5
ratios below it (one-sided 96.9%), with 50 rounds at least 32 of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.90  # two-sided; each end is a one-sided 95% bound
# The least gain that counts as faster: a gain this small does not survive a second timing on a
# shared machine, so it is not claimed.
MIN_GAIN = 0.02


@dataclass(frozen=True)
class RatioInterval:
    """The median paired ratio (candidate / original; below 1 = faster) and its confidence
    interval; ``high`` is ``inf`` (``low`` 0) when too few rounds bound it."""

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
        """The median says faster beyond ``MIN_GAIN`` but the interval reaches above it (too few
        rounds, or rounds scattered by other work): no evidence either way, neither "faster" nor
        "not faster"."""
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
