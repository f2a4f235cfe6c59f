"""F1 of ddddocr's detections against the fp32 model's (YOLOX decode, objectness x class
score > 0.1, NMS 0.45, as ddddocr decodes them; IoU >= 0.5): ``detections.f1``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agreement import pieces, reference
from detections import f1, nms, yolox

MODEL = Path(__file__).with_name("model.onnx")
THRESHOLD = 0.1
SIZE = (416, 416)


def detection_f1(outputs: dict, data: dict) -> float:
    truth = reference(MODEL, {"images": data["images"]})
    decode = lambda batch: [nms(yolox(image, SIZE, THRESHOLD)) for part in pieces(batch) for image in part]  # noqa: E731
    return f1(decode(outputs["output"]), decode(truth["output"]))
