"""A detector's decode head: int8 on the Concat of boxes (hundreds) and scores (0..1) breaks it,
the sensitivity ranks that unit first, and quantune keeps only it in float."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

import quantune
from conftest import INLINE_EXECUTOR, build_cnn
from quantune.evaluate.sensitivity import measure
from quantune.graph.capability import ModelCapability
from quantune.graph.head import head_groups, head_nodes

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "decode_head"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"decode_head_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD, METRIC = _load("build"), _load("metric")


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    folder = tmp_path_factory.mktemp("detector")
    model = BUILD.build(folder / "model.onnx")
    return model, BUILD.write_data(model, folder)


class _Reader(CalibrationDataReader):
    def __init__(self, rows: np.ndarray, name: str = "x") -> None:
        self.batches = iter([{name: rows[i : i + 16]} for i in range(0, len(rows), 16)])

    def get_next(self):
        return next(self.batches, None)


def _quantize(model: Path, calib: np.ndarray, out: Path, exclude: list[str]) -> Path:
    quantize_static(
        str(model),
        str(out),
        _Reader(calib),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=exclude,
    )
    return out


def _f1(model: Path, evaluation: Path) -> float:
    with np.load(evaluation) as data:
        x, ref = data["x"], data["ref"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    out = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return METRIC.score({"out": out}, {"ref": ref})


def test_the_head_is_what_follows_the_last_compute_op(detector, tmp_path: Path) -> None:
    model, _ = detector
    head = set(head_nodes(ModelCapability.from_model(model).nodes))
    assert {"head_concat", "anchor_add", "stride_mul", "dfl_conv", "dfl_softmax", "cls_sigmoid"} <= head
    assert not head & {"conv1", "conv3", "box_conv", "cls_conv"}  # the backbone's compute ends the walk
    classifier = ModelCapability.from_model(build_cnn(tmp_path / "cnn.onnx"))
    assert head_nodes(classifier.nodes) == []  # a Gemm at the output: no head


def test_int8_on_the_head_concat_breaks_the_detector(detector, tmp_path: Path) -> None:
    model, data = detector
    with np.load(data["calibration"]) as archive:
        calib = archive["x"]
    full = _f1(_quantize(model, calib, tmp_path / "full.onnx", []), data["evaluation"])
    decode_conv = _f1(_quantize(model, calib, tmp_path / "dfl.onnx", ["dfl_conv"]), data["evaluation"])
    concat = _f1(_quantize(model, calib, tmp_path / "concat.onnx", ["head_concat"]), data["evaluation"])
    assert full < 0.1 and decode_conv < 0.1, "int8 everywhere (or but the decode conv) should break it"
    assert concat > 0.95, "the head's Concat alone in float should restore it"


def test_sensitivity_ranks_the_head_culprit_first(detector, tmp_path: Path) -> None:
    model, data = detector
    with np.load(data["calibration"]) as archive:
        calib = archive["x"]
    quant = _quantize(model, calib, tmp_path / "qdq.onnx", [])
    report = measure(model, quant, [{"x": calib}])
    capability = ModelCapability.from_model(model)
    head = head_nodes(capability.nodes)
    units = [g for g in capability.groups if not g.shape_only] + [
        g for g in head_groups(capability.groups, head) if g.shape_only
    ]
    ranked = sorted(units, key=lambda g: -sum(report.scores.get(n, 0.0) for n in g.nodes))
    assert ranked[0].name == "head_concat", [g.name for g in ranked]
    assert report.head["head_concat"] > 0.5  # alone, it destroys a score channel
    assert report.head["dfl_conv"] < 0.05  # the decode conv alone does not


def test_quantune_keeps_only_the_head_concat_in_float(detector, tmp_path: Path) -> None:
    model, data = detector
    config = {
        "model": str(model),
        "data": {**{k: str(v) for k, v in data.items()}, "batch_size": 32},
        "evaluation": {"metric": f"{EXAMPLE / 'metric.py'}:score", "latency": {"warmup": 1, "repeats": 3}},
        "criterion": {"type": "relative", "tolerable_loss": 0.02},
        "passes": [{"name": "static_quant", "params": {"quant_format": "QDQ", "per_channel": False}}],
        # what falls back is the question, not whether int8 is faster here (0.96x on an AVX2 EPYC,
        # at the 0.97x margin: dropped in one run of a few): the ceiling is kept either way
        "search": {"strategy": "quantune", "seed": 0, "strategy_options": {"drop_slow": False}},
        "stop": {"max_trials": 6},
        "cache_dir": str(tmp_path / "cache"),
        **INLINE_EXECUTOR,
    }
    result = quantune.tune(config, output=tmp_path / "out")
    candidates = [t for t in result.trials if t.meets_criterion and t.metrics.get("quantized_ops", 0) > 0]
    assert candidates, [(t.stage, t.metrics.get("score")) for t in result.trials]
    first = min(candidates, key=lambda t: t.number)
    assert first.number <= 3  # the ceiling, the op-type tries: no bisection needed
    excluded = set(first.params.get("static_quant.nodes_to_exclude", []))
    assert "head_concat" in excluded and not excluded & {"conv1", "conv2", "conv3", "box_conv", "cls_conv"}


def _log_of_square(path: Path) -> tuple[Path, np.ndarray]:
    """fc1 -> Mul(h, h) -> Add(eps) -> Log -> fc2, inputs whose scale varies 100x between rows:
    Basic Pitch's normalized log, where int8 squares round the quiet rows to 0 and their log to -14."""
    from onnx import TensorProto, helper, numpy_helper

    from conftest import save_graph

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 1, (8, 16)).astype(np.float32), "w1"),
        numpy_helper.from_array(np.array([1e-6], np.float32), "eps"),
        numpy_helper.from_array(rng.normal(0, 0.3, (16, 4)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Mul", ["h", "h"], ["sq"], name="square"),
        helper.make_node("Add", ["sq", "eps"], ["sqe"], name="add_eps"),
        helper.make_node("Log", ["sqe"], ["lg"], name="log"),
        helper.make_node("MatMul", ["lg", "w2"], ["out"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "log_of_square",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])],
        inits,
    )
    rows = (rng.normal(0, 1, (64, 8)) * np.exp(rng.normal(0, 1.5, (64, 1)))).astype(np.float32)
    return save_graph(graph, path), rows


def test_a_square_before_a_log_ranks_first(tmp_path: Path) -> None:
    model, rows = _log_of_square(tmp_path / "log.onnx")
    quant = tmp_path / "log_qdq.onnx"
    quantize_static(
        str(model), str(quant), _Reader(rows, "x"), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8
    )
    report = measure(model, quant, [{"x": rows}])
    groups = ModelCapability.from_model(model).candidates()
    ranked = sorted(groups, key=lambda g: -sum(report.scores.get(n, 0.0) for n in g.nodes))
    assert ranked[0].name == "square" and ranked[-1].name == "fc2", [g.name for g in ranked]
    assert report.head["square"] > 0.5  # measured at the output: alone, it breaks it
