"""Pearson r between the model's document similarities and human ratings (the Lee corpus).

``outputs["461"]``: the pooled sentence embedding of each document ([1, 384] per feed, stacked
to [50, 384], or a list); each document pair's cosine similarity is compared with its human
rating (``ratings.npy``, built beside the data: 50 x 50, upper triangle). A constant output
has no correlation to give: it scores 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

RATINGS = Path(__file__).with_name("ratings.npy")


def pearson(outputs: dict, data: dict) -> float:
    pooled = outputs["461"]
    vectors = np.concatenate([np.asarray(v).reshape(1, -1) for v in pooled]).astype(np.float64)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    ratings = np.load(RATINGS)
    rows, cols = np.triu_indices(len(vectors), k=1)
    similarities = np.sum(vectors[rows] * vectors[cols], axis=1)
    r = float(np.corrcoef(similarities, ratings[rows, cols])[0, 1])
    return r if np.isfinite(r) else 0.0
