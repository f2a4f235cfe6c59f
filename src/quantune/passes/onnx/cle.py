"""Cross-layer equalization: rescale channel pairs of consecutive layers so their ranges match.

For ``A -> f -> B`` with ``f`` positively homogeneous per channel (ReLU, LeakyReLU, pools),
dividing A's output channel c by ``s_c`` and multiplying B's input channel c by it leaves the
function unchanged; ``s_c = sqrt(r_A[c] / r_B[c])`` balances both weight ranges, so one int8
scale holds all channels (Nagel et al., 2019). Node names are kept, so a later fallback still
names the same nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.registry import register_pass
from quantune.space import Categorical

_HOMOGENEOUS = {"Relu", "LeakyRelu", "MaxPool", "AveragePool", "Identity"}
_LAYERS = {"Conv", "Gemm", "MatMul"}


class CrossLayerEqualizationConfig(PassConfig):
    iterations: int = 4  # sweeps over all pairs; chains of three or more layers converge over sweeps
    min_scale: float = 1e-3  # scales are clipped to [min_scale, 1/min_scale] to avoid overflow


@dataclass
class _Layer:
    node: onnx.NodeProto
    weight: str
    bias: str | None
    out_axis: int  # axis of the weight holding output channels
    in_axis: int  # axis of the weight holding input channels


def _layer(node: onnx.NodeProto, inits: dict[str, np.ndarray]) -> _Layer | None:
    if node.op_type not in _LAYERS or len(node.input) < 2 or node.input[1] not in inits:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    weight = inits[node.input[1]]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] in inits else None
    if node.op_type == "Conv":
        if attrs.get("group", 1) != 1:
            return None
        return _Layer(node, node.input[1], bias, 0, 1)
    if node.op_type == "Gemm":
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or weight.ndim != 2:
            return None
        trans_b = attrs.get("transB", 0)
        return _Layer(node, node.input[1], bias, 0 if trans_b else 1, 1 if trans_b else 0)
    if weight.ndim != 2:  # MatMul with a 2-D constant right operand
        return None
    return _Layer(node, node.input[1], None, 1, 0)


def equalize(model: onnx.ModelProto, iterations: int = 4, min_scale: float = 1e-3) -> int:
    """Equalizes ``model`` in place; returns the number of layer pairs equalized."""
    graph = model.graph
    inits = {init.name: numpy_helper.to_array(init).astype(np.float64) for init in graph.initializer}
    uses: dict[str, int] = {}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
            consumers.setdefault(name, []).append(node)
    outputs = {out.name for out in graph.output}
    pairs: list[tuple[_Layer, _Layer]] = []
    for node in graph.node:
        first = _layer(node, inits)
        if first is None or uses.get(first.weight, 0) != 1 or (first.bias and uses.get(first.bias, 0) != 1):
            continue
        tensor = node.output[0]
        while True:
            nexts = consumers.get(tensor, [])
            if len(nexts) != 1 or tensor in outputs:
                break
            following = nexts[0]
            if following.op_type in _HOMOGENEOUS:
                tensor = following.output[0]
                continue
            second = _layer(following, inits)
            if second is not None and following.input[0] == tensor and uses.get(second.weight, 0) == 1:
                pairs.append((first, second))
            break
    for _ in range(iterations):
        for first, second in pairs:
            w1 = np.moveaxis(inits[first.weight], first.out_axis, 0)
            w2 = np.moveaxis(inits[second.weight], second.in_axis, 0)
            if w1.shape[0] != w2.shape[0]:
                continue
            r1 = np.abs(w1).reshape(w1.shape[0], -1).max(axis=1)
            r2 = np.abs(w2).reshape(w2.shape[0], -1).max(axis=1)
            scale = np.ones_like(r1)
            live = (r1 > 0) & (r2 > 0)
            scale[live] = np.sqrt(r1[live] / r2[live])
            scale = np.clip(scale, min_scale, 1.0 / min_scale)
            shape1 = (-1,) + (1,) * (w1.ndim - 1)
            shape2 = (-1,) + (1,) * (w2.ndim - 1)
            inits[first.weight] = np.moveaxis(w1 / scale.reshape(shape1), 0, first.out_axis)
            inits[second.weight] = np.moveaxis(w2 * scale.reshape(shape2), 0, second.in_axis)
            if first.bias:
                inits[first.bias] = inits[first.bias] / scale
    changed = {name for pair in pairs for layer in pair for name in (layer.weight, layer.bias) if name}
    for init in graph.initializer:
        if init.name in changed:
            dtype = numpy_helper.to_array(init).dtype
            init.CopyFrom(numpy_helper.from_array(inits[init.name].astype(dtype), init.name))
    return len(pairs)


@register_pass
class CrossLayerEqualization(Pass):
    """Balances the channel ranges of consecutive layers (function-preserving), so int8 fits them all."""

    name = "cle"
    role = "prepare"
    Config = CrossLayerEqualizationConfig
    search_space = {"iterations": Categorical((1, 4))}

    def run(self, config: CrossLayerEqualizationConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        model = onnx.load(str(model_in))
        equalize(model, config.iterations, config.min_scale)
        onnx.save(model, str(model_out))
