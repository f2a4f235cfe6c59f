"""Character accuracy of ddddocr's greedy CTC decoding on the labelled captchas, case-folded.

``outputs``: the model's logits, [steps, 1, classes] per captcha, concatenated along axis 0
(so [captchas x steps, 1, classes]); ``data["label"]``: each captcha's code points, -1 padded.
Class 0 is CTC's blank; a class maps to a character through ``charset.txt`` (ddddocr's own
list). The score is 1 - (edit distance / characters) over all captchas: an empty answer scores 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHARSET = Path(__file__).with_name("charset.txt").read_text(encoding="utf-8").split("\n")


def decode(steps: np.ndarray) -> str:
    best = steps.reshape(len(steps), -1).argmax(axis=-1)
    text, previous = [], 0
    for index in best:
        if index != previous and index != 0:
            text.append(CHARSET[int(index)])
        previous = index
    return "".join(text).lower()


def edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def char_accuracy(outputs: dict, data: dict) -> float:
    logits, labels = next(iter(outputs.values())), data["label"]
    if isinstance(logits, np.ndarray):
        logits = np.split(logits, len(labels))
    errors = total = 0
    for steps, label in zip(logits, labels, strict=True):
        truth = "".join(chr(int(c)) for c in np.asarray(label).ravel() if c >= 0)
        errors += edit_distance(decode(np.asarray(steps)), truth)
        total += len(truth)
    return 1.0 - errors / max(total, 1)
