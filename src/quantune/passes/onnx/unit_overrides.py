"""Per-channel weights for a few named layers of a per-tensor static QDQ model.

A layer whose output channels differ in range by orders of magnitude loses its small channels
to one per-tensor scale; per-channel weights for just that layer fix it at no cost to the graph,
so the quantune strategy tries it on the worst units before keeping them in fp32 (a
``TensorQuantOverrides`` entry with an ``axis``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import onnx

# The weight's output-channel axis per op type (Gemm's depends on transB; MatMul's is the last).
_WEIGHTED = ("Conv", "Gemm", "MatMul")


def per_channel_overrides(model_path: Path, nodes: Iterable[str]) -> dict[str, list[dict[str, int]]]:
    """``TensorQuantOverrides`` axis entries for the named Conv/Gemm/MatMul nodes with an initializer weight."""
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
