"""Bounded memory in sensitivity and evaluation: the work is cut to the budget, the figures stay the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import save_graph
from quantune.data import Dataset
from quantune.evaluate import EvaluationSpec, Evaluator
from quantune.evaluate.budget import run_in_pieces
from quantune.evaluate.sensitivity import capture, measure
from quantune.evaluate.sensitivity.static import _structure
from robust_helpers import qdq_quantized
from test_memory import build_wide_cnn

REPO = Path(__file__).resolve().parents[1]


def _images(rows: int, size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (rows, 3, size, size)).astype(np.float32)


def test_sensitivity_in_many_capture_groups_gives_the_one_group_report(tmp_path: Path) -> None:
    model = build_wide_cnn(tmp_path / "wide.onnx", size=32)
    x = _images(12, 32)
    quant = qdq_quantized(model, x, tmp_path / "q.onnx")
    feeds = [{"x": x[i : i + 6]} for i in range(0, 12, 6)]
    tiny = 0.05  # MB: below one row's tensors of one statistic
    jobs = _structure(onnx.load(str(model)), onnx.load(str(quant))).jobs
    plan = capture.plan(jobs, onnx.load(str(model)), onnx.load(str(quant)), lambda: iter(feeds), tiny)
    assert len(plan.groups) == len(jobs) > 4 and plan.rows == 1 and plan.total_rows == 12
    whole = measure(model, quant, feeds, budget_mb=4096)
    assert len(capture.plan(jobs, onnx.load(str(model)), onnx.load(str(quant)), lambda: iter(feeds), 4096).groups) == 1
    cut = measure(model, quant, feeds, budget_mb=tiny)
    assert cut.rows == whole.rows == 12
    for field in ("scores", "weight_noise", "activation_noise"):
        expected, got = getattr(whole, field), getattr(cut, field)
        assert expected.keys() == got.keys() and any(v > 0 for v in expected.values())
        for name in expected:
            assert got[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), (field, name)
    assert cut.outputs["y"]["sqnr_db"] == pytest.approx(whole.outputs["y"]["sqnr_db"], rel=1e-9)


_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from quantune.evaluate.sensitivity import measure
    from quantune.memory import peak_tracker, return_large_blocks

    model, quant, rows, batch, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    return_large_blocks()

    def feeds():  # generated batch by batch: only the measurement's own memory is measured
        rng = np.random.default_rng(0)
        for _ in range(0, rows, batch):
            yield {"x": rng.normal(0, 1, (batch, 3, 192, 192)).astype(np.float32)}

    with peak_tracker() as peak:
        measure(model, quant, feeds, budget_mb=budget)
    print(json.dumps({"peak_mb": peak.mb}))
    """
)


def _sensitivity_peak(model: Path, quant: Path, rows: int, batch: int, budget: float) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(model), str(quant), str(rows), str(batch), str(budget)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mb"]


def test_sensitivity_peak_is_set_by_the_budget_not_by_the_data_or_the_tensors(tmp_path: Path) -> None:
    """192x192 with 16 channels: every compared tensor of one batch of 8 rows is some 300 MB
    (raw, dequantized and float copies, twice while onnxruntime hands them over); within a
    48 MB budget, a few statistics' tensors of a few rows are captured at a time."""
    model = build_wide_cnn(tmp_path / "wide.onnx", size=192)
    quant = qdq_quantized(model, _images(4, 192), tmp_path / "q.onnx")
    everything = _sensitivity_peak(model, quant, 8, 8, 4096)
    bounded = _sensitivity_peak(model, quant, 8, 8, 48)
    more_data = _sensitivity_peak(model, quant, 32, 8, 48)
    print(f"sensitivity peak: all at once {everything:.0f} MB, bounded {bounded:.0f} MB, 4x data {more_data:.0f} MB")
    assert bounded < everything - 150, f"bounded {bounded:.0f} MB vs all at once {everything:.0f} MB"
    assert more_data <= bounded + 40, f"peak grew from {bounded:.0f} MB to {more_data:.0f} MB with 4x the data"


