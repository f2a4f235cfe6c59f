"""The head's per-node loss, measured at the outputs: one node's quantization alone, in the float model.

Local noise (a Q/DQ pair's own error against its input) says how much a tensor is rounded, not
what the rounding does: a ``Concat`` of box coordinates (0..720) and scores (0..1) rounded with
one scale has a local error of a fraction of a percent -- the coordinates dominate its energy --
and every score is gone. And an output-wide error hides it the same way. So for each node of the
model's head (:func:`quantune.passes.onnx.head.head_nodes`), the float model gets that node's
output Q/DQ pairs alone (the scales and zero points the quantized model uses), and the outputs
are compared with the float model's *per channel*, keeping the worst channel: the scores'
channels show the loss however small they are next to the boxes.

Only the head is measured this way (a few nodes, one float run each over the probe's rows):
its ops sit between the last compute op and the outputs, where nothing downstream can hide or
repair an error, and where a ranking by local noise over time put YOLOv8's decode conv last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from quantune.evaluate.sensitivity.stats import session

_SUFFIX = "__quantune_head"
FULL = ""  # key of :func:`measure_head`'s result that holds the fully quantized model's loss
# A head node whose quantization alone causes this share of the fully quantized model's
# worst-channel output error is a culprit: it ranks ahead of every other unit.
CULPRIT_SHARE = 0.5


def culprits(head: Mapping[str, float]) -> dict[str, float]:
    """The head nodes of :func:`measure_head`'s result that alone cause most of the output loss."""
    full = head.get(FULL, 0.0)
    return {name: loss for name, loss in head.items() if name != FULL and full > 0 and loss >= CULPRIT_SHARE * full}


class _Channels:
    """Per-channel squared error and energy of one output, channels on axis 1 (a detector's
    ``[N, 4 + classes, anchors]``: boxes and scores are channels), summed over batches."""

    def __init__(self) -> None:
        self.err: np.ndarray | None = None
        self.energy: np.ndarray | None = None

    def add(self, value: np.ndarray, reference: np.ndarray) -> None:
        value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
        if value.shape != reference.shape or reference.ndim == 0:
            return
        if reference.ndim == 1:
            value, reference = value[None, :], reference[None, :]
        axes = tuple(i for i in range(reference.ndim) if i != 1)
        err = np.square(value - reference).sum(axis=axes)
        energy = np.square(reference).sum(axis=axes)
        self.err = err if self.err is None else self.err + err
        self.energy = energy if self.energy is None else self.energy + energy

    def worst(self) -> float:
        """The largest per-channel squared error over energy (capped at 1): the most damaged channel."""
        if self.err is None or self.energy is None or not self.energy.size:
            return 0.0
        top = float(np.max(self.energy))
        live = self.energy > 1e-12 * max(top, 1e-30)
        if not live.any():
            return 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = self.err[live] / self.energy[live]
        ratio = np.where(np.isfinite(ratio), ratio, 1.0)
        return float(min(1.0, float(np.max(ratio))))


def _pair(qmodel: onnx.ModelProto, raw: str, seen: str) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    """The quantized model's QuantizeLinear of ``raw`` and the DequantizeLinear that gives ``seen``."""
    quant = next((n for n in qmodel.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == raw), None)
    dequant = next((n for n in qmodel.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == seen), None)
    if quant is None or dequant is None:
        return None
    return quant, dequant


