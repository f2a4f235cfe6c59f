"""PP-OCRv6's small text detector (``PP-OCRv6_det_small.onnx`` from rapidocr 3.10.0, Apache-2.0)
on rendered pages of news text, each page at its own size.

The model: a DB (differentiable binarization) detector (opset 11, ``Constant`` weights) that
maps an image [batch, 3, H, W] (H, W multiples of 32) to a text-probability map [batch, 1, H, W].
The data: pages of 320-640 x 416-736 pixels on a light background of varying shade, with 6-14
lines of gensim's Lee corpus in DejaVu Sans at random sizes and places, preprocessed as
RapidOCR does (RGB / 255, ImageNet mean and std, CHW); each page is its own feed.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from zoolib import extract, font_path, lee_lines, save_feeds

PACKAGE = "rapidocr==3.10.0"
FILES = ["model.onnx", "calib_feeds.npz", "eval_feeds.npz"]
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def page(lines: list[str], seed: int) -> dict[str, np.ndarray]:
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    width, height = 32 * rng.randint(13, 23), 32 * rng.randint(10, 20)
    shade = rng.randint(200, 255)
    image = Image.new("RGB", (width, height), (shade, shade, rng.randint(200, 255)))
    draw = ImageDraw.Draw(image)
    y = rng.randint(4, 20)
    for line in lines:
        size = rng.choice([12, 14, 16, 20, 24, 28])
        if y + size > height - 4:
            break
        ink = rng.randint(0, 90)
        draw.text((rng.randint(4, 60), y), line, font=ImageFont.truetype(font_path(), size), fill=(ink, ink, ink))
        y += int(size * rng.uniform(1.4, 2.4))
    array = np.asarray(image, dtype=np.float32) / 255.0
    return {"x": ((array - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)}


def pages(corpus: str, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    lines = lee_lines(corpus, count * 14, seed=seed, width=36)
    rng = random.Random(seed)
    feeds, start = [], 0
    for index in range(count):
        take = rng.randint(6, 14)
        feeds.append(page(lines[start : start + take], seed * 1000 + index))
        start += take
    return feeds


def build(target: Path) -> list[str]:
    extract(PACKAGE, "models/PP-OCRv6_det_small.onnx", target / "model.onnx")
    save_feeds(target / "eval_feeds.npz", pages("lee.cor", 24, seed=0))
    save_feeds(target / "calib_feeds.npz", pages("lee_background.cor", 8, seed=1))
    return FILES
