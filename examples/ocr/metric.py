"""Character accuracy of CTC greedy decoding: 1 - (edit distance / characters), over all lines.

quantune calls ``char_accuracy(outputs, data)``: the model's first output holds per-step class
probabilities [lines, steps, classes] (class 0 = CTC blank); ``data["label"]`` holds each
line's true class indices, padded with -1.
"""

from __future__ import annotations

import numpy as np


def decode(probabilities: np.ndarray) -> list[list[int]]:
    best = probabilities.argmax(axis=-1)
    lines = []
    for row in best:
        keep = np.ones(len(row), dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        lines.append([int(c) for c in row[keep] if c != 0])
    return lines


def edit_distance(a: list[int], b: list[int]) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def char_accuracy(outputs: dict[str, np.ndarray], data: dict[str, np.ndarray]) -> float:
    predicted = decode(next(iter(outputs.values())))
    errors = total = 0
    for guess, label in zip(predicted, data["label"], strict=True):
        truth = [int(c) for c in label if c >= 0]
        errors += edit_distance(guess, truth)
        total += len(truth)
    return 1.0 - errors / max(total, 1)
