"""The quantized weighted layers of a QDQ model, read and rewritten in place.

``static_quant`` feeds each quantized Conv/Gemm/MatMul its weight through a ``DequantizeLinear``
of an integer initializer (or a Q -> DQ pair on the float one) and its bias through an int32
one. The refining passes change only those integers: scales, zero points and graph stay as
static_quant made them, so the model keeps its int8 kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

LAYER_TYPES = ("Conv", "Gemm", "MatMul")
_INT_RANGES = {
    onnx.TensorProto.INT8: (-128, 127),
    onnx.TensorProto.UINT8: (0, 255),
    onnx.TensorProto.INT16: (-32768, 32767),
    onnx.TensorProto.UINT16: (0, 65535),
}


@dataclass
class QuantLayer:
    """One quantized Conv/Gemm/MatMul: where its integers live and how they dequantize."""

    node: onnx.NodeProto
    attrs: dict[str, Any]
    weight_init: str  # the initializer holding the weight (integers, or floats with a Q/DQ pair)
    float_stored: bool  # AddQDQPairToWeight: the initializer holds floats, quantized at load
    scale: np.ndarray  # broadcastable to the weight
    zero_point: np.ndarray  # broadcastable to the weight
    qmin: int
    qmax: int
    input_scale: np.ndarray | None  # the activation's scale (for a new int32 bias)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def channel_axis(self) -> int:
        """Axis of the layer's output holding its output channels."""
        return 1 if self.node.op_type == "Conv" else -1


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _broadcast(values: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """A per-tensor or per-channel (along ``axis``) parameter, shaped to broadcast against ``shape``."""
    values = np.asarray(values)
    if values.size <= 1:
        return values.reshape((1,) * len(shape))
    view = [1] * len(shape)
    view[axis % len(shape)] = values.size
    return values.reshape(view)


def _eligible(node: onnx.NodeProto, attrs: dict[str, Any], weight_rank: int) -> bool:
    """Layers the refining passes can compute in numpy exactly as onnxruntime does."""
    if node.op_type == "Conv":
        return weight_rank in (3, 4) and attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET", b"VALID", "VALID")
    if node.op_type == "Gemm":
        plain = attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA", 0)
        return plain and weight_rank == 2
    return weight_rank == 2  # MatMul with a 2-D constant right operand


def quantized_layers(model: onnx.ModelProto, op_types: tuple[str, ...] = LAYER_TYPES) -> list[QuantLayer]:
    """The model's quantized weighted layers, in graph order."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    layers: list[QuantLayer] = []
    for node in graph.node:
        if node.op_type not in op_types or len(node.input) < 2:
            continue
        dq = producer.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 2:
            continue
        source, float_stored = dq.input[0], False
        quant = producer.get(source)
        if quant is not None and quant.op_type == "QuantizeLinear":  # a Q/DQ pair on a float weight
            source, float_stored = quant.input[0], True
        if source not in inits or dq.input[1] not in inits:
            continue
        weight = inits[source]
        attrs = _attrs(node)
        if not _eligible(node, attrs, len(weight.dims)):
            continue
        zp_name = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
        if zp_name is not None and zp_name not in inits:
            continue
        zp_type = inits[zp_name].data_type if zp_name else onnx.TensorProto.UINT8
        int_type = zp_type if float_stored else weight.data_type
        if int_type not in _INT_RANGES:
            continue
        axis = _attrs(dq).get("axis", 1)
        shape = tuple(weight.dims)
        scale = _broadcast(numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32), shape, axis)
        zero = numpy_helper.to_array(inits[zp_name]).astype(np.int64) if zp_name else np.zeros(1, np.int64)
        act = producer.get(node.input[0])
        input_scale = None
        if act is not None and act.op_type == "DequantizeLinear" and act.input[1] in inits:
            input_scale = numpy_helper.to_array(inits[act.input[1]]).astype(np.float32)
        qmin, qmax = _INT_RANGES[int_type]
        layers.append(
            QuantLayer(node, attrs, source, float_stored, scale, _broadcast(zero, shape, axis), qmin, qmax, input_scale)
        )
    return layers


def integer_weight(model: onnx.ModelProto, layer: QuantLayer) -> np.ndarray:
    """The layer's weight as integers (before subtracting the zero point)."""
    values = numpy_helper.to_array(_init(model, layer.weight_init))
    if layer.float_stored:
        values = np.clip(np.round(values / layer.scale) + layer.zero_point, layer.qmin, layer.qmax)
    return values.astype(np.int64)


def set_integer_weight(model: onnx.ModelProto, layer: QuantLayer, values: np.ndarray) -> None:
    """Writes new integers (clipped to the type's range) into the weight's initializer."""
    init = _init(model, layer.weight_init)
    values = np.clip(np.asarray(values), layer.qmin, layer.qmax)
    if layer.float_stored:  # floats that quantize back to exactly these integers
        array = ((values - layer.zero_point) * layer.scale).astype(numpy_helper.to_array(init).dtype)
    else:
        array = values.astype(numpy_helper.to_array(init).dtype)
    init.CopyFrom(numpy_helper.from_array(array, init.name))


def layer_bias(model: onnx.ModelProto, layer: QuantLayer, channels: int) -> np.ndarray:
    """The bias the layer adds, as floats (zeros when it has none)."""
    if len(layer.node.input) < 3 or not layer.node.input[2]:
        return np.zeros(channels, np.float32)
    inits = {init.name: init for init in model.graph.initializer}
    name = layer.node.input[2]
    if name in inits:
        return numpy_helper.to_array(inits[name]).astype(np.float32).reshape(-1)
    dq = _producer(model, name)
    values = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float64)
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
    zero = numpy_helper.to_array(inits[dq.input[2]]).astype(np.float64) if len(dq.input) > 2 and dq.input[2] else 0.0
    return ((values - zero) * scale).astype(np.float32).reshape(-1)


