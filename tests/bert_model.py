"""A tiny BERT-like encoder layer built with ``onnx.helper``: the graph torch exports for one
layer (LayerNorm, Q/K/V MatMul + bias, the additive attention mask, Softmax, the output
projection with a residual Add + LayerNorm, and an Erf-GELU feed-forward block), small enough
for unit tests and shaped so onnxruntime's transformer optimizer fuses it (Attention,
SkipLayerNormalization, BiasGelu)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from conftest import save_graph

HIDDEN = 64
HEADS = 4
FFN = 128


def build_bert_layer(path: Path, seed: int = 0) -> Path:
    """``x[N, S, 64]`` (float) and ``mask[N, S]`` (int64, 1 = token) -> ``out[N, S, 64]``."""
    rng = np.random.default_rng(seed)
    head = HIDDEN // HEADS
    arrays: dict[str, np.ndarray] = {
        "ln0_g": 1 + rng.normal(0, 0.1, HIDDEN),
        "ln0_b": rng.normal(0, 0.1, HIDDEN),
        "ln1_g": 1 + rng.normal(0, 0.1, HIDDEN),
        "ln1_b": rng.normal(0, 0.1, HIDDEN),
        "ln2_g": 1 + rng.normal(0, 0.1, HIDDEN),
        "ln2_b": rng.normal(0, 0.1, HIDDEN),
        "wo": rng.normal(0, 0.1, (HIDDEN, HIDDEN)),
        "bo": rng.normal(0, 0.05, HIDDEN),
        "w_in": rng.normal(0, 0.1, (HIDDEN, FFN)),
        "b_in": rng.normal(0, 0.05, FFN),
        "w_out": rng.normal(0, 0.1, (FFN, HIDDEN)),
        "b_out": rng.normal(0, 0.05, HIDDEN),
    }
    for name in "qkv":
        arrays[f"w{name}"] = rng.normal(0, 0.15, (HIDDEN, HIDDEN))
        arrays[f"b{name}"] = rng.normal(0, 0.05, HIDDEN)
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()]
    inits += [
        numpy_helper.from_array(np.array([0, 0, HEADS, head], np.int64), "split_heads"),
        numpy_helper.from_array(np.array([0, 0, HIDDEN], np.int64), "merge_heads"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(-10000.0, np.float32), "neg"),
        numpy_helper.from_array(np.array(math.sqrt(head), np.float32), "scale"),
        numpy_helper.from_array(np.array(math.sqrt(2.0), np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    node = helper.make_node
    nodes = [
        node("LayerNormalization", ["x", "ln0_g", "ln0_b"], ["h"], name="ln0", axis=-1, epsilon=1e-12),
        # the additive mask: (1 - mask) * -10000, broadcast over heads and query positions
        node("Unsqueeze", ["mask", "axis1"], ["m1"], name="mask_unsq1"),
        node("Unsqueeze", ["m1", "axis2"], ["m2"], name="mask_unsq2"),
        node("Cast", ["m2"], ["m3"], name="mask_cast", to=TensorProto.FLOAT),
        node("Sub", ["one", "m3"], ["m4"], name="mask_sub"),
        node("Mul", ["m4", "neg"], ["mask_add"], name="mask_mul"),
    ]
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [
            node("MatMul", ["h", f"w{name}"], [f"{name}0"], name=f"matmul_{name}"),
            node("Add", [f"b{name}", f"{name}0"], [f"{name}1"], name=f"add_{name}"),
            node("Reshape", [f"{name}1", "split_heads"], [f"{name}2"], name=f"reshape_{name}"),
            node("Transpose", [f"{name}2"], [f"{name}3"], name=f"transpose_{name}", perm=perm),
        ]
    nodes += [
        node("MatMul", ["q3", "k3"], ["s0"], name="matmul_qk"),
        node("Div", ["s0", "scale"], ["s1"], name="div_qk"),
        node("Add", ["s1", "mask_add"], ["s2"], name="add_mask"),
        node("Softmax", ["s2"], ["p"], name="softmax", axis=3),
        node("MatMul", ["p", "v3"], ["c0"], name="matmul_pv"),
        node("Transpose", ["c0"], ["c1"], name="transpose_ctx", perm=[0, 2, 1, 3]),
        node("Reshape", ["c1", "merge_heads"], ["c2"], name="reshape_ctx"),
        node("MatMul", ["c2", "wo"], ["o0"], name="matmul_o"),
        node("Add", ["bo", "o0"], ["o1"], name="add_o"),
        node("Add", ["o1", "h"], ["r0"], name="residual0"),
        node("LayerNormalization", ["r0", "ln1_g", "ln1_b"], ["a"], name="ln1", axis=-1, epsilon=1e-12),
        # feed-forward: GELU(x) = x * 0.5 * (1 + erf(x / sqrt(2)))
        node("MatMul", ["a", "w_in"], ["f0"], name="matmul_ffn_in"),
        node("Add", ["b_in", "f0"], ["f1"], name="add_ffn_in"),
        node("Div", ["f1", "sqrt2"], ["g0"], name="gelu_div"),
        node("Erf", ["g0"], ["g1"], name="gelu_erf"),
        node("Add", ["g1", "one"], ["g2"], name="gelu_add"),
        node("Mul", ["f1", "g2"], ["g3"], name="gelu_mul"),
        node("Mul", ["g3", "half"], ["g4"], name="gelu_half"),
        node("MatMul", ["g4", "w_out"], ["f2"], name="matmul_ffn_out"),
        node("Add", ["b_out", "f2"], ["f3"], name="add_ffn_out"),
        node("Add", ["f3", "a"], ["r1"], name="residual1"),
        node("LayerNormalization", ["r1", "ln2_g", "ln2_b"], ["out"], name="ln2", axis=-1, epsilon=1e-12),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_bert_layer",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", HIDDEN]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", "S"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "S", HIDDEN])],
        inits,
    )
    return save_graph(graph, path)


def bert_inputs(rows: int, seed: int, tokens: int = 12) -> dict[str, np.ndarray]:
    """Random hidden states, with the last few positions of every other row masked out."""
    rng = np.random.default_rng(seed)
    mask = np.ones((rows, tokens), np.int64)
    mask[::2, tokens - 3 :] = 0
    return {"x": rng.normal(0, 1, (rows, tokens, HIDDEN)).astype(np.float32), "mask": mask}


CLASSES = 6


def build_bert_classifier(path: Path, seed: int = 0) -> Path:
    """The encoder layer with a classifier head: mean over positions -> MatMul + bias -> ``logits[N, 6]``."""
    import onnx

    model = onnx.load(str(build_bert_layer(path, seed)))
    graph = model.graph
    rng = np.random.default_rng(seed + 1)
    graph.initializer.extend(
        [
            numpy_helper.from_array(rng.normal(0, 0.3, (HIDDEN, CLASSES)).astype(np.float32), "w_cls"),
            numpy_helper.from_array(rng.normal(0, 0.05, CLASSES).astype(np.float32), "b_cls"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("ReduceMean", ["out"], ["pooled"], name="pool", axes=[1], keepdims=0),
            helper.make_node("MatMul", ["pooled", "w_cls"], ["l0"], name="matmul_cls"),
            helper.make_node("Add", ["l0", "b_cls"], ["logits"], name="add_cls"),
        ]
    )
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES]))
    return save_graph(graph, path)
