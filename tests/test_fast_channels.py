"""Per-channel weights quantized for all channels at once give onnxruntime's very bytes
(passes/onnx/fast_channels.py), and a quantizer call uses them only where they do."""

from __future__ import annotations

import hashlib
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.quant_utils import quantize_data

from conftest import save_graph
from quantune.passes import get_pass
from quantune.passes.onnx import dynamic_quant, fast_channels


@pytest.mark.parametrize("q_type", [TensorProto.INT8, TensorProto.UINT8])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_every_channel_as_onnxruntime_quantizes_it_alone(q_type: int, reduce_range: bool) -> None:
    rng = np.random.default_rng(4)
    weights = rng.normal(0, 0.3, (6, 9, 4)).astype(np.float32)
    weights[:, 2] = 0.0  # an all-zero channel
    weights[:, 3] = np.abs(weights[:, 3])  # no negatives
    weights[:, 4] *= 1e-30  # a range too small for a float32 scale
    symmetric = q_type == TensorProto.INT8
    quantized, zero, scale = fast_channels.quantize_channels(weights, q_type, 1, symmetric, reduce_range)
    for channel in range(weights.shape[1]):
        z, s, q = quantize_data(weights[:, channel].flatten(), q_type, symmetric, reduce_range=reduce_range)
        assert zero[channel] == z and zero.dtype == z.dtype
        assert scale[channel] == s and scale.dtype == s.dtype
        assert np.array_equal(quantized[:, channel].flatten(), q)


def _matmuls(path: Path) -> Path:
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (16, 33)).astype(np.float32), f"w{i}") for i in range(2)]
    inits[1] = numpy_helper.from_array(rng.normal(0, 0.2, (33, 8)).astype(np.float32), "w1")
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"], name="a"),
        helper.make_node("MatMul", ["h", "w1"], ["y"], name="b"),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
        inits,
    )
    return save_graph(graph, path)


@pytest.mark.parametrize("reduce_range", [False, True])
def test_a_dynamic_model_is_byte_identical_with_or_without(tmp_path: Path, monkeypatch, reduce_range: bool) -> None:
    model = _matmuls(tmp_path / "m.onnx")
    dynamic = get_pass("dynamic_quant")
    config = dynamic.Config(per_channel=True, reduce_range=reduce_range)
    digests = []
    for fast in (True, False):
        monkeypatch.setattr(dynamic_quant, "fast_per_channel", fast_channels.fast_per_channel if fast else nullcontext)
        out = tmp_path / f"{fast}.onnx"
        dynamic().run(config, model, out, None)
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert digests[0] == digests[1]
    scales = [i for i in onnx.load(str(tmp_path / "True.onnx")).graph.initializer if i.name.endswith("_scale")]
    assert {tuple(s.dims) for s in scales if s.name.startswith("w")} == {(33,), (8,)}  # per channel indeed


def _conv_and_head(path: Path) -> Path:
    """A conv, then a wide MatMul (the shape of a CTC head: many output channels, some all-zero)."""
    rng = np.random.default_rng(6)
    conv = rng.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32)
    head = rng.normal(0, 0.2, (6, 301)).astype(np.float32)
    head[:, 7] = 0.0
    head[:, 9] = np.abs(head[:, 9])
    inits = [numpy_helper.from_array(conv, "wc"), numpy_helper.from_array(head, "wh")]
    nodes = [
        helper.make_node("Conv", ["x", "wc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("ReduceMean", ["r"], ["m"], name="pool", axes=[2, 3], keepdims=0),
        helper.make_node("MatMul", ["m", "wh"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 301])],
        inits,
    )
    return save_graph(graph, path)


@pytest.mark.parametrize(
    ("quant_format", "activation_type", "reduce_range"),
    [("QDQ", "uint8", False), ("QDQ", "int8", True), ("QOperator", "uint8", True), ("QOperator", "int8", False)],
)
def test_a_static_model_is_byte_identical_with_or_without(
    tmp_path: Path, monkeypatch, quant_format: str, activation_type: str, reduce_range: bool
) -> None:
    """The QDQ quantizer's per-channel scales and weights, and the QOperator one's, computed every
    channel at once: the very model onnxruntime writes channel by channel."""
    from quantune.data import Dataset
    from quantune.passes import PassContext
    from quantune.passes.onnx import static_quant

    model = _conv_and_head(tmp_path / "m.onnx")
    rows = {"x": np.random.default_rng(7).normal(0, 1, (16, 3, 8, 8)).astype(np.float32)}
    static = get_pass("static_quant")
    config = static.Config(
        per_channel=True, reduce_range=reduce_range, quant_format=quant_format, activation_type=activation_type
    )
    calls: list[str] = []
    real = fast_channels.channel_params
    monkeypatch.setattr(fast_channels, "channel_params", lambda *a: calls.append("fast") or real(*a))
    digests = []
    for fast in (True, False):
        monkeypatch.setattr(static_quant, "fast_per_channel", fast_channels.fast_per_channel if fast else nullcontext)
        out = tmp_path / f"{fast}.onnx"
        static().run(config, model, out, PassContext(Dataset(rows, "calib"), ["x"], 8, tmp_path))
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert calls, "the vectorized path was never taken"
    assert fast_channels._VERIFIED and all(fast_channels._VERIFIED.values())  # onnxruntime's arithmetic here
    assert digests[0] == digests[1]
    scales = {tuple(i.dims) for i in onnx.load(str(tmp_path / "True.onnx")).graph.initializer if "scale" in i.name}
    assert (301,) in scales and (6,) in scales  # per channel indeed
