"""Accuracy from labels, and agreement of a candidate's first output with the original model's
(no labels needed), sample by sample."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def top1(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Share of samples whose arg-max over the last axis equals the label."""
    return float(np.mean(np.argmax(outputs, axis=-1).reshape(-1) == labels.reshape(-1)))


def flat_outputs(array: np.ndarray) -> np.ndarray:
    return array.reshape(len(array), -1).astype(np.float64)


# Elements per block the agreement metrics compare at once: every figure is per row, so blocks
# give the same figures without float64 copies of a wide output, and stay in the processor's cache.
BLOCK_ELEMENTS = 1 << 18


def _blocks(*arrays: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """The arrays cut along their first axis into blocks of about ``BLOCK_ELEMENTS`` elements."""
    first = arrays[0]
    if first.ndim == 0 or len(first) == 0:
        return [arrays]
    per_row = max(1, first.size // len(first))
    step = max(1, BLOCK_ELEMENTS // per_row)
    return [tuple(a[start : start + step] for a in arrays) for start in range(0, len(first), step)]


def broken_outputs(flat: np.ndarray) -> np.ndarray:
    """Per sample: whether the candidate's output holds NaN or infinity (it agrees with nothing)."""
    return ~np.all(np.isfinite(flat), axis=1)


def top1_agreement(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Share of samples whose arg-max over the last axis is the reference's. A row without a unique
    maximum (a constant output) agrees only with an all-equal reference row, not by chance with
    class 0; non-finite rows never agree."""
    outputs, reference = np.asarray(outputs), np.asarray(reference)
    agree = [top1_agree(out, ref) for out, ref in _blocks(outputs, reference)]
    return float(np.mean(np.concatenate([a.reshape(-1) for a in agree]) if agree else agree))


def _exact_float(array: np.ndarray) -> np.ndarray:
    """A float array as it is (arg-max, ties and finiteness do not change in float64), others in float64."""
    return array if np.issubdtype(array.dtype, np.floating) else np.asarray(array, dtype=np.float64)


def top1_agree(outputs: np.ndarray, reference: np.ndarray) -> np.ndarray:
    out, ref = _exact_float(outputs), _exact_float(reference)
    same = np.argmax(out, axis=-1) == np.argmax(ref, axis=-1)
    finite = np.all(np.isfinite(out), axis=-1)
    # a non-finite row never agrees, so only finite rows' ties matter (NaN would not equal itself)
    out_tied = np.all(out == out[..., :1], axis=-1)
    ref_tied = np.all(ref == ref[..., :1], axis=-1)
    return np.where(out_tied, ref_tied, same & ~ref_tied) & finite


def cosine(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Mean per-sample cosine similarity, centred on the reference's per-sample mean, so a constant
    output scores 0 against a varying reference (plain cosine would give near 1). A constant
    reference sample uses the raw cosine; both zero = 1.0, one zero = 0.0; non-finite samples score 0.
    """
    outputs, reference = np.asarray(outputs), np.asarray(reference)
    sims = [output_cosines(flat_outputs(out), flat_outputs(ref)) for out, ref in _blocks(outputs, reference)]
    return float(np.mean(np.concatenate(sims)))


def output_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Row sums by einsum over two centred copies, no other full-size temporaries.
    center = b.mean(axis=1, keepdims=True)
    y = b - center
    ny = np.sqrt(_row_dots(y, y))
    nb = np.sqrt(_row_dots(b, b))
    varies = ny > 1e-9 * nb
    x = a - center
    if not varies.all():  # a constant reference row: the raw vectors
        rows = ~varies
        x[rows], y[rows], ny[rows] = a[rows], b[rows], nb[rows]
    broken = broken_outputs(a)
    if broken.any():
        x[broken] = 0.0
    nx = np.sqrt(_row_dots(x, x))
    both_zero = (nx == 0) & (ny == 0)
    one_zero = (nx == 0) ^ (ny == 0)
    # exact where rounding would leave a trace: a zero or constant output against a varying reference
    one_zero |= (_row_dots(a, a) == 0) & (nb > 0)
    one_zero |= varies & np.all(a == a[:, :1], axis=1)
    dots = _row_dots(x, y)
    sims = np.clip(dots / np.where((nx > 0) & (ny > 0), nx * ny, 1.0), -1.0, 1.0)
    sims = np.where(one_zero, 0.0, np.where(both_zero, 1.0, sims))
    return np.where(broken, 0.0, sims)


def _row_dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, the dot product of ``a`` and ``b`` (2-D, the same shape)."""
    return np.einsum("ij,ij->i", a, b)


def l2(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Mean per-sample Euclidean distance (infinite when an output holds NaN or infinity)."""
    distances = _per_block(outputs, reference, lambda diff: np.linalg.norm(diff, axis=1))
    return float("inf") if distances is None else float(np.mean(np.concatenate(distances)))


def max_abs_diff(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Largest absolute difference (infinite when an output holds NaN or infinity)."""
    largest = _per_block(outputs, reference, lambda diff: np.max(np.abs(diff)))
    return float("inf") if largest is None else float(max(largest))


def _per_block(outputs: np.ndarray, reference: np.ndarray, figure: Callable[[np.ndarray], np.ndarray]) -> list | None:
    """``figure`` of each block's difference; None when an output holds NaN or infinity."""
    parts = []
    for out, ref in _blocks(np.asarray(outputs), np.asarray(reference)):
        a = flat_outputs(out)
        if broken_outputs(a).any():
            return None
        parts.append(figure(a - flat_outputs(ref)))
    return parts


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
