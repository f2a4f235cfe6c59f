"""Targeted recovery: the worst units keep int8 with per-channel weights or a fine-tune of just their
layers before any of them goes to fp32 (strategy/accuracy/targeted.py, static_quant.per_channel_nodes,
fast_finetune.nodes) -- real onnxruntime quantization on small built models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

import quantune
from conftest import accuracy_problem
from quantune.engine.trials.trial import TrialRecord
from quantune.passes.onnx.qdq_layers import integer_weight, quantized_layers
from quantune.report.precision import recovered
from quantune.space import Point
from quantune.strategy import Outcome, create_strategy
from test_accuracy_strategies import CONV2, CONV5, drive, scaled_config
from test_finetune_passes import _error, _inputs, _run, build_outlier_mlp
from test_report_precision import _typed


def _scales(path: Path) -> dict[str, tuple[int, ...]]:
    """Each quantized layer's weight scale shape (() per tensor, (C,) per channel)."""
    model = onnx.load(str(path))
    return {layer.name: tuple(np.shape(np.squeeze(layer.scale))) for layer in quantized_layers(model)}


def test_per_channel_nodes_quantize_only_the_named_layer_per_channel(tmp_path: Path) -> None:
    """The outlier MLP's fc1 (rows scaled x60) breaks per-tensor int8; per-channel weights on fc1
    alone recover most of the error, and fc2/fc3 keep their one scale."""
    model = build_outlier_mlp(tmp_path / "mlp.onnx")
    calib, held_out = _inputs(256, seed=1), {"x": _inputs(200, seed=2)}
    plain = _run("static_quant", {"per_channel": False}, model, tmp_path, calib)
    fixed = _run("static_quant", {"per_channel": False, "per_channel_nodes": ["fc1", "relu1"]}, model, tmp_path, calib)
    assert _scales(plain) == {"fc1": (), "fc2": (), "fc3": ()}
    assert _scales(fixed)["fc1"] != () and _scales(fixed)["fc2"] == () and _scales(fixed)["fc3"] == ()
    before, after = onnx.load(str(plain)), onnx.load(str(fixed))
    assert [n.op_type for n in before.graph.node] == [n.op_type for n in after.graph.node]  # same graph
    assert _error(fixed, model, held_out) < 0.5 * _error(plain, model, held_out)


def test_fast_finetune_nodes_fits_only_the_named_layers(tmp_path: Path) -> None:
    model = build_outlier_mlp(tmp_path / "mlp.onnx")
    calib = _inputs(256, seed=1)
    qdq = _run("static_quant", {"per_channel": False}, model, tmp_path, calib)
    params = {"optim": "adaround", "iterations": 200, "learning_rate": 0.02, "nodes": ["fc2"]}
    tuned = _run("fast_finetune", params, qdq, tmp_path, calib)
    before, after = onnx.load(str(qdq)), onnx.load(str(tuned))
    old = {layer.name: integer_weight(before, layer) for layer in quantized_layers(before)}
    new = {layer.name: integer_weight(after, layer) for layer in quantized_layers(after)}
    assert np.array_equal(old["fc1"], new["fc1"]) and np.array_equal(old["fc3"], new["fc3"])
    assert not np.array_equal(old["fc2"], new["fc2"])  # the named layer was fitted


def _pc(point: Point) -> set[str]:
    return set(point.get("static_quant.per_channel_nodes", []))


def _excluded(point: Point) -> set[str]:
    return set(point.get("static_quant.nodes_to_exclude", []))


def test_a_fallen_unit_goes_back_to_int8_with_per_channel_weights(tmp_path: Path) -> None:
    """Made-up outcomes: CONV5 must stay fp32; CONV2 holds in int8 only with per-channel weights."""
    config = scaled_config(tmp_path, "quantune", max_trials=30)
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(config, {"latency_trials": 0}))

    def judge(point: Point) -> Outcome:
        excluded, pc = _excluded(point), _pc(point)
        meets = CONV5 in excluded and (CONV2 in excluded or CONV2 in pc)
        return Outcome(1.0 + 0.1 * len(excluded), 0.0 if meets else 0.05, meets, {"latency_ms": 1.0})

    drive(strategy, judge)
    notes = strategy.learned()["recovered"]
    assert notes["stage"] == "targeted" and notes["passes"] == ["per-channel weights"]
    assert notes["units"] == [CONV2] and notes["fallen"] == [CONV5] and notes["before_fallback"] is False
    best = strategy.best_meeting()
    assert best is not None and _excluded(best.point) & {CONV2, CONV5} == {CONV5}
    assert CONV2 in _pc(best.point)


def test_a_real_run_keeps_every_unit_int8_with_per_channel_worst_units(tmp_path: Path) -> None:
    """The scaled CNN, per-tensor weights, no refining flow (like the config ``quantune init``
    writes): plain int8 misses the 1% budget; per-channel weights on the three worst units hold it
    with nothing in fp32, and the precision map says so."""
    config = scaled_config(tmp_path, "quantune", max_trials=3)
    config["search"]["strategy_options"]["latency_trials"] = 0
    # one variant: which format's ceiling is faster is the machine's call (a loaded machine may pick
    # QOperator), and this test asks how accuracy is recovered, not which variant is faster
    config["passes"][0]["params"]["quant_format"] = "QDQ"
    result = quantune.tune(config, output=tmp_path / "out")
    stages = [(t.stage, t.accuracy_loss, t.meets_criterion) for t in result.trials]
    meeting = [t for t in result.trials if t.meets_criterion and t.metrics.get("quantized_ops", 0) > 0]
    assert meeting and all(not t.params.get("static_quant.nodes_to_exclude") for t in meeting), stages
    chosen = next(t for t in meeting if t.stage.startswith("recover targeted"))
    assert chosen.params.get("static_quant.per_channel_nodes"), stages
    assert not any(t.stage.startswith("bisect") for t in result.trials), stages
    results = {"strategy": result.strategy_notes}
    record = TrialRecord(number=chosen.number, flow=list(chosen.flow), params=chosen.params, status="ok")
    text, nodes = recovered(_typed(results), record)
    assert "per-channel weights" in text and "before any fallback" in text
    assert nodes and all(how.startswith("recovered by per-channel weights") for how in nodes.values())


