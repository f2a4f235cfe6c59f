"""Detection F1 against the fp32 model's detections, for the zoo's YOLO-family detectors.

A detector's raw output is not comparable cell by cell in a useful way: what a user keeps is
the boxes after the score threshold and NMS. So both the candidate's and the fp32 model's
outputs (``agreement.reference``) are decoded the way the package that ships the model
decodes them (YOLOv8: [1, 4 + classes, anchors] of centre/size in pixels and class scores;
YOLOX: [1, anchors, 5 + classes] of grid offsets, log sizes, objectness and class scores),
thresholded, put through per-class NMS, and matched greedily (highest score first, same
class, IoU >= 0.5). The score is the F1 of the matches over all images: 1.0 for the fp32
model itself, 0.0 for a model that finds nothing (or only boxes the reference lacks); a box
whose score is within ``BAND`` of the threshold and has no partner counts neither way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

BAND = 0.05  # scores this close to the threshold count neither way when unmatched (``f1``)


@dataclass(frozen=True)
class Boxes:
    """One image's detections: xyxy [n, 4], scores [n], classes [n]."""

    xyxy: np.ndarray
    scores: np.ndarray
    classes: np.ndarray


def yolov8(output: np.ndarray, threshold: float) -> Boxes:
    """[4 + classes, anchors] (one image; cx, cy, w, h then class scores) -> boxes above ``threshold``."""
    rows = np.asarray(output, dtype=np.float64).T
    scores = rows[:, 4:].max(axis=1)
    keep = scores >= threshold
    cx, cy, w, h = rows[keep, :4].T
    xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    return Boxes(xyxy, scores[keep], rows[keep, 4:].argmax(axis=1))


def yolox(output: np.ndarray, size: tuple[int, int], threshold: float, strides=(8, 16, 32)) -> Boxes:
    """[anchors, 5 + classes] (one image, raw YOLOX head) -> boxes above ``threshold``.

    The grid decode of YOLOX's ``demo_postprocess``: centre = (offset + cell) * stride, size =
    exp(log size) * stride; score = objectness * class score."""
    rows = np.asarray(output, dtype=np.float64)
    grids, steps = [], []
    for stride in strides:
        xs, ys = np.meshgrid(np.arange(size[1] // stride), np.arange(size[0] // stride))
        grids.append(np.stack([xs, ys], axis=2).reshape(-1, 2))
        steps.append(np.full((grids[-1].shape[0], 1), stride))
    grid, step = np.concatenate(grids), np.concatenate(steps)
    centre = (rows[:, :2] + grid) * step
    extent = np.exp(np.clip(rows[:, 2:4], -20, 20)) * step
    per_class = rows[:, 4:5] * rows[:, 5:]
    scores = per_class.max(axis=1)
    keep = scores >= threshold
    xyxy = np.concatenate([centre - extent / 2, centre + extent / 2], axis=1)
    return Boxes(xyxy[keep], scores[keep], per_class[keep].argmax(axis=1))


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    low = np.maximum(box[:2], others[:, :2])
    high = np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=1)
    area = lambda b: np.prod(np.clip(b[..., 2:] - b[..., :2], 0, None), axis=-1)  # noqa: E731
    return inter / np.maximum(area(box) + area(others) - inter, 1e-9)


def nms(boxes: Boxes, overlap: float = 0.45, limit: int = 300) -> Boxes:
    """Per-class non-maximum suppression, at most ``limit`` boxes (highest scores)."""
    order = np.argsort(-boxes.scores, kind="stable")[: limit * 10]
    kept: list[int] = []
    for index in order:
        same = [k for k in kept if boxes.classes[k] == boxes.classes[index]]
        if same and iou(boxes.xyxy[index], boxes.xyxy[same]).max() > overlap:
            continue
        kept.append(int(index))
        if len(kept) == limit:
            break
    return Boxes(boxes.xyxy[kept], boxes.scores[kept], boxes.classes[kept])


def matches(mine: Boxes, theirs: Boxes, overlap: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Greedy one-to-one matches (highest score first) of the same class with IoU >= ``overlap``:
    which of mine and which of theirs found a partner."""
    free = np.ones(len(theirs.scores), dtype=bool)
    matched = np.zeros(len(mine.scores), dtype=bool)
    for index in np.argsort(-mine.scores, kind="stable"):
        candidates = free & (theirs.classes == mine.classes[index])
        if not candidates.any():
            continue
        overlaps = np.where(candidates, iou(mine.xyxy[index], theirs.xyxy), -1.0)
        best = int(overlaps.argmax())
        if overlaps[best] >= overlap:
            free[best] = False
            matched[index] = True
    return matched, ~free


def f1(mine: list[Boxes], theirs: list[Boxes], threshold: float, band: float = BAND) -> float:
    """F1 of the candidate's detections against the reference's over all images (1.0 when neither has any).

    ``mine`` is decoded down to ``threshold - band``, ``theirs`` at ``threshold``: a box whose
    score lies within ``band`` of the threshold counts neither way when it has no partner (a
    reference box the candidate scores just under the threshold is still found; a candidate
    box just over it that the reference lacks is no false alarm). Without the band one box
    crossing the threshold by 0.001 moves F1 by more than a 1% budget on a few dozen boxes.
    """
    hits = found = expected = 0
    for m, t in zip(mine, theirs, strict=True):
        matched, partnered = matches(m, t)
        hits += int(matched.sum())
        found += int(matched.sum()) + int(np.sum(~matched & (m.scores >= threshold + band)))
        expected += int(partnered.sum()) + int(np.sum(~partnered & (t.scores >= threshold + band)))
    return 1.0 if found + expected == 0 else 2.0 * hits / (found + expected)


def versus_fp32(
    model, outputs: dict, data: dict, output: str, threshold: float, decode: Callable[[np.ndarray, float], Boxes]
) -> float:
    """The zoo detectors' metric: ``f1`` of the candidate's detections (``decode`` of each image's
    ``output``, then NMS; unmatched boxes within ``BAND`` of the threshold count neither way)
    against the fp32 ``model``'s on the same images (``agreement.reference``, cached)."""
    from agreement import pieces, reference

    truth = reference(model, {"images": data["images"]})

    def boxes(batch, cut: float) -> list[Boxes]:
        return [nms(decode(image, cut)) for part in pieces(batch) for image in part]

    return f1(boxes(outputs[output], threshold - BAND), boxes(truth[output], threshold), threshold)
