"""Agreement of the text detector's probability map with the fp32 model's: F1 of text pixels
(``agreement.text_pixel_f1``), over all pages. A detector that finds nothing scores 0."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import agreement

MODEL = Path(__file__).with_name("model.onnx")


def text_pixel_f1(outputs: dict, data: dict) -> float:
    return agreement.text_pixel_f1(MODEL, outputs, data)
