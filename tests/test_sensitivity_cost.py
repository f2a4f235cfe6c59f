"""The sensitivity measurement's time is set by the evaluation, not by the units: it spends a
bounded number of whole-model runs (counted at the sessions, never timed), and the unit that
breaks the model still ranks first (evaluate/sensitivity/cost.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

from conftest import INLINE_EXECUTOR, accuracy_problem
from quantune.engine.measure.sensitivity_probe import EVALUATIONS
from quantune.evaluate.sensitivity import head, static
from quantune.evaluate.sensitivity.cost import HEAVY
from quantune.evaluate.sensitivity.stats import session as real_session
from quantune.strategy.accuracy.context import AccuracyContext

CONVS = ("conv1", "conv2", "conv3", "conv4")
# conv1's channel 0 is dead (zero weights, a negative bias: ReLU gives 0), and conv2's weights
# that read it are 1000x the others: no effect in float, but per-tensor int8 rounds the rest to 0
BROKEN = "conv2"


def _model(path: Path, batch: int | str = "N") -> Path:
    rng = np.random.default_rng(0)
    weights = {name: rng.normal(0, 0.3, (8, 8 if name != "conv1" else 3, 3, 3)).astype(np.float32) for name in CONVS}
    weights["conv1"][0] = 0.0
    weights[BROKEN][:, 0] *= 1000.0
    bias = np.zeros(8, np.float32)
    bias[0] = -1.0
    nodes, inits, x = [], [numpy_helper.from_array(bias, "conv1.b")], "x"
    for name in CONVS:
        inits.append(numpy_helper.from_array(weights[name], f"{name}.w"))
        inputs = [x, f"{name}.w", *(["conv1.b"] if name == "conv1" else [])]
        nodes.append(helper.make_node("Conv", inputs, [f"{name}.out"], name=name, pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"{name}.out"], [f"{name}.relu"], name=f"{name}.relu"))
        x = f"{name}.relu"
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (8, 10)).astype(np.float32), "fc.w"))
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w"], ["y"], name="fc"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


class _Reader(CalibrationDataReader):
    def __init__(self, rows: np.ndarray) -> None:
        self.it = iter([{"x": rows[i : i + 8]} for i in range(0, len(rows), 8)])

    def get_next(self):
        return next(self.it, None)


def _quantize(model: Path, out: Path, rows: np.ndarray, exclude: list[str]) -> Path:
    quantize_static(str(model), str(out), _Reader(rows), quant_format=QuantFormat.QDQ, nodes_to_exclude=exclude)
    return out


def _error(model: Path, quant: Path, rows: np.ndarray) -> float:
    """The output's relative squared error, both run as the QDQ graph defines them (no fusions)."""

    def run(path: Path) -> np.ndarray:
        return real_session(onnx.load(str(path))).run(None, {"x": rows})[0]

    reference = run(model)
    return float(np.sum((run(quant) - reference) ** 2) / np.sum(reference**2))


class _Counted:
    """A real session that counts its rows as whole-model runs (its share of the float model's convs)."""

    spent = 0.0

    def __init__(self, model: onnx.ModelProto) -> None:
        self.session = real_session(model)
        heavy = sum(node.op_type in HEAVY for node in model.graph.node)
        self.share = heavy / (len(CONVS) + 1)  # the convs and the classifier's Gemm

    def run(self, names, feeds):
        rows = len(next(iter(feeds.values())))
        _Counted.spent += self.share * rows
        return self.session.run(names, feeds)


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(static, "session", _Counted)
    monkeypatch.setattr(head, "session", _Counted)
    _Counted.spent = 0.0
    return _Counted


def test_the_breaking_unit_is_the_truth(tmp_path: Path) -> None:
    """The model as built: int8 breaks it, and conv2 alone kept float repairs it (no other unit does)."""
    model = _model(tmp_path / "m.onnx")
    rows = np.random.default_rng(1).normal(0, 1, (64, 3, 16, 16)).astype(np.float32)
    full = _error(model, _quantize(model, tmp_path / "q.onnx", rows, []), rows)
    repaired = {
        name: _error(model, _quantize(model, tmp_path / f"q-{name}.onnx", rows, [name]), rows) for name in CONVS
    }
    assert min(repaired, key=repaired.get) == BROKEN
    assert repaired[BROKEN] < 0.2 * full < min(v for k, v in repaired.items() if k != BROKEN)


