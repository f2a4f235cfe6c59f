"""F1 of a candidate's detections against the float model's (``ref`` in eval.npz).

A detection is an anchor whose best class score exceeds 0.5; a candidate's detection matches
the float model's at the same anchor when the class agrees and every box side is within 16 px.
"""

from __future__ import annotations

import numpy as np

THRESHOLD = 0.5
TOLERANCE_PX = 16.0


def score(outputs, data) -> float:
    out, ref = np.asarray(outputs["out"]), np.asarray(data["ref"])
    boxes, scores = out[:, :4], out[:, 4:]
    ref_boxes, ref_scores = ref[:, :4], ref[:, 4:]
    found, wanted = scores.max(axis=1) > THRESHOLD, ref_scores.max(axis=1) > THRESHOLD
    same_class = scores.argmax(axis=1) == ref_scores.argmax(axis=1)
    close = np.all(np.abs(boxes - ref_boxes) <= TOLERANCE_PX, axis=1)
    hits = int(np.sum(found & wanted & same_class & close))
    total = int(found.sum()) + int(wanted.sum())
    return 1.0 if total == 0 else 2.0 * hits / total
