"""Metrics over outputs that come one feed at a time, and the outputs' storage form.

When every feed's output stacks, a metric sees one array. When they do not (an output width that
follows the input's), each feed is scored on its own and the figures combined as the metric
combines samples: a mean weighted by sample count, or the largest for ``max_abs_diff``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from quantune.data.dataset import stack

FeedOutputs = list[dict[str, np.ndarray]]
Metric = Callable[[np.ndarray, np.ndarray], float]

_MAX_METRICS = {"max_abs_diff"}
# Metrics whose samples are arg-max positions (the per-row ones count rows).
_POSITION_METRICS = {"top1", "top1_agreement"}


def output_samples(name: str, output: np.ndarray) -> int:
    if name in _POSITION_METRICS:
        return max(1, output.size // max(1, output.shape[-1])) if output.ndim else 1
    return max(1, len(output)) if output.ndim else 1


def over_feeds(name: str, func: Metric, outputs: list[np.ndarray], others: list[np.ndarray]) -> float:
    """``func`` over per-feed ``outputs`` and ``others`` (the reference outputs, or the labels)."""
    stacked, other = stack(outputs), stack(others)
    if isinstance(stacked, np.ndarray) and isinstance(other, np.ndarray):
        return func(stacked, other)
    figures = [func(out, ref) for out, ref in zip(outputs, others, strict=True)]
    if name in _MAX_METRICS:
        return float(max(figures))
    weights = [output_samples(name, out) for out in outputs]
    return float(np.average(figures, weights=weights))


def stacked_outputs(outputs: FeedOutputs) -> dict[str, np.ndarray | list[np.ndarray]]:
    """Output name -> stacked along axis 0 when every feed's output stacks, else one per feed."""
    names = list(outputs[0]) if outputs else []
    return {name: stack([feed[name] for feed in outputs]) for name in names}


def pack(outputs: FeedOutputs) -> dict[str, np.ndarray]:
    """Per-feed outputs as one flat dict of arrays (for the artifact cache's ``.npz``)."""
    return {f"{index:06d}|{name}": value for index, feed in enumerate(outputs) for name, value in feed.items()}


def unpack(packed: dict[str, np.ndarray]) -> FeedOutputs:
    """The inverse of :func:`pack`, names in their stored order."""
    feeds: dict[int, dict[str, np.ndarray]] = {}
    for key, value in packed.items():
        index, _, name = key.partition("|")
        feeds.setdefault(int(index), {})[name] = value
    return [feeds[index] for index in sorted(feeds)]
