"""Plain tensor names for onnxruntime's static quantizer, when the model's own names break it.

Names made of fused op names (``a/conv1d_25;a/conv1d_25``) can make onnxruntime's QDQ quantizer
wire a node to the wrong tensor, giving a model onnxruntime refuses. So a static model that
onnx's strict shape inference refuses is made again from a copy with plain names (ranges and
overrides renamed with it), and the names are put back where that keeps every name unique.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from quantune.model import external_data_files, without_weights

PREFIX = "quantune_t"


def inference_error(path: Path) -> str | None:
    """Why onnx's strict shape inference refuses the model at ``path``, or ``None`` (also with external data)."""
    if external_data_files(path):
        return None
    model = without_weights(onnx.load(str(path)))
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as exc:
        return " ".join(str(exc).split())[:300]
    return None


def plain_names(model: onnx.ModelProto) -> dict[str, str] | None:
    """Renames the inner tensors of ``model`` in place: old -> new, or ``None`` for a model with subgraphs."""
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in model.graph.node for a in n.attribute
    ):
        return None
    graph = model.graph
    kept = {value.name for value in [*graph.input, *graph.output]}
    names: dict[str, str] = {}

    def new(name: str) -> str:
        if not name or name in kept:
            return name
        return names.setdefault(name, f"{PREFIX}{len(names)}")

    for tensor in graph.initializer:
        tensor.name = new(tensor.name)
    for info in graph.value_info:
        info.name = new(info.name)
    for node in graph.node:
        node.input[:] = [new(name) for name in node.input]
        node.output[:] = [new(name) for name in node.output]
    return names


def restore_names(model: onnx.ModelProto, names: dict[str, str]) -> bool:
    """The original names back in ``model`` (quantized from a :func:`plain_names` copy); the
    quantizer's own tensors keep their plain-based names. False, and nothing changed, when a
    restored name would be another tensor's too."""
    back = {new: old for old, new in names.items()}
    graph = model.graph
    found = (
        [t.name for t in graph.initializer] + [o for n in graph.node for o in n.output] + [v.name for v in graph.input]
    )
    current = {name for name in found if name}
    renamed = {back.get(name, name) for name in current}
    if len(renamed) != len(current):
        return False
    for tensor in graph.initializer:
        tensor.name = back.get(tensor.name, tensor.name)
    for info in graph.value_info:
        info.name = back.get(info.name, info.name)
    for node in graph.node:
        node.input[:] = [back.get(name, name) for name in node.input]
        node.output[:] = [back.get(name, name) for name in node.output]
    return True


def renamed_ranges(source: Path, target: Path, names: dict[str, str]) -> None:
    """The calibration ranges at ``source`` (onnxruntime's JSON cache) with their tensors renamed, at ``target``."""
    payload = json.loads(source.read_text())
    payload["data"] = {names.get(name, name): value for name, value in payload["data"].items()}
    target.write_text(json.dumps(payload))
