"""Per-operator quantization sensitivity of a static (QDQ) quantization, from one pass of data: each Q/DQ pair's own
noise inside the quantized model, and each weighted node's re-run alone on the inputs it really sees."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from quantune import progress
from quantune.evaluate.sensitivity import capture, cost
from quantune.evaluate.sensitivity.capture import Job
from quantune.evaluate.sensitivity.head import FULL, amplified_nodes, culprits, cut_nodes, measure_head
from quantune.evaluate.sensitivity.stats import NodeStats, SensitivityReport, session, single_node, with_outputs
from quantune.graph.capability import ModelCapability
from quantune.graph.head import head_nodes, lead_in_nodes
from quantune.memory import room_mb

log = logging.getLogger("quantune.sensitivity")

_WEIGHTED = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
HEAD_LIMIT = 32  # head nodes re-run at most (one float run each): a decoder's tail, not a whole model
AMPLIFIED_LIMIT = 8  # nodes feeding a Log or a division re-run at most (each reruns what follows it)
LEAD_IN_LIMIT = 8  # lead-in nodes re-run at most, nearest the inputs (each reruns the whole float model)


@dataclass
class _Structure:
    """What is compared: Q/DQ pairs, weighted nodes, products of two activations, outputs."""

    qdq: dict[str, tuple[str, str]]  # float name -> (raw in quant model, dequantized in quant model)
    weighted: dict[str, tuple[onnx.NodeProto, list[tuple[str, str]], list[tuple[str, str]]]]
    products: dict[str, tuple[onnx.NodeProto, list[tuple[str, str, str]]]]
    outputs: list[str]
    jobs: list[Job] = field(default_factory=list)


def _structure(fmodel: onnx.ModelProto, qmodel: onnx.ModelProto) -> _Structure:
    f_inits = _inits(fmodel)
    q_inits = _inits(qmodel)
    f_tensors = {out for node in fmodel.graph.node for out in node.output} | {i.name for i in fmodel.graph.input}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in qmodel.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    # Quantized activation tensors: raw float T -> its DQ(Q(T)), named by the float model's tensor.
    qdq: dict[str, tuple[str, str]] = {}
    for node in qmodel.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in q_inits:
            continue
        for dq in consumers.get(node.output[0], []):
            if dq.op_type == "DequantizeLinear":
                raw, seen = node.input[0], dq.output[0]
                name = raw if raw in f_tensors else seen
                if name in f_tensors:
                    qdq[name] = (raw, seen)
                break

    # Weighted nodes: (float node, the activations it sees in the quant model, its dequantized weights).
    q_by_name = {node.name: node for node in qmodel.graph.node}
    weighted = {}
    for node in fmodel.graph.node:
        qnode = q_by_name.get(node.name)
        if node.op_type not in _WEIGHTED or qnode is None or len(qnode.input) != len(node.input):
            continue
        acts = [(f, q) for f, q in zip(node.input, qnode.input, strict=True) if f and f not in f_inits]
        weights = [
            (f, q) for f, q in zip(node.input, qnode.input, strict=True) if f in f_inits and q not in q_inits and q != f
        ]
        if acts and weights:
            weighted[node.name] = (node, acts, weights)

    # MatMuls of two quantized activations: (float node, [(float input, raw, dequantized)]).
    raw_of = {seen: raw for raw, seen in qdq.values()}
    products = {}
    for node in fmodel.graph.node:
        qnode = q_by_name.get(node.name)
        if node.op_type != "MatMul" or qnode is None or len(qnode.input) != len(node.input):
            continue
        if any(f in f_inits for f in node.input):
            continue
        pairs = [(f, raw_of.get(q, q), q) for f, q in zip(node.input, qnode.input, strict=True)]
        if any(seen in raw_of for _, _, seen in pairs):
            products[node.name] = (node, pairs)

    q_outputs = {o.name for o in qmodel.graph.output}
    outputs = [o.name for o in fmodel.graph.output if o.name in q_outputs]
    found = _Structure(qdq, weighted, products, outputs)
    # the jobs in graph order, so a group holds neighbours (a node's inputs with its activations)
    order = {out: i for i, node in enumerate(fmodel.graph.node) for out in node.output}
    jobs: list[tuple[int, Job]] = []
    for name, (raw, seen) in qdq.items():
        jobs.append((order.get(name, -1), Job(f"act:{name}", (raw, seen), (name,))))
    for name, (node, acts, weights) in weighted.items():
        made = tuple(out for out in node.output if out)
        jobs.append(
            (order.get(node.output[0], -1), Job(f"weight:{name}", tuple(q for _, q in [*acts, *weights]), (), made))
        )
    for name, (node, pairs) in products.items():
        needs = tuple(dict.fromkeys(n for _, raw, seen in pairs for n in (raw, seen)))
        made = tuple(out for out in node.output if out)
        jobs.append((order.get(node.output[0], -1), Job(f"product:{name}", needs, (), made)))
    for name in outputs:
        jobs.append((len(order), Job(f"out:{name}", (name,), (name,))))
    found.jobs = [job for _, job in sorted(jobs, key=lambda item: item[0])]
    return found


def measure(
    float_model: str | Path,
    quant_model: str | Path,
    batches: Iterable[dict[str, np.ndarray]] | Callable[[], Iterable[dict[str, np.ndarray]]],
    *,
    budget_mb: float | None = None,
    row_runs: float | None = None,
) -> SensitivityReport:
    """Scores every node of ``float_model`` against its QDQ quantization ``quant_model``. ``batches``: the data, or a
    function returning it afresh. Memory is bounded by ``budget_mb``, time by ``row_runs`` (:mod:`.cost`)."""
    fmodel = onnx.load(str(float_model))
    qmodel = onnx.load(str(quant_model))
    found = _structure(fmodel, qmodel)
    feeds = capture.replayable(batches)
    budget = room_mb() if budget_mb is None else budget_mb  # what this process leaves of the budget
    plan = capture.plan(found.jobs, fmodel, qmodel, feeds, budget)
    probes = _probes(fmodel, found)
    per_row = _per_row(found, fmodel, qmodel, plan, probes)
    while row_runs is not None and per_row > row_runs and len(probes) > 1:
        probes = probes[:-1]  # the lead-in's, then the amplifiers' (each reruns much of the model)
        per_row = _per_row(found, fmodel, qmodel, plan, probes)
    rows = cost.affordable_rows(per_row, row_runs, plan.total_rows)
    if rows < plan.total_rows:
        feeds = cost.first_rows(feeds, rows, cut=plan.rows is not None)
        plan.total_rows = sum(capture.feed_rows(feed) for feed in feeds())
    log.info(
        "sensitivity: %d rows, %.1f whole-model runs of a row each (%.0f in all; bound %s)",
        plan.total_rows,
        per_row,
        per_row * plan.total_rows,
        "none" if row_runs is None else f"{row_runs:.0f}",
    )
    input_names = {i.name for i in fmodel.graph.input} - _inits(fmodel)

    stats = {job.key: NodeStats() for job in found.jobs}
    ref_stats = {name: NodeStats() for name in found.qdq}
    for done, group in enumerate(plan.groups, start=1):
        _run_group(group, found, fmodel, qmodel, capture.pieces(feeds, plan.rows), input_names, stats, ref_stats)
        progress.tick(done, len(plan.groups), "capture groups")

    def noise(prefix: str) -> dict[str, float]:
        return {key[len(prefix) :]: s.nmse() for key, s in stats.items() if key.startswith(prefix)}

    activation_noise, weight_noise, product_noise = noise("act:"), noise("weight:"), noise("product:")
    scores: dict[str, float] = {}
    for node in fmodel.graph.node:
        adjacent = [t for t in [*node.input, *node.output] if t in activation_noise]
        scores[node.name] = (
            weight_noise.get(node.name, 0.0)
            + product_noise.get(node.name, 0.0)
            + sum(activation_noise[t] for t in adjacent)
        )
    head = _head_loss(fmodel, qmodel, found, feeds, plan.rows, probes)
    # A head culprit outranks every other unit: its score is above the sum of all the others.
    above = sum(scores.values())
    for name, loss in culprits(head).items():
        scores[name] = above + loss
    return SensitivityReport(
        scores=scores,
        head=head,
        weight_noise=weight_noise,
        activation_noise=activation_noise,
        tensors={name: s.summary() for name, s in ref_stats.items()},
        outputs={name: stats[f"out:{name}"].summary() for name in found.outputs},
        rows=plan.total_rows,
        product_noise=product_noise,
    )


def _probes(fmodel: onnx.ModelProto, found: _Structure) -> list[list[str]]:
    """The nodes scored at the outputs: the head's, those feeding an amplifier and the lead-in's, each capped."""
    structure = ModelCapability.from_model(fmodel)
    nodes = head_nodes(structure.nodes, [o.name for o in fmodel.graph.output])
    by_name = {node.name: node for node in fmodel.graph.node}
    lead_in = [
        name
        for name in lead_in_nodes(structure.nodes, structure.float_inputs)
        if name in by_name and name not in set(nodes) and any(t in found.qdq for t in by_name[name].output)
    ][:LEAD_IN_LIMIT]
    amplified = [
        name
        for name in amplified_nodes(fmodel)
        if name not in set(nodes) and any(t in found.qdq for t in by_name[name].output)
    ][:AMPLIFIED_LIMIT]
    probes = [nodes[-HEAD_LIMIT:], amplified, [n for n in lead_in if n not in set(amplified)]]
    return [probe for probe in probes if probe]


def _per_row(
    found: _Structure, fmodel: onnx.ModelProto, qmodel: onnx.ModelProto, plan: capture.Plan, probes: list[list[str]]
) -> float:
    """Whole-model runs of one row per row of data; a quantized run counts :data:`cost.QUANTIZED` times."""
    f_share, q_share = cost.Share(fmodel), cost.Share(qmodel)
    per_row = 0.0
    for group in plan.groups:
        q_names = {n for job in group for n in job.quant}
        f_names = {n for job in group for n in job.float}
        per_row += cost.QUANTIZED * q_share(cost.ancestors(qmodel.graph, q_names)) if q_names else 0.0
        per_row += f_share(cost.ancestors(fmodel.graph, f_names)) if f_names else 0.0
    alone = [node for node, _, _ in found.weighted.values()] + [node for node, _ in found.products.values()]
    per_row += 2 * f_share(alone)
    for probe in probes:
        per_row += 1 + cost.QUANTIZED + len(probe) * f_share(cut_nodes(fmodel, probe))
    return per_row


def _head_loss(
    fmodel: onnx.ModelProto, qmodel: onnx.ModelProto, found: _Structure, feeds, rows, probes: list[list[str]]
) -> dict[str, float]:
    """The probes' nodes (:func:`_probes`) scored by their own quantization's effect on the outputs."""
    result: dict[str, float] = {}
    for measured in probes:
        try:
            part = measure_head(fmodel, qmodel, found.qdq, measured, capture.pieces(feeds, rows))
        except Exception as exc:  # what cannot be re-run alone keeps its local scores
            log.warning("output-level sensitivity skipped for %d node(s): %s", len(measured), exc)
            continue
        full = max(result.get(FULL, 0.0), part.pop(FULL, 0.0))
        result.update(part)
        result[FULL] = full
    return result


def _run_group(
    group: list[Job],
    found: _Structure,
    fmodel: onnx.ModelProto,
    qmodel: onnx.ModelProto,
    pieces: Iterable[dict[str, np.ndarray]],
    input_names: set[str],
    stats: dict[str, NodeStats],
    ref_stats: dict[str, NodeStats],
) -> None:
    """One capture group over all the data: its tensors as the sessions' only outputs."""
    q_names = list(dict.fromkeys(n for job in group for n in job.quant))
    f_names = list(dict.fromkeys(n for job in group for n in job.float))
    q_session = session(with_outputs(qmodel, q_names, only=True)) if q_names else None
    f_session = session(with_outputs(fmodel, f_names, only=True)) if f_names else None
    singles: dict[str, ort.InferenceSession] = {}
    swapped: dict[str, ort.InferenceSession] = {}
    for job in group:
        kind, name = job.key.split(":", 1)
        if kind == "weight":
            node, acts, _ = found.weighted[name]
            singles[name] = session(single_node(node, fmodel, [f for f, _ in acts]))
        elif kind == "product":
            node, _ = found.products[name]
            singles[name] = session(single_node(node, fmodel, list(node.input)))
    for piece in pieces:
        feeds = {k: v for k, v in piece.items() if k in input_names}
        qv = dict(zip(q_names, q_session.run(q_names, feeds), strict=True)) if q_session else {}
        fv = dict(zip(f_names, f_session.run(f_names, feeds), strict=True)) if f_session else {}
        for job in group:
            kind, name = job.key.split(":", 1)
            if kind == "act":
                raw, seen = found.qdq[name]
                stats[job.key].add(qv[seen], qv[raw])
                ref_stats[name].add(qv[seen], fv[name])
            elif kind == "out":
                stats[job.key].add(qv[name], fv[name])
            elif kind == "weight":
                node, acts, weights = found.weighted[name]
                act_feeds = {f: qv[q] for f, q in acts}
                reference = singles[name].run(None, act_feeds)[0]
                # The same node with dequantized weights: swap the initializers for what DQ produced.
                if name not in swapped:  # dequantized weights are constants: build once
                    swapped[name] = _swap_weights(node, fmodel, {f: qv[q] for f, q in weights})
                value = swapped[name].run(None, act_feeds)[0]
                stats[job.key].add(value, reference)
                del reference, value, act_feeds
            else:
                node, pairs = found.products[name]
                reference = singles[name].run(None, {f: qv[raw] for f, raw, _ in pairs})[0]
                value = singles[name].run(None, {f: qv[seen] for f, _, seen in pairs})[0]
                stats[job.key].add(value, reference)
                del reference, value
        del qv, fv, feeds, piece  # before the next piece runs: one piece's tensors at a time


def _swap_weights(node: onnx.NodeProto, model: onnx.ModelProto, weights: Mapping[str, np.ndarray]):
    """A session of ``node`` alone with ``weights`` in place of its float initializers."""
    activations = [name for name in node.input if name and name not in weights and name not in _inits(model)]
    single = single_node(node, model, activations)
    kept = [init for init in single.graph.initializer if init.name not in weights]
    del single.graph.initializer[:]
    single.graph.initializer.extend(kept)
    single.graph.initializer.extend(
        numpy_helper.from_array(np.asarray(value, dtype=np.float32), name) for name, value in weights.items()
    )
    return session(single)


def _inits(model: onnx.ModelProto) -> set[str]:
    return {init.name for init in model.graph.initializer}
