"""ddddocr's captcha recognizer (``common.onnx``, ddddocr 1.6.1, MIT) on captchas drawn by ``captcha``.

The model: a conv net with a CTC head over 8,210 characters, input [1, 1, 64, width] (grey,
height 64, width as the image's aspect ratio gives), output [steps, 1, classes]. The data:
4-5 character captchas (digits and lowercase letters) drawn by the ``captcha`` package with
the fonts it ships, 160x60 like the package's default, preprocessed as ddddocr does (height
64 keeping the ratio, grey, / 255) so every image is [1, 1, 64, 170]; ``label`` holds each
captcha's characters as Unicode code points (padded with -1); ``charset.txt`` the model's
classes, one per line, for the metric.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from zoolib import extract, member

PACKAGE = "ddddocr==1.6.1"
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
FILES = ["model.onnx", "calib.npz", "eval.npz", "charset.txt"]


class SeededSecrets:
    """What ``captcha.image`` uses of ``secrets``, drawn from a seeded generator instead.

    The package draws its distortions with ``secrets`` (unseedable), so the same build would
    give different captchas each time; the zoo's data must be the same on every build.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def randbelow(self, n: int) -> int:
        return self.rng.randrange(n)

    def randbits(self, k: int) -> int:
        return self.rng.getrandbits(k)

    def choice(self, items):
        return self.rng.choice(items)


def captchas(count: int, seed: int) -> dict[str, np.ndarray]:
    import captcha.image
    from captcha.image import ImageCaptcha
    from PIL import Image

    rng = random.Random(seed)
    captcha.image.secrets = SeededSecrets(seed + 1)  # type: ignore[assignment]
    generator = ImageCaptcha(width=160, height=60)
    images, labels = [], np.full((count, 8), -1, dtype=np.int32)
    for row in range(count):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.choice([4, 5])))
        image = generator.generate_image(text).resize((170, 64), Image.LANCZOS).convert("L")
        images.append(np.asarray(image, dtype=np.float32)[None] / 255.0)
        labels[row, : len(text)] = [ord(c) for c in text]
    return {"input1": np.stack(images).astype(np.float32), "label": labels}


def build(target: Path) -> list[str]:
    extract(PACKAGE, "ddddocr/common.onnx", target / "model.onnx")
    namespace: dict = {}
    exec(member(PACKAGE, "ddddocr/charsets.py").decode("utf-8"), namespace)  # plain list literals
    (target / "charset.txt").write_text("\n".join(namespace["CHARSET_BETA"]) + "\n", encoding="utf-8")
    np.savez(target / "eval.npz", **captchas(300, seed=0))
    calib = captchas(64, seed=1)
    del calib["label"]
    np.savez(target / "calib.npz", **calib)
    return FILES
