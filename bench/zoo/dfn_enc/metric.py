"""Fidelity of DeepFilterNet's encoder outputs to the fp32 model's: 1 - relative L2 error.

The encoder's outputs feed the two decoders (``emb``, the GRU's embedding; ``e0``-``e3`` and
``c0``, skip connections; ``lsnr``, the local SNR estimate). Each output is compared with the
original model's on the same features (``agreement.reference``) as 1 - ||candidate - fp32|| /
||fp32||, floored at 0; the score is the mean over the outputs. An all-zero output scores 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agreement import fidelity, reference

MODEL = Path(__file__).with_name("model.onnx")


def output_fidelity(outputs: dict, data: dict) -> float:
    truth = reference(MODEL, {"feat_erb": data["feat_erb"], "feat_spec": data["feat_spec"]})
    return sum(fidelity(outputs[name], truth[name]) for name in truth) / len(truth)
