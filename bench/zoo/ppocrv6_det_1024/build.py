"""PP-OCRv6's small text detector (``PP-OCRv6_det_small.onnx`` from rapidocr 3.10.0, Apache-2.0)
on whole 1024x1024 pages of news text: the ``ppocrv6_det`` model at the size a scanned page is
detected at, where one run at batch 1 takes about a second.

The data: 1024x1024 pages on a light background of varying shade, with 16-40 lines of gensim's
Lee corpus in DejaVu Sans at random sizes, in one or two columns, preprocessed as RapidOCR does
(RGB / 255, ImageNet mean and std, CHW), stacked as one fixed-shape table.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from zoolib import extract, font_path, lee_lines

PACKAGE = "rapidocr==3.10.0"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
SIZE = 1024
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def page(lines: list[str], seed: int) -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    shade = rng.randint(200, 255)
    image = Image.new("RGB", (SIZE, SIZE), (shade, shade, rng.randint(200, 255)))
    draw = ImageDraw.Draw(image)
    columns = rng.choice([1, 2])
    lines = iter(lines)
    for column in range(columns):
        y = rng.randint(16, 80)
        while True:
            size = rng.choice([14, 16, 20, 24, 28, 36])
            line = next(lines, None)
            if line is None or y + size > SIZE - 16:
                break
            ink = rng.randint(0, 90)
            x = column * SIZE // columns + rng.randint(8, 60)
            draw.text((x, y), line, font=ImageFont.truetype(font_path(), size), fill=(ink, ink, ink))
            y += int(size * rng.uniform(1.4, 2.6))
    array = np.asarray(image, dtype=np.float32) / 255.0
    return ((array - MEAN) / STD).transpose(2, 0, 1).astype(np.float32)


def pages(corpus: str, count: int, seed: int) -> np.ndarray:
    lines = lee_lines(corpus, count * 40, seed=seed, width=36)
    return np.stack([page(lines[i * 40 : (i + 1) * 40], seed * 1000 + i) for i in range(count)])


def build(target: Path) -> list[str]:
    extract(PACKAGE, "models/PP-OCRv6_det_small.onnx", target / "model.onnx")
    np.savez(target / "eval.npz", x=pages("lee.cor", 32, seed=0))
    np.savez(target / "calib.npz", x=pages("lee_background.cor", 8, seed=1))
    return FILES
