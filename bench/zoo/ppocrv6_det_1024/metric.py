"""Agreement of the text detector's probability map with the fp32 model's: F1 of text pixels.

A pixel whose text probability exceeds 0.3 (DB's binarization threshold in RapidOCR) is text;
the score is the F1 of the candidate's text pixels against the original model's on the same
pages (``agreement.reference``), over all pages. A detector that finds nothing scores 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agreement import mask_f1, reference

MODEL = Path(__file__).with_name("model.onnx")
OUTPUT = "fetch_name_0"


def text_pixel_f1(outputs: dict, data: dict) -> float:
    truth = reference(MODEL, {"x": data["x"]})
    return mask_f1(outputs[OUTPUT], truth[OUTPUT], threshold=0.3)
