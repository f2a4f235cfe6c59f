"""Recipes that recover accuracy without leaving int8 (cle, smooth_quant), and the sensitivity probe."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

import quantune
from conftest import save_graph
from quantune.data import Dataset
from quantune.evaluate.sensitivity import measure
from quantune.graph.capability import ModelCapability
from quantune.passes import PassContext
from quantune.passes.onnx.cle import equalize

ROOT = Path(__file__).resolve().parents[1]
SCALED = ROOT / "examples" / "scaled_cnn" / "model.onnx"
DIGITS = ROOT / "examples" / "digits"


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    calib = np.load(DIGITS / "calib.npz")
    evaluation = np.load(DIGITS / "eval.npz")
    return calib["input"], evaluation["input"], evaluation["label"]


class _Reader(CalibrationDataReader):
    def __init__(self, rows: np.ndarray) -> None:
        self._batches = iter([{"input": rows[i : i + 64]} for i in range(0, len(rows), 64)])

    def get_next(self) -> dict | None:
        return next(self._batches, None)


def _top1(path: Path, inputs: np.ndarray, labels: np.ndarray) -> float:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return float(np.mean(session.run(None, {"input": inputs})[0].argmax(1) == labels))


def _int8(src: Path, dst: Path, calib: np.ndarray, **kwargs) -> Path:
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quantize_static(str(src), str(dst), _Reader(calib), quant_format=QuantFormat.QDQ, **kwargs)
    finally:
        logging.disable(logging.NOTSET)
    return dst


def test_scaled_cnn_is_the_digits_function_and_breaks_plain_int8(tmp_path: Path) -> None:
    calib, inputs, labels = _data()
    fp32 = _top1(SCALED, inputs, labels)
    assert fp32 == _top1(DIGITS / "model.onnx", inputs, labels)
    plain = _top1(_int8(SCALED, tmp_path / "q.onnx", calib), inputs, labels)
    assert (fp32 - plain) / fp32 > 0.01  # static_quant defaults miss the 1% budget


def test_cle_preserves_the_function_and_rescues_int8(tmp_path: Path) -> None:
    calib, inputs, labels = _data()
    model = onnx.load(str(SCALED))
    assert equalize(model) == 3  # conv0->conv2, conv2->conv5 (through Relu+MaxPool), gemm1->gemm3
    onnx.save(model, str(tmp_path / "cle.onnx"))
    ref = ort.InferenceSession(str(SCALED), providers=["CPUExecutionProvider"]).run(None, {"input": inputs})[0]
    out = ort.InferenceSession(str(tmp_path / "cle.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(out.run(None, {"input": inputs})[0], ref, rtol=1e-3, atol=1e-3)
    fp32 = _top1(SCALED, inputs, labels)
    quantized = _top1(_int8(tmp_path / "cle.onnx", tmp_path / "q.onnx", calib), inputs, labels)
    assert (fp32 - quantized) / fp32 <= 0.01


def _outlier_mlp(path: Path) -> Path:
    """LayerNorm-free MatMul -> Relu -> Gemm over 8 features; feature 3 of the input is 50x larger."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 6)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 6)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        inits,
    )
    return save_graph(graph, path)


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.7])
def test_smooth_quant_preserves_the_function_and_shrinks_outliers(tmp_path: Path, alpha: float) -> None:
    rows = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32)
    rows[:, 3] *= 50
    src = _outlier_mlp(tmp_path / "mlp.onnx")
    pass_cls = quantune.get_pass("smooth_quant")
    context = PassContext(Dataset({"x": rows}, "calib"), ["x"], 16, tmp_path)
    pass_cls().run(pass_cls.Config(alpha=alpha), src, tmp_path / "sq.onnx", context)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": rows})[0]
    smoothed = onnx.load(str(tmp_path / "sq.onnx"))
    assert next(n.op_type for n in smoothed.graph.node) == "Mul"  # X / s before the MatMul
    out = ort.InferenceSession(str(tmp_path / "sq.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": rows})[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    inv = numpy_helper.to_array(next(i for i in smoothed.graph.initializer if i.name == "x_smooth_inv_scale"))
    assert inv[3] == inv.min()  # the outlier channel is scaled down most


def test_sensitivity_ranks_the_scaled_convs_first_in_one_run(tmp_path: Path) -> None:
    calib, _, _ = _data()
    quantized = _int8(SCALED, tmp_path / "q.onnx", calib)
    report = measure(SCALED, quantized, [{"input": calib[i : i + 64]} for i in range(0, 128, 64)])
    capability = ModelCapability.from_model(SCALED)
    scores = {g.name: sum(report.scores[n] for n in g.nodes) for g in capability.groups}
    ranked = sorted(scores, key=scores.get, reverse=True)
    assert ranked[:2] == ["/features/features.2/Conv", "/features/features.5/Conv"]
    assert report.rows == 128
    assert report.outputs["logits"]["cosine"] < 0.99  # the final outputs show the damage
    assert set(report.tensors["/features/features.3/Relu_output_0"]) == {"mse", "sqnr_db", "cosine"}
