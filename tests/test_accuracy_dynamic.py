"""Accuracy-driven tuning of a dynamic_quant step, shape-only groups, and the choice between flows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantune
from conftest import accuracy_problem, save_graph
from quantune.evaluate.sensitivity import measure_dynamic
from quantune.graph.capability import ModelCapability
from quantune.space import Point
from quantune.strategy import WAIT, Outcome, create_strategy


def build_outlier_mlp(folder: Path, seed: int = 0) -> Path:
    """x[batch, 8] -> Reshape -> MatMul(w1) -> Relu -> MatMul(w2) -> Transpose -> y, plus an embedding Gather.

    Column 3 of ``w1`` is an outlier (x100): a per-tensor weight scale crushes the other
    columns, so ``mm1`` is the sensitive node, unless weights are quantized per channel.
    """
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.5, (8, 16)).astype(np.float32)
    w1[:, 3] *= 100.0
    w2 = rng.normal(0, 0.5, (16, 4)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(rng.normal(0, 1, (10, 4)).astype(np.float32), "table"),
        numpy_helper.from_array(np.array([-1, 8], dtype=np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["xr"], name="reshape"),
        helper.make_node("MatMul", ["xr", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["hr"], name="relu"),
        helper.make_node("MatMul", ["hr", "w2"], ["o"], name="mm2"),
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        helper.make_node("Add", ["o", "e"], ["s"], name="add"),
        helper.make_node("Transpose", ["s"], ["y"], name="transpose", perm=[0, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        inits,
    )
    save_graph(graph, folder / "model.onnx")
    for name, rows in (("calib", 64), ("eval", 64)):
        np.savez(
            folder / f"{name}.npz",
            x=np.abs(rng.normal(0, 1, (rows, 8))).astype(np.float32),
            ids=rng.integers(0, 10, rows).astype(np.int64),
        )
    return folder / "model.onnx"


def mlp_config(tmp_path: Path, strategy: str, *, flows: list | None = None, max_trials: int = 12) -> dict:
    build_outlier_mlp(tmp_path / "mlp")
    return {
        "model": str(tmp_path / "mlp" / "model.onnx"),
        "data": {
            "calibration": str(tmp_path / "mlp" / "calib.npz"),
            "evaluation": str(tmp_path / "mlp" / "eval.npz"),
            "batch_size": 16,
        },
        "evaluation": {"metric": "cosine", "latency": {"warmup": 1, "repeats": 2, "threads": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.001},
        "passes": [{"name": "dynamic_quant", "search": True}, {"name": "static_quant", "search": True}],
        "flows": flows or [["dynamic_quant"]],
        "search": {"sampler": "random", "seed": 0, "strategy": strategy},
        "stop": {"max_trials": max_trials},
        "cache_dir": str(tmp_path / "cache"),
        "executor": {"kind": "inline"},
    }


def drive(strategy, judge, limit: int = 60) -> list[Point]:
    points = []
    for _ in range(limit):
        proposal = strategy.ask()
        if proposal is None:
            break
        assert proposal is not WAIT
        if "flow" in proposal.point:  # the proposal runs the flow its point names
            assert proposal.flow == tuple(strategy.problem.flows[proposal.point["flow"]])
        points.append(proposal.point)
        strategy.tell(proposal, judge(proposal.point))
    return points


# -- capability -----------------------------------------------------------------------------------


def test_dynamic_capability_is_what_quantize_dynamic_touches(tmp_path: Path) -> None:
    capability = ModelCapability.from_model(build_outlier_mlp(tmp_path), mode="dynamic")
    assert capability.quantizable == {"mm1", "mm2", "embed", "transpose"}
    assert [g.nodes for g in capability.groups] == [("mm1",), ("mm2",), ("embed",), ("transpose",)]
    # the Transpose only moves data: never a fallback candidate
    assert [g.name for g in capability.candidates()] == ["mm1", "mm2", "embed"]


def test_shape_only_static_groups_are_not_candidates(tmp_path: Path) -> None:
    capability = ModelCapability.from_model(build_outlier_mlp(tmp_path))
    shape_only = {g.name for g in capability.groups if g.shape_only}
    assert "reshape" in shape_only
    assert "embed" not in shape_only  # a Gather of a constant table is an embedding, not shape-only
    assert {g.name for g in capability.candidates()} == {g.name for g in capability.groups} - shape_only


def test_dynamic_sensitivity_finds_the_matmul_with_the_outlier_weights(tmp_path: Path) -> None:
    path = build_outlier_mlp(tmp_path)
    data = dict(np.load(tmp_path / "calib.npz"))
    batches = [{k: v[i : i + 16] for k, v in data.items()} for i in range(0, 64, 16)]
    report = measure_dynamic(path, batches)
    assert report.rows == 64
    assert report.scores["mm1"] > 10 * max(report.scores["mm2"], report.scores["embed"])
    assert report.scores["relu"] == 0.0
    per_channel = measure_dynamic(path, batches, per_channel=True)
    assert per_channel.scores["mm1"] < report.scores["mm1"] / 100  # per-column scales fix it


# -- strategies on a dynamic flow (fake evaluations) ----------------------------------------------


def needs_mm1_or_per_channel(point: Point) -> Outcome:
    meets = "mm1" in point.get("dynamic_quant.nodes_to_exclude", []) or bool(point.get("dynamic_quant.per_channel"))
    return Outcome(1.0, 0.0 if meets else 0.05, meets, {})


def needs_mm1(point: Point) -> Outcome:
    excluded = point.get("dynamic_quant.nodes_to_exclude", [])
    meets = "mm1" in excluded
    return Outcome(1.0 + 0.1 * len(excluded), 0.0 if meets else 0.05, meets, {})


def test_quantune_starts_a_dynamic_step_per_channel(tmp_path: Path) -> None:
    """Neural Compressor's dynamic defaults: per-channel weights, so this model meets at its ceiling."""
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(mlp_config(tmp_path, "quantune"), {"latency_trials": 0}))
    points = drive(strategy, needs_mm1_or_per_channel)
    assert strategy.ctx.dynamic and strategy.ctx.quant_step == "dynamic_quant"
    assert {s.split(":")[0] for s in strategy.stage_log} == {"ceiling"}
    assert all(p["dynamic_quant.per_channel"] is True for p in points)
    best = strategy.best_meeting()
    assert best is not None and not best.point.get("dynamic_quant.nodes_to_exclude")


