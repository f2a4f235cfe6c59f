"""Capability and groups: what onnxruntime quantizes, and fallback sets that keep graphs valid."""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from conftest import save_graph
from quantune.graph.capability import ModelCapability, quantizable_op_types

ROOT = Path(__file__).resolve().parents[1]
SCALED = ROOT / "examples" / "scaled_cnn" / "model.onnx"


def build_residual(path: Path, seed: int = 0) -> Path:
    """Conv -> Relu -> Conv -> Add(residual) -> Relu -> MaxPool -> GAP -> Flatten -> Gemm, 8x8 input."""
    rng = np.random.default_rng(seed)
    arrays = {
        "w1": rng.normal(0, 0.5, (4, 1, 3, 3)),
        "b1": rng.normal(0, 0.1, (4,)),
        "w2": rng.normal(0, 0.3, (4, 4, 3, 3)),
        "b2": rng.normal(0, 0.1, (4,)),
        "wf": rng.normal(0, 0.5, (3, 4)),
        "bf": rng.normal(0, 0.1, (3,)),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )
    return save_graph(graph, path)


class _Reader(CalibrationDataReader):
    def __init__(self, rows: np.ndarray) -> None:
        self._batches = iter([{"input": rows[i : i + 8]} for i in range(0, len(rows), 8)])

    def get_next(self) -> dict | None:
        return next(self._batches, None)


def _quantize(src: Path, dst: Path, rows: np.ndarray, **kwargs) -> Path:
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quantize_static(str(src), str(dst), _Reader(rows), **kwargs)
    finally:
        logging.disable(logging.NOTSET)
    return dst


def test_quantizable_types_come_from_onnxruntime_registries() -> None:
    types = quantizable_op_types()
    assert {"Conv", "MatMul", "Gemm", "Relu", "MaxPool", "Add"} <= types
    assert "Softmax" in types and "Erf" not in types


def test_scaled_cnn_groups_fuse_conv_with_its_followers() -> None:
    capability = ModelCapability.from_model(SCALED)
    groups = {group.name: group.nodes for group in capability.groups}
    assert groups["/features/features.2/Conv"] == (
        "/features/features.2/Conv",
        "/features/features.3/Relu",
        "/features/features.4/MaxPool",
    )
    assert len(capability.groups) == 5  # 3 convs, 2 gemms
    assert capability.op_types() == ["Conv", "Gemm"]
    assert capability.blocks() == {}


def test_residual_add_is_its_own_group(tmp_path: Path) -> None:
    capability = ModelCapability.from_model(build_residual(tmp_path / "r.onnx"))
    names = {group.name: group.nodes for group in capability.groups}
    assert names["add"] == ("add", "relu2", "pool", "gap", "flatten")  # two activation inputs: its own group
    assert names["conv1"] == ("conv1", "relu1")
    # user op_types_to_quantize narrow what is quantizable
    only_conv = ModelCapability.from_model(tmp_path / "r.onnx", op_types=["Conv"])
    assert [g.name for g in only_conv.groups] == ["conv1", "conv2"]


def test_blocks_are_found_from_layer_names() -> None:
    nodes = []
    previous = "x"
    for layer in range(3):
        for part in ("q", "o"):
            out = f"t{layer}{part}"
            nodes.append(
                helper.make_node("MatMul", [previous, "w"], [out], name=f"/encoder/layer.{layer}/{part}/MatMul")
            )
            previous = out
    graph = helper.make_graph(
        nodes,
        "blocks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")],
    )
    capability = ModelCapability.from_model(helper.make_model(graph))
    blocks = capability.blocks()
    assert list(blocks) == ["layer.0", "layer.1", "layer.2"]
    assert blocks["layer.1"] == ["/encoder/layer.1/q/MatMul", "/encoder/layer.1/o/MatMul"]


@pytest.mark.parametrize("quant_format", [QuantFormat.QDQ, QuantFormat.QOperator])
def test_every_fallback_set_yields_a_model_onnxruntime_runs(tmp_path: Path, quant_format: QuantFormat) -> None:
    model = build_residual(tmp_path / "r.onnx")
    rows = np.random.default_rng(0).normal(size=(16, 1, 8, 8)).astype(np.float32)
    capability = ModelCapability.from_model(model)
    names = [group.name for group in capability.groups]
    for size in range(len(names) + 1):
        for chosen in itertools.combinations(names, size):
            excluded, _ = capability.assignment(dict.fromkeys(chosen, "fp32"))
            out = _quantize(model, tmp_path / "q.onnx", rows, quant_format=quant_format, nodes_to_exclude=excluded)
            session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
            (logits,) = session.run(None, {"input": rows[:2]})
            assert logits.shape == (2, 3) and np.isfinite(logits).all(), chosen


def test_int16_groups_become_tensor_overrides(tmp_path: Path) -> None:
    model = build_residual(tmp_path / "r.onnx")
    rows = np.random.default_rng(0).normal(size=(16, 1, 8, 8)).astype(np.float32)
    capability = ModelCapability.from_model(model)
    excluded, overrides = capability.assignment({"conv2": "int16", "fc": "fp32"}, base_excluded=["gap"])
    assert excluded == ["fc", "gap"]
    assert overrides == {"c2": "int16", "r1": "int16"}
    out = _quantize(
        model,
        tmp_path / "q16.onnx",
        rows,
        quant_format=QuantFormat.QDQ,
        nodes_to_exclude=excluded,
        extra_options={
            "TensorQuantOverrides": {name: [{"quant_type": QuantType.QInt16}] for name in overrides},
            "UseQDQContribOps": True,
        },
    )
    graph = onnx.load(str(out)).graph
    zero_points = {init.name: init.data_type for init in graph.initializer if "zero_point" in init.name}
    assert TensorProto.INT16 in zero_points.values()
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": rows[:2]})


def test_an_unnamed_node_is_no_fallback_candidate(tmp_path: Path, cnn_model: Path) -> None:
    # onnxruntime matches nodes_to_exclude against node.name: an invented name would exclude nothing
    model = onnx.load(str(cnn_model))
    model.graph.node[2].name = ""  # the second Conv
    path = tmp_path / "unnamed.onnx"
    onnx.save(model, str(path))
    capability = ModelCapability.from_model(path)
    assert "conv1" in capability.quantizable
    assert not any(name.startswith("Conv_") for name in capability.quantizable)
    assert len(capability.quantizable) == len(ModelCapability.from_model(cnn_model).quantizable) - 1
