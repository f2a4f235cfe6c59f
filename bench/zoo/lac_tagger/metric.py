"""Agreement of LAC's per-character tags with the fp32 model's: the share of characters whose
best tag (arg-max of the 59 tag scores) is the one the original model gives on the same
sentence (``agreement.reference``). A constant output gets only the characters whose tag
happens to be that constant.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agreement import pieces, reference

MODEL = Path(__file__).with_name("model.onnx")
OUTPUT = "fetch_name_0"


def tag_agreement(outputs: dict, data: dict) -> float:
    truth = reference(MODEL, {"token_ids": data["token_ids"], "length": data["length"]})
    same = total = 0
    for mine, theirs in zip(pieces(outputs[OUTPUT]), pieces(truth[OUTPUT]), strict=True):
        same += int(np.sum(mine.argmax(axis=-1) == theirs.argmax(axis=-1)))
        total += theirs[..., 0].size
    return same / max(total, 1)
