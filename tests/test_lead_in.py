"""The lead-in: shape-only ops between the graph's input and the first conv (an audio model's
framing of the raw waveform) quantized with one uint8 scale for quiet samples (~1e-3) next to
loud ones (~1e2) break the model; the convs in int8 do not. The lead-in is a fallback unit,
its measured effect at the outputs ranks it first, and quantune keeps only it in float."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

import quantune
from conftest import INLINE_EXECUTOR, accuracy_problem, build_cnn, run_model, save_graph
from quantune.evaluate.metrics import cosine
from quantune.evaluate.sensitivity import measure
from quantune.graph.capability import ModelCapability
from quantune.graph.head import lead_in_nodes
from quantune.strategy.accuracy.context import AccuracyContext

LEAD_IN = {"frame_reshape", "frame_pad", "frame_slice"}
CONVS = {"conv1", "conv2"}


def _build(path: Path, seed: int = 0) -> Path:
    """x[N, 72] -> Reshape -> Pad (reflect) -> Slice (drops the loud tail) -> Conv -> Relu -> Conv.

    Quantized, the Pad reads the whole input (its scale spans the loud tail) and the Slice
    keeps that scale, so the conv sees the quiet signal rounded to zero; with the lead-in in
    float, the conv's own input scale fits the quiet signal."""
    rng = np.random.default_rng(seed)
    floats = {
        "w1": rng.normal(0, 0.5, (8, 1, 5)),
        "b1": rng.normal(0, 1e-3, (8,)),
        "w2": rng.normal(0, 0.3, (8, 8, 3)),
        "b2": rng.normal(0, 1e-3, (8,)),
    }
    ints = {"shape": [-1, 1, 72], "pads": [0, 0, 2, 0, 0, 2], "starts": [0], "ends": [66], "axes": [2]}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in floats.items()]
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="frame_reshape"),
        helper.make_node("Pad", ["r", "pads"], ["pd"], name="frame_pad", mode="reflect"),
        helper.make_node("Slice", ["pd", "starts", "ends", "axes"], ["p"], name="frame_slice"),
        helper.make_node("Conv", ["p", "w1", "b1"], ["c1"], name="conv1"),
        helper.make_node("Relu", ["c1"], ["a1"], name="relu1"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["out"], name="conv2", pads=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "lead_in",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 72])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 8, 62])],
        inits,
    )
    return save_graph(graph, path)


