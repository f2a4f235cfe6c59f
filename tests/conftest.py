"""Shared fixtures: tiny real ONNX models built with ``onnx.helper``, their data, and configs.

Every model has seeded random weights, opset 17 and a dynamic batch axis. Every config points
its ``cache_dir`` into ``tmp_path`` and ``QUANTUNE_CACHE_DIR`` is redirected for every test, so
the suite never touches ``~/.cache``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantune

# Trials in this process when the config schema has an executor choice: no worker start-up per
# run (the suite stays fast) and passes registered by a test are visible to the trials. The
# default executor is exercised by the digits example and the CLI's valid run.
INLINE_EXECUTOR: dict[str, Any] = {"executor": {"kind": "inline"}} if "executor" in quantune.Config.model_fields else {}

CNN_CLASSES = 4
MLP_FEATURES = 16
MLP_CLASSES = 5


def save_graph(graph: onnx.GraphProto, path: Path) -> Path:
    """The graph as a checked opset-17 model file (IR 8, which every onnxruntime here loads)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def build_cnn(path: Path, seed: int = 0) -> Path:
    """Conv -> Relu -> Conv -> GlobalAveragePool -> Flatten -> Gemm over ``input[N, 1, 8, 8]``."""
    rng = np.random.default_rng(seed)
    arrays = {
        "w1": rng.normal(0, 0.5, (8, 1, 3, 3)),
        "b1": rng.normal(0, 0.1, (8,)),
        "w2": rng.normal(0, 0.3, (8, 8, 3, 3)),
        "b2": rng.normal(0, 0.1, (8,)),
        "wf": rng.normal(0, 0.5, (CNN_CLASSES, 8)),
        "bf": rng.normal(0, 0.1, (CNN_CLASSES,)),
    }
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CNN_CLASSES])],
        inits,
    )
    return save_graph(graph, path)


def build_mlp(path: Path, seed: int = 0) -> Path:
    """MatMul -> Add -> Relu -> Gemm over ``x[N, 16]``."""
    rng = np.random.default_rng(seed)
    arrays = {
        "w1": rng.normal(0, 0.4, (MLP_FEATURES, 32)),
        "b1": rng.normal(0, 0.1, (32,)),
        "w2": rng.normal(0, 0.3, (32, MLP_CLASSES)),
        "b2": rng.normal(0, 0.1, (MLP_CLASSES,)),
    }
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="matmul1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
        helper.make_node("Relu", ["hb"], ["hr"], name="relu1"),
        helper.make_node("Gemm", ["hr", "w2", "b2"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", MLP_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", MLP_CLASSES])],
        inits,
    )
    return save_graph(graph, path)


def run_model(path: str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """All outputs of the model at ``path`` for ``feeds``, on the CPU provider."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def cnn_inputs(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (rows, 1, 8, 8)).astype(np.float32)


def mlp_inputs(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (rows, MLP_FEATURES)).astype(np.float32)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may fall back to ``~/.cache/quantune``."""
    monkeypatch.setenv("QUANTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("default-cache")))


@pytest.fixture(scope="session")
def _suite_lane(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("lane") / "quantune-latency.lock")


@pytest.fixture(autouse=True)
def _private_latency_lane(_suite_lane: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's timings share a lane of their own (its runs' subprocesses inherit it): a run
    elsewhere on the machine holding the machine-wide one would stall them, and print that they wait."""
    monkeypatch.setenv("QUANTUNE_LATENCY_LOCK", _suite_lane)


@pytest.fixture
def cnn_model(tmp_path: Path) -> Path:
    return build_cnn(tmp_path / "cnn.onnx")


@pytest.fixture
def mlp_model(tmp_path: Path) -> Path:
    return build_mlp(tmp_path / "mlp.onnx")


@pytest.fixture
def cnn_data(tmp_path: Path, cnn_model: Path) -> dict[str, Path]:
    """``calib.npz`` (64 rows) and ``eval.npz`` (48 rows, labelled with the fp32 model's own
    predictions, so the baseline's top1 is exactly 1.0)."""
    calib = cnn_inputs(64, seed=1)
    evaluation = cnn_inputs(48, seed=2)
    labels = np.argmax(run_model(cnn_model, {"input": evaluation})[0], axis=1).astype(np.int64)
    np.savez(tmp_path / "calib.npz", input=calib)
    np.savez(tmp_path / "eval.npz", input=evaluation, label=labels)
    return {"calibration": tmp_path / "calib.npz", "evaluation": tmp_path / "eval.npz"}


@pytest.fixture
def make_config(tmp_path: Path, cnn_model: Path, cnn_data: dict[str, Path]) -> Callable[..., dict[str, Any]]:
    """Builds a small, fast config dict over the tiny CNN with absolute paths.

    ``passes`` replaces the default flow; any other keyword replaces that top-level field.
    """

    def make(passes: list[dict[str, Any]] | None = None, **overrides: Any) -> dict[str, Any]:
        config: dict[str, Any] = {
            "model": str(cnn_model),
            "data": {
                "calibration": str(cnn_data["calibration"]),
                "evaluation": str(cnn_data["evaluation"]),
                "batch_size": 16,
            },
            "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "threads": 1}},
            "criterion": {"type": "relative", "tolerable_loss": 0.5},
            "objective": "latency",
            "passes": passes
            if passes is not None
            else [{"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}}],
            "search": {"sampler": "exhaustive", "seed": 0},
            "stop": {"max_trials": 8},
            "cache_dir": str(tmp_path / "cache"),
            **INLINE_EXECUTOR,
        }
        for key, value in overrides.items():
            config[key] = copy.deepcopy(value)
        return config

    return make


def accuracy_problem(config: dict[str, Any], options: dict[str, Any] | None = None, *, timed: bool = False):
    """The SearchProblem the engine would give a strategy for ``config``, with a seeded random
    sampler and ``options`` as the strategy options (built by the engine's own function).

    Tests that drive a strategy with made-up outcomes judge speed by those outcomes alone:
    unless ``timed``, the side-by-side timing of real candidate models is left out (on these
    tiny models every quantized variant is slower than fp32, which would end the search)."""
    import dataclasses

    from quantune.config import load_config
    from quantune.engine.run.problem import search_problem
    from quantune.engine.trials.setup import build_run

    search = {**config.get("search", {}), "sampler": "random", "seed": 0, "strategy_options": dict(options or {})}
    loaded = load_config({**config, "search": search})
    problem = search_problem(build_run(loaded), loaded.config)
    return (
        problem if timed else dataclasses.replace(problem, latency_ratio=None, ceiling_ratios=None, paired_latency=None)
    )


@pytest.fixture(autouse=True)
def _no_end_of_run_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs skip report.html (seconds of drawing each); tests of the report set QUANTUNE_REPORT=1."""
    monkeypatch.setenv("QUANTUNE_REPORT", "0")


@pytest.fixture(scope="session")
def ov_python() -> Path:
    """The OpenVINO target environment's python (``make test`` builds it); absent: the test is skipped, with why."""
    from target_env import openvino_python

    python, why = openvino_python()
    if python is None:
        pytest.skip(why)
    return python
