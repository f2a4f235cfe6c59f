"""Embedding tables as int8 symmetric per-tensor: Neural Compressor's Gather, which onnxruntime cannot make.

onnxruntime quantizes a Gather's table as an activation (uint8, asymmetric); as a weight (int8,
symmetric, 7-bit with ``reduce_range``) it loses less accuracy, and one ``DequantizeLinear``
after the Gather dequantizes only the gathered rows. A table is rewritten only when every use is
the data input of a Gather being quantized, in the main graph, and it is no graph input; the
Gather keeps its name, so fallback still names it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantune.model import graphs

QMAX = 127
QMAX_REDUCED = 64  # onnxruntime's (and Neural Compressor's) symmetric int8 range with reduce_range


def quantize_gathers(model: onnx.ModelProto, nodes_to_exclude: Iterable[str] = (), reduce_range: bool = False) -> int:
    """Rewrites ``model``'s embedding Gathers in place (see the module docstring); returns how many."""
    graph = model.graph
    excluded = set(nodes_to_exclude)
    tables = {init.name: init for init in graph.initializer if init.data_type == TensorProto.FLOAT}
    shared = {value.name for value in graph.input} | {value.name for value in graph.output}
    shared |= _subgraph_names(graph)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in tables:
                readers.setdefault(name, []).append((node, index))

    def quantizable(node: onnx.NodeProto, index: int) -> bool:
        return node.op_type == "Gather" and node.domain in ("", "ai.onnx") and index == 0 and node.name not in excluded

    rewritten = 0
    taken = {init.name for init in graph.initializer} | {out for node in graph.node for out in node.output}
    new_nodes: dict[int, onnx.NodeProto] = {}  # id(gather) -> its DequantizeLinear
    for name, uses in readers.items():
        if name in shared or not all(quantizable(node, index) for node, index in uses):
            continue
        table = tables[name]
        quantized, scale = _quantize(numpy_helper.to_array(table), QMAX_REDUCED if reduce_range else QMAX)
        q_name, s_name, z_name = (
            _fresh(f"{name}{suffix}", taken) for suffix in ("_quantized", "_scale", "_zero_point")
        )
        graph.initializer.remove(table)
        graph.initializer.extend(
            [
                numpy_helper.from_array(quantized, q_name),
                numpy_helper.from_array(np.array(scale, dtype=np.float32), s_name),
                numpy_helper.from_array(np.array(0, dtype=np.int8), z_name),
            ]
        )
        for node, _ in uses:
            gathered = node.output[0]
            raw = _fresh(f"{gathered}_quantized", taken)
            node.input[0] = q_name
            node.output[0] = raw
            new_nodes[id(node)] = helper.make_node(
                "DequantizeLinear",
                [raw, s_name, z_name],
                [gathered],
                name=_fresh(f"{node.name or gathered}_DequantizeLinear", taken),
            )
            rewritten += 1
    if new_nodes:
        ordered = []
        for node in graph.node:
            ordered.append(node)
            if id(node) in new_nodes:
                ordered.append(new_nodes[id(node)])
        del graph.node[:]
        graph.node.extend(ordered)
    return rewritten


def _quantize(table: np.ndarray, qmax: int) -> tuple[np.ndarray, np.float32]:
    """int8 table and its scale (max|w| / qmax, float32 arithmetic as onnxruntime's and NC's quantizers)."""
    peak = np.float32(np.abs(table).max()) if table.size else np.float32(0)
    scale = peak / np.float32(qmax) if peak > 0 else np.float32(1)
    quantized = np.clip(np.round(table.astype(np.float32) / scale), -qmax, qmax).astype(np.int8)
    return quantized, np.float32(scale)


def _fresh(name: str, taken: set[str]) -> str:
    candidate, counter = name, 1
    while candidate in taken:
        candidate, counter = f"{name}_{counter}", counter + 1
    taken.add(candidate)
    return candidate


def _subgraph_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a subgraph (If/Loop/Scan body) of ``graph`` reads: such a table stays float."""
    names: set[str] = set()
    inner = graphs(graph)
    next(inner)  # ``graph`` itself
    for sub in inner:
        for node in sub.node:
            names.update(node.input)
        names.update(value.name for value in sub.output)
    return names
