"""A static model onnx refuses is made again with plain tensor names (passes/onnx/tensor_names.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import quantune.passes.onnx.static_quant as static_quant
from conftest import build_cnn, cnn_inputs, run_model
from quantune.data import Dataset
from quantune.passes.onnx.tensor_names import inference_error, plain_names, restore_names
from test_passes import run_pass


def test_plain_names_round_trip(tmp_path) -> None:
    model = onnx.load(str(build_cnn(tmp_path / "m.onnx")))
    original = onnx.ModelProto()
    original.CopyFrom(model)
    names = plain_names(model)
    assert names and "input" not in names and "logits" not in names  # the graph's inputs and outputs stay
    assert {i.name for i in model.graph.initializer} == {names[i.name] for i in original.graph.initializer}
    assert restore_names(model, names) and model == original
    assert inference_error(tmp_path / "m.onnx") is None


def test_a_model_onnx_refuses_is_detected(tmp_path) -> None:
    """A Transpose whose perm does not fit its input's rank: what onnxruntime refused on Basic Pitch."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [36])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    assert inference_error(path) is not None


@pytest.mark.parametrize("quant_format", ["QDQ", "QOperator"])
def test_a_refused_model_is_quantized_again_with_plain_names(quant_format, tmp_path, monkeypatch) -> None:
    """The second quantization (plain names) gives the same model, names restored, as the first."""
    cnn = build_cnn(tmp_path / "cnn.onnx")
    calibration = Dataset({"input": cnn_inputs(64, seed=1)}, "data.calibration")
    params = {"quant_format": quant_format}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = run_pass("static_quant", params, cnn, tmp_path / "a", calibration=calibration)
    refusals: list[str] = []
    real = static_quant.inference_error

    def first_refused(path):  # the first result is called refused; the plain-names one is checked for real
        if not refusals:
            refusals.append(str(path))
            return "refused (test)"
        return real(path)

    monkeypatch.setattr(static_quant, "inference_error", first_refused)
    retried = run_pass("static_quant", params, cnn, tmp_path / "b", calibration=calibration)
    assert refusals  # the retry ran
    a, b = onnx.load(str(plain)), onnx.load(str(retried))
    source = onnx.load(str(cnn)).graph
    originals = {t.name for t in source.initializer} | {o for n in source.node for o in n.output}

    def tensors(model: onnx.ModelProto) -> set[str]:
        return {t.name for t in model.graph.initializer} | {x for n in model.graph.node for x in [*n.input, *n.output]}

    kept = tensors(a) & originals
    assert kept and tensors(b) & originals == kept  # the original names are back where the first model has them
    assert sorted(n.op_type for n in a.graph.node) == sorted(n.op_type for n in b.graph.node)
    feeds = {"input": cnn_inputs(16, seed=3)}
    np.testing.assert_array_equal(run_model(plain, feeds)[0], run_model(retried, feeds)[0])
