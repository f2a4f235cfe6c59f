"""Per-channel weights for a few named layers of a per-tensor static QDQ model.

Per-tensor weights are one scale per layer; a layer whose output channels differ in range by
orders of magnitude (a scaled conv, a decode head's box and score channels side by side) loses
its small channels to rounding. Quantizing just that layer's weights per channel fixes it at no
cost to the graph (the same QDQ pattern, a scale vector instead of a scalar), so the quantune
strategy tries it on the worst units before keeping them in fp32 (strategy/accuracy/targeted.py).
onnxruntime takes it as a ``TensorQuantOverrides`` entry with an ``axis`` for the weight.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import onnx

# The weight's output-channel axis per op type (Gemm's depends on transB; MatMul's is the last).
_WEIGHTED = ("Conv", "Gemm", "MatMul")


def per_channel_overrides(model_path: Path, nodes: Iterable[str]) -> dict[str, list[dict[str, int]]]:
    """``TensorQuantOverrides`` entries (weight name -> [{"axis": a}]) for the named Conv/Gemm/MatMul
    nodes whose weight is an initializer; other names are ignored (a unit's non-weighted ops)."""
    wanted = set(nodes)
    if not wanted:
        return {}
    model = onnx.load(str(model_path), load_external_data=False)
    dims = {init.name: len(init.dims) for init in model.graph.initializer}
    out: dict[str, list[dict[str, int]]] = {}
    for node in model.graph.node:
        if node.name not in wanted or node.op_type not in _WEIGHTED or len(node.input) < 2:
            continue
        weight = node.input[1]
        rank = dims.get(weight)
        if rank is None or rank < 2:
            continue
        if node.op_type == "Conv":
            axis = 0
        elif node.op_type == "Gemm":
            trans = next((a.i for a in node.attribute if a.name == "transB"), 0)
            axis = 0 if trans else 1
        else:
            axis = rank - 1
        out[weight] = [{"axis": axis}]
    return out
