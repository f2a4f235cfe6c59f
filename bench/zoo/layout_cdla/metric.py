"""Agreement of the layout detector's class scores with the fp32 model's: F1 of the detections.

The four score outputs (one per feature-map stride, [1, anchors, 10 classes] each, after the
sigmoid) are compared with the original model's on the same pages (``agreement.reference``):
an (anchor, class) cell above 0.4 is a detection, and the score is the F1 of the candidate's
detections against the reference's, over all pages and strides. A model that detects nothing
scores 0; one that detects everything scores little.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agreement import mask_f1, reference

MODEL = Path(__file__).with_name("model.onnx")
SCORES = ("transpose_0.tmp_0", "transpose_2.tmp_0", "transpose_4.tmp_0", "transpose_6.tmp_0")


def detection_f1(outputs: dict, data: dict) -> float:
    truth = reference(MODEL, {"image": data["image"]})
    mine = [x for name in SCORES for x in _parts(outputs[name])]
    theirs = [x for name in SCORES for x in _parts(truth[name])]
    return mask_f1(mine, theirs, threshold=0.4)


def _parts(value) -> list:
    return list(value) if not hasattr(value, "shape") else [value]
