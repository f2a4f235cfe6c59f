"""Rebuilds the OCR example from PyPI packages only: PP-OCRv4 text recognition on rendered news text.

- model: PP-OCRv4's text recognizer (CRNN-style, SVTR neck, CTC head over 6,623 characters + space)
  as shipped in the `rapidocr-onnxruntime` wheel, with its input fixed to [batch, 3, 48, 320];
- eval.npz: 128 lines of real news text (the Lee corpus from gensim's test data, lee.cor)
  rendered in DejaVu Sans (the font matplotlib ships) at a few sizes, preprocessed as RapidOCR
  does (height 48, keep ratio, normalize to [-1, 1], pad to width 320), plus `label`: each
  line's characters as indices of the model's CTC classes (padded with -1);
- calib.npz: 128 other lines (lee_background.cor), rendered the same way.

Run it with the build venv's python (see bench/setup.sh). Files go to
$QUANTUNE_BENCH_CACHE/ocr (default ~/.cache/quantune-bench/ocr) and are linked into this folder.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import gensim
import matplotlib
import numpy as np
import onnx
import rapidocr_onnxruntime
from PIL import Image, ImageDraw, ImageFont

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("QUANTUNE_BENCH_CACHE", Path.home() / ".cache" / "quantune-bench")).expanduser()
TARGET = CACHE / "ocr"
TEST_DATA = Path(gensim.__file__).parent / "test" / "test_data"
FONT = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
MODEL = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_PP-OCRv4_rec_infer.onnx"
HEIGHT, WIDTH, MAX_LABEL = 48, 320, 40


def lines_of(name: str, count: int, seed: int) -> list[str]:
    """Short lines (at most ~28 characters, whole words) cut from the corpus's documents."""
    text = " ".join((TEST_DATA / name).read_text(encoding="latin-1").split())
    words, lines, current = text.split(" "), [], ""
    for word in words:
        if len(current) + 1 + len(word) > 28:
            if len(current) >= 8:
                lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    rng = random.Random(seed)
    rng.shuffle(lines)
    return lines[:count]


def render(text: str, size: int) -> np.ndarray:
    font = ImageFont.truetype(str(FONT), size)
    left, top, right, bottom = font.getbbox(text)
    image = Image.new("RGB", (right - left + 16, bottom - top + 12), "white")
    ImageDraw.Draw(image).text((8 - left, 6 - top), text, font=font, fill="black")
    width = min(WIDTH, int(np.ceil(HEIGHT * image.width / image.height)))
    resized = np.asarray(image.resize((width, HEIGHT), Image.BILINEAR), dtype=np.float32)
    normalized = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    padded = np.zeros((3, HEIGHT, WIDTH), dtype=np.float32)
    padded[:, :, :width] = normalized
    return padded


def encode(text: str, classes: dict[str, int]) -> np.ndarray:
    label = np.full(MAX_LABEL, -1, dtype=np.int64)
    ids = [classes[c] for c in text if c in classes][:MAX_LABEL]
    label[: len(ids)] = ids
    return label


def dataset(lines: list[str], classes: dict[str, int], with_labels: bool) -> dict[str, np.ndarray]:
    sizes = [22, 26, 30, 34]
    arrays = {"x": np.stack([render(line, sizes[i % len(sizes)]) for i, line in enumerate(lines)])}
    if with_labels:
        arrays["label"] = np.stack([encode(line, classes) for line in lines])
    return arrays


def main() -> None:
    TARGET.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(MODEL))
    characters = dict((p.key, p.value) for p in model.metadata_props)["character"].splitlines()
    classes = {c: i + 1 for i, c in enumerate(characters)}  # 0 is CTC's blank
    classes.setdefault(" ", len(characters) + 1)
    shape = model.graph.input[0].type.tensor_type.shape.dim
    shape[2].dim_value, shape[3].dim_value = HEIGHT, WIDTH
    onnx.save(model, str(TARGET / "model.onnx"))
    np.savez(TARGET / "eval.npz", **dataset(lines_of("lee.cor", 128, 0), classes, True))
    np.savez(TARGET / "calib.npz", **dataset(lines_of("lee_background.cor", 128, 1), classes, False))
    for name in ("model.onnx", "calib.npz", "eval.npz"):
        link = HERE / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(TARGET / name)
    print(f"wrote {TARGET} (model, calib.npz, eval.npz) and linked them into {HERE}")


if __name__ == "__main__":
    main()
