"""The head's per-node loss, measured at the outputs: local noise says how much a tensor is rounded, not what it does
(boxes and scores under one scale lose every score). Each head node's Q/DQ pairs alone, worst channel kept."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from quantune.evaluate.sensitivity.stats import session, with_outputs

_SUFFIX = "__quantune_head"
FULL = ""  # key of :func:`measure_head`'s result that holds the fully quantized model's loss
# A head node whose quantization alone causes this share of the fully quantized model's output error is a culprit.
CULPRIT_SHARE = 0.5
# ... and at least this much of it: where the quantized model is almost exact, no node is singled out.
CULPRIT_FLOOR = 1e-3


def culprits(head: Mapping[str, float]) -> dict[str, float]:
    """The head nodes of :func:`measure_head`'s result that alone cause most of the output loss."""
    full = head.get(FULL, 0.0)
    floor = max(CULPRIT_SHARE * full, CULPRIT_FLOOR)
    return {name: loss for name, loss in head.items() if name != FULL and loss >= floor}


class _Channels:
    """Per-channel squared error and energy of one output, channels on axis 1, summed over batches."""

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
    """A copy of ``fmodel`` with ``qmodel``'s Q/DQ pair after each of ``tensors``; None when none can be copied."""
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


def cut_nodes(fmodel: onnx.ModelProto, names: Sequence[str]) -> list[onnx.NodeProto]:
    """The nodes ``names`` and every node downstream of them, in graph order."""
    wanted, reached = set(names), set()
    nodes = []
    for node in fmodel.graph.node:  # graph order is topological: one pass finds the closure
        if node.name in wanted or reached & set(node.input):
            nodes.append(node)
            reached.update(node.output)
    return nodes


def _cut(fmodel: onnx.ModelProto, names: Sequence[str]) -> tuple[list[onnx.NodeProto], list[str], list[str]]:
    """The nodes ``names`` and downstream, the tensors they read from outside and the outputs they make."""
    nodes = cut_nodes(fmodel, names)
    made = {out for node in nodes for out in node.output}
    inits = {init.name for init in fmodel.graph.initializer}
    boundary = list(dict.fromkeys(t for node in nodes for t in node.input if t and t not in made and t not in inits))
    outputs = [o.name for o in fmodel.graph.output if o.name in made]
    return nodes, boundary, outputs


# Ops that blow up a small absolute error (log(0), a division by zero, a square root of a negative).
AMPLIFIERS = frozenset({"Log", "Sqrt", "Reciprocal", "Pow", "Div"})
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Clip", "Max", "Abs", "Relu"})


def amplified_nodes(fmodel: onnx.ModelProto, depth: int = 2) -> list[str]:
    """Nodes feeding an amplifier (a Log, a Div's denominator) through at most ``depth`` elementwise ops."""
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in fmodel.graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, index))
    found = []
    for node in fmodel.graph.node:
        if node.op_type in ("Constant", *AMPLIFIERS):
            continue
        frontier, hit = list(node.output), False
        for _ in range(depth + 1):
            following = []
            for tensor in frontier:
                for consumer, index in consumers.get(tensor, []):
                    if consumer.op_type in AMPLIFIERS and (consumer.op_type != "Div" or index == 1):
                        hit = True
                    elif consumer.op_type in _ELEMENTWISE:
                        following.extend(consumer.output)
            if hit or not following:
                break
            frontier = following
        if hit:
            found.append(node.name)
    return found


def _head_model(
    fmodel: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], boundary: Mapping[str, np.ndarray], outputs: Sequence[str]
) -> onnx.ModelProto:
    """The head alone: ``boundary`` tensors as its inputs, its initializers, ``outputs``."""
    used = {t for node in nodes for t in node.input}
    graph = onnx.helper.make_graph(
        list(nodes),
        "head",
        [
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), None)
            for name, value in boundary.items()
        ],
        [onnx.ValueInfoProto(name=name) for name in outputs],
        [init for init in fmodel.graph.initializer if init.name in used],
    )
    model = onnx.helper.make_model(graph, opset_imports=fmodel.opset_import)
    model.ir_version = fmodel.ir_version
    return model


def measure_head(
    fmodel: onnx.ModelProto,
    qmodel: onnx.ModelProto,
    qdq: Mapping[str, tuple[str, str]],
    head: Sequence[str],
    pieces: Iterable[dict[str, np.ndarray]],
) -> dict[str, float]:
    """Head node -> worst channel's error with only its outputs quantized; ``FULL`` -> all quantized."""
    nodes, boundary, outputs = _cut(fmodel, head)
    if not outputs:
        return {}
    inputs = {i.name for i in fmodel.graph.input} - {i.name for i in fmodel.graph.initializer}
    computed = [t for t in boundary if t not in inputs]  # the rest are the model's own inputs
    reference = session(with_outputs(fmodel, [*computed, *outputs], only=True))
    quantized = session(qmodel)
    q_inputs = {i.name for i in qmodel.graph.input}
    cuts: list[dict[str, np.ndarray]] = []
    refs: list[list[np.ndarray]] = []
    whole = {out: _Channels() for out in outputs}  # the fully quantized model, for comparison
    for feed in pieces:
        values = reference.run([*computed, *outputs], {k: v for k, v in feed.items() if k in inputs})
        cut = dict(zip(computed, values[: len(computed)], strict=True))
        cuts.append({name: cut[name] if name in cut else feed[name] for name in boundary})
        refs.append(values[len(computed) :])
        q_values = quantized.run(outputs, {k: v for k, v in feed.items() if k in q_inputs})
        for out, value, expected in zip(outputs, q_values, refs[-1], strict=True):
            whole[out].add(value, expected)
    found: dict[str, float] = {FULL: max((s.worst() for s in whole.values()), default=0.0)}
    if not cuts:
        return found
    sub = _head_model(fmodel, nodes, cuts[0], outputs)
    for node in (n for n in nodes if n.name in set(head)):
        tensors = {t: qdq[t] for t in node.output if t in qdq}
        model = injected(sub, qmodel, tensors) if tensors else None
        if model is None:
            found[node.name] = 0.0
            continue
        run = session(model)
        stats = {out: _Channels() for out in outputs}
        for cut, ref in zip(cuts, refs, strict=True):
            for out, value, expected in zip(outputs, run.run(outputs, cut), ref, strict=True):
                stats[out].add(value, expected)
        found[node.name] = max((s.worst() for s in stats.values()), default=0.0)
    return found
