"""PaddleOCR's text-direction classifier (``ch_ppocr_mobile_v2.0_cls_infer.onnx`` from
rapidocr-onnxruntime 1.4.4, Apache-2.0) on rendered lines of news text, half of them upside down.

The model: a MobileNetV3 (opset 11, weights as ``Constant`` nodes, unfused BatchNorm) that
says whether a text line reads upright (class 0) or turned 180 degrees (class 1). The data:
lines of gensim's Lee corpus rendered in DejaVu Sans at a few sizes, every other one rotated
by 180 degrees, preprocessed as RapidOCR does (height 48, keep the ratio, at most 192 wide,
normalized to [-1, 1], zero-padded to 192): [N, 3, 48, 192], ``label`` = 0 or 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from zoolib import extract, lee_lines, ppocr_normalize, render_line

PACKAGE = "rapidocr-onnxruntime==1.4.4"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
HEIGHT, WIDTH = 48, 192


def sample(text: str, size: int, turned: bool) -> np.ndarray:
    from PIL import Image

    image = render_line(text, size)
    if turned:
        image = image.rotate(180)
    width = min(WIDTH, int(np.ceil(HEIGHT * image.width / image.height)))
    padded = np.zeros((3, HEIGHT, WIDTH), dtype=np.float32)
    padded[:, :, :width] = ppocr_normalize(image.resize((width, HEIGHT), Image.BILINEAR))
    return padded


def dataset(lines: list[str]) -> dict[str, np.ndarray]:
    sizes = [20, 24, 28, 32, 36]
    turned = [i % 2 == 1 for i in range(len(lines))]
    x = np.stack([sample(line, sizes[i % len(sizes)], turned[i]) for i, line in enumerate(lines)])
    return {"x": x, "label": np.array(turned, dtype=np.int64)}


def build(target: Path) -> list[str]:
    extract(PACKAGE, "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", target / "model.onnx")
    np.savez(target / "eval.npz", **dataset(lee_lines("lee.cor", 256, seed=0, width=22)))
    calib = dataset(lee_lines("lee_background.cor", 64, seed=1, width=22))
    del calib["label"]
    np.savez(target / "calib.npz", **calib)
    return FILES
