"""The model's output head: the ops between the last compute op and the outputs.

A detector's decode head is where int8 breaks such models (one scale for coordinates and
scores), yet its ops carry little compute, so they are ranked by their measured effect on the
outputs instead. The head is found from the graph alone: walk back from every output through
non-compute ops, continuing through a compute op fed by a ``Softmax``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from quantune.graph.capability import Group, NodeInfo

# Ops that do the learned compute: the walk from the outputs stops at them.
COMPUTE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "GRU", "RNN"})
# Where the walk from the inputs stops: compute, and ops whose outputs are a shape's integers.
_ENDS = COMPUTE | {"Shape", "Size"}
# Ops between a Softmax and a decode conv that only move data.
_MOVES = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Split"})


def _fed_by_softmax(node: NodeInfo, producer: dict[str, NodeInfo]) -> bool:
    """Whether an activation input of ``node`` comes from a ``Softmax`` (through data moves only)."""
    pending = [producer[t] for t in node.inputs if t in producer]
    seen: set[str] = set()
    while pending:
        parent = pending.pop()
        if parent.name in seen:
            continue
        seen.add(parent.name)
        if parent.op_type == "Softmax":
            return True
        if parent.op_type in _MOVES:
            pending.extend(producer[t] for t in parent.inputs if t in producer)
    return False


def head_nodes(nodes: Sequence[NodeInfo], outputs: Iterable[str] | None = None) -> list[str]:
    """Names of the head's nodes, in graph order (``outputs`` defaults to tensors no node reads)."""
    producer = {tensor: node for node in nodes for tensor in node.outputs}
    if outputs is None:
        read = {t for node in nodes for t in node.inputs}
        outputs = [t for node in nodes for t in node.outputs if t not in read]
    head: set[str] = set()
    pending = [producer[t] for t in outputs if t in producer]
    while pending:
        node = pending.pop()
        if node.name in head:
            continue
        if node.op_type in COMPUTE and not _fed_by_softmax(node, producer):
            continue  # the backbone's last compute op: the head starts after it
        head.add(node.name)
        pending.extend(producer[t] for t in node.inputs if t in producer)
    return [node.name for node in nodes if node.name in head]


def head_groups(groups: Sequence[Group], head: Iterable[str]) -> list[Group]:
    """The groups with a node in the head (the units marked ``head`` in rankings and reports;
    the lead-in's, :func:`lead_in_nodes`, alike)."""
    names = set(head)
    return [group for group in groups if names & set(group.nodes)]


def lead_in_nodes(nodes: Sequence[NodeInfo], inputs: Iterable[str] | None = None) -> list[str]:
    """Names of the lead-in's nodes, in graph order: the ops from the graph's inputs to the first
    compute ops.

    The mirror of the head: shape-only ops (an audio framing) that quantize an input spanning
    orders of magnitude with one scale, so they are fallback units here too. ``inputs``: the
    graph's float inputs (default: tensors no node makes).
    """
    if inputs is None:
        made = {t for node in nodes for t in node.outputs}
        inputs = [t for node in nodes for t in node.inputs if t not in made]
    reached = set(inputs)
    found: list[str] = []
    for node in nodes:  # graph order is topological: one pass
        if node.op_type in _ENDS or not node.inputs or not set(node.inputs) <= reached:
            continue  # a compute op ends the walk (a Shape's ints too); a node fed by one is past the lead-in
        found.append(node.name)
        reached.update(node.outputs)
    return found
