"""PP-OCRv6's small text recognizer (``PP-OCRv6_rec_small.onnx`` from rapidocr 3.10.0, Apache-2.0)
on lines of news text rendered at their natural width.

The model: an SVTR-style recognizer (opset 11, weights as ``Constant`` nodes) with a CTC head
over 18,709 characters + blank, input [batch, 3, 48, width]. The data: lines of gensim's Lee
corpus (10-32 characters) rendered in DejaVu Sans at a few sizes, preprocessed as RapidOCR
does (height 48 keeping the ratio, normalized to [-1, 1]), each line its own feed at its own
width (about 360-640 pixels) — no padding — with ``label``: the line's characters as the
model's class indices ([1, characters]).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from zoolib import extract, lee_lines, ppocr_normalize, render_line, save_feeds

PACKAGE = "rapidocr==3.10.0"
FILES = ["model.onnx", "calib_feeds.npz", "eval_feeds.npz"]
HEIGHT = 48


def line_feed(text: str, size: int, classes: dict[str, int], labelled: bool) -> dict[str, np.ndarray]:
    from PIL import Image

    image = render_line(text, size)
    width = int(np.ceil(HEIGHT * image.width / image.height))
    feed = {"x": ppocr_normalize(image.resize((width, HEIGHT), Image.BILINEAR))[None]}
    if labelled:
        feed["label"] = np.array([[classes[c] for c in text if c in classes]], dtype=np.int64)
    return feed


def build(target: Path) -> list[str]:
    model_path = extract(PACKAGE, "models/PP-OCRv6_rec_small.onnx", target / "model.onnx")
    meta = {p.key: p.value for p in onnx.load(str(model_path), load_external_data=False).metadata_props}
    characters = meta["character"].splitlines()
    classes = {c: i + 1 for i, c in enumerate(characters)}  # 0 is CTC's blank
    classes.setdefault(" ", len(characters) + 1)
    sizes = [22, 26, 30, 34]
    evaluation = lee_lines("lee.cor", 64, seed=0, width=32)
    calibration = lee_lines("lee_background.cor", 24, seed=1, width=32)
    save_feeds(
        target / "eval_feeds.npz",
        [line_feed(t, sizes[i % 4], classes, True) for i, t in enumerate(evaluation)],
    )
    save_feeds(
        target / "calib_feeds.npz",
        [line_feed(t, sizes[i % 4], classes, False) for i, t in enumerate(calibration)],
    )
    return FILES
