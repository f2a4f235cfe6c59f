"""Bounded memory: chunked calibration gives the one-shot ranges, and its peak does not grow with the data."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization.calibrate import create_calibrator

from conftest import build_cnn, cnn_inputs, save_graph
from quantune.memory import peak_tracker
from quantune.passes.onnx.calibration import ChunkPlanner, calibrate_ranges

REPO = Path(__file__).resolve().parents[1]


def _feeds(rows: int, batch: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    x = cnn_inputs(rows, seed=seed)
    return [{"input": x[i : i + batch]} for i in range(0, rows, batch)]


def _one_shot(model: Path, feeds, method: CalibrationMethod, tmp_path: Path):
    """onnxruntime's own calibration, every batch in one collect_data call (as quantize_static does)."""
    calibrator = create_calibrator(
        model, None, augmented_model_path=str(tmp_path / "augmented.onnx"), calibrate_method=method
    )

    class Reader:
        def __init__(self) -> None:
            self.items = iter(feeds)

        def get_next(self):
            return next(self.items, None)

    calibrator.collect_data(Reader())
    return calibrator.compute_data()


def _bounds(ranges, name: str) -> np.ndarray:
    return np.array([float(np.min(ranges[name].range_value[0])), float(np.max(ranges[name].range_value[1]))])


@pytest.mark.parametrize("method", ["MinMax", "Entropy", "Percentile", "Distribution"])
def test_chunked_ranges_match_one_shot(tmp_path: Path, method: str) -> None:
    model = build_cnn(tmp_path / "cnn.onnx")
    feeds = _feeds(96, 16)
    kind = CalibrationMethod[method]
    reference = _one_shot(model, feeds, kind, tmp_path)
    # a budget of a few bytes: one row per chunk, 96 chunks
    chunked = calibrate_ranges(model, lambda: feeds, kind, budget_mb=1e-6)
    assert set(chunked.keys()) == set(reference.keys())
    for name in reference:
        expected, got = _bounds(reference, name), _bounds(chunked, name)
        if method in ("MinMax", "Entropy", "Distribution"):  # counted into the same bins: exact
            np.testing.assert_array_equal(got, expected, err_msg=name)
        else:  # symmetric percentile's bins start at 0 rather than at the smallest |x|
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4, err_msg=name)


def test_ragged_last_batch_calibrates_with_histograms(tmp_path: Path) -> None:
    """80 rows at 32: onnxruntime stacks a call's batches and fails on the 16-row last one."""
    model = build_cnn(tmp_path / "cnn.onnx")
    feeds = _feeds(80, 32)
    ranges = calibrate_ranges(model, lambda: feeds, CalibrationMethod.Entropy)
    assert "c2" in ranges


def test_planner_splits_big_batches_and_never_mixes_shapes() -> None:
    planner = ChunkPlanner(max_rows=10, splittable=True)
    feeds = [{"x": np.zeros((25, 3))}, {"x": np.zeros((4, 3))}, {"x": np.zeros((4, 5))}]
    same = [{"x": np.zeros((3, 3))}] * 4
    assert [len(chunk) for chunk in planner.chunks(same)] == [3, 1]  # batches of one shape share a chunk
    chunks = list(planner.chunks(feeds))
    assert [[len(f["x"]) for f in chunk] for chunk in chunks] == [[10], [10], [5], [4], [4]]
    fixed = ChunkPlanner(max_rows=10, splittable=False)
    assert [len(c[0]["x"]) for c in fixed.chunks(feeds[:1])] == [25]  # a fixed batch dimension is never cut


def test_peak_tracker_sees_a_block_s_allocation() -> None:
    with peak_tracker() as outer:
        with peak_tracker() as inner:
            block = np.ones(40 * 1024 * 1024 // 8)  # 40 MB, touched
            del block
        after_inner = inner.mb
    assert after_inner >= 40 and outer.mb >= after_inner


def build_wide_cnn(path: Path, size: int = 64, channels: int = 16) -> Path:
    """Three full-resolution convolutions: large activations for a small model."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (channels, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (channels, channels, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, (1, channels, 3, 3)).astype(np.float32), "w3"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, size, size])],
        inits,
    )
    return save_graph(graph, path)


_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from onnxruntime.quantization import CalibrationMethod
    from quantune.memory import peak_tracker
    from quantune.passes.onnx.calibration import calibrate_ranges

    model, rows = sys.argv[1], int(sys.argv[2])

    def feeds():  # generated batch by batch: only the calibration's own memory is measured
        rng = np.random.default_rng(0)
        for _ in range(0, rows, 8):
            yield {"x": rng.normal(0, 1, (8, 3, 64, 64)).astype(np.float32)}

    with peak_tracker() as peak:
        calibrate_ranges(model, feeds, CalibrationMethod.Entropy, budget_mb=16)
    print(json.dumps({"peak_mb": peak.mb}))
    """
)


def _calibration_peak(model: Path, rows: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(model), str(rows)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mb"]


def test_calibration_peak_does_not_grow_with_ten_times_the_data(tmp_path: Path) -> None:
    """40 rows vs 400 rows of 64x64 (about 1.3 MB of calibrated tensors a row): one-shot
    Entropy would hold some 0.5 GB more for the larger set; chunked, the peak stays put."""
    model = build_wide_cnn(tmp_path / "wide.onnx")
    small = _calibration_peak(model, 40)
    large = _calibration_peak(model, 400)
    assert large <= small + 120, f"peak grew from {small:.0f} MB to {large:.0f} MB with 10x the data"


def test_the_budget_follows_the_worker_s_memory_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantune.engine.executors.stage import Isolation, run_stage
    from quantune.memory import memory_budget_mb, total_memory_mb

    monkeypatch.delenv("QUANTUNE_MEMORY_BUDGET_MB", raising=False)
    limited = run_stage("budget", memory_budget_mb, isolation=Isolation(log_dir=tmp_path, memory_limit_mb=4000))
    assert limited.ok and 64 <= limited.value <= 2000  # half of what the limit leaves
    free = run_stage("budget", memory_budget_mb, isolation=Isolation(log_dir=tmp_path))
    assert free.value == pytest.approx(total_memory_mb() / 4)
