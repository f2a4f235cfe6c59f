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


def top1_agreement(outputs: np.ndarray, reference: np.ndarray) -> float:
    return float(np.mean(np.argmax(outputs, axis=-1) == np.argmax(reference, axis=-1)))


def cosine(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Mean per-sample cosine similarity (1.0 = same direction)."""
    a, b = _flat(outputs), _flat(reference)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.sum(a * b, axis=1)
    sims = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 1.0)
    return float(np.mean(sims))


def l2(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Mean per-sample Euclidean distance."""
    return float(np.mean(np.linalg.norm(_flat(outputs) - _flat(reference), axis=1)))


def max_abs_diff(outputs: np.ndarray, reference: np.ndarray) -> float:
    return float(np.max(np.abs(_flat(outputs) - _flat(reference))))


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