def needs_per_tensor(point: Point) -> Outcome:
    meets = point.get("dynamic_quant.per_channel") is False
    return Outcome(1.0, 0.0 if meets else 0.05, meets, {})


def test_quantune_screens_per_tensor_when_per_channel_misses(tmp_path: Path) -> None:
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(mlp_config(tmp_path, "quantune"), {"latency_trials": 0}))
    points = drive(strategy, needs_per_tensor)
    screens = [p for p, s in zip(points, strategy.stage_log, strict=True) if s.startswith("screen")]
    assert screens and screens[0]["dynamic_quant.per_channel"] is False
    best = strategy.best_meeting()
    assert best is not None and best.point["dynamic_quant.per_channel"] is False


def test_quantune_bisects_the_dynamic_fallback(tmp_path: Path) -> None:
    strategy = create_strategy("quantune")
    config = mlp_config(tmp_path, "quantune")
    config["passes"][0] = {"name": "dynamic_quant"}  # nothing to screen: straight to the fallback
    strategy.bind(accuracy_problem(config, {"latency_trials": 0}))
    drive(strategy, needs_mm1)
    assert strategy.ranking[0].name == "mm1"  # ranked first by the dynamic sensitivity
    best = strategy.best_meeting()
    assert best is not None and best.point["dynamic_quant.nodes_to_exclude"] == ["mm1"]


@pytest.mark.parametrize("name", ["auto", "basic", "mse", "mse_v2", "conservative"])
def test_fallback_strategies_tune_a_dynamic_step(tmp_path: Path, name: str) -> None:
    strategy = create_strategy(name)
    strategy.bind(accuracy_problem(mlp_config(tmp_path, name, max_trials=30)))
    points = drive(strategy, needs_mm1)
    assert points and all(k == "flow" or k.startswith("dynamic_quant.") for p in points for k in p)
    assert all("tensor_overrides" not in k for p in points for k in p)
    assert strategy.best_meeting() is not None


