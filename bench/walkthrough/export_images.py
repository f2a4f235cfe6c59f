"""Writes the zoo's PP-OCR text-direction data as a folder of PNG images, one sub-folder per class.

The README's "Your own model" walk-through starts where a user starts: a model and a folder of
inputs. The zoo builds ppocr_cls's data as normalised arrays (bench/zoo/ppocr_cls/build.py); this
turns them back into the images they were rendered as (``images/0/*.png`` upright lines,
``images/180/*.png`` upside-down ones, PaddleOCR's own label names), 320 in all.

    python bench/walkthrough/export_images.py DEST   # after: python bench/zoo/run.py --build-only --models ppocr_cls
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image


def main(dest: Path) -> None:
    zoo = Path(os.environ.get("QUANTUNE_ZOO_CACHE", Path.home() / ".cache" / "quantune-zoo")) / "ppocr_cls"
    with np.load(zoo / "eval.npz") as data:
        lines, labels = data["x"], data["label"]
    with np.load(zoo / "calib.npz") as data:  # unlabelled: orientation 0 and 180 alternate (build.py)
        extra = data["x"]
    lines = np.concatenate([lines, extra])
    labels = np.concatenate([labels, np.arange(len(extra)) % 2])
    for index, (line, label) in enumerate(zip(lines, labels, strict=True)):
        pixels = np.clip((line.transpose(1, 2, 0) * 0.5 + 0.5) * 255.0, 0, 255).round().astype(np.uint8)
        folder = dest / ("0" if label == 0 else "180")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"line{index:04d}.png")
    print(f"wrote {len(lines)} images to {dest}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "images"))
