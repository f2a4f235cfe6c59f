"""What onnxruntime's static quantizer can quantize in a model, and how nodes fall back together.

Capability comes from onnxruntime's own registries, never a hand-kept list. Nodes fall back in
groups because onnxruntime fuses a Conv/MatMul with the ops after it: excluding the Conv alone
would leave Q/DQ pairs that cost time and fix nothing. Blocks (repeated layers found from node
names) serve block-wise fallback. fp16 is not offered: the CPU provider lacks fp16 kernels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import onnx
from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

Precision = Literal["int8", "int16", "fp32"]
Mode = Literal["static", "dynamic"]

# Ops that onnxruntime fuses into, or quantizes only together with, the op that feeds them.
FOLLOWER_TYPES = frozenset(
    {
        "Relu",
        "Clip",
        "LeakyRelu",
        "Sigmoid",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "Flatten",
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Resize",
        "Pad",
        "Slice",
        "Split",
    }
)
# Ops that only move or reshape data: they add no arithmetic error, so falling them back fixes nothing
# (a Gather of a constant table is not among them: its table is quantized).
SHAPE_TYPES = frozenset(
    {
        "Gather",
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Slice",
        "Split",
        "Concat",
        "Expand",
        "Tile",
        "Pad",
        "Resize",
        "MaxPool",
        "GatherElements",
        "GatherND",
        "DepthToSpace",
        "SpaceToDepth",
    }
)
_BLOCK = re.compile(r"(?:^|[/._])((?:layers?|blocks?|h|encoder_layer|decoder_layer)[._/]?(\d+))(?=[/._]|$)")


def quantizable_op_types(mode: Mode = "static") -> frozenset[str]:
    """Op types ``quantize_static`` (either format) or ``quantize_dynamic`` quantizes by default."""
    if mode == "dynamic":
        return frozenset(IntegerOpsRegistry)
    return frozenset(QLinearOpsRegistry) | frozenset(QDQRegistry)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    op_type: str
    inputs: tuple[str, ...]  # activation inputs only (no initializers, no empty names)
    outputs: tuple[str, ...]
    weights: tuple[str, ...]  # initializer inputs
    first_constant: bool = False  # input 0 is a constant (a Gather's table)
    second_constant: bool = False  # input 1 is a constant (a MatMul's weights)


@dataclass(frozen=True)
class Group:
    """Nodes that fall back together; ``name`` is its first (anchor) node's name."""

    name: str
    op_type: str
    nodes: tuple[str, ...]
    activations: tuple[str, ...]  # activation tensors the group reads or writes
    shape_only: bool = field(default=False, compare=False)  # only data movement: no fallback candidate

    def __len__(self) -> int:
        return len(self.nodes)