def test_the_worst_units_fine_tuned_alone_before_any_fallback(tmp_path: Path) -> None:
    """Made-up outcomes: only a fine-tune restricted to the worst layers holds the budget (a fit of
    every layer, the refined flow's ceiling, does not): the strategy finds it before any bisection."""
    from test_recover import _strategy

    def judge(point: Point) -> Outcome:
        meets = point.get("flow") == "quant>ft" and bool(point.get("ft.nodes"))
        return Outcome(1.0, 0.0 if meets else 0.03, meets, {"latency_ms": 1.0})  # 3 budgets: a close miss

    strategy = _strategy(tmp_path)
    points = drive(strategy, judge)
    assert not any(point.get("quant.nodes_to_exclude") for point in points)
    notes = strategy.learned()["recovered"]
    assert notes["stage"] == "targeted" and notes["passes"] == ["per-channel weights", "fast_finetune"]
    tuned = next(point for point in points if point.get("ft.nodes"))
    assert set(tuned["ft.nodes"]) <= {
        CONV2,
        CONV5,
        "/features/features.0/Conv",
        "/classifier/classifier.1/Gemm",
        "/classifier/classifier.3/Gemm",
    }
    assert len(notes["units"]) <= 3 and set(tuned["quant.per_channel_nodes"]) == set(tuned["ft.nodes"])


def test_no_fix_applies_so_no_sensitivity_is_measured_for_it(tmp_path: Path) -> None:
    """Per-channel ceilings and no refining flow (the config ``quantune init`` writes): the targeted
    stage has nothing to try, and must not measure the sensitivity (149 s on PP-OCRv6's detector
    under load) before the stages that may need none (the screen); the bisection measures it."""
    import dataclasses

    passes = [{"name": "static_quant", "search": True, "params": {"per_channel": True}}]
    problem = accuracy_problem(scaled_config(tmp_path, "quantune", max_trials=10, passes=passes))
    strategy = create_strategy("quantune")
    measured_after: list[list[str]] = []

    def sensitivity(point: Point, flow: tuple[str, ...]) -> dict[str, float]:
        measured_after.append(list(strategy.stage_log))
        assert problem.sensitivity is not None
        return dict(problem.sensitivity(point, flow))

    strategy.bind(dataclasses.replace(problem, sensitivity=sensitivity))

    def judge(point: Point) -> Outcome:
        meets = {CONV2, CONV5} <= _excluded(point)
        return Outcome(1.0, 0.0 if meets else 0.05, meets, {"latency_ms": 1.0})

    drive(strategy, judge)
    assert not any(s.startswith("recover targeted") for s in strategy.stage_log)
    assert measured_after and all(any(s.startswith("screen") for s in log) for log in measured_after)


def test_the_precision_map_tells_a_fix_before_the_fallback_from_one_after_it() -> None:
    notes = {"flow": "static_quant", "passes": ["per-channel weights"], "units": [CONV2], "fallen": []}
    chosen = TrialRecord(number=0, flow=["static_quant"], params={}, status="ok")
    for before, words in ((True, "before any fallback"), (False, "the fallback had put in fp32")):
        results = {"strategy": {"recovered": {**notes, "stage": "targeted", "before_fallback": before}}}
        text, nodes = recovered(_typed(results), chosen)
        assert words in text and "per-channel weights" in text, text
        assert nodes[CONV2].startswith("recovered by per-channel weights")


def test_per_channel_then_a_refined_flow_each_keep_a_fallen_unit_and_say_how(tmp_path: Path) -> None:
    """Made-up outcomes: CONV2 holds in int8 with per-channel weights; CONV5 only in the fine-tuned
    flow with its layer fitted alone (the worst three fitted together miss). After the fallback put
    both in fp32, each comes back by its own fix, CONV5 by a fit of just the layers back in int8."""
    from test_recover import _strategy

    def judge(point: Point) -> Outcome:
        excluded = set(point.get("quant.nodes_to_exclude", []))
        channel = set(point.get("quant.per_channel_nodes", []))
        tuned = point.get("flow") == "quant>ft" and point.get("ft.nodes") == [CONV5]
        meets = (CONV2 in excluded or CONV2 in channel) and (CONV5 in excluded or tuned)
        return Outcome(1.0 + 0.1 * len(excluded), 0.0 if meets else 0.03, meets, {"latency_ms": 1.0})

    strategy = _strategy(tmp_path)
    points = drive(strategy, judge)
    notes = strategy.learned()["recovered"]
    assert notes["flow"] == "quant>ft" and notes["fallen"] == []
    # the worst layers were fitted alone first: no fit of every layer (minutes on a large model)
    assert not any(p.get("flow") == "quant>ft" and not p.get("ft.nodes") for p in points)
    assert set(notes["units"]) == {CONV2, CONV5}
    assert notes["how"] == {CONV2: "per-channel weights", CONV5: "fast_finetune"}
    best = strategy.best_meeting()
    assert best is not None and not {CONV2, CONV5} & set(best.point.get("quant.nodes_to_exclude", []))
