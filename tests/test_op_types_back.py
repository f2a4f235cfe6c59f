"""After an op-type fallback, the elementwise ops go back to int8 one group at a time, not by type.

A transformer's Add and Mul are residuals, biases, GELU and mask arithmetic; Neural Compressor's
QOperator model keeps them int8. When quantizing every Add misses the budget because of one
fragile Add (the attention mask's, whose -10000 swamps the scores' range), the other Adds cost no
accuracy in int8 and should not stay in fp32 with it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import quantune
from bert_model import bert_inputs, build_bert_classifier
from conftest import INLINE_EXECUTOR, run_model

ELEMENTWISE = ("Add", "Mul")


def _config(tmp_path: Path) -> dict[str, Any]:
    model = build_bert_classifier(tmp_path / "classifier.onnx")
    evaluation = bert_inputs(200, seed=2)
    labels = np.argmax(run_model(model, evaluation)[0], axis=1).astype(np.int64)
    np.savez(tmp_path / "calib.npz", **bert_inputs(64, seed=1))
    np.savez(tmp_path / "eval.npz", **evaluation, label=labels)
    return {
        "model": str(model),
        "prepare": "off",
        "data": {
            "calibration": str(tmp_path / "calib.npz"),
            "evaluation": str(tmp_path / "eval.npz"),
            "batch_size": 50,
        },
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "threads": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.01},
        "objective": "size",  # no decision rests on a timing
        "passes": [
            {
                "name": "static_quant",
                "search": True,
                "params": {"quant_format": "QOperator", "activation_type": "uint8"},
            }
        ],
        "search": {"sampler": "tpe", "seed": 0, "strategy": "quantune"},
        "stop": {"max_trials": 14},
        **INLINE_EXECUTOR,
    }


def test_the_adds_that_cost_no_accuracy_go_back_to_int8_after_an_op_type_fallback(tmp_path: Path) -> None:
    result = quantune.tune(_config(tmp_path), output=tmp_path / "run")
    stages = [t.stage for t in sorted(result.trials, key=lambda t: t.number)]
    assert any(s.startswith("op types: int8 ['MatMul'] only") for s in stages), stages  # Add as a type misses
    assert result.best is not None and result.best.meets_criterion, stages
    nodes = onnx.load(str(result.best.model_path)).graph.node
    ops = Counter(node.op_type for node in nodes)
    float_elementwise = sorted(node.name for node in nodes if node.op_type in ELEMENTWISE)
    # in fp32: the mask's Add (and what only feeds it); the residuals and the GELU's Add and Muls int8
    assert set(float_elementwise) <= {"add_mask", "mask_mul"}, (float_elementwise, stages)
    assert ops["QLinearAdd"] >= 7 + 2 and ops["QLinearMul"] >= 2, (ops, stages)  # biases + residuals; GELU
