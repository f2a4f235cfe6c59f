"""After an op-type fallback, the elementwise ops go back to int8 one group at a time, not by type.

A transformer's Add and Mul are residuals, biases, GELU and mask arithmetic; Neural Compressor's
QOperator model keeps them int8. When quantizing every Add misses the budget because of one
fragile Add (the attention mask's, whose -10000 swamps the scores' range), the other Adds cost no
accuracy in int8 and should not stay in fp32 with it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import quantune
from bert_model import bert_inputs, build_bert_classifier
from conftest import INLINE_EXECUTOR, accuracy_problem, run_model
from quantune.space import Point
from quantune.strategy import Outcome, create_strategy
from test_answer_early import _drive, _fast, _layernorm

ELEMENTWISE = ("Add", "Mul")
EXCLUDE = "static_quant.nodes_to_exclude"


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


@pytest.mark.parametrize(("median", "ends"), [(0.90, False), (0.99, True)])
def test_a_ceiling_faster_by_its_median_is_no_tie_that_ends_the_search(
    tmp_path: Path, median: float, ends: bool
) -> None:
    """The op-type model (compute only in int8) meets; the ceiling times faster than it by the median,
    yet in an interval too wide to call it faster (a busy machine). 10% faster by the median: the
    search goes on to put the elementwise groups back in int8; 1%: a tie, the search ends there."""

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        ceiling = not candidate.get(EXCLUDE)
        ratio = median if ceiling else 1.0
        return {"ratio_median": ratio, "ratio_ci_low": ratio - 0.15, "ratio_ci_high": 1.05, "faster": False}

    problem = dataclasses.replace(accuracy_problem(_layernorm(tmp_path, "latency")), latency_ratio=_fast)
    strategy = create_strategy("quantune")
    strategy.bind(dataclasses.replace(problem, paired_latency=paired))
    strategy.observe_baseline({"latency_ms": 1.0})

    def judge(point: Point) -> Outcome:  # any fallback meets; the fully quantized model misses
        meets = bool(point.get(EXCLUDE))
        return Outcome(1.0, 0.0 if meets else 0.1, meets, {"latency_ms": 1.0})

    stages = [stage for _, stage in _drive(strategy, judge)]
    assert any(stage.startswith("op types: int8") for stage in stages), stages
    assert ("nothing faster is possible" in strategy.finished_reason) is ends, strategy.finished_reason
    assert any(stage.startswith("op types: +") for stage in stages) is not ends, stages
