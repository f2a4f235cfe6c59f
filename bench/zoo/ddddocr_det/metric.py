"""F1 of ddddocr's detections against the fp32 model's (YOLOX decode, objectness x class
score > 0.1, NMS 0.45, as ddddocr decodes them; IoU >= 0.5; a box within 0.05 of the
threshold without a partner counts neither way): ``detections.f1``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from detections import versus_fp32, yolox

MODEL = Path(__file__).with_name("model.onnx")
THRESHOLD = 0.1
SIZE = (416, 416)


def detection_f1(outputs: dict, data: dict) -> float:
    return versus_fp32(MODEL, outputs, data, "output", THRESHOLD, lambda image, cut: yolox(image, SIZE, cut))