def can_set_bias(model: onnx.ModelProto, layer: QuantLayer) -> bool:
    """Conv and Gemm take a bias; a missing one is added only when its int32 scale is known."""
    if layer.node.op_type not in ("Conv", "Gemm"):
        return False
    if len(layer.node.input) >= 3 and layer.node.input[2]:
        inits = {init.name for init in model.graph.initializer}
        name = layer.node.input[2]
        dq = _producer(model, name) if name not in inits else None
        return name in inits or (dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits)
    return layer.input_scale is not None and layer.input_scale.size == 1


def set_bias(model: onnx.ModelProto, layer: QuantLayer, values: np.ndarray) -> None:
    """Writes a new float bias: into the int32 initializer (rounded at its scale), the float
    initializer, or a new int32 bias with scale input scale x weight scale."""
    values = np.asarray(values, np.float64).reshape(-1)
    inits = {init.name: init for init in model.graph.initializer}
    name = layer.node.input[2] if len(layer.node.input) >= 3 else ""
    if name and name in inits:
        dtype = numpy_helper.to_array(inits[name]).dtype
        inits[name].CopyFrom(numpy_helper.from_array(values.astype(dtype), name))
        return
    if name:
        dq = _producer(model, name)
        scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
        zero = numpy_helper.to_array(inits[dq.input[2]]).astype(np.float64) if len(dq.input) > 2 and dq.input[2] else 0
        target = inits[dq.input[0]]
        ints = np.clip(np.round(values / scale + zero), -(2**31), 2**31 - 1)
        target.CopyFrom(numpy_helper.from_array(ints.astype(numpy_helper.to_array(target).dtype), target.name))
        return
    assert layer.input_scale is not None
    scale = (float(layer.input_scale.reshape(-1)[0]) * layer.scale.reshape(-1)).astype(np.float32)
    scale = np.broadcast_to(scale, values.shape).copy() if scale.size > 1 else scale.reshape(())
    base = f"{layer.name}_bias_correction"
    ints = np.clip(np.round(values / scale.astype(np.float64)), -(2**31), 2**31 - 1).astype(np.int32)
    model.graph.initializer.extend(
        [numpy_helper.from_array(ints, f"{base}_quantized"), numpy_helper.from_array(scale, f"{base}_scale")]
    )
    dq_attrs = {"axis": 0} if scale.ndim else {}
    dq = helper.make_node(
        "DequantizeLinear", [f"{base}_quantized", f"{base}_scale"], [base], name=f"{base}_DequantizeLinear", **dq_attrs
    )
    while len(layer.node.input) < 3:
        layer.node.input.append("")
    layer.node.input[2] = base
    position = next(i for i, node in enumerate(model.graph.node) if node.name == layer.name)
    model.graph.node.insert(position, dq)


def _init(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(init for init in model.graph.initializer if init.name == name)


def _producer(model: onnx.ModelProto, tensor: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node if tensor in node.output)
