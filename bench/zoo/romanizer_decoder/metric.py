"""Agreement of the romanizations with the fp32 decoder's: character accuracy, 1 - edit distance
/ characters, of each name's decoded Latin spelling against the one the original decoder gives
when run the same way (``runner.run`` on the original model). An empty answer scores 0.

``outputs["tokens"]``: per name, [1, 32] token ids padded with 0 (stacked, or a list per feed);
``data``: the feeds' inputs (prefix, memory, src_mask, hidden), per name.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
from agreement import split_feeds  # noqa: E402
from runner import run  # noqa: E402

TOKENS = json.loads((HERE / "vocab.json").read_text(encoding="utf-8"))["tokens"]
_REFERENCE: dict[int, list[str]] = {}


def spell(ids) -> str:
    return "".join(TOKENS[i] for i in np.ravel(ids) if i > 2 and not TOKENS[i].startswith("<"))


def _reference(data: dict) -> list[str]:
    import onnxruntime as ort

    feeds = split_feeds(data, ["prefix", "memory", "src_mask", "hidden"], batch=1)
    key = hash(b"".join(np.ascontiguousarray(f["memory"]).tobytes()[:64] for f in feeds))
    if key not in _REFERENCE:
        session = ort.InferenceSession(str(HERE / "model.onnx"), providers=["CPUExecutionProvider"])
        _REFERENCE[key] = [spell(out["tokens"]) for out in run(session, feeds)]
    return _REFERENCE[key]


def edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def spelling_agreement(outputs: dict, data: dict) -> float:
    truth = _reference(data)
    mine = [spell(t) for t in outputs["tokens"]]
    errors = sum(edit_distance(a, b) for a, b in zip(mine, truth, strict=True))
    return 1.0 - errors / max(sum(len(b) for b in truth), 1)