def test_an_evaluation_feed_over_the_budget_runs_in_pieces_with_the_same_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime as ort

    model = build_wide_cnn(tmp_path / "wide.onnx", size=64)
    x = _images(48, 64)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for budget, fits in (("1", lambda rows: rows == 1), ("4096", lambda rows: rows >= 48)):
        monkeypatch.setenv("QUANTUNE_MEMORY_BUDGET_MB", budget)
        sized: dict[tuple, int] = {}
        run_in_pieces(session, ["y"], {"x": x}, sized)
        assert len(sized) == 1 and fits(next(iter(sized.values()))), (budget, sized)  # a row's footprint, measured
    spec = EvaluationSpec(metric="cosine", batch_size=48)

    def figures(budget: str) -> tuple[dict, dict]:
        monkeypatch.setenv("QUANTUNE_MEMORY_BUDGET_MB", budget)
        evaluator = Evaluator(spec, Dataset({"x": x}, "test"), ["x"], threads=1)
        outputs = evaluator.outputs(model)
        metrics, _ = evaluator.evaluate(model, None)
        return outputs[0], metrics

    whole, whole_metrics = figures("4096")
    cut, cut_metrics = figures("1")
    np.testing.assert_allclose(cut["y"], whole["y"], rtol=1e-5, atol=1e-6)
    assert cut_metrics["cosine"] == pytest.approx(whole_metrics["cosine"]) and cut["y"].shape == (48, 1, 64, 64)


def test_a_feed_whose_outputs_do_not_follow_its_rows_is_never_cut(tmp_path: Path) -> None:
    """An output with its own first dimension (an in-graph NMS's box list) cannot be joined back."""
    import onnxruntime as ort

    from quantune.evaluate.budget import batch_follows_rows

    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Shape", ["x"], ["s"])],
        "g",
        [value("x", TensorProto.FLOAT, ["N", 4])],
        [value("y", TensorProto.FLOAT, ["N", 4]), value("s", TensorProto.INT64, [2])],
    )
    session = ort.InferenceSession(str(save_graph(graph, tmp_path / "g.onnx")))
    assert not batch_follows_rows(session)
    assert batch_follows_rows(ort.InferenceSession(str(build_wide_cnn(tmp_path / "w.onnx", size=8))))


def _long_conv(path: Path, length: int, channels: int = 32) -> Path:
    """Two convolutions over a long 1-D signal, pooled to 4 logits: a few kB of weights, some
    8 MB of activations a row (so a batch of 48 needs hundreds of MB at once, one row a few)."""
    rng = np.random.default_rng(0)

    def init(name: str, shape: list[int], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    weights = [
        init("w1", [channels, 1, 1, 9], 0.3),
        init("b1", [channels], 0.05),
        init("w2", [channels, channels, 1, 9], 0.06),
        init("b2", [channels], 0.05),
        init("w3", [4, channels], 0.3),
        init("b3", [4], 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[0, 4, 0, 4]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[0, 4, 0, 4]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], transB=1),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "long_conv",
        [value("x", TensorProto.FLOAT, ["batch", 1, 1, length])],
        [value("logits", TensorProto.FLOAT, ["batch", 4])],
        weights,
    )
    return save_graph(graph, path)


def test_every_stage_of_a_run_keeps_a_low_memory_budget(tmp_path: Path) -> None:
    """The engine (its preparation check), calibration, the original's evaluation and the trials
    peak within the budget: batches of 48 long rows are cut to what one row's measured footprint
    says fits (whole, the calibration alone took twice the budget)."""
    import onnxruntime as ort

    budget = 300
    model = _long_conv(tmp_path / "model.onnx", length=16000)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for name, rows in (("calib", 48), ("eval", 96)):
        x = rng.normal(0, 1, (rows, 1, 1, 16000)).astype(np.float32)
        np.savez(tmp_path / f"{name}.npz", x=x, label=session.run(None, {"x": x})[0].argmax(1))
    config = {
        "model": "model.onnx",
        "data": {"calibration": "calib.npz", "evaluation": "eval.npz", "batch_size": 48},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "threads": 1, "batch_size": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.5},
        "passes": [{"name": "static_quant", "params": {"calibrate_method": {"search": ["MinMax", "Percentile"]}}}],
        "search": {"sampler": "exhaustive", "seed": 0},
        "stop": {"max_trials": 2},
        "cache_dir": "cache",
    }
    (tmp_path / "quantune.json").write_text(json.dumps(config))
    # the engine's own process (the preparation's check runs there) is measured by a parent of its own
    measured = "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
    measured += "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024); sys.exit(done.returncode)"
    done = subprocess.run(
        [sys.executable, "-c", measured, sys.executable, "-m", "quantune", "run", "quantune.json", "--output", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), "QUANTUNE_MEMORY_BUDGET_MB": str(budget)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    peaks = {"engine": float(done.stdout.strip().splitlines()[-1]), **result["stage_peak_rss_mb"]}
    peaks.update({f"trial {t['number']}": t["peak_rss_mb"] for t in result["trials"] if t.get("peak_rss_mb")})
    assert {"calibration", "baseline_evaluation"} <= peaks.keys() and len(result["trials"]) == 2, peaks
    over = {stage: mb for stage, mb in peaks.items() if mb > budget}
    assert not over, f"over the {budget} MB budget: {over}"