def test_quantune_tunes_the_fastest_flow(tmp_path: Path) -> None:
    """Speed first: the flow whose fully-quantized variant is fastest is tuned, even though the
    other one misses the budget by less (the flow the old strategy chose)."""
    config = mlp_config(tmp_path, "quantune", flows=[["static_quant"], ["dynamic_quant"]])

    def judge(point: Point) -> Outcome:
        if point["flow"] == "static_quant":
            return Outcome(2.0, 0.01, False, {"latency_ms": 2.0})
        return (
            Outcome(1.0, 0.05, False, {"latency_ms": 1.0})
            if not needs_mm1_or_per_channel(point).meets
            else (Outcome(1.0, 0.0, True, {"latency_ms": 1.0}))
        )

    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(config, {"latency_trials": 0}))
    points = drive(strategy, judge)
    ceilings = [p for p, s in zip(points, strategy.stage_log, strict=False) if s.startswith("ceiling")]
    assert {p["flow"] for p in ceilings} == {"static_quant", "dynamic_quant"}  # every flow's ceiling
    assert strategy.ctx.flow_name == "dynamic_quant"
    assert all(p["flow"] == "dynamic_quant" for p in points[len(ceilings) :])
    # the flow option pins one flow: no other default is tried
    pinned = create_strategy("quantune")
    pinned.bind(accuracy_problem(config, {"latency_trials": 0, "flow": "static_quant"}))
    assert all(p["flow"] == "static_quant" for p in drive(pinned, judge))


def test_real_run_on_a_dynamic_flow(tmp_path: Path) -> None:
    config = mlp_config(tmp_path, "quantune", max_trials=4)
    # a tiny model runs fastest in fp32: keep its ceiling (else the timing alone ends the run)
    config["search"]["strategy_options"] = {"drop_slow": False}
    result = quantune.tune(config, output=tmp_path / "run")
    assert 1 <= len(result.trials) <= 4
    assert all(trial.status == "ok" for trial in result.trials)


# -- static sensitivity: noise through a MatMul of two activations ---------------------------------


def test_softmax_matmul_product_noise_is_scored(tmp_path: Path) -> None:
    """x -> MatMul(w) -> Softmax -> MatMul(., x): attention's probabilities times values."""
    import contextlib
    import io
    import logging

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from quantune.evaluate.sensitivity import measure

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 2.0, (8, 8)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "x"], ["y"], name="context"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 8])],
        [w],
    )
    float_path, quant_path = save_graph(graph, tmp_path / "f.onnx"), tmp_path / "q.onnx"
    rows = rng.normal(0, 1, (32, 8, 8)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rows[i : i + 8]} for i in range(0, 32, 8)])

        def get_next(self):
            return next(self.batches, None)

    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quantize_static(str(float_path), str(quant_path), Reader(), quant_format=QuantFormat.QDQ)
    finally:
        logging.disable(logging.NOTSET)
    report = measure(float_path, quant_path, [{"x": rows[i : i + 8]} for i in range(0, 32, 8)])
    assert set(report.product_noise) == {"context"}  # the weighted MatMul has weight noise instead
    assert report.product_noise["context"] > 0
    assert report.scores["context"] >= report.product_noise["context"]


def test_a_model_is_evaluated_once_whichever_stage_proposes_it(tmp_path: Path) -> None:
    """The screen's ``per_channel=True`` and the latency sampler's full point are one point."""
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(mlp_config(tmp_path, "quantune", max_trials=30)))
    points = drive(strategy, needs_mm1_or_per_channel)
    assert len(points) <= 8  # weight_type x per_channel x reduce_range
    models = {tuple(sorted((k, str(v)) for k, v in p.items())) for p in points}
    assert len(models) == len(points)
    assert all({"dynamic_quant.per_channel", "dynamic_quant.weight_type"} <= set(p) for p in points)


