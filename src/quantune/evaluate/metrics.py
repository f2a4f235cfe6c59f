"""Accuracy from labels, and agreement of a candidate's outputs with the original model's.

Agreement metrics need no labels: they compare the candidate's first output with the
original model's on the same evaluation data, sample by sample.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def top1(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Share of samples whose arg-max over the last axis equals the label."""
    return float(np.mean(np.argmax(outputs, axis=-1).reshape(-1) == labels.reshape(-1)))


def _flat(array: np.ndarray) -> np.ndarray:
    return array.reshape(len(array), -1).astype(np.float64)


def _broken(flat: np.ndarray) -> np.ndarray:
    """Per sample: whether the candidate's output holds NaN or infinity (it agrees with nothing)."""
    return ~np.all(np.isfinite(flat), axis=1)


def top1_agreement(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Share of samples whose arg-max over the last axis is the reference's.

    A candidate row without a unique maximum (all equal: an all-zero or constant output)
    agrees only where the reference row is all equal too; ``argmax`` alone would pick index
    0 and agree by chance with every reference whose top class is the first. Non-finite rows
    never agree. (With one value on the last axis every row is "all equal": use cosine or l2.)
    """
    out = np.asarray(outputs, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    same = np.argmax(out, axis=-1) == np.argmax(ref, axis=-1)
    flat_out = np.nan_to_num(out, nan=0.0)
    out_tied = np.all(flat_out == flat_out[..., :1], axis=-1)
    ref_tied = np.all(ref == ref[..., :1], axis=-1)
    finite = np.all(np.isfinite(out), axis=-1)
    agree = np.where(out_tied, ref_tied, same & ~ref_tied) & finite
    return float(np.mean(agree))


def cosine(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Mean per-sample cosine similarity, centred on the reference's mean (1.0 = same shape).

    Both vectors of a sample are shifted by the *reference's* per-sample mean before the
    cosine, so an output that is constant (all zeros, or any constant: a detector that found
    nothing) scores 0 against a reference that varies, an output shifted by an offset scores
    below 1, and an unchanged output still scores exactly 1. Plain cosine would give an
    all-positive reference and a constant output a score near 1. Where the reference sample is
    itself constant (or has one value), centring leaves nothing to compare, so the raw cosine
    is used there. Zero vectors are handled, never divided by: both zero = 1.0, one zero = 0.0.
    Samples whose output holds NaN or infinity score 0.
    """
    a, b = _flat(outputs), _flat(reference)
    center = b.mean(axis=1, keepdims=True)
    centred_b = b - center
    varies = np.linalg.norm(centred_b, axis=1) > 1e-9 * np.linalg.norm(b, axis=1)
    x = np.where(varies[:, None], a - center, a)
    y = np.where(varies[:, None], centred_b, b)
    broken = _broken(a)
    x = np.where(broken[:, None], 0.0, x)
    nx, ny = np.linalg.norm(x, axis=1), np.linalg.norm(y, axis=1)
    both_zero = (nx == 0) & (ny == 0)
    one_zero = (nx == 0) ^ (ny == 0)
    # exact where rounding would leave a trace: a zero or constant output against a varying reference
    one_zero |= (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) > 0)
    one_zero |= varies & np.all(a == a[:, :1], axis=1)
    dots = np.sum(x * y, axis=1)
    sims = np.clip(dots / np.where((nx > 0) & (ny > 0), nx * ny, 1.0), -1.0, 1.0)
    sims = np.where(one_zero, 0.0, np.where(both_zero, 1.0, sims))
    return float(np.mean(np.where(broken, 0.0, sims)))


def l2(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Mean per-sample Euclidean distance (infinite when an output holds NaN or infinity)."""
    a = _flat(outputs)
    if _broken(a).any():
        return float("inf")
    return float(np.mean(np.linalg.norm(a - _flat(reference), axis=1)))


def max_abs_diff(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Largest absolute difference (infinite when an output holds NaN or infinity)."""
    a = _flat(outputs)
    if _broken(a).any():
        return float("inf")
    return float(np.max(np.abs(a - _flat(reference))))


LABEL_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {"top1": top1}
AGREEMENT_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "top1_agreement": top1_agreement,
    "cosine": cosine,
    "l2": l2,
    "max_abs_diff": max_abs_diff,
}
_LOWER_IS_BETTER = {"l2", "max_abs_diff", "latency_ms", "size_bytes"}


def metric_direction(name: str) -> bool:
    """True when higher values of the built-in metric ``name`` are better."""
    return name not in _LOWER_IS_BETTER
