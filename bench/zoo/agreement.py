"""Agreement with the fp32 model, for zoo models without labels — measures an empty output cannot pass.

A custom metric sees only the candidate's outputs and the evaluation data, so the fp32
reference is computed here: the original model (the ``model.onnx`` beside the metric script)
runs on the same inputs, once, and its outputs are kept on disk under the zoo cache, keyed by
the model's and the inputs' bytes. Data and outputs come as quantune hands them to a metric:
each name maps to one array stacked along axis 0, or to a list of arrays (one per feed).

The measures score 1.0 for the reference itself and 0.0 for an all-zero or constant output:
``fidelity`` (1 - relative L2 error, floored at 0) and ``mask_f1`` (F1 of the cells above a
threshold, against the reference's).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

try:
    from zoolib import CACHE
except ImportError:  # imported by path from a metric script: zoolib sits beside this file
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from zoolib import CACHE

Batch = np.ndarray | Sequence[np.ndarray]


def split_feeds(data: dict[str, Batch], names: list[str], batch: int = 16) -> list[dict[str, np.ndarray]]:
    """The feeds back out of a metric's ``data``: per feed when any input came as a list.

    quantune stacks each array name on its own: a name whose arrays all have one shape comes
    stacked even when another name comes as a list (one per feed), so a stacked name is cut
    into the listed name's row counts. With every name stacked, rows go in runs of ``batch``.
    """
    listed = next((n for n in names if not isinstance(data[n], np.ndarray)), None)
    if listed is None:
        total = len(data[names[0]])
        return [{n: np.asarray(data[n])[i : i + batch] for n in names} for i in range(0, total, batch)]
    feeds, start = [], 0
    for index, part in enumerate(data[listed]):
        rows, feed = len(part), {}
        for name in names:
            value = data[name]
            feed[name] = np.asarray(value[start : start + rows] if isinstance(value, np.ndarray) else value[index])
        feeds.append(feed)
        start += rows
    return feeds


def reference(model: Path, data: dict[str, Batch]) -> dict[str, Batch]:
    """The fp32 model's outputs on ``data``'s inputs, shaped as quantune shapes a candidate's."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    dim = session.get_inputs()[0].shape[0]
    feeds = split_feeds(data, names, dim if isinstance(dim, int) and dim > 0 else 16)
    digest = hashlib.sha256(model.read_bytes())
    for feed in feeds:
        for name in names:
            digest.update(name.encode() + str(feed[name].shape).encode() + np.ascontiguousarray(feed[name]).tobytes())
    store = CACHE / "references" / f"{digest.hexdigest()[:24]}.npz"
    outputs = [o.name for o in session.get_outputs()]
    if store.is_file():
        with np.load(store) as saved:
            per_feed = [{o: saved[f"{i}/{o}"] for o in outputs} for i in range(len(feeds))]
    else:
        per_feed = [dict(zip(outputs, session.run(None, feed), strict=True)) for feed in feeds]
        store.parent.mkdir(parents=True, exist_ok=True)
        partial = store.with_suffix(".tmp.npz")
        np.savez(partial, **{f"{i}/{o}": out[o] for i, out in enumerate(per_feed) for o in outputs})
        partial.replace(store)
    if all(isinstance(data[n], np.ndarray) for n in names):
        return {o: np.concatenate([out[o] for out in per_feed]) for o in outputs}
    return {o: [out[o] for out in per_feed] for o in outputs}


def pieces(value: Batch) -> list[np.ndarray]:
    """One array per feed (or the one stacked array), as float64."""
    if isinstance(value, np.ndarray):
        return [value.astype(np.float64)]
    return [np.asarray(v, dtype=np.float64) for v in value]


def fidelity(candidate: Batch, truth: Batch) -> float:
    """1 - ||candidate - truth|| / ||truth|| over every element, floored at 0 (zeros score 0)."""
    error = sum(float(np.sum((c - t) ** 2)) for c, t in zip(pieces(candidate), pieces(truth), strict=True))
    norm = sum(float(np.sum(t**2)) for t in pieces(truth))
    return max(0.0, 1.0 - float(np.sqrt(error / max(norm, 1e-30))))


def mask_f1(candidate: Batch, truth: Batch, threshold: float) -> float:
    """F1 of the cells above ``threshold`` against the reference's (1.0 when neither has any)."""
    hits = found = expected = 0
    for c, t in zip(pieces(candidate), pieces(truth), strict=True):
        mine, theirs = c > threshold, t > threshold
        hits += int(np.sum(mine & theirs))
        found += int(np.sum(mine))
        expected += int(np.sum(theirs))
    if found + expected == 0:
        return 1.0
    return 2.0 * hits / (found + expected)


def text_pixel_f1(model: Path, outputs: dict, data: dict, output: str = "fetch_name_0") -> float:
    """A DB text detector's probability map against ``model``'s (fp32) on the same pages: F1 of the
    pixels above 0.3, DB's binarization threshold in RapidOCR (0 for a detector that finds nothing)."""
    truth = reference(model, {"x": data["x"]})
    return mask_f1(outputs[output], truth[output], threshold=0.3)
