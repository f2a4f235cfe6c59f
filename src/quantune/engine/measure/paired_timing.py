"""One candidate timed against a reference model side by side, in rounds that stop once the paired ratio is surely on
one side of ``1 - MIN_GAIN``. Byte-identical models are never timed; a pair once timed is read from the cache."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from quantune.evaluate.latency import TimingRequest
from quantune.evaluate.paired import MIN_GAIN, paired_ratio
from quantune.evaluate.rounds import MIN_ROUNDS_TO_DECIDE, pair_decided
from quantune.store import cache_key

log = logging.getLogger("quantune.strategy")
# 2: every pair timed through the evaluator's backend (before, a target.python run's pairs were
# timed in this process on the CPU provider: those entries must not be read back)
KEY_VERSION = 2

PAIRED_ROUNDS = 20  # the most interleaved rounds one decision takes (a ceiling's too)
MIN_ROUNDS = MIN_ROUNDS_TO_DECIDE  # the fewest rounds a paired answer rests on (the rounds' own rule)


def same_model(rounds: int = 0) -> dict[str, Any]:
    """The answer for a byte-identical pair: not faster, nothing timed."""
    return {"ratio_median": 1.0, "rounds": rounds, "faster": False, "same_model": True}


def paired_latency(
    context: Any,
    candidate: tuple[Mapping[str, Any], tuple[str, ...]],
    reference: tuple[Mapping[str, Any], tuple[str, ...]],
    build: Callable[[dict[str, Any], tuple[str, ...]], tuple[Any, str]],
    limit: float | None = None,
) -> dict[str, Any] | None:
    """``candidate``'s latency over ``reference``'s, side by side (``RatioInterval.to_dict``, ``faster``), or None."""
    cand_path, cand_sha = build(dict(candidate[0]), tuple(candidate[1]))
    ref_path, ref_sha = build(dict(reference[0]), tuple(reference[1]))
    if cand_sha == ref_sha:
        return same_model()
    spec = context.evaluator.spec.latency
    key = pair_key(context, ref_sha, cand_sha)
    cached = context.cache.get_json("evals", key)
    if cached is not None:
        return dict(cached)
    feeds = getattr(context.evaluator, "_latency_feeds", None)
    try:  # target.python: each model on its provider there (the backend times where it runs)
        request = TimingRequest(
            (ref_path, cand_path),
            feeds,
            spec,
            context.evaluator.spec.runner,
            threshold=1.0 - MIN_GAIN,
            min_rounds=MIN_ROUNDS,
            max_rounds=max(MIN_ROUNDS, min(spec.repeats, PAIRED_ROUNDS)),
            limit=limit,
        )
        timings = context.evaluator.backend.time(request)
    except Exception as exc:  # the backend cannot run one of them: unknown, as below
        log.warning("paired timing: the backend cannot run the pair (%s)", str(exc).splitlines()[0][:200])
        return None
    result = pair_result(timings[1], timings[0])
    if result is None:
        return None
    if result["rounds"] < MIN_ROUNDS:  # cut at the run's limit: too few rounds to mean anything
        log.info("paired timing: stopped at the run's time limit after %d rounds: no answer", result["rounds"])
        return None
    context.cache.put_json("evals", key, result)
    log.info(
        "paired timing: %.3fx the reference over %d rounds (faster: %s)",
        result["ratio_median"],
        result["rounds"],
        result["faster"],
    )
    return result


def pair_key(context: Any, reference_sha: str, candidate_sha: str) -> str:
    """The cache key of one pair's answer, shared by the ceilings' session and :func:`paired_latency`."""
    return cache_key(
        "paired-latency",
        KEY_VERSION,
        reference_sha,
        candidate_sha,
        vars(context.evaluator.spec.latency),
        MIN_GAIN,
        PAIRED_ROUNDS,
        context.evaluator.dataset.fingerprint,
        context.evaluator.backend.fingerprint(),
    )


def pair_result(candidate_s: np.ndarray, reference_s: np.ndarray) -> dict[str, Any] | None:
    """A paired timing's answer over the rounds both rows ran; None when they never ran together."""
    both = ~np.isnan(candidate_s) & ~np.isnan(reference_s)
    if not both.any():
        return None
    interval = paired_ratio(candidate_s[both], reference_s[both])
    return {**interval.to_dict(), "faster": interval.faster, "same_model": False}


def store_pairs(
    context: Any,
    timings: np.ndarray,
    pairs: Sequence[tuple[int, int]],
    sha_of: Mapping[int, str],
    most: int,
    quiet: bool = False,
) -> int:
    """Each (row, reference row) pair's answer from rounds timed for another purpose, cached when decided; how many."""
    stored = 0
    for row, reference in pairs:
        result = pair_result(timings[row], timings[reference])
        if result is None or result["rounds"] < MIN_ROUNDS:
            continue
        if result["rounds"] < most and not pair_decided(timings, row, reference):
            continue
        context.cache.put_json("evals", pair_key(context, sha_of[reference], sha_of[row]), result)
        stored += 1
        if not quiet:
            log.info(
                "paired timing (in the speed ceilings' rounds): %.3fx the reference over %d rounds (faster: %s)",
                result["ratio_median"],
                result["rounds"],
                result["faster"],
            )
    return stored
