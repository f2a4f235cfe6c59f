"""Types of the extended model's fused com.microsoft ops from its skeleton: what symbolic inference of the whole model gives."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import save_graph
from layernorm_model import build_layernorm_mlp
from quantune.passes.base import PassContext
from quantune.passes.onnx import pre_optimize
from quantune.passes.onnx.dynamic_quant import DynamicQuantization, DynamicQuantizationConfig
from quantune.passes.onnx.pre_optimize import add_types
from quantune.passes.onnx.skeleton import UNREAD_BY_SYMBOLIC, unread_weights
from quantune.prepare.shapes import symbolic_infer
from test_dynamic_ceilings import build_silu_cnn


def build_gelu_mlp(path: Path, seed: int = 0) -> Path:
    """MatMul -> bias -> erf Gelu -> MatMul: onnxruntime's extended level makes the middle a
    com.microsoft BiasGelu, whose output onnx's inference cannot type; the weights are large
    enough (32 KB) to leave the skeleton."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.2, (64, 128)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(0, 0.1, (128,)).astype(np.float32), "b0"),
        numpy_helper.from_array(rng.normal(0, 0.2, (128, 64)).astype(np.float32), "w1"),
        numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["m0"], name="fc0"),
        helper.make_node("Add", ["m0", "b0"], ["h"], name="bias0"),
        helper.make_node("Div", ["h", "sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="add1"),
        helper.make_node("Mul", ["h", "e1"], ["g0"], name="mul"),
        helper.make_node("Mul", ["g0", "half"], ["g"], name="half_mul"),
        helper.make_node("MatMul", ["g", "w1"], ["y"], name="fc1"),
    ]
    graph = helper.make_graph(
        nodes,
        "gelu_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 64])],
        inits,
    )
    return save_graph(graph, path)


MODELS = {
    "silu": (build_silu_cnn, "QuickGelu"),
    "gelu": (build_gelu_mlp, "BiasGelu"),
    "layernorm": (build_layernorm_mlp, None),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_skeleton_gives_the_symbolic_types_of_the_whole_model(tmp_path: Path, name: str) -> None:
    build, fused = MODELS[name]
    extended = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    source = build(tmp_path / f"{name}.onnx")
    pre_optimize.save_optimized(source, tmp_path / "ext.onnx", extended, pre_optimize.CONV_FUSIONS)  # untyped
    model = onnx.load(str(tmp_path / "ext.onnx"))
    ops = Counter(node.op_type for node in model.graph.node)
    if fused:
        assert ops[fused] >= 1, f"onnxruntime did not fuse a {fused}: {dict(ops)}"
    if name == "gelu":  # its weights are large enough to leave the skeleton
        assert len(list(unread_weights(model.graph, UNREAD_BY_SYMBOLIC))) == 2
    whole = symbolic_infer(model, guess_output_rank=True)
    expected = [info.SerializeToString() for info in whole.graph.value_info if info.name not in _known(model)]
    added = add_types(model)
    assert added, "nothing to type"
    assert [info.SerializeToString() for info in model.graph.value_info if info.name in set(added)] == expected
    fused_outputs = {out for node in model.graph.node if node.domain == "com.microsoft" for out in node.output}
    assert fused_outputs <= _known(model), "a fused op's output is left without a type"


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("weight_type", ["int8", "mixed"])
def test_a_float_path_through_a_fused_op_is_quantized_as_with_symbolic_inference_of_the_whole_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, weight_type: str
) -> None:
    build, _ = MODELS[name]
    source = build(tmp_path / f"{name}.onnx")
    config = DynamicQuantizationConfig(pre_optimize="extended", weight_type=weight_type, per_channel=True)
    digests, nodes = {}, {}
    for skeleton in (True, False):
        with monkeypatch.context() as patch:
            if not skeleton:  # today's inference of the whole model
                patch.setattr(pre_optimize, "without_weights", lambda model, unread: model)
            out = tmp_path / f"{skeleton}.onnx"
            DynamicQuantization().run(config, source, out, PassContext(None, ["x"], 1, tmp_path))
        digests[skeleton] = hashlib.sha256(out.read_bytes()).hexdigest()
        nodes[skeleton] = Counter(node.op_type for node in onnx.load(str(out)).graph.node)
    assert digests[True] == digests[False]
    quantized = nodes[True]["MatMulInteger"] + nodes[True]["ConvInteger"]
    float_compute = nodes[True]["MatMul"] + nodes[True]["Conv"]
    assert quantized >= 2 and float_compute == 0, dict(nodes[True])  # the compute after the fused op too


def _known(model: onnx.ModelProto) -> set[str]:
    return {info.name for info in model.graph.value_info}
