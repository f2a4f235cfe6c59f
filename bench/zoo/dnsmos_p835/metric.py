"""Agreement of DNSMOS's three raw MOS figures with the fp32 model's: 1 - mean absolute
difference in MOS points, floored at 0.

Each clip's signal, background and overall figures (about 1-5) are compared with the original
model's on the same audio (``agreement.reference``): a 1% budget is a mean drift of 0.01 MOS
points, well inside the model's own error against listeners. An all-zero output scores 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agreement import pieces, reference

MODEL = Path(__file__).with_name("model.onnx")
OUTPUT = "Identity:0"


def mos_agreement(outputs: dict, data: dict) -> float:
    truth = reference(MODEL, {"input_1": data["input_1"]})
    mine, theirs = np.concatenate(pieces(outputs[OUTPUT])), np.concatenate(pieces(truth[OUTPUT]))
    return max(0.0, 1.0 - float(np.mean(np.abs(mine - theirs))))