def _audio(rows: int, seed: int) -> np.ndarray:
    """Quiet samples (~1e-3) and a loud tail (~1e2) the model slices off."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1e-3, (rows, 72))
    x[:, 64:] = rng.normal(0, 50, (rows, 8))
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def audio_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    folder = tmp_path_factory.mktemp("lead_in")
    model = _build(folder / "model.onnx")
    np.savez(folder / "calib.npz", x=_audio(32, 1))
    np.savez(folder / "eval.npz", x=_audio(32, 2))
    return model, {"calibration": folder / "calib.npz", "evaluation": folder / "eval.npz"}


class _Reader(CalibrationDataReader):
    def __init__(self, rows: np.ndarray) -> None:
        self.batches = iter([{"x": rows}])

    def get_next(self):
        return next(self.batches, None)


def _quantize(model: Path, out: Path, exclude: set[str]) -> Path:
    quantize_static(
        str(model),
        str(out),
        _Reader(_audio(32, 1)),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=sorted(exclude),
    )
    return out


def _config(model: Path, data: dict[str, Path], tmp_path: Path, **search) -> dict:
    return {
        "model": str(model),
        "data": {**{k: str(v) for k, v in data.items()}, "batch_size": 32},
        "evaluation": {"metric": "cosine", "latency": {"warmup": 1, "repeats": 3}},
        "criterion": {"type": "absolute", "tolerable_loss": 0.01},
        "passes": [{"name": "static_quant", "params": {"quant_format": "QDQ", "per_channel": False}}],
        "search": {"strategy": "quantune", "seed": 0, **search},
        "stop": {"max_trials": 6},
        "cache_dir": str(tmp_path / "cache"),
        **INLINE_EXECUTOR,
    }


def test_the_lead_in_is_what_precedes_the_first_compute_op(audio_model, tmp_path: Path) -> None:
    model, _ = audio_model
    capability = ModelCapability.from_model(model)
    assert set(lead_in_nodes(capability.nodes, capability.float_inputs)) == LEAD_IN
    classifier = ModelCapability.from_model(build_cnn(tmp_path / "cnn.onnx"))
    assert lead_in_nodes(classifier.nodes, classifier.float_inputs) == []  # the input feeds a Conv: no lead-in


def test_int8_on_the_lead_in_breaks_the_model_and_the_convs_do_not(audio_model, tmp_path: Path) -> None:
    model, _ = audio_model
    x = _audio(32, 2)
    reference = run_model(model, {"x": x})[0]

    def agreement(exclude: set[str]) -> float:
        out = _quantize(model, tmp_path / f"q{len(exclude)}.onnx", exclude)
        return cosine(run_model(out, {"x": x})[0], reference)

    assert agreement(set()) < 0.5, "int8 everywhere should break it"
    assert agreement(CONVS) < 0.9, "the convs alone in float should not restore it"
    assert agreement(LEAD_IN) > 0.99, "the lead-in alone in float should restore it"


def test_the_lead_in_is_a_unit_marked_in_the_ranking(audio_model, tmp_path: Path) -> None:
    model, data = audio_model
    context = AccuracyContext.from_problem(accuracy_problem(_config(model, data, tmp_path)), "quantune")
    units = {group.name: set(group.nodes) for group in context.candidates}
    lead = [name for name, nodes in units.items() if nodes & LEAD_IN]
    assert lead and set().union(*(units[name] for name in lead)) >= LEAD_IN, units
    assert context.lead_in == LEAD_IN
    context.ranked(context.base_point())
    assert all(context.scores[name].get("lead_in") for name in lead)
    assert not any(context.scores[name].get("lead_in") for name in units if name not in lead)


def test_a_model_whose_input_feeds_a_conv_has_no_lead_in_unit(tmp_path: Path, make_config) -> None:
    config = make_config([{"name": "static_quant", "params": {"quant_format": "QDQ"}}], search={"strategy": "quantune"})
    context = AccuracyContext.from_problem(accuracy_problem(config), "quantune")
    assert context.lead_in == set()
    assert [g.name for g in context.candidates] == [g.name for g in context.capability.candidates()]


def test_sensitivity_ranks_the_lead_in_first(audio_model, tmp_path: Path) -> None:
    model, _ = audio_model
    quant = _quantize(model, tmp_path / "qdq.onnx", set())
    report = measure(model, quant, [{"x": _audio(32, 1)}])
    capability = ModelCapability.from_model(model)
    units = [g for g in capability.groups if not g.shape_only or set(g.nodes) & LEAD_IN]
    ranked = sorted(units, key=lambda g: -sum(report.scores.get(n, 0.0) for n in g.nodes))
    assert set(ranked[0].nodes) & LEAD_IN, [g.name for g in ranked]
    assert max(report.head.get(n, 0.0) for n in LEAD_IN) > 0.5  # alone, at the outputs, it breaks it


def test_quantune_keeps_only_the_lead_in_in_float(audio_model, tmp_path: Path) -> None:
    model, data = audio_model
    # drop_slow off: on a model this small no int8 variant is faster than fp32 (what is tested is accuracy)
    config = _config(model, data, tmp_path, strategy_options={"drop_slow": False})
    result = quantune.tune(config, output=tmp_path / "out")
    candidates = [t for t in result.trials if t.meets_criterion and t.metrics.get("quantized_ops", 0) > 0]
    assert candidates, [(t.stage, t.metrics.get("cosine")) for t in result.trials]
    first = min(candidates, key=lambda t: t.number)
    excluded = set(first.params.get("static_quant.nodes_to_exclude", []))
    assert excluded & LEAD_IN and not excluded & CONVS, excluded
    best = result.best
    assert best is not None and best.meets_criterion, "no in-budget model"
    kept = set(best.params.get("static_quant.nodes_to_exclude", []))
    assert kept & LEAD_IN and not kept & CONVS, [(t.number, t.stage, t.metrics.get("cosine")) for t in result.trials]


def test_token_ids_feed_no_lead_in(tmp_path: Path) -> None:
    """Integer inputs (token ids: Reshape -> embedding Gather) and a Shape's integers start none."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array([-1, 4], np.int64), "shape"),
        numpy_helper.from_array(rng.normal(0, 1, (16, 8)).astype(np.float32), "table"),
        numpy_helper.from_array(rng.normal(0, 1, (8, 4)).astype(np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Reshape", ["ids", "shape"], ["flat"], name="ids_reshape"),
        helper.make_node("Gather", ["table", "flat"], ["emb"], name="embedding"),
        helper.make_node("Shape", ["x"], ["x_shape"], name="x_shape"),
        helper.make_node("Reshape", ["emb", "x_shape"], ["e"], name="emb_reshape"),
        helper.make_node("Add", ["e", "x"], ["h"], name="add_x"),
        helper.make_node("MatMul", ["h", "w"], ["out"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "tokens",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4, 4])],
        inits,
    )
    capability = ModelCapability.from_model(save_graph(graph, tmp_path / "tokens.onnx"))
    assert capability.float_inputs == ("x",)
    assert lead_in_nodes(capability.nodes, capability.float_inputs) == []  # Shape ends it; Add reads the ids' path
