"""A node the static pass excludes runs in float in the session onnxruntime builds, not just in the file.

onnxruntime's ``WeightBiasQuantization`` transformer re-quantizes an excluded Conv/Gemm that sits
between quantized neighbours at session load; these tests read the optimized model onnxruntime
saves (``SessionOptions.optimized_model_filepath``) to see what really runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import save_graph
from quantune.data import Dataset
from quantune.passes.onnx.float_fallback import keep_excluded_float
from test_passes import run_pass


def _conv_chain(path: Path) -> Path:
    """conv1 -> relu1 -> conv2 -> relu2 -> conv3 over ``input[N, 1, 8, 8]``."""
    rng = np.random.default_rng(0)
    shapes = {"w1": (8, 1, 3, 3), "w2": (8, 8, 3, 3), "w3": (4, 8, 3, 3)}
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, s).astype(np.float32), n) for n, s in shapes.items()]
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["out"], name="conv3", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4, 8, 8])],
        inits,
    )
    return save_graph(graph, path)


def _optimized(path: Path, tmp_path: Path) -> onnx.ModelProto:
    """The graph onnxruntime runs for ``path`` (all optimizations on, as in evaluation)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.optimized_model_filepath = str(tmp_path / f"{path.stem}.optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


def _quantized_weighted(model: onnx.ModelProto) -> set[str]:
    """Names (prefixes) of the nodes that run as QLinearConv."""
    return {
        node.name.split("_token")[0].removesuffix("_quant")
        for node in model.graph.node
        if node.op_type == "QLinearConv"
    }


@pytest.fixture
def chain(tmp_path: Path) -> tuple[Path, Dataset]:
    model = _conv_chain(tmp_path / "chain.onnx")
    rows = np.random.default_rng(1).normal(0, 1, (32, 1, 8, 8)).astype(np.float32)
    return model, Dataset({"input": rows}, "data.calibration")


@pytest.mark.parametrize("quant_format", ["QDQ", "QOperator"])
def test_excluded_conv_runs_in_float(chain: tuple[Path, Dataset], tmp_path: Path, quant_format: str) -> None:
    model, calibration = chain
    params = {"quant_format": quant_format, "activation_type": "uint8", "nodes_to_exclude": ["conv2", "relu2"]}
    out = run_pass("static_quant", params, model, tmp_path, calibration=calibration)
    running = _optimized(out, tmp_path)
    quantized = _quantized_weighted(running)
    assert "conv2" not in quantized, "the excluded conv was re-quantized at session load"
    assert {"conv1", "conv3"} <= quantized, "the neighbours lost their int8 kernels"
    assert any(n.op_type == "Conv" for n in running.graph.node), "no float Conv left in the optimized graph"


def test_without_the_fix_onnxruntime_quantizes_the_excluded_conv(
    chain: tuple[Path, Dataset], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transformer is real in this onnxruntime: with the rewiring off, conv2 runs as QLinearConv."""
    import quantune.passes.onnx.static_quant as static_quant

    monkeypatch.setattr(static_quant, "keep_excluded_float", lambda model, excluded: 0)
    model, calibration = chain
    params = {"quant_format": "QDQ", "activation_type": "uint8", "nodes_to_exclude": ["conv2", "relu2"]}
    out = run_pass("static_quant", params, model, tmp_path, calibration=calibration)
    assert "conv2" in _quantized_weighted(_optimized(out, tmp_path))


def test_rewired_model_computes_the_same(chain: tuple[Path, Dataset], tmp_path: Path) -> None:
    """The per-channel DQ is the same arithmetic as the per-tensor one (checked without fusion)."""
    model, calibration = chain
    params = {"quant_format": "QDQ", "activation_type": "uint8", "nodes_to_exclude": ["conv2", "relu2"]}
    out = run_pass("static_quant", params, model, tmp_path, calibration=calibration)
    proto = onnx.load(str(out))
    assert keep_excluded_float(proto, ["conv2"]) == 0  # already rewired by the pass: nothing left to do
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    feeds = {"input": np.random.default_rng(3).normal(0, 1, (4, 1, 8, 8)).astype(np.float32)}
    plain = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.isfinite(plain).all()
    assert np.abs(plain - reference).max() < 0.2 * np.abs(reference).max()
