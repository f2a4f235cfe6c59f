"""Preflight: data the model cannot take, a loader returning nothing useful, a metric that is not a
finite number -- each one line naming the file or field and what was expected, exit 2, before the
output folder is claimed (it is not created)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from conftest import INLINE_EXECUTOR, cnn_inputs
from quantune.cli import main

SCRIPTS = """
import numpy as np

def none():
    return None

def number():
    return 7

def ragged_names():
    return [{"input": np.zeros((1, 1, 8, 8), np.float32)}, {"other": np.zeros((1, 1, 8, 8), np.float32)}]

def empty_list():
    return []

def nan_metric(outputs, data):
    return float("nan")

def inf_metric(outputs, data):
    return float("inf")

def word_metric(outputs, data):
    return "good"

def bad_runner(session, feeds):
    return None

def short_runner(session, feeds):
    return [{"y": np.zeros(3)}]
"""


@pytest.fixture
def base(tmp_path: Path, cnn_model: Path, cnn_data: dict[str, Path]) -> dict[str, Any]:
    (tmp_path / "scripts.py").write_text(SCRIPTS)
    return {
        "model": cnn_model.name,
        "data": {"calibration": "calib.npz", "evaluation": "eval.npz", "batch_size": 16},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3}},
        "criterion": {"type": "absolute", "tolerable_loss": 0.5},
        "passes": [{"name": "static_quant"}],
        "stop": {"max_trials": 1},
        "cache_dir": "cache",
        **INLINE_EXECUTOR,
    }


def save(tmp_path: Path, name: str, **arrays: np.ndarray) -> str:
    np.savez(tmp_path / name, **arrays)
    return name


def labels(rows: int) -> np.ndarray:
    return np.zeros(rows, np.int64)


def run(tmp_path: Path, config: dict[str, Any], capsys) -> tuple[int, str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    output = tmp_path / "out"
    code = main(["run", str(path), "--output", str(output), "--quiet"])
    err = capsys.readouterr().err
    if code == 2:
        assert not output.exists(), "a preflight error must come before the output folder is claimed"
    return code, err


def check(tmp_path, config, capsys, *needles: str) -> None:
    code, err = run(tmp_path, config, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantune: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


# (name, how to break the base config, what the one line must say)
def _eval(tmp_path, **arrays):
    return save(tmp_path, "bad_eval.npz", **arrays)


CASES = {
    "wrong input name": (
        lambda c, t: c["data"].update(evaluation=_eval(t, image=cnn_inputs(8, 0), label=labels(8))),
        ["data.evaluation ('bad_eval.npz')", "no array for model input(s) ['input']", "'image'"],
    ),
    "dtype not a number": (
        lambda c, t: c["data"].update(evaluation=_eval(t, input=np.full((8, 1, 8, 8), "a"), label=labels(8))),
        ["array 'input' has dtype <U1", "float32"],
    ),
    "dtype that does not convert": (
        lambda c, t: c["data"].update(evaluation=_eval(t, input=np.zeros((8, 1, 8, 8), np.complex64), label=labels(8))),
        ["array 'input' has dtype complex64"],
    ),
    "wrong rank": (
        lambda c, t: c["data"].update(evaluation=_eval(t, input=cnn_inputs(8, 0)[:, 0], label=labels(8))),
        ["array 'input' has rank 3", "takes rank 4"],
    ),
    "fixed dimension": (
        lambda c, t: c["data"].update(evaluation=_eval(t, input=np.zeros((8, 1, 8, 9), np.float32), label=labels(8))),
        ["array 'input' has shape (8, 1, 8, 9)", "needs 8 along axis 3"],
    ),
    "zero-length evaluation data": (
        lambda c, t: c["data"].update(evaluation=_eval(t, input=np.zeros((0, 1, 8, 8), np.float32), label=labels(0))),
        ["data.evaluation ('bad_eval.npz')", "holds no rows"],
    ),
    "NaN inputs": (
        lambda c, t: c["data"].update(
            evaluation=_eval(t, input=np.full((8, 1, 8, 8), np.nan, np.float32), label=labels(8))
        ),
        ["array 'input' holds 512 NaN/Inf value(s)"],
    ),
    "labels missing for a label metric": (
        lambda c, t: c["data"].update(evaluation=_eval(t, input=cnn_inputs(8, 0))),
        ["no label array 'label'"],
    ),
    "calibration of the wrong rank": (
        lambda c, t: c["data"].update(calibration=save(t, "bad_calib.npz", input=cnn_inputs(8, 0)[:, 0])),
        ["data.calibration ('bad_calib.npz')", "has rank 3"],
    ),
    "calibration with zero rows": (
        lambda c, t: c["data"].update(calibration=save(t, "bad_calib.npz", input=np.zeros((0, 1, 8, 8), np.float32))),
        ["data.calibration ('bad_calib.npz')", "holds no rows"],
    ),
    "calibration of the wrong dtype": (
        lambda c, t: c["data"].update(calibration=save(t, "bad_calib.npz", input=np.ones((8, 1, 8, 8), np.bool_) + 0j)),
        ["data.calibration ('bad_calib.npz')", "complex128"],
    ),
    "a scalar array": (
        lambda c, t: c["data"].update(evaluation=_eval(t, input=np.float32(1.0), label=labels(8))),
        ["data.evaluation", "scalars"],
    ),
    "loader returns None": (
        lambda c, t: c["data"].update(evaluation="scripts.py:none"),
        ["data.evaluation: 'scripts.py:none' returned None"],
    ),
    "loader returns a number": (
        lambda c, t: c["data"].update(evaluation="scripts.py:number"),
        ["data.evaluation: 'scripts.py:number' returned int"],
    ),
    "loader returns no feeds": (
        lambda c, t: c["data"].update(evaluation="scripts.py:empty_list"),
        ["returned no feeds"],
    ),
    "a feed without an input": (
        lambda c, t: c["data"].update(calibration="scripts.py:ragged_names"),
        ["data.calibration", "feed 1 has arrays ['other']"],
    ),
    "metric returns NaN": (
        lambda c, t: c["evaluation"].update(metric="scripts.py:nan_metric"),
        ["evaluation.metric: 'scripts.py:nan_metric' gave nan on the original model", "finite number"],
    ),
    "metric returns inf": (
        lambda c, t: c["evaluation"].update(metric="scripts.py:inf_metric"),
        ["'scripts.py:inf_metric' gave inf"],
    ),
    "metric returns a word": (
        lambda c, t: c["evaluation"].update(metric="scripts.py:word_metric"),
        ["evaluating the original model failed", "word_metric"],
    ),
    "runner returns None": (
        lambda c, t: c["evaluation"].update(runner="scripts.py:bad_runner"),
        ["runner 'scripts.py:bad_runner' returned NoneType", "one per feed"],
    ),
    "runner returns too few outputs": (
        lambda c, t: c["evaluation"].update(runner="scripts.py:short_runner"),
        ["returned list of 1", "a list of 3 dict(s)"],
    ),
    "timed feed past the last": (
        lambda c, t: c["evaluation"]["latency"].update(feed=3),
        ["evaluation.latency.feed: 3 is past the last evaluation feed"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_preflight_error_is_one_line_and_exit_2(case, base, tmp_path, capsys):
    breaks, needles = CASES[case]
    breaks(base, tmp_path)
    check(tmp_path, base, capsys, *needles)


def test_a_fixed_batch_dimension_needs_that_batch_size(base, tmp_path, capsys):
    import onnx

    model = onnx.load(str(tmp_path / base["model"]))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(model, str(tmp_path / "fixed.onnx"))
    base["model"] = "fixed.onnx"
    check(tmp_path, base, capsys, "data.batch_size: 16", "fixed batch dimension of 1", "set data.batch_size: 1")


def test_castable_dtypes_are_converted_and_the_run_goes_on(base, tmp_path, capsys):
    base["data"]["calibration"] = save(tmp_path, "calib64.npz", input=cnn_inputs(32, 1).astype(np.float64))
    code, err = run(tmp_path, base, capsys)
    assert code == 0, err


def test_through_the_installed_command_no_traceback(base, tmp_path):
    base["data"]["evaluation"] = "scripts.py:none"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(base))
    done = subprocess.run(
        [sys.executable, "-m", "quantune.cli", "run", str(tmp_path / "config.yaml"), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_check_runs_the_preflight_alone(base, tmp_path, capsys):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(base))
    assert main(["check", str(tmp_path / "config.yaml")]) == 0
    assert "ok: the data fits the model and the original scores top1 = 1" in capsys.readouterr().out
    base["evaluation"]["metric"] = "scripts.py:nan_metric"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(base))
    assert main(["check", str(tmp_path / "config.yaml")]) == 2
    assert "gave nan on the original model" in capsys.readouterr().err


def test_data_the_model_rejects_at_run_time_is_one_line(tmp_path, capsys):
    """Shapes each fine alone that the model cannot combine (3 by 5): onnxruntime's error, one line."""
    from onnx import TensorProto, helper

    from conftest import save_graph

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", "W"]) for n in ("a", "b")]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "W"])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="add")], "add", inputs, [output])
    save_graph(graph, tmp_path / "add.onnx")
    np.savez(tmp_path / "ab.npz", a=np.ones((4, 3), np.float32), b=np.ones((4, 5), np.float32))
    config = {
        "model": "add.onnx",
        "data": {"evaluation": "ab.npz"},
        "evaluation": {"metric": "cosine"},
        "passes": [{"name": "graph_opt"}],
        "cache_dir": "cache",
        **INLINE_EXECUTOR,
    }
    check(tmp_path, config, capsys, "evaluating the original model failed: onnxruntime failed on evaluation feed 0")
