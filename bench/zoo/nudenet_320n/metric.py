"""F1 of NudeNet's detections against the fp32 model's (score >= 0.25, NMS 0.45, as NudeNet
decodes them; same class, IoU >= 0.5; a box within 0.05 of the
threshold without a partner counts neither way): ``detections.f1``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from detections import versus_fp32, yolov8

MODEL = Path(__file__).with_name("model.onnx")
THRESHOLD = 0.25


def detection_f1(outputs: dict, data: dict) -> float:
    return versus_fp32(MODEL, outputs, data, "output0", THRESHOLD, yolov8)
