"""ddddocr's click-captcha target detector (``common_det.onnx``, ddddocr 1.6.1, MIT): a
YOLOX-style detector (83 Conv, opset 11), input [1, 3, 416, 416], output [1, 3549, 6] — the
raw YOLOX head (grid offsets, log sizes, objectness, one class) that ddddocr decodes in Python.

The data: click captchas drawn here as such captchas look — 3 to 6 characters (letters,
digits, Greek and Cyrillic letters in DejaVu Sans, each its own size, colour and rotation)
scattered over a view of a real photograph (``photos.scene``), 320x160 — preprocessed as
ddddocr does: BGR [0, 255] (no scaling), letterboxed to 416x416 at the top left, padded with
114, CHW.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from photos import letterbox, scene
from zoolib import extract, font_path

PACKAGE = "ddddocr==1.6.1"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
SIZE = 416
GLYPHS = "ABDEFGHKMNPRSTUWXYZabdefghkmnqrtuy23456789ΓΔΘΛΞΠΣΦΨΩБГДЖИЛФЦЧШЩЪЫЭЮЯ"


def captcha(seed: int):
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    image = scene(seed).resize((320, 160), Image.BILINEAR)
    spots: list[tuple[int, int]] = []
    for _ in range(rng.randint(3, 6)):
        size = rng.randint(22, 38)
        glyph = Image.new("RGBA", (size * 2, size * 2), (0, 0, 0, 0))
        colour = tuple(rng.randint(0, 255) for _ in range(3))
        ImageDraw.Draw(glyph).text(
            (size // 2, size // 3), rng.choice(GLYPHS), font=ImageFont.truetype(font_path(), size), fill=(*colour, 255)
        )
        glyph = glyph.rotate(rng.uniform(-40, 40), resample=Image.BILINEAR)
        for _ in range(20):  # a free spot, so characters do not overlap
            x, y = rng.randint(0, 320 - 2 * size), rng.randint(0, 160 - 2 * size)
            if all(abs(x - a) > size * 1.4 or abs(y - b) > size * 1.4 for a, b in spots):
                break
        spots.append((x, y))
        image.paste(glyph, (x, y), glyph)
    return image


def tensor(seed: int) -> np.ndarray:
    square = letterbox(captcha(seed), (SIZE, SIZE), (114, 114, 114))
    return np.ascontiguousarray(np.asarray(square, dtype=np.float32)[:, :, ::-1].transpose(2, 0, 1))


def build(target: Path) -> list[str]:
    extract(PACKAGE, "ddddocr/common_det.onnx", target / "model.onnx")
    np.savez(target / "eval.npz", images=np.stack([tensor(seed) for seed in range(48)]))
    np.savez(target / "calib.npz", images=np.stack([tensor(seed) for seed in range(1000, 1012)]))
    return FILES
