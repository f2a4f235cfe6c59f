"""Which operators carry a model's time: onnxruntime's own profiler, per node, on the original model.

Keeping an operator in float costs what that operator costs. The graph is profiled without
optimizations, so every time belongs to a node as the user wrote it; figures are shares, so the
machine's noise cancels out of the ordering. Within one kind of node (an op type; depthwise
convolutions apart) the kind's measured time is spread over its nodes by their work, not by each
node's own timing: nodes of near-equal cost would swap places from one profile to the next, and
the same run twice would try different trials.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from quantune.evaluate.latency import latency_lane


def node_time_shares(
    model: str | Path, feeds: Mapping[str, np.ndarray], *, threads: int = 1, runs: int = 10
) -> dict[str, float]:
    """Each node's share (0..1) of the summed kernel time over ``runs`` runs of ``feeds``."""
    with tempfile.TemporaryDirectory(prefix="quantune-profile-") as folder:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "profile")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        with latency_lane():
            for _ in range(runs + 1):
                session.run(None, dict(feeds))
        events = json.loads(Path(session.end_profiling()).read_text())
    totals: dict[str, float] = {}  # the warm-up run is counted too: shares, not absolute times
    work: dict[str, tuple[str, float]] = {}  # node -> (its kind, its work)
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        node = name[: -len("_kernel_time")]
        totals[node] = totals.get(node, 0.0) + float(event.get("dur", 0.0))
        work.setdefault(node, node_work(event.get("args") or {}))
    return spread_by_work(totals, work)


def spread_by_work(totals: Mapping[str, float], work: Mapping[str, tuple[str, float]]) -> dict[str, float]:
    """Each node's share: its kind's measured share split by work (unknown work: the nodes' own timings)."""
    total = sum(totals.values())
    if total <= 0:
        return {}
    kinds: dict[str, list[str]] = {}
    for node in totals:
        kinds.setdefault(work.get(node, ("?", 0.0))[0], []).append(node)
    shares: dict[str, float] = {}
    for nodes in kinds.values():
        amounts = [work.get(n, ("?", 0.0))[1] for n in nodes]
        if not all(a > 0 for a in amounts):  # a node of unknown work: the kind keeps its own timings
            shares.update((node, totals[node] / total) for node in nodes)
            continue
        per_work = sum(totals[n] for n in nodes) / sum(amounts) / total
        shares.update((node, amount * per_work) for node, amount in zip(nodes, amounts, strict=True))
    return shares


def node_work(args: Mapping[str, object]) -> tuple[str, float]:
    """(kind, work) of a profiled node: multiply-accumulates for Conv, Gemm, MatMul; else elements moved."""
    op = str(args.get("op_name", "?"))
    inputs = [_dims(entry) for entry in args.get("input_type_shape") or []]  # type: ignore[union-attr]
    outputs = [_dims(entry) for entry in args.get("output_type_shape") or []]  # type: ignore[union-attr]
    out = sum(_count(dims) for dims in outputs)
    if op == "Conv" and len(inputs) >= 2 and len(inputs[1]) >= 3:
        kind = "Conv (depthwise)" if inputs[1][1] == 1 and len(inputs[0]) > 1 and inputs[0][1] > 1 else "Conv"
        return kind, float(out * _count(inputs[1][1:]))
    if op in ("MatMul", "Gemm") and inputs and inputs[0]:
        return op, float(out * inputs[0][-1])
    return op, float(out + sum(_count(dims) for dims in inputs))


def _dims(entry: object) -> list[int]:
    """The dimensions of one ``{dtype: [dims]}`` shape entry of the profiler."""
    if isinstance(entry, Mapping):
        for dims in entry.values():
            if isinstance(dims, list) and all(isinstance(d, int) and d >= 0 for d in dims):
                return list(dims)
    return []


def _count(dims: list[int]) -> int:
    return int(np.prod(dims)) if dims else 0
