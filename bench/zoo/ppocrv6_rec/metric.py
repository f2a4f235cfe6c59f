"""Character accuracy of CTC greedy decoding: 1 - (edit distance / characters), over all lines.

``outputs["fetch_name_0"]``: per line, [1, steps, classes] class probabilities (class 0 is
CTC's blank) — a list, one per feed, since the lines' widths differ (or one stacked array if
they happen to stack); ``data["label"]``: per line, [1, characters] true class indices. An
empty answer scores 0.
"""

from __future__ import annotations

import numpy as np


def decode(probabilities: np.ndarray) -> list[int]:
    best = probabilities.reshape(-1, probabilities.shape[-1]).argmax(axis=-1)
    keep = np.ones(len(best), dtype=bool)
    keep[1:] = best[1:] != best[:-1]
    return [int(c) for c in best[keep] if c != 0]


def edit_distance(a: list[int], b: list[int]) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def _rows(value) -> list[np.ndarray]:
    if isinstance(value, np.ndarray):
        return list(value)  # stacked: one row per line
    return [np.asarray(v)[0] for v in value]  # one [1, ...] array per feed


def char_accuracy(outputs: dict, data: dict) -> float:
    probabilities = outputs.get("fetch_name_0", next(iter(outputs.values())))
    errors = total = 0
    for steps, label in zip(_rows(probabilities), _rows(data["label"]), strict=True):
        truth = [int(c) for c in np.ravel(label) if c >= 0]
        errors += edit_distance(decode(steps), truth)
        total += len(truth)
    return 1.0 - errors / max(total, 1)
