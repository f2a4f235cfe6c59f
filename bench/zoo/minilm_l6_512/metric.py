"""Agreement of the sentence embeddings with the fp32 model's: the mean cosine similarity per window.

Sentence embeddings are compared by cosine similarity, so that is what a candidate must keep:
each window's ``embedding`` against the original model's on the same tokens
(``agreement.reference``), averaged over the windows. An all-zero output scores 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agreement import reference

MODEL = Path(__file__).with_name("model.onnx")


def embedding_cosine(outputs: dict, data: dict) -> float:
    truth = np.asarray(reference(MODEL, {k: data[k] for k in ("input_ids", "attention_mask")})["embedding"], np.float64)
    mine = np.asarray(outputs["embedding"], np.float64)
    norms = np.linalg.norm(mine, axis=1) * np.linalg.norm(truth, axis=1)
    cosine = np.sum(mine * truth, axis=1) / np.maximum(norms, 1e-30)
    return float(np.mean(np.where(norms > 0, cosine, 0.0)))
