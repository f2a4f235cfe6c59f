"""Keeps a Conv/ConvTranspose/Gemm that quantization excluded really in float when onnxruntime runs it.

onnxruntime's ``WeightBiasQuantization`` transformer quantizes, at session load, the float
weight of such a node between a per-tensor ``DequantizeLinear`` and a ``QuantizeLinear``:
exactly the fallback an accuracy search makes, which then silently runs int8. The fix is in the
model, so it holds for anyone who loads it: the excluded node reads its input through a
``DequantizeLinear`` of its own with per-channel (repeated) scale and zero point.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

WEIGHTED = ("Conv", "ConvTranspose", "Gemm")


def keep_excluded_float(model: onnx.ModelProto, excluded: Iterable[str]) -> int:
    """Rewires each excluded weighted node that reads a per-tensor DQ; returns how many were rewired."""
    names = set(excluded)
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    rewired = 0
    for node in list(graph.node):
        if node.name not in names or node.op_type not in WEIGHTED or len(node.input) < 2:
            continue
        dq = producer.get(node.input[0])
        if dq is None or dq.op_type != "DequantizeLinear" or node.input[1] not in inits:
            continue
        axis, channels = _input_channels(node, tuple(inits[node.input[1]].dims))
        scale = _constant(inits, dq.input[1])
        zero = _constant(inits, dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
        if scale is None or scale.size != 1 or channels is None or (len(dq.input) > 2 and zero is None):
            continue
        scale_name, out_name = f"{node.name}_float_input_scale", f"{node.input[0]}_{node.name}_float_input"
        graph.initializer.append(numpy_helper.from_array(np.full(channels, scale.item(), scale.dtype), scale_name))
        inputs = [dq.input[0], scale_name]
        if zero is not None:
            zero_name = f"{node.name}_float_input_zero_point"
            graph.initializer.append(numpy_helper.from_array(np.full(channels, zero.item(), zero.dtype), zero_name))
            inputs.append(zero_name)
        position = list(graph.node).index(node)
        graph.node.insert(
            position,
            helper.make_node("DequantizeLinear", inputs, [out_name], name=f"{node.name}_float_input", axis=axis),
        )
        node.input[0] = out_name
        rewired += 1
    if rewired:  # a DQ whose only reader was rewired is dead; left in, it would block the upstream fusion
        used = {name for node in graph.node for name in node.input} | {out.name for out in graph.output}
        for node in list(graph.node):
            if node.op_type == "DequantizeLinear" and not any(out in used for out in node.output):
                graph.node.remove(node)
    return rewired


def _input_channels(node: onnx.NodeProto, weight_shape: tuple[int, ...]) -> tuple[int, int | None]:
    """(axis of input 0 that holds its channels, how many): what a per-channel DQ of the input needs."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Conv" and len(weight_shape) >= 2:
        return 1, int(weight_shape[1]) * int(attrs.get("group", 1))
    if node.op_type == "ConvTranspose" and len(weight_shape) >= 1:
        return 1, int(weight_shape[0])
    if node.op_type == "Gemm" and len(weight_shape) == 2:
        channels = int(weight_shape[1] if attrs.get("transB", 0) else weight_shape[0])
        return (0 if attrs.get("transA", 0) else 1), channels
    return 1, None


def _constant(inits: dict[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    return numpy_helper.to_array(inits[name]) if name in inits else None
