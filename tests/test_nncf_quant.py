"""NNCF's ONNX quantizer as a pass: the accuracy strategy reaches it through its traits alone
(speed ceilings over its presets, fallback through its ignored scope), and the fallback it
writes keeps the node in float in the model NNCF builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

from conftest import accuracy_problem, cnn_inputs
from quantune.data import Dataset
from quantune.passes.base import PassContext
from quantune.passes.onnx.nncf_quant import NNCFQuantization, NNCFQuantizationConfig
from quantune.space import Point
from quantune.strategy import WAIT, Outcome, create_strategy
from quantune.strategy.accuracy.context import AccuracyContext
from quantune.strategy.accuracy.speed import speed_variants

pytest.importorskip("nncf", reason="the nncf extra is not installed (pip install 'quantune[nncf]')")

CULPRIT = "conv2"


def _config(make_config: Any) -> dict[str, Any]:
    config = make_config([{"name": "nncf_quant", "search": True, "params": {"subset_size": 16}}])
    config["search"] = {"strategy": "quantune", "strategy_options": {"drop_slow": False, "latency_trials": 0}}
    return config


def _needs_culprit_float(point: Point) -> Outcome:
    """A made-up evaluation: the criterion holds iff the culprit conv stays in float."""
    kept = set(point.get("nncf_quant.ignored_nodes", []))
    meets = CULPRIT in kept
    return Outcome(1.0 + 0.1 * len(kept), 0.0 if meets else 0.05, meets, {})


def test_the_accuracy_strategy_builds_ceilings_and_falls_back_for_nncf(make_config: Any) -> None:
    problem = accuracy_problem(_config(make_config), {"drop_slow": False, "latency_trials": 0})
    (ctx,) = AccuracyContext.all_from_problem(problem, "quantune")
    ceilings = speed_variants(ctx)
    assert {point["nncf_quant.preset"] for point, _ in ceilings} == {"performance", "mixed"}
    assert sorted(label for _, label in ceilings) == ["nncf_quant: mixed", "nncf_quant: performance"]

    strategy = create_strategy("quantune")
    strategy.bind(problem)
    points = []
    for _ in range(40):
        proposal = strategy.ask()
        if proposal is None:
            break
        assert proposal is not WAIT
        points.append(proposal.point)
        strategy.tell(proposal, _needs_culprit_float(proposal.point))
    stages = [stage.split(":")[0] for stage in strategy.stage_log]
    assert "ceiling" in stages
    best = strategy.best_meeting()
    assert best is not None and CULPRIT in best.point["nncf_quant.ignored_nodes"]
    assert not set(best.point["nncf_quant.ignored_nodes"]) >= {"conv1", "conv2", "fc"}  # not everything fell


def test_nncf_keeps_the_ignored_node_float(tmp_path: Path, cnn_model: Path) -> None:
    rows = cnn_inputs(32, seed=1)
    context = PassContext(Dataset({"input": rows}, "calib"), ["input"], 16, tmp_path)
    out = tmp_path / "q.onnx"
    NNCFQuantization().run(NNCFQuantizationConfig(subset_size=32, ignored_nodes=[CULPRIT]), cnn_model, out, context)
    model = onnx.load(str(out))
    produced = {output: node for node in model.graph.node for output in node.output}

    def dequantized_inputs(name: str) -> int:
        node = next(n for n in model.graph.node if n.name == name)
        return sum(1 for i in node.input if i in produced and produced[i].op_type == "DequantizeLinear")

    assert dequantized_inputs("conv1") >= 1
    assert dequantized_inputs(CULPRIT) == 0
