"""The run's limit reaches a target environment (``target.python``): its side-by-side rounds stop
at the deadline the engine gives, as local ones do (issue 23: the target server ran every planned
round whatever the limit). The target here is this interpreter (numpy and onnxruntime are all the
server needs); behaviour is asserted (rounds run), never timings."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from conftest import build_mlp, mlp_inputs
from quantune.evaluate import LatencySpec, TargetBackend, TimingRequest


def test_the_target_stops_its_rounds_at_the_deadline(tmp_path: Path) -> None:
    model = build_mlp(tmp_path / "m.onnx")
    feed = {"x": mlp_inputs(1, 0)}
    backend = TargetBackend(sys.executable)
    try:
        spec = LatencySpec(warmup=1, repeats=100000, threads=1)
        passed = time.perf_counter() - 1.0  # the limit is already spent: only the fewest rounds run
        timings = backend.time(TimingRequest((model, model), feed, spec, None, deadline=passed, min_rounds=3))
        assert timings.shape == (2, 3)
        assert (timings > 0).all()
        # without a deadline every planned round runs
        whole = backend.time(TimingRequest((model,), feed, LatencySpec(warmup=1, repeats=7, threads=1), None))
        assert whole.shape == (1, 7)
    finally:
        backend.close()