def test_sensitivity_spends_at_most_its_bound_and_ranks_the_breaking_unit_first(tmp_path: Path, counted) -> None:
    model = _model(tmp_path / "m.onnx")
    calibration = np.random.default_rng(1).normal(0, 1, (256, 3, 16, 16)).astype(np.float32)
    quant = _quantize(model, tmp_path / "q.onnx", calibration[:64], [])
    batches = [{"x": calibration[i : i + 8]} for i in range(0, len(calibration), 8)]
    evaluation_rows, evaluations = 32, 1.5
    unbounded = static.measure(model, quant, batches)
    everything = counted.spent
    assert unbounded.rows == len(calibration) and everything > 4 * evaluations * evaluation_rows  # many runs a row

    counted.spent = 0.0
    bounded = static.measure(model, quant, batches, row_runs=evaluations * evaluation_rows)
    assert 0 < bounded.rows < len(calibration)
    assert counted.spent <= evaluations * evaluation_rows  # whole-model runs of one row: <= 1.5 evaluations
    for report in (unbounded, bounded):
        assert max(report.scores, key=report.scores.get) == BROKEN, report.scores


def test_a_bound_below_one_row_measures_one_row(tmp_path: Path, counted) -> None:
    model = _model(tmp_path / "m.onnx")
    calibration = np.random.default_rng(1).normal(0, 1, (16, 3, 16, 16)).astype(np.float32)
    quant = _quantize(model, tmp_path / "q.onnx", calibration, [])
    report = static.measure(model, quant, [{"x": calibration}], row_runs=0.5)
    assert report.rows == 1
    assert max(report.scores, key=report.scores.get) == BROKEN


def test_a_fixed_batch_is_measured_whole(tmp_path: Path) -> None:
    """A model whose batch dimension is fixed takes no fewer rows: the bound keeps whole batches."""
    model = _model(tmp_path / "m.onnx", batch=8)
    calibration = np.random.default_rng(1).normal(0, 1, (32, 3, 16, 16)).astype(np.float32)
    quant = _quantize(model, tmp_path / "q.onnx", calibration, [])
    report = static.measure(model, quant, [{"x": calibration[i : i + 8]} for i in range(0, 32, 8)], row_runs=20)
    assert report.rows == 8
    assert max(report.scores, key=report.scores.get) == BROKEN


def test_the_strategys_sensitivity_spends_at_most_its_evaluations_and_ranks_the_breaking_unit_first(
    tmp_path: Path, counted
) -> None:
    """Through the engine (the probe builds the QDQ model and measures it): the rows measured
    are what :data:`EVALUATIONS` runs of the evaluation data pay for, of many more calibration rows."""
    model = _model(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", x=rng.normal(0, 1, (256, 3, 16, 16)).astype(np.float32))
    np.savez(tmp_path / "eval.npz", x=rng.normal(0, 1, (32, 3, 16, 16)).astype(np.float32))
    config = {
        "model": str(model),
        "data": {"calibration": str(tmp_path / "calib.npz"), "evaluation": str(tmp_path / "eval.npz"), "batch_size": 8},
        "evaluation": {"metric": "cosine", "latency": {"warmup": 1, "repeats": 3}},
        "criterion": {"type": "absolute", "tolerable_loss": 0.01},
        "passes": [{"name": "static_quant", "params": {"quant_format": "QDQ", "per_channel": False}}],
        "search": {"strategy": "quantune", "seed": 0},
        "cache_dir": str(tmp_path / "cache"),
        **INLINE_EXECUTOR,
    }
    context = AccuracyContext.from_problem(accuracy_problem(config, {"sensitivity_rows": 256}), "quantune")
    ranked = context.ranked(context.base_point())
    assert BROKEN in ranked[0][0].nodes, [(g.name, s) for g, s in ranked]
    assert 0 < counted.spent <= EVALUATIONS * 32  # whole-model runs of one row: EVALUATIONS evaluations
