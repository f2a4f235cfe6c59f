"""Facts about the model a flow starts from, which passes read to prune points that cannot work.

What preparation could not fix is written down here (all JSON values, so they travel in cache
records), so :meth:`quantune.passes.Pass.supports` can refuse a point before a trial is spent
on it. A pass reading a key an older record lacks prunes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import onnx

WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose"})
BIASED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm"})


def default_opset(model: onnx.ModelProto) -> int:
    """The model's ``ai.onnx`` opset (0 when it imports none)."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)


def model_facts(model: onnx.ModelProto) -> dict[str, Any]:
    """The facts above, read from the main graph (weights need not be loaded)."""
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    weights: list[list[str]] = []
    biases: list[list[str]] = []
    for node in graph.node:
        if node.op_type in WEIGHTED_OPS and len(node.input) > 1 and node.input[1] not in initializers:
            weights.append([node.name, node.op_type])
        if node.op_type in BIASED_OPS and len(node.input) > 2 and node.input[2] and node.input[2] not in initializers:
            biases.append([node.name, node.op_type])
    return {
        "opset": default_opset(model),
        "computed_weights": weights,
        "computed_biases": biases,
        "matmul_weights": matmul_weights(model),
        "op_types": dict(sorted(Counter(node.op_type for node in graph.node).items())),
    }


def matmul_weights(model: onnx.ModelProto) -> list[list[Any]]:
    """``[name, K, N]`` per MatMul with a constant 2-D weight (leading dimensions of 1 allowed),
    the weights ``MatMulNBits`` can take; onnxruntime's quantizer skips the others silently."""
    graph = model.graph
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    found: list[list[Any]] = []
    for node in graph.node:
        if node.op_type != "MatMul" or len(node.input) < 2 or node.input[1] not in shapes:
            continue
        dims = shapes[node.input[1]]
        if len(dims) >= 2 and all(d == 1 for d in dims[:-2]):
            found.append([node.name, int(dims[-2]), int(dims[-1])])
    return found


def quantized_among(
    nodes: Iterable[Sequence[str]], op_types_to_quantize: Iterable[str] | None, nodes_to_exclude: Iterable[str]
) -> list[str]:
    """The names of ``nodes`` ([name, op_type]) a quantizer with these options would touch (named ones
    only: onnxruntime excludes nodes by name)."""
    wanted = None if op_types_to_quantize is None else set(op_types_to_quantize)
    excluded = set(nodes_to_exclude)
    return [
        name for name, op_type in nodes if (wanted is None or op_type in wanted) and (not name or name not in excluded)
    ]
