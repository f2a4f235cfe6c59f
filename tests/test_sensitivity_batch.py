"""The static sensitivity measured in batches of rows where the model's batch axis is free:
the same scores as one row at a time, fewer session runs (engine/measure/sensitivity_probe.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

from quantune.engine.measure.sensitivity_probe import MEASURE_BATCH, measure_batch
from quantune.evaluate.sensitivity.static import measure


def _conv_model(path: Path, batch: int | str) -> Path:
    """Conv -> Relu -> Conv with a Softmax head; ``batch``: the input's first axis."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.5, (5, 4, 1, 1)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Softmax", ["c2"], ["y"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5, 8, 8])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


class _Reader(CalibrationDataReader):
    def __init__(self, rows: np.ndarray) -> None:
        self.it = iter([{"x": rows[i : i + 1]} for i in range(len(rows))])

    def get_next(self):
        return next(self.it, None)


def test_a_free_batch_axis_is_measured_in_batches(tmp_path: Path) -> None:
    assert measure_batch(_conv_model(tmp_path / "free.onnx", "N"), 1) == MEASURE_BATCH
    assert measure_batch(_conv_model(tmp_path / "fixed.onnx", 1), 1) == 1
    assert measure_batch(_conv_model(tmp_path / "free2.onnx", "N"), 32) == 32  # never fewer than the run's


def test_batched_scores_equal_one_row_at_a_time(tmp_path: Path) -> None:
    model = _conv_model(tmp_path / "model.onnx", "N")
    rows = np.random.default_rng(1).normal(0, 1, (12, 3, 8, 8)).astype(np.float32)
    quantized = tmp_path / "q.onnx"
    quantize_static(str(model), str(quantized), _Reader(rows), quant_format=QuantFormat.QDQ)
    single = measure(model, quantized, [{"x": rows[i : i + 1]} for i in range(len(rows))])
    batched = measure(model, quantized, [{"x": rows[i : i + 8]} for i in range(0, len(rows), 8)])
    assert single.scores and set(single.scores) == set(batched.scores)
    for name, score in single.scores.items():
        assert batched.scores[name] == pytest.approx(score, rel=1e-6, abs=1e-12), name
