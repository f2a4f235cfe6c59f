"""What a sensitivity measurement costs in whole-model runs of one row, and the rows it can afford: a budget set by the
model, not by how many units it has. Compute is counted by the nodes that carry it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import onnx

from quantune.evaluate.sensitivity.capture import Feed, Feeds, feed_rows

# A run of the QDQ model in runs of the float model: its Q/DQ pairs run unfused and each tensor is compared twice.
QUANTIZED = 2.0
HEAVY = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "GRU", "RNN", "Einsum"})


def has_subgraphs(graph: onnx.GraphProto) -> bool:
    """Whether a node holds a subgraph (If, Loop, Scan), which may read outer tensors its inputs do not name."""
    return any(
        attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for attr in n.attribute
    )


def ancestors(graph: onnx.GraphProto, wanted: Iterable[str]) -> list[onnx.NodeProto]:
    """The nodes ``wanted`` tensors depend on, in graph order (every node where a subgraph may hide a read)."""
    if has_subgraphs(graph):
        return list(graph.node)
    needed = set(wanted)
    keep = []
    for node in reversed(graph.node):
        if any(out in needed for out in node.output):
            keep.append(node)
            needed.update(name for name in node.input if name)
    return list(reversed(keep))


class Share:
    """A set of a model's nodes as a share of one run of it, counted by its heavy nodes (else by all)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        heavy = sum(node.op_type in HEAVY for node in model.graph.node)
        self.by_heavy = heavy > 0
        self.total = max(1, heavy if self.by_heavy else len(model.graph.node))

    def __call__(self, nodes: Iterable[onnx.NodeProto]) -> float:
        count = sum(1 for node in nodes if not self.by_heavy or node.op_type in HEAVY)
        return count / self.total


def affordable_rows(per_row: float, budget: float | None, available: int) -> int:
    """Rows of data ``budget`` pays for at ``per_row`` (None: no bound), at least one, at most ``available``."""
    if budget is None or per_row <= 0:
        return available
    return max(1, min(available, math.floor(budget / per_row)))


def first_rows(feeds: Feeds, rows: int, cut: bool = True) -> Feeds:
    """The first ``rows`` rows of the data, the last batch cut along its first axis when ``cut``."""

    def limited() -> Iterator[Feed]:
        left = rows
        for feed in feeds():
            if left <= 0:
                return
            n = feed_rows(feed)
            yield feed if n <= left or not cut else {k: v[:left] for k, v in feed.items()}
            left -= n

    return limited
