"""Step: ``Constant`` nodes of the main graph become initializers, where onnxruntime's quantizers
look for weights; the tensor is the same either way."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

_ATTRIBUTE_VALUES = ("value", "value_float", "value_floats", "value_int", "value_ints")


def constants_to_initializers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Moves every dense Constant of the main graph into the initializers (not one whose output
    is a graph output, nor a sparse or string one); subgraphs keep theirs."""
    graph = model.graph
    outputs = {out.name for out in graph.output}
    taken = {init.name for init in graph.initializer}
    moved: list[onnx.TensorProto] = []
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        tensor = _tensor_of(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else None
        if tensor is None or node.output[0] in outputs or node.output[0] in taken:
            kept.append(node)
            continue
        moved.append(tensor)
    if not moved:
        return model, []
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(kept)
    result.graph.initializer.extend(moved)
    if result.ir_version < 4:  # before IR 4 every initializer must also be a graph input
        for tensor in moved:
            result.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    return result, [f"{len(moved)} Constant node(s) -> initializers"]


def _tensor_of(node: onnx.NodeProto) -> onnx.TensorProto | None:
    if len(node.attribute) != 1 or len(node.output) != 1:
        return None
    attribute = node.attribute[0]
    if attribute.name not in _ATTRIBUTE_VALUES:
        return None  # sparse_value, value_string(s): left as they are
    value = helper.get_attribute_value(attribute)
    if attribute.name == "value":
        if value.data_type == onnx.TensorProto.STRING:
            return None
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
    else:
        dtype = "float32" if attribute.name.startswith("value_float") else "int64"
        tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype))
    tensor.name = node.output[0]
    return tensor
