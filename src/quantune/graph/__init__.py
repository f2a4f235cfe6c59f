"""What a model's graph is made of, read from the model alone: what onnxruntime can quantize in
it, how its nodes fall back together, its output head and its input lead-in.

Below both the passes (which quantize by it) and the evaluation (whose sensitivity measurement
reads it), so neither imports the other for it.
"""

from __future__ import annotations

from quantune.graph.capability import Group, ModelCapability, NodeInfo, Precision, quantizable_op_types
from quantune.graph.head import head_groups, head_nodes, lead_in_nodes

__all__ = [
    "Group",
    "ModelCapability",
    "NodeInfo",
    "Precision",
    "head_groups",
    "head_nodes",
    "lead_in_nodes",
    "quantizable_op_types",
]
