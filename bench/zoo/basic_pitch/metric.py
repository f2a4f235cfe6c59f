"""Agreement of Basic Pitch's note and onset activations with the fp32 model's.

A (frame, key) cell whose activation exceeds 0.5 is a sounding note (note output) or an
onset (onset output), the thresholds basic-pitch's note creation uses at their strictest; the
score is the F1 of the candidate's cells against the original model's on the same audio
(``agreement.reference``), over both outputs: silence scores 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agreement import mask_f1, reference

MODEL = Path(__file__).with_name("model.onnx")
INPUT = "serving_default_input_2:0"
ACTIVATIONS = ("StatefulPartitionedCall:1", "StatefulPartitionedCall:2")  # note and onset, [batch, 172, 88]


def note_f1(outputs: dict, data: dict) -> float:
    truth = reference(MODEL, {INPUT: data[INPUT]})
    return mask_f1([outputs[n] for n in ACTIVATIONS], [truth[n] for n in ACTIVATIONS], threshold=0.5)
