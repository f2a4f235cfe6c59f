"""Pearson r between the model's document similarities and human ratings (the Lee corpus).

quantune calls ``pearson(outputs, data)`` with the model's outputs over the evaluation data and
every array of eval.npz: the token embeddings (``last_hidden_state``, [docs, tokens, 384]) are
mean-pooled over the attention mask and normalized, as sentence-transformers does; each
document pair's cosine similarity is compared with its human rating (``ratings``: a 50 x 50
matrix whose upper triangle holds the ratings, so it shares eval.npz's first axis).
"""

from __future__ import annotations

import numpy as np


def embeddings(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask.astype(np.float64)[..., None]
    pooled = (tokens.astype(np.float64) * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def pearson(outputs: dict[str, np.ndarray], data: dict[str, np.ndarray]) -> float:
    tokens = outputs.get("last_hidden_state", next(iter(outputs.values())))
    vectors = embeddings(tokens, data["attention_mask"])
    rows, cols = np.triu_indices(len(vectors), k=1)
    similarities = np.sum(vectors[rows] * vectors[cols], axis=1)
    ratings = data["ratings"][rows, cols].astype(np.float64)
    return float(np.corrcoef(similarities, ratings)[0, 1])
