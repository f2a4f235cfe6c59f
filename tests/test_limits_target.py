"""The run's limit reaches a target environment (``target.python``): its side-by-side rounds stop
at the deadline the engine gives, as local ones do (issue 23: the target server ran every planned
round whatever the limit). The target here is this interpreter (numpy and onnxruntime are all the
server needs); behaviour is asserted (rounds run), never timings."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from quantune.evaluate import LatencySpec, TargetBackend


def _model(path: Path) -> Path:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.ones(16, dtype=np.float32).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_the_target_stops_its_rounds_at_the_deadline(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx")
    feed = {"x": np.ones((1, 4), dtype=np.float32)}
    backend = TargetBackend(sys.executable)
    try:
        spec = LatencySpec(warmup=1, repeats=100000, threads=1)
        passed = time.perf_counter() - 1.0  # the limit is already spent: only the fewest rounds run
        timings = backend.timings([model, model], feed, spec, None, deadline=passed, min_rounds=3)
        assert timings.shape == (2, 3)
        assert (timings > 0).all()
        # without a deadline every planned round runs
        whole = backend.timings([model], feed, LatencySpec(warmup=1, repeats=7, threads=1), None)
        assert whole.shape == (1, 7)
    finally:
        backend.close()