def test_the_chosen_flows_default_is_not_evaluated_again(tmp_path: Path) -> None:
    config = mlp_config(tmp_path, "quantune", flows=[["static_quant"], ["dynamic_quant"]], max_trials=30)
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(config))
    points = drive(strategy, lambda p: Outcome(1.0, 0.5, False, {}) if p["flow"] == "static_quant" else needs_mm1(p))
    keys = [tuple(sorted((k, str(v)) for k, v in p.items())) for p in points]
    assert len(set(keys)) == len(keys)
    ceilings = [v.point for v in strategy.shared.variants if v.ctx.flow_name == strategy.ctx.flow_name]
    assert any(strategy.known(point) is not None for point in ceilings)  # remembered under the new flow


# -- block-first bisection (static) ----------------------------------------------------------------


def build_layers(folder: Path, layers: int = 4) -> Path:
    """x[batch, 8] -> (layer.i: MatMul fc1 -> Relu -> MatMul fc2) x layers -> y."""
    rng = np.random.default_rng(1)
    nodes, inits, current = [], [], "x"
    for i in range(layers):
        for name in ("fc1", "fc2"):
            weight = f"w{i}{name}"
            inits.append(numpy_helper.from_array(rng.normal(0, 0.4, (8, 8)).astype(np.float32), weight))
            nodes.append(
                helper.make_node("MatMul", [current, weight], [f"{weight}_out"], name=f"/layer.{i}/{name}/MatMul")
            )
            current = f"{weight}_out"
            if name == "fc1":
                nodes.append(helper.make_node("Relu", [current], [f"{current}_r"], name=f"/layer.{i}/act/Relu"))
                current = f"{current}_r"
    nodes.append(helper.make_node("Identity", [current], ["y"], name="out"))
    graph = helper.make_graph(
        nodes,
        "layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        inits,
    )
    save_graph(graph, folder / "model.onnx")
    for name in ("calib", "eval"):
        np.savez(folder / f"{name}.npz", x=rng.normal(0, 1, (32, 8)).astype(np.float32))
    return folder / "model.onnx"


@pytest.mark.parametrize("blocks", [True, False])
def test_bisection_goes_by_blocks_first(tmp_path: Path, blocks: bool) -> None:
    build_layers(tmp_path / "layers")
    config = mlp_config(tmp_path, "quantune", max_trials=30)
    folder = tmp_path / "layers"
    config.update(
        model=str(folder / "model.onnx"),
        data={"calibration": str(folder / "calib.npz"), "evaluation": str(folder / "eval.npz"), "batch_size": 16},
        passes=[{"name": "static_quant", "params": {"quant_format": "QDQ"}}],
        flows=None,
    )
    target = "/layer.2/fc2/MatMul"

    def judge(point: Point) -> Outcome:
        excluded = point.get("static_quant.nodes_to_exclude", [])
        return Outcome(1.0 + 0.1 * len(excluded), 0.0 if target in excluded else 0.05, target in excluded, {})

    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(config, {"latency_trials": 0, "bisect_blocks": blocks}))
    drive(strategy, judge)
    stages = [s.split(":")[0] for s in strategy.stage_log]
    assert ("bisect blocks" in stages) == blocks
    best = strategy.best_meeting()
    assert best is not None and target in best.point["static_quant.nodes_to_exclude"]
    assert strategy.smallest_meeting_fallback is not None
    # block-level then group-level: O(log blocks + log groups) evaluations
    assert sum(1 for s in stages if s.startswith("bisect")) <= 3 + 4


def test_a_tensor_quantized_with_an_infinite_scale_is_the_most_sensitive() -> None:
    """An attention mask of -inf calibrates to an infinite scale: DQ(Q(T)) is NaN everywhere."""
    from quantune.evaluate.sensitivity import NodeStats

    reference = np.array([[0.0, -np.inf], [0.0, 0.0]])
    broken = NodeStats()
    broken.add(np.full_like(reference, np.nan), reference)
    assert broken.channel_nmse() == 1.0
    fine = NodeStats()
    fine.add(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[1.0, 2.0], [3.0, 4.01]]))
    assert 0.0 < fine.channel_nmse() < 1e-3
