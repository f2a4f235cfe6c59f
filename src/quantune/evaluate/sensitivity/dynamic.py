"""Per-operator sensitivity of a dynamic quantization, without building the quantized model: each node
``quantize_dynamic`` touches is re-computed in float and as the dynamic kernel does, so activation noise counts as much
as the weights'."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from quantune.evaluate.sensitivity import capture, cost
from quantune.evaluate.sensitivity.capture import Job
from quantune.evaluate.sensitivity.stats import NodeStats, SensitivityReport, session, with_outputs
from quantune.memory import room_mb


def fake_quant(array: np.ndarray, kind: str, *, reduce_range: bool = False, axis: int | None = None) -> np.ndarray:
    """``array`` fake-quantized as onnxruntime does (int8 symmetric, uint8 asymmetric), per tensor or along ``axis``."""
    x = np.asarray(array, dtype=np.float32)
    reduce = tuple(i for i in range(x.ndim) if axis is None or i != axis % x.ndim)
    if kind == "int8":
        qmax = 64.0 if reduce_range else 127.0  # onnxruntime's symmetric 7-bit range is [-64, 64]
        scale = np.max(np.abs(x), axis=reduce, keepdims=True) / qmax
        scale = np.where(scale > 0, scale, 1.0)
        return np.clip(np.round(x / scale), -qmax, qmax) * scale
    qmax = 127.0 if reduce_range else 255.0
    low = np.minimum(np.min(x, axis=reduce, keepdims=True), 0.0)
    high = np.maximum(np.max(x, axis=reduce, keepdims=True), 0.0)
    scale = (high - low) / qmax
    scale = np.where(scale > 0, scale, 1.0)
    zero = np.round(-low / scale)
    return (np.clip(np.round(x / scale) + zero, 0, qmax) - zero) * scale


def measure_dynamic(
    float_model: str | Path,
    batches: Iterable[dict[str, np.ndarray]] | Callable[[], Iterable[dict[str, np.ndarray]]],
    *,
    weight_type: str = "int8",
    per_channel: bool = False,
    reduce_range: bool = False,
    budget_mb: float | None = None,
    row_runs: float | None = None,
) -> SensitivityReport:
    """Scores the nodes ``quantize_dynamic`` would touch, bounded by ``row_runs`` (:mod:`.cost`)."""
    from quantune.graph.capability import ModelCapability

    model = onnx.load(str(float_model))
    inits = {init.name: init for init in model.graph.initializer}
    capability = ModelCapability.from_model(model, mode="dynamic")
    nodes = [node for node in model.graph.node if (node.name or "") in capability.quantizable]
    plans: dict[str, tuple[onnx.NodeProto, str, np.ndarray, np.ndarray]] = {}  # (node, activation, quantized, float)
    if weight_type == "mixed":  # uint8 is for convolutions only: MatMul weights and Gather tables are int8
        weight_type = "int8"
    for node in nodes:
        if node.op_type == "MatMul" and node.input[1] in inits:
            weight = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
            axis = -1 if per_channel and weight.ndim >= 2 else None
            quantized = fake_quant(weight, weight_type, reduce_range=reduce_range, axis=axis)
            plans[node.name] = (node, node.input[0], quantized, weight)
        elif node.op_type == "Gather" and node.input[0] in inits:
            table = numpy_helper.to_array(inits[node.input[0]]).astype(np.float32)
            plans[node.name] = (node, node.input[1], fake_quant(table, weight_type, reduce_range=reduce_range), table)
    input_names = {i.name for i in model.graph.input} - set(inits)
    jobs = [
        Job(name, (), () if act in input_names or act in inits else (act,), tuple(o for o in node.output if o))
        for name, (node, act, _, _) in plans.items()
    ]
    feeds = capture.replayable(batches)
    budget = room_mb() if budget_mb is None else budget_mb  # what this process leaves of the budget
    plan = capture.plan(jobs, model, None, feeds, budget)
    share = cost.Share(model)
    per_row = 2 * share(node for node, _, _, _ in plans.values())  # each node recomputed twice
    for group in plan.groups:
        names = {n for job in group for n in job.float}
        per_row += share(cost.ancestors(model.graph, names)) if names else 0.0
    rows = cost.affordable_rows(per_row, row_runs, plan.total_rows)
    if rows < plan.total_rows:
        feeds = cost.first_rows(feeds, rows, cut=plan.rows is not None)
        plan.total_rows = sum(capture.feed_rows(feed) for feed in feeds())
    stats = {name: NodeStats() for name in plans}
    for group in plan.groups:
        names = list(dict.fromkeys(n for job in group for n in job.float))
        runner = session(with_outputs(model, names, only=True)) if names else None
        for piece in capture.pieces(feeds, plan.rows):
            batch = {k: v for k, v in piece.items() if k in input_names}
            values = dict(zip(names, runner.run(names, batch), strict=True)) if runner else {}
            values.update({k: v for k, v in batch.items() if k not in values})
            for job in group:
                node, act, quantized, reference_weights = plans[job.key]
                if act not in values:
                    continue
                if node.op_type == "MatMul":
                    a = np.asarray(values[act], dtype=np.float32)
                    reference = a @ reference_weights
                    value = fake_quant(a, "uint8", reduce_range=False) @ quantized
                else:
                    indices = np.asarray(values[act]).astype(np.int64)
                    axis = _attr(node, "axis", 0)
                    reference = np.take(reference_weights, indices, axis=axis)
                    value = np.take(quantized, indices, axis=axis)
                stats[job.key].add(value, reference)
                del reference, value
            del values, batch, piece  # before the next piece runs
    scores = {node.name: 0.0 for node in model.graph.node}
    noise = {name: stat.nmse() for name, stat in stats.items()}
    scores.update(noise)
    return SensitivityReport(
        scores=scores,
        weight_noise=noise,
        tensors={name: stat.summary() for name, stat in stats.items()},
        rows=plan.total_rows,
    )


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return default