@dataclass
class ModelCapability:
    """The quantizable nodes of one model, their groups, and its repeated blocks."""

    nodes: list[NodeInfo]
    quantizable: frozenset[str]  # node names
    groups: list[Group] = field(default_factory=list)
    float_inputs: tuple[str, ...] = ()  # the graph's float inputs, where a lead-in starts (graph/head.py)

    @classmethod
    def from_model(
        cls,
        model: str | Path | onnx.ModelProto,
        op_types: Iterable[str] | None = None,
        mode: Mode = "static",
    ) -> ModelCapability:
        """``op_types`` restricts what may be quantized (a user's ``op_types_to_quantize``).

        ``mode="dynamic"`` reads what ``quantize_dynamic`` touches, each node a group of its own
        (activations are quantized inside each op, so nothing fuses across ops).
        """
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
        graph = proto.graph
        constants = {init.name for init in graph.initializer}
        constants |= {node.output[0] for node in graph.node if node.op_type == "Constant" and node.output}
        every = quantizable_op_types(mode)
        allowed = every if op_types is None else every & set(op_types)
        nodes: list[NodeInfo] = []
        unnamed: set[str] = set()
        for index, node in enumerate(graph.node):
            name = node.name or f"{node.op_type}_{index}"
            if not node.name:
                unnamed.add(name)
            inputs = tuple(t for t in node.input if t and t not in constants)
            weights = tuple(t for t in node.input if t and t in constants)
            first = len(node.input) > 0 and node.input[0] in constants
            second = len(node.input) > 1 and node.input[1] in constants
            nodes.append(NodeInfo(name, node.op_type, inputs, tuple(node.output), weights, first, second))
        # An unnamed node cannot be in nodes_to_exclude: grouped, but no fallback candidate.
        quantizable = frozenset(
            n.name for n in nodes if n.op_type in allowed and n.op_type != "Constant" and n.name not in unnamed
        )
        if mode == "dynamic":
            by_name = {n.name: n for n in nodes}
            quantizable = frozenset(name for name in quantizable if _dynamic_quantizes(by_name[name]))
        floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
        inputs = tuple(
            i.name for i in graph.input if i.name not in constants and i.type.tensor_type.elem_type in floats
        )
        capability = cls(nodes, quantizable, float_inputs=inputs)
        if mode == "dynamic":
            capability.groups = [
                Group(n.name, n.op_type, (n.name,), n.inputs + n.outputs) for n in nodes if n.name in quantizable
            ]
        else:
            capability.groups = _group(nodes, quantizable)
        for group in capability.groups:
            object.__setattr__(group, "shape_only", _shape_only(group, capability.by_name))
        return capability

    def candidates(self) -> list[Group]:
        """Groups worth a fallback: every group but the shape-only ones (Reshape, Transpose, ...)."""
        return [group for group in self.groups if not group.shape_only]

    @cached_property
    def by_name(self) -> dict[str, NodeInfo]:
        return {node.name: node for node in self.nodes}

    @cached_property
    def group_by_name(self) -> dict[str, Group]:
        return {group.name: group for group in self.groups}

    def op_types(self) -> list[str]:
        """Op types of the groups' anchors, in first-seen order (the op-type-wise tuning items)."""
        seen: dict[str, None] = {}
        for group in self.groups:
            seen.setdefault(group.op_type, None)
        return list(seen)

    def blocks(self) -> dict[str, list[str]]:
        """Repeated blocks (``layer.0``, ``layer.1``, ...) -> their group names; empty when fewer than two."""
        found: dict[str, list[str]] = {}
        for group in self.groups:
            match = _BLOCK.search(group.name)
            if match:
                found.setdefault(match.group(1), []).append(group.name)
        return found if len(found) >= 2 else {}

    def assignment(
        self, precisions: Mapping[str, Precision], *, base_excluded: Sequence[str] = ()
    ) -> tuple[list[str], dict[str, str]]:
        """Pass parameters for a group -> precision map: (nodes_to_exclude, tensor_overrides); groups
        not in ``precisions`` stay int8, ``base_excluded`` stay fp32 whatever the search does."""
        excluded: dict[str, None] = dict.fromkeys(base_excluded)
        overrides: dict[str, str] = {}
        for name, precision in precisions.items():
            group = self.group_by_name[name]
            if precision == "fp32":
                excluded.update(dict.fromkeys(group.nodes))
            elif precision == "int16":
                overrides.update(dict.fromkeys(group.activations, "int16"))
        return sorted(excluded), dict(sorted(overrides.items()))


def _dynamic_quantizes(node: NodeInfo) -> bool:
    """Whether ``quantize_dynamic`` quantizes this node (MatMul: constant B; Gather: constant table)."""
    if node.op_type in ("MatMul", "Gather"):
        return node.first_constant if node.op_type == "Gather" else node.second_constant
    return True


def _shape_only(group: Group, by_name: Mapping[str, NodeInfo]) -> bool:
    """Every node only moves data (a Gather of a constant table, an embedding, does not)."""
    for name in group.nodes:
        node = by_name[name]
        if node.op_type not in SHAPE_TYPES:
            return False
        if node.op_type == "Gather" and node.first_constant:
            return False
    return True


def _group(nodes: list[NodeInfo], quantizable: frozenset[str]) -> list[Group]:
    producer = {tensor: node for node in nodes for tensor in node.outputs}
    owner: dict[str, str] = {}  # node -> group name
    members: dict[str, list[str]] = {}
    order: list[str] = []
    for node in nodes:
        if node.name not in quantizable:
            continue
        parents = [producer[t] for t in node.inputs if t in producer]
        parent = parents[0] if len(parents) == 1 else None
        joins = (
            parent is not None
            and parent.name in owner
            and (
                node.op_type in FOLLOWER_TYPES
                or (node.op_type in {"Add", "Mul"} and len(node.inputs) == 1)  # bias / scale by a constant
            )
        )
        if joins:
            assert parent is not None
            group = owner[parent.name]
        else:
            group = node.name
            order.append(group)
            members[group] = []
        owner[node.name] = group
        members[group].append(node.name)
    by_name = {node.name: node for node in nodes}
    groups: list[Group] = []
    for name in order:
        tensors: dict[str, None] = {}
        for member in members[name]:
            tensors.update(dict.fromkeys(by_name[member].inputs))
            tensors.update(dict.fromkeys(by_name[member].outputs))
        groups.append(Group(name, by_name[name].op_type, tuple(members[name]), tuple(tensors)))
    return groups
