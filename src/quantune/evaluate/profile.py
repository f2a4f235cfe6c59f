"""Which operators carry a model's time: onnxruntime's own profiler, per node, on the original model.

An accuracy search that keeps an operator in float pays for it in latency, and what it pays
depends on the operator: a LayerNorm's Div costs almost nothing in float, a large MatMul
most of the model. The profiler (``SessionOptions.enable_profiling``) reports each kernel's
time; the graph is run without optimizations so every time is attributed to a node of the
model as the user wrote it (fusions would rename them). Figures are shares of the total, so
the machine's noise cancels out of the ordering that uses them.
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
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        node = name[: -len("_kernel_time")]
        totals[node] = totals.get(node, 0.0) + float(event.get("dur", 0.0))
    total = sum(totals.values())
    return {node: value / total for node, value in totals.items()} if total > 0 else {}
