"""The culprits ranked as a provider runs the quantized model (``evaluate/sensitivity/provider.py``).

Real parts: onnxruntime quantizes (QDQ) and runs both models; the OpenVINO test runs the engine's
own sensitivity function for a point on OpenVINO in the real target environment (``target_env.py``),
skipped with its reason where it cannot be made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from conftest import accuracy_problem
from quantune.evaluate.backend import LocalBackend
from quantune.evaluate.sensitivity.provider import measure_on_provider
from quantune.evaluate.target_backend import TargetBackend

CPU, OV = "CPUExecutionProvider", "OpenVINOExecutionProvider"


def _two_convs(folder: Path) -> tuple[Path, Path, list[dict[str, np.ndarray]]]:
    """conv1's output channels differ in weight range by four orders of magnitude (per-tensor int8
    flattens the small ones); conv2's weights are even. Returns (float model, its QDQ model, feeds)."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    w1[0] *= 100.0
    w1[1:] *= 0.01
    w2 = rng.normal(size=(4, 4, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4, 8, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = [{"x": rng.normal(size=(8, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    return _quantized(model, folder, feeds)


def test_the_node_whose_quantization_adds_the_error_ranks_first(tmp_path: Path) -> None:
    """conv1's per-tensor weights lose its small channels; conv2 only passes on what it is given:
    conv1 scores above conv2, whose score is the error it adds, not the error it inherits."""
    float_path, quant_path, feeds = _two_convs(tmp_path)
    backend = LocalBackend()

    def run(model: Path, batch: list[dict[str, np.ndarray]]) -> list[Any]:
        return backend.outputs(model, batch, threads=1, runner=None, settings={"provider": CPU})

    scores = measure_on_provider(float_path, quant_path, feeds, run, tmp_path / "work")
    assert set(scores) >= {"conv1", "conv2"}
    assert scores["conv1"] > 10 * scores["conv2"], scores
    assert min(scores.values()) >= 0.0


def test_a_point_on_openvino_is_ranked_as_openvino_runs_it(make_config, ov_python: Path, caplog) -> None:
    """The engine's sensitivity function, asked for a point on OpenVINO, runs the quantized model there
    (on the target environment) and caches that ranking apart from the CPU provider's."""
    passes = [
        {"name": "static_quant", "search": True, "params": {"quant_format": "QDQ", "per_channel": False}},
        {"name": "execution_provider", "id": "provider", "params": {"provider": {"search": [CPU, OV]}}},
    ]
    config = make_config(passes, search={"strategy": "quantune"}, target={"python": str(ov_python)})
    problem = accuracy_problem(config)
    flow = next(tuple(steps) for steps in problem.flows.values() if "static_quant" in steps)
    name = next(n for n, steps in problem.flows.items() if tuple(steps) == flow)
    point = {"flow": name, "static_quant.quant_format": "QDQ"}
    on_cpu = problem.sensitivity({**point, "provider.provider": CPU}, flow)
    on_ov = problem.sensitivity({**point, "provider.provider": OV}, flow)
    assert on_ov and set(on_ov) <= set(problem.capability(None, "static").by_name) | {n for n in on_ov}
    assert all(np.isfinite(v) and v >= 0.0 for v in on_ov.values())
    worst = max(on_ov, key=lambda n: on_ov[n])
    assert on_ov[worst] > 0.0 and worst in on_cpu  # a node the quantizer sees, measured on OpenVINO
    assert "sensitivity on" not in caplog.text  # measured there, not the CPU provider's standing in


def _two_matmuls(folder: Path) -> tuple[Path, Path, list[dict[str, np.ndarray]]]:
    """Two independent MatMuls: ``mm1`` reads ``x`` (one column thirty times the others) kept in 16-bit
    activations with 8-bit weights (a tensor override, as the int16 precision of a unit writes it),
    ``mm2`` reads ``z`` in 8-bit. Returns (float model, its QDQ model, feeds)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 16)).astype(np.float32)
    x[:, 0] *= 30.0
    z = rng.normal(size=(64, 16)).astype(np.float32)
    z[:, 0] *= 1.5
    w1, w2 = (rng.normal(size=(16, 16)).astype(np.float32) for _ in range(2))
    info = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, 16]) for name in ("x", "z", "y1", "y2")]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["y1"], name="mm1"),
            helper.make_node("MatMul", ["z", "w2"], ["y2"], name="mm2"),
        ],
        "two_matmuls",
        info[:2],
        info[2:],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    feeds = [{"x": x[i : i + 16], "z": z[i : i + 16]} for i in range(0, 64, 16)]
    return _quantized(model, folder, feeds, {"TensorQuantOverrides": {"x": [{"quant_type": QuantType.QUInt16}]}})


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.left = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.left, None)


def _quantized(
    model: onnx.ModelProto, folder: Path, feeds: list[dict[str, np.ndarray]], extra: dict[str, Any] | None = None
) -> tuple[Path, Path, list[dict[str, np.ndarray]]]:
    """``model`` saved in ``folder`` and its per-tensor QDQ int8 model calibrated on ``feeds``: (float, quantized, feeds)."""
    float_path, quant_path = folder / "float.onnx", folder / "quant.onnx"
    onnx.save(model, str(float_path))
    quantize_static(
        str(float_path),
        str(quant_path),
        _Reader(feeds),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=False,
        extra_options=extra or {},
    )
    return float_path, quant_path, feeds


def test_openvino_and_the_cpu_provider_rank_the_same_model_otherwise(tmp_path: Path, ov_python: Path) -> None:
    """OpenVINO runs a MatMul with 16-bit activations and 8-bit weights with more error than the CPU
    provider does (an 8-bit MatMul gives both the same numbers): on the CPU provider mm2 is the worse
    unit, on OpenVINO mm1 -- the culprits differ by provider, and each ranking is that provider's."""
    float_path, quant_path, feeds = _two_matmuls(tmp_path)
    ov = TargetBackend(str(ov_python))
    try:
        scores = {}
        for provider, backend in ((CPU, LocalBackend()), (OV, ov)):

            def run(model: Path, batch: list[dict[str, np.ndarray]], backend=backend, provider=provider) -> list[Any]:
                return backend.outputs(model, batch, threads=1, runner=None, settings={"provider": provider})

            scores[provider] = measure_on_provider(float_path, quant_path, feeds, run, tmp_path / provider)
    finally:
        ov.close()
    assert scores[CPU]["mm2"] > scores[CPU]["mm1"], scores
    assert scores[OV]["mm1"] > scores[OV]["mm2"], scores
    assert scores[OV]["mm2"] == pytest.approx(scores[CPU]["mm2"], rel=1e-3)  # the 8-bit MatMul: the same numbers


def test_the_exposed_tensors_come_back_a_few_feeds_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """Every float tensor of both models comes back from the provider: the calls hold at most
    ``HELD_BYTES`` of them (one feed a call where one feed is more), and the scores do not change."""
    from quantune.evaluate.sensitivity import provider

    float_path, quant_path, feeds = _two_convs(tmp_path)
    backend, calls = LocalBackend(), []

    def run(model: Path, batch: list[dict[str, np.ndarray]]) -> list[Any]:
        calls.append(len(batch))
        return backend.outputs(model, batch, threads=1, runner=None, settings={"provider": CPU})

    whole = measure_on_provider(float_path, quant_path, feeds, run, tmp_path / "whole")
    assert calls == [1, 1, len(feeds) - 1, len(feeds) - 1]  # the first feed sizes the rest
    calls.clear()
    monkeypatch.setattr(provider, "HELD_BYTES", 1)
    piecewise = measure_on_provider(float_path, quant_path, feeds, run, tmp_path / "pieces")
    assert calls == [1] * (2 * len(feeds))
    assert piecewise == pytest.approx(whole, rel=1e-9)
