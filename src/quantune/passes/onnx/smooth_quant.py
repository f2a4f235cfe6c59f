"""SmoothQuant: move activation outliers into the weights, per input channel, before int8.

For ``Y = X @ W`` and any positive ``s`` per input channel, ``Y = (X / s) @ (s * W)``; with
``s_k = max|X_k|^alpha / max|W_k|^(1 - alpha)`` the activation's outliers shrink and the
weights absorb them (Xiao et al., 2022). ``X / s`` is folded into a preceding
LayerNormalization when it feeds only smoothable layers, else a ``Mul`` is inserted. Written
with numpy and onnx (onnxruntime's own SmoothQuant needs neural-compressor).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from pydantic import Field

from quantune.errors import TrialError
from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.registry import register_pass
from quantune.space import Categorical


class SmoothQuantConfig(PassConfig):
    alpha: float = Field(default=0.5, ge=0.0, le=1.0)
    op_types: list[str] = ["MatMul", "Gemm"]
    calibration_samples: int | None = Field(default=128, gt=0)
    fold: bool = True  # fold into a preceding LayerNormalization where possible


def _weight_rows(node: onnx.NodeProto, inits: dict[str, np.ndarray]) -> int | None:
    """Axis of the constant weight that meets the activation's last axis, or None if not smoothable."""
    if len(node.input) < 2 or node.input[1] not in inits or inits[node.input[1]].ndim != 2:
        return None
    if node.op_type == "MatMul":
        return 0
    if node.op_type == "Gemm":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transA", 0):
            return None
        return 1 if attrs.get("transB", 0) else 0
    return None


def activation_maxima(model_path: Path, tensors: list[str], context: PassContext, limit: int | None) -> dict:
    """Per last-axis channel max |x| of ``tensors`` over the calibration data."""
    model = onnx.load(str(model_path))
    present = {out.name for out in model.graph.output}
    for name in tensors:
        if name not in present:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    maxima: dict[str, np.ndarray] = {}
    assert context.calibration is not None
    for batch in context.calibration.batches(context.input_names, context.batch_size, limit):
        for name, value in zip(tensors, session.run(tensors, batch), strict=True):
            flat = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            maxima[name] = flat if name not in maxima else np.maximum(maxima[name], flat)
    return maxima


def smooth(model: onnx.ModelProto, maxima: dict[str, np.ndarray], config: SmoothQuantConfig) -> int:
    """Smooths ``model`` in place; returns the number of activation tensors smoothed."""
    graph = model.graph
    inits = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    uses: dict[str, int] = {}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    producer = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
            consumers.setdefault(name, []).append(node)
    smoothed = 0
    new_nodes: list[tuple[int, onnx.NodeProto]] = []
    for tensor, act_max in maxima.items():
        layers = [
            n
            for n in consumers.get(tensor, [])
            if n.op_type in config.op_types
            and n.input[0] == tensor
            and _weight_rows(n, inits) is not None
            and uses.get(n.input[1], 0) == 1
        ]
        if not layers:
            continue
        w_max = np.zeros_like(act_max, dtype=np.float64)
        for node in layers:
            weight = np.moveaxis(inits[node.input[1]], _weight_rows(node, inits) or 0, 0)
            if weight.shape[0] != act_max.shape[0]:
                w_max = None  # type: ignore[assignment]
                break
            w_max = np.maximum(w_max, np.abs(weight).max(axis=1))
        if w_max is None:
            continue
        live = (act_max > 0) & (w_max > 0)
        scale = np.ones_like(act_max, dtype=np.float64)
        scale[live] = act_max[live] ** config.alpha / w_max[live] ** (1.0 - config.alpha)
        scale = np.clip(scale, 1e-5, 1e5)
        for node in layers:
            axis = _weight_rows(node, inits) or 0
            weight = np.moveaxis(inits[node.input[1]], axis, 0)
            inits[node.input[1]] = np.moveaxis(weight * scale[:, None], 0, axis).astype(inits[node.input[1]].dtype)
        source = producer.get(tensor)
        only_layers = len(consumers.get(tensor, [])) == len(layers)
        if (
            config.fold
            and source is not None
            and source.op_type == "LayerNormalization"
            and only_layers
            and len(source.input) >= 3
            and all(uses.get(name, 0) == 1 and name in inits for name in source.input[1:3])
        ):
            for name in source.input[1:3]:
                inits[name] = (inits[name] / scale).astype(inits[name].dtype)
        else:
            inv = f"{tensor}_smooth_inv_scale"
            out = f"{tensor}_smoothed"
            inits[inv] = (1.0 / scale).astype(np.float32)
            mul = helper.make_node("Mul", [tensor, inv], [out], name=f"{tensor}_SmoothMul")
            for node in layers:
                node.input[0] = out
            position = next(i for i, n in enumerate(graph.node) if any(inp == out for inp in n.input))
            new_nodes.append((position, mul))
        smoothed += 1
    for position, node in sorted(new_nodes, key=lambda pn: -pn[0]):
        graph.node.insert(position, node)
    kept = {init.name for init in graph.initializer}
    for init in graph.initializer:
        init.CopyFrom(numpy_helper.from_array(inits[init.name], init.name))
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in inits.items() if name not in kept)
    return smoothed


@register_pass
class SmoothQuant(Pass):
    """Migrates activation outliers into MatMul/Gemm weights per input channel (function-preserving)."""

    name = "smooth_quant"
    role = "prepare"
    Config = SmoothQuantConfig
    needs_calibration = True
    search_space = {"alpha": Categorical((0.3, 0.5, 0.7))}

    def run(self, config: SmoothQuantConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        if context.calibration is None:
            raise TrialError("smooth_quant needs calibration data: set data.calibration in the config")
        model = onnx.load(str(model_in))
        inits = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
        tensors = sorted(
            {
                node.input[0]
                for node in model.graph.node
                if node.op_type in config.op_types
                and _weight_rows(node, inits) is not None
                and node.input[0] not in inits
            }
        )
        maxima = activation_maxima(model_in, tensors, context, config.calibration_samples) if tensors else {}
        smooth(model, maxima, config)
        onnx.save(model, str(model_out))