def injected(
    fmodel: onnx.ModelProto, qmodel: onnx.ModelProto, tensors: Mapping[str, tuple[str, str]]
) -> onnx.ModelProto | None:
    """A copy of ``fmodel`` with the quantized model's Q/DQ pair after each of ``tensors``
    (float name -> (raw, dequantized) names in ``qmodel``); None when none can be copied."""
    q_inits = {init.name: init for init in qmodel.graph.initializer}
    model = onnx.ModelProto()
    model.CopyFrom(fmodel)
    producers = {out: node for node in model.graph.node for out in node.output}
    added = 0
    for index, (name, (raw, seen)) in enumerate(tensors.items()):
        pair = _pair(qmodel, raw, seen)
        node = producers.get(name)
        if pair is None or node is None:
            continue
        quant, dequant = pair
        params = [p for p in list(quant.input[1:]) + list(dequant.input[1:]) if p]
        if any(p not in q_inits for p in params):
            continue
        renamed = {p: f"{p}{_SUFFIX}{index}" for p in params}
        for p, new in renamed.items():
            init = onnx.TensorProto()
            init.CopyFrom(q_inits[p])
            init.name = new
            model.graph.initializer.append(init)
        before, quantized = f"{name}{_SUFFIX}{index}_in", f"{name}{_SUFFIX}{index}_q"
        node.output[list(node.output).index(name)] = before
        q = onnx.helper.make_node(
            "QuantizeLinear", [before, *(renamed.get(p, p) for p in quant.input[1:])], [quantized]
        )
        q.attribute.extend(quant.attribute)
        dq = onnx.helper.make_node(
            "DequantizeLinear", [quantized, *(renamed.get(p, p) for p in dequant.input[1:])], [name]
        )
        dq.attribute.extend(dequant.attribute)
        model.graph.node.extend([q, dq])
        added += 1
    if not added:
        return None
    _sort(model.graph)
    return model


def _sort(graph: onnx.GraphProto) -> None:
    """Topological order after appending nodes (onnxruntime wants producers first)."""
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        rest = []
        for node in pending:
            if all(name in ready for name in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):  # a cycle or an outer-scope name: keep the rest as they were
            ordered.extend(rest)
            break
        pending = rest
    del graph.node[:]
    graph.node.extend(ordered)


def measure_head(
    fmodel: onnx.ModelProto,
    qmodel: onnx.ModelProto,
    qdq: Mapping[str, tuple[str, str]],
    head: Sequence[str],
    pieces: Iterable[dict[str, np.ndarray]],
) -> dict[str, float]:
    """Head node -> the worst output channel's relative error when only that node's outputs are
    quantized (0 for a head node the quantized model leaves float); ``FULL`` -> the same for the
    fully quantized model.

    ``pieces``: the data, a list of feeds (read once per head node).
    """
    feeds = list(pieces)
    inputs = {i.name for i in fmodel.graph.input} - {i.name for i in fmodel.graph.initializer}
    outputs = [o.name for o in fmodel.graph.output]
    by_name = {node.name: node for node in fmodel.graph.node}
    reference = session(fmodel)
    refs = [reference.run(outputs, {k: v for k, v in feed.items() if k in inputs}) for feed in feeds]
    whole = {out: _Channels() for out in outputs}  # the fully quantized model, for comparison
    quantized = session(qmodel)
    q_inputs = {i.name for i in qmodel.graph.input}
    for feed, ref in zip(feeds, refs, strict=True):
        values = quantized.run(outputs, {k: v for k, v in feed.items() if k in q_inputs})
        for out, value, expected in zip(outputs, values, ref, strict=True):
            whole[out].add(value, expected)
    found: dict[str, float] = {FULL: max((s.worst() for s in whole.values()), default=0.0)}
    for name in head:
        node = by_name.get(name)
        tensors = {t: qdq[t] for t in (node.output if node is not None else []) if t in qdq}
        model = injected(fmodel, qmodel, tensors) if tensors else None
        if model is None:
            found[name] = 0.0
            continue
        run = session(model)
        stats = {out: _Channels() for out in outputs}
        for feed, ref in zip(feeds, refs, strict=True):
            values = run.run(outputs, {k: v for k, v in feed.items() if k in inputs})
            for out, value, expected in zip(outputs, values, ref, strict=True):
                stats[out].add(value, expected)
        found[name] = max((s.worst() for s in stats.values()), default=0.0)
    return found
